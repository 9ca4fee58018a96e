"""Pure logic of the ml2 side: wire values, host cache, binding decision, batching."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from podwire import keys
from podwire.backoff import Backoff
from podwire.errors import RetryableError, ValidationError
from podwire.ml2 import feedback as feedback_module
from podwire.ml2.binding import Binding, Decline, Segment, decide
from podwire.ml2.feedback import Feedback
from podwire.ml2.forwarder import batch_ops
from podwire.ml2.host_cache import HostCache, HostDirectory, StateChange
from podwire.ml2.journal import Entry
from podwire.schema import nodes as values
from podwire.schema.deployment import Deployment
from podwire.schema.ports import DesiredPort, FixedIp, TrunkInfo, parse_desired_port

HOST = "node-1"


def fed_cache(**extra: bytes) -> HostCache:
    cache = HostCache()
    cache.apply("put", keys.state_alive(HOST), values.alive_value(1.0, "0.1.0"))
    cache.apply("put", keys.state_physnet(HOST, "physnet1"), values.physnet_value("eth1"))
    cache.apply("put", keys.state_vtep(HOST), values.vtep_value("192.0.2.10"))
    for key, raw in extra.items():
        cache.apply("put", key, raw)
    return cache


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[1]", b'{"v": 2, "interface": "eth1"}', b'{"v": true, "interface": "eth1"}',
     b'{"v": 1}', b'{"v": 1, "interface": ""}'],
)  # fmt: skip
def test_bad_physnet_values_are_rejected(raw: bytes) -> None:
    with pytest.raises(ValidationError):
        values.parse_physnet(raw)


def test_unknown_fields_are_ignored() -> None:
    assert values.parse_vtep(b'{"v": 1, "ip": "192.0.2.1", "future": {"x": 1}}') == "192.0.2.1"
    with pytest.raises(ValidationError):
        values.parse_vtep(b'{"v": 1, "ip": "not-an-ip"}')


def test_desired_port_encoding_is_stable_and_parseable() -> None:
    port = DesiredPort(
        port_id=PORT_ID, network_id=NETWORK_ID, mac_address="fa:16:3e:00:00:01", mtu=1450,
        network_type="vxlan", physnet=None, segmentation_id=1001, vif_type="veth",
        fixed_ips=(FixedIp("10.0.0.5", "s1", "10.0.0.0/24", "10.0.0.1"),),
        security_groups=(SG2, SG1), device_owner="compute:podwire", device_id="pod-1",
        trunk=TrunkInfo(PARENT_ID, "vlan", 101),
    )  # fmt: skip
    decoded = json.loads(port.encode())
    assert decoded["v"] == 1 and decoded["mtu"] == 1450
    assert decoded["fixed_ips"] == [
        {
            "ip_address": "10.0.0.5",
            "subnet_id": "s1",
            "cidr": "10.0.0.0/24",
            "gateway_ip": "10.0.0.1",
        }
    ]
    assert decoded["trunk"] == {
        "parent_port_id": PARENT_ID, "segmentation_type": "vlan", "segmentation_id": 101
    }  # fmt: skip
    assert parse_desired_port(port.encode(), PORT_ID) == port
    assert port.encode() == DesiredPort(**port.__dict__).encode()


PORT_ID = "7d7c0f0e-1a2b-4c3d-8e9f-001122334455"
NETWORK_ID = "0aaafa7a-e6be-4119-89f2-6070b63f72c6"
PARENT_ID = "1aaafa7a-e6be-4119-89f2-6070b63f72c6"
SG1 = "2aaafa7a-e6be-4119-89f2-6070b63f72c6"
SG2 = "3aaafa7a-e6be-4119-89f2-6070b63f72c6"


def test_cache_tracks_hosts_and_reports_changes() -> None:
    cache = fed_cache()
    state = cache.get(HOST)
    assert state.alive and state.physnets == {"physnet1": "eth1"} and state.vtep == "192.0.2.10"
    port_key = keys.state_port(HOST, "port-1")
    assert cache.apply("put", port_key, values.port_state_value(2.0)) == [
        StateChange("port_wired", HOST, "port-1")
    ]
    assert cache.wired_ports() == [(HOST, "port-1")]
    assert cache.apply("delete", keys.state_alive(HOST), b"") == [StateChange("host_down", HOST)]
    assert not cache.get(HOST).alive and cache.dead_hosts() == [HOST]
    assert cache.apply("delete", port_key, b"") == [StateChange("port_unwired", HOST, "port-1")]
    assert cache.apply("delete", port_key, b"") == []


def test_status_reports_of_an_agent_change_nothing_for_neutron() -> None:
    """The agent's policy and memif reports are for podwire status; the driver skips them (a
    memif report once stopped the driver's state follower: every later binding waited)."""
    cache = fed_cache()
    memif = values.memif_state_value([], 1.0)
    assert cache.apply("put", keys.state_memif(HOST), memif) == []
    assert cache.apply("delete", keys.state_memif(HOST), b"") == []
    assert (
        cache.apply("put", keys.state_policy(HOST), values.policy_state_value(1, 2, 0, 1.0)) == []
    )
    port_key = keys.state_port(HOST, "port-1")
    assert cache.apply("put", port_key, values.port_state_value(2.0)) == [
        StateChange("port_wired", HOST, "port-1")
    ]


def test_cache_treats_malformed_values_as_absent() -> None:
    cache = fed_cache()
    assert cache.apply("put", keys.state_physnet(HOST, "physnet1"), b"{bad") == []
    assert cache.get(HOST).physnets == {}
    assert cache.apply("put", keys.state_alive(HOST), b'{"v": 9}') == [
        StateChange("host_down", HOST)
    ]
    assert cache.apply("put", keys.state_port(HOST, "p"), b'{"v": 1, "wired_at": "x"}') == []
    assert cache.wired_ports() == []
    assert cache.apply("put", "/podwire/state/nodes/h/unknown/x", b"{}") == []
    assert cache.get("never-seen").alive is False


FLAT = Segment("seg-flat", "flat", "physnet1", None)
VXLAN = Segment("seg-vx", "vxlan", None, 1001)


def test_binding_needs_an_alive_host_serving_the_segment() -> None:
    state = fed_cache().get(HOST)
    bound = decide("normal", "compute:podwire", "p", [FLAT], state, "/run/vhu")
    assert bound == Binding(FLAT, "veth", {})
    other_physnet = Segment("s2", "vlan", "physnet9", 100)
    assert isinstance(
        decide("normal", "compute:podwire", "p", [other_physnet], state, "/"), Decline
    )
    assert isinstance(decide("direct", "compute:podwire", "p", [FLAT], state, "/"), Decline)
    assert isinstance(
        decide("normal", "compute:podwire", "p", [FLAT], HostCache().get(HOST), "/"), Decline
    )

    no_vtep = HostCache()
    no_vtep.apply("put", keys.state_alive(HOST), values.alive_value(1.0, "x"))
    assert isinstance(decide("normal", "", "p", [VXLAN], no_vtep.get(HOST), "/"), Decline)
    assert decide("normal", "", "p", [other_physnet, VXLAN], state, "/") == Binding(
        VXLAN, "tap", {}
    )


def test_vif_type_follows_owner_and_capabilities() -> None:
    caps = values.capabilities_value(["veth", "tap", "vhostuser"], ["flat", "vxlan"])
    state = fed_cache(**{keys.state_capabilities(HOST): caps}).get(HOST)
    assert decide("normal", "network:dhcp", "p", [FLAT], state, "/d") == Binding(FLAT, "tap", {})
    assert decide("normal", "trunk:subport", "p", [FLAT], state, "/d") == Binding(FLAT, "veth", {})
    vm = decide("normal", "compute:nova", "abc", [FLAT], state, "/d/")
    assert vm == Binding(
        FLAT, "vhostuser", {"vhostuser_socket": "/d/pw-abc", "vhostuser_mode": "server"}
    )
    vlan = Segment("s3", "vlan", "physnet1", 100)
    assert isinstance(decide("normal", "compute:podwire", "p", [vlan], state, "/d"), Decline)
    tap_only = values.capabilities_value(["tap"], ["flat"])
    limited = fed_cache(**{keys.state_capabilities(HOST): tap_only}).get(HOST)
    assert isinstance(decide("normal", "compute:podwire", "p", [FLAT], limited, "/d"), Decline)


def test_batch_keeps_the_last_change_per_key() -> None:
    rows = [Entry(1, "/a", "1"), Entry(2, "/b", "1"), Entry(3, "/a", None), Entry(4, "/a", "3")]
    ops = batch_ops(rows)
    described = [(op.message.request_put.key, op.message.request_put.value) for op in ops]
    assert described == [(b"/b", b"1"), (b"/a", b"3")]


def test_a_policy_row_goes_to_every_deployment_a_port_row_to_its_own() -> None:
    blue = Deployment("blue").etcd_namespace
    secgroup, port = keys.secgroup("sg1"), blue + keys.node_port("h", "p")
    rows = [Entry(1, secgroup, "{}"), Entry(2, port, None)]
    ops = batch_ops(rows, ["", blue])
    described = [op.message.request_put.key or op.message.request_delete_range.key for op in ops]
    assert described == [secgroup.encode(), (blue + secgroup).encode(), port.encode()]


def _alive_in(cache: HostCache, host: str) -> None:
    cache.apply("put", keys.state_alive(host), json.dumps({"v": 1, "started_at": 1.0}).encode())


def test_a_host_belongs_to_the_deployment_it_is_alive_in() -> None:
    default, blue = Deployment(), Deployment("blue")
    hosts = HostDirectory([default, blue])
    _alive_in(hosts.caches["blue"], "h1")
    assert hosts.get("h1").alive and hosts.deployment_of("h1") == blue
    assert hosts.key("h1", "/podwire/x") == blue.etcd_namespace + "/podwire/x"
    assert hosts.deployment_of("unknown") == default  # the home deployment
    _alive_in(hosts.caches["podwire"], "h1")  # registered in both: bound by neither
    assert not hosts.get("h1").alive
    hosts.caches["blue"].apply("delete", keys.state_alive("h1"), b"")
    assert hosts.get("h1").alive and hosts.deployment_of("h1") == default


class FlakySink:
    """Neutron that fails the first ``failures`` calls, as during an API restart."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.completed: list[str] = []
        self.settled: list[tuple[str, bool]] = []  # (port, completed before)

    def port_wired(self, host: str, port_id: str) -> bool:
        if self.failures:
            self.failures -= 1
            raise RetryableError("neutron is restarting")
        self.completed.append(port_id)
        return True

    def port_settled(self, host: str, port_id: str) -> bool:
        self.settled.append((port_id, port_id in self.completed))
        return False

    def port_unwired(self, host: str, port_id: str) -> bool:
        return False

    def host_down(self, host: str) -> int:
        return 0


class SlowSink:
    """Neutron whose calls take a while: records what it was asked, in order, and how many
    calls were under way at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.busy = self.most_busy = 0
        self._lock = threading.Lock()

    def _call(self, kind: str, port_id: str) -> bool:
        with self._lock:
            self.busy += 1
            self.most_busy = max(self.most_busy, self.busy)
        time.sleep(0.05)
        with self._lock:
            self.busy -= 1
            self.calls.append((kind, port_id))
        return True

    def port_wired(self, host: str, port_id: str) -> bool:
        return self._call("wired", port_id)

    def port_settled(self, host: str, port_id: str) -> bool:
        return False

    def port_unwired(self, host: str, port_id: str) -> bool:
        return self._call("unwired", port_id)

    def host_down(self, host: str) -> int:
        return 0


async def test_feedback_acts_on_several_ports_at_once_each_in_order() -> None:
    """A burst of pods: their ports go ACTIVE together, not one Neutron call after another;
    one port's changes keep their order."""
    sink = SlowSink()
    feedback = Feedback(None, fed_cache(), sink, is_active=lambda: True)  # type: ignore[arg-type]
    burst = [StateChange("port_wired", HOST, f"port-{i}") for i in range(6)]
    churn = [StateChange("port_unwired", HOST, "port-0"), StateChange("port_wired", HOST, "port-0")]
    await feedback._act(burst + churn)
    assert sink.most_busy > 1
    assert [c for c in sink.calls if c[1] == "port-0"] == [
        ("wired", "port-0"),
        ("unwired", "port-0"),
        ("wired", "port-0"),
    ]
    assert len(sink.calls) == 8


async def test_feedback_retries_a_failed_neutron_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feedback_module, "RETRY", Backoff(0.01, 0.1))
    sink = FlakySink(failures=2)
    feedback = Feedback(None, fed_cache(), sink, is_active=lambda: True)  # type: ignore[arg-type]
    async with asyncio.TaskGroup() as group:  # what run() gives its retries
        feedback._group = group
        await feedback._act([StateChange("port_wired", HOST, "port-1")])
        assert sink.completed == []
        async with asyncio.timeout(10):
            while not sink.completed:
                await asyncio.sleep(0.01)
    assert sink.completed == ["port-1"] and sink.failures == 0


async def test_feedback_looks_again_at_each_port_it_completed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Neutron's completions can race and announce nothing: each completed port gets a second
    look a moment later; a failed completion gets none (its retry's success will), nor does a
    port its host no longer reports wired (set DOWN meanwhile: not to be made ACTIVE)."""
    monkeypatch.setattr(feedback_module, "SETTLE_DELAY", 0.01)
    monkeypatch.setattr(feedback_module, "RETRY", Backoff(0.05, 0.1))
    sink = FlakySink(failures=1)
    wired = {keys.state_port(HOST, p): values.port_state_value(1.0) for p in ("port-1", "port-2")}
    feedback = Feedback(None, fed_cache(**wired), sink, is_active=lambda: True)  # type: ignore[arg-type]
    async with asyncio.TaskGroup() as group:
        feedback._group = group
        await feedback._act([StateChange("port_wired", HOST, "port-1")])  # fails, retries
        await feedback._act([StateChange("port_wired", HOST, "port-2")])
        await feedback._act([StateChange("port_wired", HOST, "port-3")])  # unwired since
        async with asyncio.timeout(10):
            while len(sink.settled) < 2:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
    assert sorted(sink.settled) == [("port-1", True), ("port-2", True)]
    assert "port-3" in sink.completed
