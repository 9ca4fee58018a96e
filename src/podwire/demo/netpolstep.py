"""NetworkPolicy through the real apiserver, enforced by Neutron: a default-deny-ingress
policy on one kube pod silences a ping from another, a policy naming that peer by its labels
lets it in again. The controller's ``[kubernetes]`` side turns each policy into a Neutron
security group (and address group) on the pod's port; the agents enforce it.

The kube pods carry a group of their own with no ingress rule, so what they admit is only
what the policies (or the controller's open group, for a pod none selects) allow; the demo's
group admits them, so they still reach the CNI pods."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from podwire.demo.kube import NAMESPACE, Kube
from podwire.errors import StackError
from podwire.k8s.groups import group_name
from podwire.k8s.objects import ObjectKey

LABEL = "podwire.io/demo-pod"
CONFIRMING_PINGS = 3


def kube_group(neutron: Any, project: str, demo_group: str) -> str:
    """The kube pods' own group: no ingress rule; the demo's group admits its members."""
    group = neutron.network.create_security_group(name="demo-kube", project_id=project)
    neutron.network.create_security_group_rule(
        security_group_id=demo_group,
        direction="ingress",
        ethertype="IPv4",
        remote_group_id=group.id,
    )
    return str(group.id)


def labelled(manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod with a label naming it, for the policies' selectors."""
    manifest["metadata"]["labels"] = {LABEL: manifest["metadata"]["name"]}
    return manifest


@dataclass
class PolicyFigures:
    denied: int = 0
    deny_ms: float = 0.0
    allowed: int = 0
    allow_ms: float = 0.0

    def line(self) -> str:
        return (
            f"NetworkPolicy: default deny ingress -> {self.denied} of {CONFIRMING_PINGS}"
            f" pings answered, in force {self.deny_ms:.0f} ms after kubectl apply; allowing"
            f" the peer by pod selector -> {self.allowed} of {CONFIRMING_PINGS}, in force"
            f" {self.allow_ms:.0f} ms after kubectl apply"
        )


@dataclass
class Pair:
    """``client`` pings ``server`` (kube pods); ``address`` is the server's."""

    client: str
    server: str
    address: str


def run(kube: Kube, neutron: Any, pair: Pair, port_id: str) -> PolicyFigures:
    """``port_id``: the server's Neutron port, which must come to carry the policy's group."""
    figures = PolicyFigures()
    print(
        f"==> NetworkPolicy: {pair.client} pings {pair.server} (other host); a default-deny"
        " policy, then one allowing the peer by pod selector (kubectl apply)",
        flush=True,
    )
    kube.wait(lambda: _ping(kube, pair), f"{pair.client} answered by {pair.server} (no policy)")
    deny = _policy("demo-deny", pair.server, [])
    figures.deny_ms = _enforce(kube, neutron, pair, port_id, deny)
    figures.denied = _count(kube, pair, "1")
    peers = [{"from": [{"podSelector": {"matchLabels": {LABEL: pair.client}}}]}]
    allow = _policy("demo-allow", pair.server, peers)
    figures.allow_ms = _enforce(kube, neutron, pair, port_id, allow)
    figures.allowed = _count(kube, pair, "2")
    kube.kubectl("delete", "networkpolicy", "-n", NAMESPACE, "demo-deny", "demo-allow")
    if figures.denied or figures.allowed < CONFIRMING_PINGS:
        raise StackError(figures.line())
    return figures


def _enforce(kube: Kube, neutron: Any, pair: Pair, port_id: str, policy: dict[str, Any]) -> float:
    """Applies ``policy``; milliseconds from kubectl's return to the first ping that went as
    it says (answered when it admits peers), probed once its group is on the port."""
    name = policy["metadata"]["name"]
    kube.apply(policy)
    applied = time.perf_counter()
    group = _carried(kube, neutron, name, port_id)
    _say(f"policy {name} is Neutron security group {group.name}: {_rules(neutron, group)}")
    admits = bool(policy["spec"].get("ingress"))
    went = "admitted" if admits else "denied"
    return _until(kube, pair, admits, applied, f"the ping {went} by {name}")


def _policy(name: str, server: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": {LABEL: server}},
        "policyTypes": ["Ingress"],
    }
    if ingress:
        spec["ingress"] = ingress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def _carried(kube: Kube, neutron: Any, policy: str, port_id: str) -> Any:
    """The policy's group once the server's port carries it."""
    name = group_name(ObjectKey(NAMESPACE, policy))

    def carried() -> Any | None:
        groups = list(neutron.network.security_groups(name=name))
        port = neutron.network.get_port(port_id)
        return next((g for g in groups if g.id in port.security_group_ids), None)

    return kube.wait(carried, f"Neutron group {name} of policy {policy} on port {port_id}")


def _until(kube: Kube, pair: Pair, answered: bool, since: float, what: str) -> float:
    """Milliseconds from ``since`` to the start of the first ping that went as wanted."""
    started = [0.0]

    def went() -> bool:
        started[0] = time.perf_counter()
        return _ping(kube, pair) is answered

    kube.wait(went, what)
    return (started[0] - since) * 1000


def _count(kube: Kube, pair: Pair, wait_s: str) -> int:
    """``wait_s``: 1 s is plenty to see silence, 2 s spares an admitted ping on a busy host
    from being taken for a denied one."""
    return sum(_ping(kube, pair, wait_s) for _ in range(CONFIRMING_PINGS))


def _ping(kube: Kube, pair: Pair, wait_s: str = "1") -> bool:
    return kube.exec(pair.client, "ping", "-c", "1", "-W", wait_s, pair.address)


def _rules(neutron: Any, group: Any) -> str:
    """Its ingress rules, an address group by its name and addresses (one entry per peer
    for both IP versions)."""
    said: dict[str, list[str]] = {}
    for rule in neutron.network.security_group_rules(security_group_id=group.id):
        if rule.direction != "ingress":
            continue
        remote = rule.remote_ip_prefix or "anywhere"
        if rule.remote_address_group_id:
            peers = neutron.network.get_address_group(rule.remote_address_group_id)
            remote = f"address group {peers.name} {sorted(peers.addresses)}"
        said.setdefault(f"ingress {rule.protocol or 'any'} from {remote}", []).append(
            rule.ether_type
        )
    return "; ".join(f"{s} ({', '.join(sorted(e))})" for s, e in said.items()) or "no ingress rule"


def _say(message: str) -> None:
    print(f"    {message}", flush=True)
