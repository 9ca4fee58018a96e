"""In-use records keep the pod their port was handed out for; records written before the
field existed read as before (no pod), and the pure rule that decides an in-use port's
groups after a NetworkPolicy pass."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from podwire import keys
from podwire.controller.inuse import parse_record
from podwire.errors import ValidationError
from podwire.k8s.compile import compile_policies
from podwire.kubeside.policy_view import PolicyView, wanted_groups
from podwire.schema.inuse import InUse, PoolKey
from podwire.schema.records import InUseValue, parse_in_use
from podwire.schema.vif import PodRef, Vif
from tests.k8s.objects import cluster, key, namespace, pod, policy

PORT = "7d7c0f0e-1a2b-4c3d-8e9f-001122334455"
NET = "0aaafa7a-e6be-4119-89f2-6070b63f72c6"
PROJECT = "0123456789abcdef0123456789abcdef"
VIF = Vif(
    PORT,
    NET,
    PROJECT,
    "fa:16:3e:66:f4:e5",
    1450,
    [],
    security_groups=["1c9e5d0e-2b3a-4c5d-8e9f-00112233aaaa"],
)
# A record as controllers before the pod field wrote it (byte for byte).
OLD = (
    '{"network_id":"' + NET + '","port_id":"' + PORT + '","project_id":"' + PROJECT + '",'
    '"v":1,"vif":' + json.dumps(VIF.to_json(), sort_keys=True, separators=(",", ":")) + "}"
).encode()


def test_a_record_of_before_reads_as_one_of_no_pod() -> None:
    value = parse_in_use(OLD, "in use")
    assert (value.project_id, value.vif, value.pod) == (PROJECT, VIF, None)
    record = parse_record(keys.vif("n1", "c1:eth0"), OLD)
    assert record.pod is None
    # Written again without a pod, it is the record it was: nothing moves for old readers.
    assert record.encode() == OLD == InUseValue(PROJECT, VIF).encode()


def test_a_record_keeps_its_pod() -> None:
    ref = PodRef("ns", "web", "5b9c3f2e-0000-4000-8000-000000000001")
    record = InUse("n1", "c1:eth0", PoolKey("n1", PROJECT, NET), VIF, pod=ref)
    raw = record.encode()
    assert json.loads(raw)["pod"] == {"namespace": "ns", "name": "web", "uid": ref.uid}
    assert parse_record(keys.vif("n1", "c1:eth0"), raw) == record
    # Older controllers read it too: they ignore the field (readers accept unknown fields).
    assert parse_in_use(raw, "in use").vif == VIF


def test_a_records_pod_is_read_strictly() -> None:
    body = json.loads(OLD)
    body["pod"] = {"namespace": "ns", "name": "x" * 300}
    with pytest.raises(ValidationError, match="pod"):
        parse_in_use(json.dumps(body).encode(), "in use")


def _view(policies: list[object], labels: dict[str, str]) -> tuple[PolicyView, str]:
    web = pod("ns", "web", ["10.0.0.5"], labels)
    state = cluster([namespace("ns")], [web], policies)  # type: ignore[arg-type]
    desired = compile_policies(state)
    ids = {name: f"id-{name}" for name in desired.groups}
    view = PolicyView(state.pods, desired.pods, ids, frozenset(ids.values()))
    return view, web.meta.uid


def test_a_ports_groups_are_its_own_and_its_pods_policies() -> None:
    isolate = policy("ns", "web-in", {"podSelector": {"matchLabels": {"app": "web"}}})
    view, uid = _view([isolate], {"app": "web"})
    record = InUse(
        "n1",
        "c1:eth0",
        PoolKey("n1", PROJECT, NET),
        replace(VIF, security_groups=["own-sg", "id-podwire-np-open-ingress"]),
        pod=PodRef("ns", "web", uid),
    )
    names = sorted(view.policies[key("ns", "web")].groups)
    assert wanted_groups(record, view, PROJECT) == tuple(
        sorted(["own-sg", *(f"id-{n}" for n in names)])
    )
    assert "id-podwire-np-open-ingress" not in (wanted_groups(record, view, PROJECT) or ())
    # Not this pass's to decide: another project, no pod, another uid, a pod not cached.
    assert wanted_groups(record, view, "other") is None
    assert wanted_groups(replace(record, pod=None), view, PROJECT) is None
    assert wanted_groups(replace(record, pod=PodRef("ns", "web", "old-uid")), view, PROJECT) is None
    assert wanted_groups(replace(record, pod=PodRef("ns", "gone")), view, PROJECT) is None
    # A group not in Neutron yet: decided by a later pass.
    partial = replace(view, group_ids={})
    assert wanted_groups(record, partial, PROJECT) is None
