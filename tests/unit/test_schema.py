"""Every reader of the schema against random and adversarial input (hypothesis).

The property each reader must have: whatever the bytes, it returns a value or raises
``ValidationError`` (never another exception: a watcher, the CNI server or the API would
crash on it), and what a writer produced reads back as the same value.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podwire import keys
from podwire.agent.cni import request as cni_request
from podwire.cni.spec import CniError
from podwire.errors import ValidationError
from podwire.schema import doc, fields, nodes, records
from podwire.schema.ports import DesiredPort, FixedIp, TrunkInfo, parse_desired_port
from podwire.schema.vif import PodRef, Vif, VifRequest


def examples(full: int) -> int:
    """``scripts/check`` (PODWIRE_QUICK=1) runs a tenth of the examples, to stay fast."""
    return max(10, full // 10) if os.environ.get("PODWIRE_QUICK") else full


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
uuids = st.uuids().map(str)
hex_ids = st.text("0123456789abcdef", min_size=32, max_size=32)
macs = st.tuples(*[st.integers(0, 255)] * 6).map(
    lambda b: ":".join(f"{x:02x}" for x in ((b[0] & 0xFE) | 0x02, *b[1:]))
)
names = st.from_regex(fields.NAME, fullmatch=True)
ifnames = st.from_regex(fields.IFNAME, fullmatch=True)
container_ids = st.from_regex(fields.CONTAINER_ID, fullmatch=True)


def _fixed_ip(host: int) -> FixedIp:
    return FixedIp(f"10.1.{host // 250}.{host % 250 + 2}", "s1", "10.1.0.0/16", "10.1.0.1")


desired_ports = st.builds(
    DesiredPort,
    port_id=uuids,
    network_id=uuids,
    mac_address=macs,
    mtu=st.integers(*fields.MTU_RANGE),
    network_type=st.just("vxlan"),
    physnet=st.none(),
    segmentation_id=st.integers(*fields.VNI_RANGE),
    vif_type=st.sampled_from(["veth", "tap"]),
    fixed_ips=st.lists(st.integers(0, 10_000).map(_fixed_ip), max_size=3).map(tuple),
    security_groups=st.lists(uuids, max_size=3).map(tuple),
    device_owner=st.sampled_from(["compute:podwire", ""]),
    device_id=st.text(string.ascii_letters, max_size=10),
    trunk=st.none() | st.builds(TrunkInfo, uuids, st.just("vlan"), st.integers(1, 4094)),
    project_id=st.none() | hex_ids,
    vif_details=st.just({}),
)

READERS: list[tuple[str, Callable[[bytes], Any]]] = [
    ("desired port", lambda raw: parse_desired_port(raw)),
    ("alive", nodes.parse_alive),
    ("physnet", nodes.parse_physnet),
    ("vtep", nodes.parse_vtep),
    ("capabilities", nodes.parse_capabilities),
    ("port state", nodes.parse_port_state),
    ("in use", lambda raw: records.parse_in_use(raw, "in use")),
    ("leader", records.parse_leader),
    ("ml2 report", records.parse_ml2_report),
    ("vif", lambda raw: Vif.from_json(doc.decode(raw, "vif"))),
    ("vif request", lambda raw: VifRequest.from_json(doc.decode(raw, "body"))),
]


def _only_validation_errors(read: Callable[[bytes], Any], raw: bytes) -> None:
    try:
        read(raw)
    except ValidationError as exc:
        assert str(exc)  # names the problem


@pytest.mark.parametrize(("what", "read"), READERS, ids=[r[0] for r in READERS])
@settings(max_examples=examples(60), deadline=None)
@given(raw=st.binary(max_size=200))
def test_random_bytes_are_refused_cleanly(
    what: str, read: Callable[[bytes], Any], raw: bytes
) -> None:
    _only_validation_errors(read, raw)


@pytest.mark.parametrize(("what", "read"), READERS, ids=[r[0] for r in READERS])
@settings(max_examples=examples(60), deadline=None)
@given(value=st.dictionaries(st.text(max_size=20), json_values, max_size=8))
def test_random_objects_are_refused_cleanly(
    what: str, read: Callable[[bytes], Any], value: dict[str, Any]
) -> None:
    _only_validation_errors(read, json.dumps({"v": 1, **value}).encode())


@settings(max_examples=examples(100), deadline=None)
@given(port=desired_ports)
def test_desired_port_round_trip(port: DesiredPort) -> None:
    assert parse_desired_port(port.encode(), port.port_id) == port


@settings(max_examples=examples(120), deadline=None)
@given(
    port=desired_ports,
    field=st.sampled_from(sorted(DesiredPort.__dataclass_fields__)),
    junk=json_values,
)
def test_desired_port_with_one_field_mangled(port: DesiredPort, field: str, junk: Any) -> None:
    """Adversarial: a valid value with one field replaced by anything."""
    body = port.to_dict()
    body[field] = junk
    try:
        parsed = parse_desired_port(doc.encode(body), port.port_id)
    except ValidationError:
        return
    assert parsed.port_id == port.port_id  # accepted only as a value every agent can wire


@settings(max_examples=examples(100), deadline=None)
@given(port=desired_ports)
def test_vif_round_trip(port: DesiredPort) -> None:
    vif = Vif(
        port.port_id, port.network_id, port.project_id or "ab", port.mac_address, port.mtu,
        list(port.fixed_ips), segmentation_id=port.segmentation_id,
        security_groups=list(port.security_groups),
    )  # fmt: skip
    assert Vif.from_json(json.loads(json.dumps(vif.to_json()))) == vif


@settings(max_examples=examples(100), deadline=None)
@given(
    container=container_ids,
    ifname=ifnames,
    sgs=st.lists(uuids, max_size=5),
    pod=st.none() | st.builds(PodRef, st.text(max_size=10), st.text(max_size=10)),
    replaces=st.none() | uuids,
)
def test_vif_request_round_trip(
    container: str, ifname: str, sgs: list[str], pod: PodRef | None, replaces: str | None
) -> None:
    pod = None if pod is None else PodRef(*(_printable(v) for v in (pod.namespace, pod.name)))
    request = VifRequest(
        fields.attachment_id(container, ifname),
        "net",
        None,
        tuple(sorted(set(sgs))),
        pod,
        replaces,
    )
    body = request.to_json()
    assert ("replaces" in body) == (replaces is not None)  # older controllers refuse it
    assert VifRequest.from_json(json.loads(json.dumps(body))) == request


@settings(max_examples=examples(50), deadline=None)
@given(port=desired_ports, other=uuids, which=st.sampled_from(["port_id", "network_id"]))
def test_in_use_records_whose_ids_disagree_are_refused(
    port: DesiredPort, other: str, which: str
) -> None:
    vif = Vif(port.port_id, port.network_id, "ab", port.mac_address, port.mtu, list(port.fixed_ips))
    raw = records.InUseValue("ab", vif).encode()
    assert records.parse_in_use(raw, "in use").vif == vif
    edited = json.loads(raw)
    if edited[which] == other:
        return
    edited[which] = other
    with pytest.raises(ValidationError, match=f"{which} differs from the VIF's"):
        records.parse_in_use(json.dumps(edited).encode(), "in use")


def _printable(value: str) -> str:
    return "".join(c for c in value if c.isprintable())


@settings(max_examples=examples(100), deadline=None)
@given(a=container_ids, b=ifnames, c=container_ids, d=ifnames)
def test_attachment_ids_are_injective(a: str, b: str, c: str, d: str) -> None:
    if (a, b) != (c, d):
        assert fields.attachment_id(a, b) != fields.attachment_id(c, d)
    assert fields.attachment(fields.attachment_id(a, b), "x") == fields.attachment_id(a, b)


def test_attachments_a_dot_join_confused_are_distinct() -> None:
    assert fields.attachment_id("a.b", "c") != fields.attachment_id("a", "b.c")


def test_legacy_attachment_ids_read_as_the_canonical_form() -> None:
    cid = "0123abcd" * 8
    assert fields.attachment(f"{cid}.eth0", "x") == f"{cid}:eth0"
    for bad in ("noseparator", ":eth0", "c:", "c:e/th0", "c:eth0\n", "../x:eth0"):
        with pytest.raises(ValidationError):
            fields.attachment(bad, "x")


@pytest.mark.parametrize(
    "check",
    [fields.name, fields.neutron_ref, fields.neutron_id, fields.container_id, fields.ifname],
)
def test_names_are_matched_in_full(check: Callable[[Any, str], str]) -> None:
    assert check("abc1", "x") == "abc1"
    for bad in ("abc1\n", "abc1\r", "\nabc1", "abc1 ", "", "a/b"):
        with pytest.raises(ValidationError):
            check(bad, "x")
    with pytest.raises(ValueError):
        keys.check_segment("host\n", "host")


def test_deep_nesting_is_a_validation_error() -> None:
    for raw in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50 + "1" + "}" * 50):
        with pytest.raises(ValidationError, match="nested deeper"):
            doc.decode(raw, "x")
    assert doc.decode("[" * 10 + "]" * 10, "x") == [[[[[[[[[[]]]]]]]]]]


def test_vtep_must_be_a_unicast_host_address() -> None:
    assert nodes.parse_vtep(nodes.vtep_value("192.0.2.1")) == "192.0.2.1"
    for bad in (
        "224.0.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "240.0.0.1",
        "ff02::1",
        "::",
        "::1",
        "1.2.3",
    ):
        with pytest.raises(ValidationError):
            nodes.parse_vtep(nodes.vtep_value(bad))
    for bad, kind in (("127.0.0.1", "loopback"), ("127.1.2.3", "loopback"),
                      ("169.254.1.1", "link-local"), ("fe80::1", "link-local")):  # fmt: skip
        with pytest.raises(ValidationError, match=f"{kind} address, not another node's VTEP"):
            nodes.parse_vtep(nodes.vtep_value(bad))


def test_capabilities_carry_the_pod_driver() -> None:
    raw = nodes.capabilities_value(["veth"], ["vxlan"], "nested")
    assert nodes.parse_capabilities(raw).pod_driver == "nested"
    assert nodes.parse_capabilities(nodes.capabilities_value(["veth"], ["flat"])).pod_driver is None
    with pytest.raises(ValidationError, match="pod_driver"):
        nodes.parse_capabilities(nodes.capabilities_value(["veth"], ["flat"], "magic"))


def test_a_pod_driver_registered_under_its_earlier_name_reads_as_its_new_one() -> None:
    raw = nodes.capabilities_value(["veth"], ["vxlan"], "noop")
    assert nodes.parse_capabilities(raw).pod_driver == "unpooled"


def test_leader_values_in_both_forms() -> None:
    assert records.parse_leader(records.leader_value("ctl-1")) == "ctl-1"
    assert records.parse_leader(b"neutron-host:1234") == "neutron-host:1234"
    with pytest.raises(ValidationError):
        records.parse_leader(b"bad\nidentity")


@settings(max_examples=examples(120), deadline=None)
@given(
    env=st.dictionaries(
        st.sampled_from(["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS"]),
        st.text(max_size=30),
    ),
    stdin=st.text(max_size=200) | json_values.map(json.dumps),
)
def test_cni_requests_get_cni_errors(env: dict[str, str], stdin: str) -> None:
    try:
        cni_request.parse_request(env, stdin)
    except CniError as exc:
        assert exc.code in (1, 4, 6, 7) and exc.msg


def test_a_heartbeat_is_fresh_for_two_ttls_and_a_beat_needs_its_ttl() -> None:
    beat = nodes.parse_alive(nodes.alive_value(1.0, "t", 1000.0, 10))
    assert (beat.beat_at, beat.ttl) == (1000.0, 10)
    assert beat.fresh(1020.0) and not beat.fresh(1020.5)
    assert nodes.parse_alive(nodes.alive_value(1.0, "t")).fresh(1e12)  # before the beat
    for bad in (b'{"v":1,"started_at":1,"ttl":10}', b'{"v":1,"started_at":1,"beat_at":1,"ttl":0}',
                b'{"v":1,"started_at":1,"beat_at":1,"ttl":3601}'):  # fmt: skip
        with pytest.raises(ValidationError):
            nodes.parse_alive(bad)
