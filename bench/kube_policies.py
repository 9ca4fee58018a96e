"""kube_bench's second half: the same node's controller restarted with ``[kubernetes]`` and
20 NetworkPolicies in the pods' namespace, every one selecting the bench's pods, so a pod's
port carries 21 groups (the conflist's and the 20 policies') decided from the API before it
is handed out, and its address joins the address group its peers' rules name.

The pool is populated for that set of groups once the policies are in Neutron: the steady
state of a node whose policies have not changed for a while (a policy change costs one port
update per pooled port, which is not what this row measures)."""

from __future__ import annotations

from typing import Any

from bench.cri_bench import PodwireNode
from bench.harness import wait_for
from podwire.k8s.groups import group_name
from podwire.k8s.objects import ObjectKey

POLICIES = 20
LABEL = {"bench": "kube"}  # on every pod of kube_bench; what the policies select


def policies(namespace: str) -> list[dict[str, Any]]:
    """Ingress from the bench's own pods (an address group) or from an ipBlock with an
    except, one port each; every fourth one also isolates egress (to those pods)."""
    made = []
    for index in range(POLICIES):
        peer: dict[str, Any] = {"podSelector": {"matchLabels": LABEL}}
        if index % 2:
            peer = {"ipBlock": {"cidr": "10.0.0.0/8", "except": [f"10.{index}.0.0/16"]}}
        spec: dict[str, Any] = {
            "podSelector": {"matchLabels": LABEL},
            "ingress": [{"from": [peer], "ports": [{"protocol": "TCP", "port": 8000 + index}]}],
        }
        if index % 4 == 3:
            spec["policyTypes"] = ["Ingress", "Egress"]
            spec["egress"] = [{"to": [{"podSelector": {"matchLabels": LABEL}}]}]
        made.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": f"np{index}", "namespace": namespace},
                "spec": spec,
            }
        )
    return made


def kubernetes_toml(stack: dict[str, Any], project: str) -> str:
    return f'[kubernetes]\nkubeconfig = "{stack["kubeconfig"]}"\nproject_id = "{project}"\n'


def policy_groups(node: PodwireNode, namespace: str, timeout: float = 120.0) -> list[str]:
    """The ids of the 20 policies' groups, once the controller made them all."""
    wanted = {group_name(ObjectKey(namespace, f"np{i}")) for i in range(POLICIES)}

    def found() -> list[str] | None:
        listed = node.conn.network.security_groups(project_id=node.project)
        ids = {group.name: group.id for group in listed if group.name in wanted}
        return sorted(ids.values()) if len(ids) == len(wanted) else None

    return list(wait_for(found, timeout, 0.5, f"the {POLICIES} policies' groups in Neutron"))


def enforce(stack: dict[str, Any], node: PodwireNode, namespace: str) -> None:
    """Restart the node's controller with ``[kubernetes]`` (the agent keeps its token and
    URL), wait for the policies' groups (kube_bench applied the policies) and warm the pool
    for the pods' set of groups."""
    node.services.stop_child("controller")
    node.services.start_controller([node.host], kubernetes_toml(stack, node.project))
    groups = [node.group.id, *policy_groups(node, namespace)]
    node.settle_groups = groups  # the rounds after this one take ports of this set alone
    node.populate(groups)
