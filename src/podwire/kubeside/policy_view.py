"""What one NetworkPolicy pass decided, as the ports see it, and the set of groups an in-use
port must carry for it: pure, so its rules are unit-tested exactly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from podwire.k8s.groups import PodPolicies
from podwire.k8s.objects import K8sPod, ObjectKey
from podwire.schema.inuse import InUse, SgKey, sg_key


@dataclass(frozen=True)
class PolicyView:
    """``pods``: the pass's snapshot of the pod cache; ``policies``: each pod's groups (by
    name); ``group_ids``: the marked groups' Neutron ids by name; ``marked``: the id of every
    group the reconciler owns, the ones a port's set is recomputed from (any other group of a
    port came from its CNI config and stays)."""

    pods: Mapping[ObjectKey, K8sPod]
    policies: Mapping[ObjectKey, PodPolicies]
    group_ids: Mapping[str, str]
    marked: frozenset[str]


def wanted_groups(record: InUse, view: PolicyView, project_id: str) -> SgKey | None:
    """The groups the record's port must carry now, or None when the pass does not decide
    them: a port of another project or of no pod, a pod this snapshot does not hold (not
    listed yet, or gone: its release is another matter) or holds under another uid, a pod
    on the host's network, a group not in Neutron."""
    pod = record.pod
    if pod is None or record.key.project_id != project_id:
        return None
    key = ObjectKey(pod.namespace, pod.name)
    cached = view.pods.get(key)
    policies = view.policies.get(key)
    if cached is None or policies is None or (pod.uid and cached.meta.uid != pod.uid):
        return None
    ids = [view.group_ids.get(name) for name in policies.groups]
    if None in ids:
        return None
    own = (group for group in record.vif.security_groups if group not in view.marked)
    return sg_key([*own, *(group for group in ids if group is not None)])
