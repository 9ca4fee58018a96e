"""The ``podwire`` interface driver against real namespaces, its methods called as an agent does.

A simulated host is one namespace (the driver's ``host_netns``), the agent's ``qdhcp-`` one
another; the driver runs in a process of its own with Neutron's privsep daemons.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.agent.netenv import NetEnv, in_ns
from tests.neutron_agents.drivers import DriverProc
from tests.neutron_agents.netinfo import links

MAC = "fa:16:3e:12:34:56"


@pytest.fixture
def spaces(netenv: NetEnv) -> tuple[str, str]:
    """(host namespace, agent namespace)."""
    return netenv.namespace("host"), netenv.namespace("agent")


@pytest.fixture
def driver(spaces: tuple[str, str], netenv: NetEnv) -> Iterator[DriverProc]:
    proc = DriverProc(f"{netenv.tag}-h", spaces[0])
    yield proc
    proc.close()


def port_and_names() -> tuple[str, str, str]:
    port_id = str(uuid.uuid4())
    return port_id, "ns-" + port_id[:11], "tap" + port_id[:11]


def test_plug_makes_the_pair_and_again_is_a_repair(
    driver: DriverProc, spaces: tuple[str, str]
) -> None:
    host_ns, agent_ns = spaces
    port_id, device, tap = port_and_names()

    assert driver.plug(port_id, device, MAC, agent_ns, 1450) == {"ok": True}
    agent_end, host_end = links(agent_ns)[device], links(host_ns)[tap]
    assert agent_end["address"] == MAC and agent_end["mtu"] == 1450
    assert host_end["mtu"] == 1450 and host_end["linkinfo"]["info_kind"] == "veth"
    assert "UP" in agent_end["flags"] and "UP" in host_end["flags"]
    assert "master" not in host_end  # the node agent, not the driver, bridges it
    assert agent_end["ifalias"].split(" ")[2] == port_id

    # An agent restarted finds the pair: plug repairs what drifted and keeps the pair.
    index = agent_end["ifindex"]
    in_ns(agent_ns, "ip", "link", "set", device, "down", "address", "fa:16:3e:00:00:99")
    assert driver.plug(port_id, device, MAC, agent_ns, 1400) == {"ok": True}
    agent_end, host_end = links(agent_ns)[device], links(host_ns)[tap]
    assert agent_end["address"] == MAC and "UP" in agent_end["flags"]
    assert agent_end["mtu"] == 1400 and host_end["mtu"] == 1400
    assert agent_end["ifindex"] == index

    assert driver.call("set_mtu", device, 1300, agent_ns, None) == {"ok": True}
    assert links(agent_ns)[device]["mtu"] == 1300 and links(host_ns)[tap]["mtu"] == 1300

    assert driver.unplug(device, agent_ns) == {"ok": True}
    assert device not in links(agent_ns) and tap not in links(host_ns)
    assert driver.unplug(device, agent_ns) == {"ok": True}  # already gone: nothing to do


def test_foreign_devices_are_left_alone(
    driver: DriverProc, spaces: tuple[str, str], netenv: NetEnv
) -> None:
    host_ns, agent_ns = spaces
    port_id, device, _tap = port_and_names()
    # Someone else's device with the agent end's name, and another host's pair.
    in_ns(agent_ns, "ip", "link", "add", device, "type", "veth", "peer", "name", "stranger0")
    assert driver.unplug(device, agent_ns) == {"ok": True}
    assert device in links(agent_ns)
    answer = driver.plug(port_id, device, MAC, agent_ns, 1450)
    assert answer["error"] == "ForeignDevice" and device in answer["message"]
    assert device in links(agent_ns)

    other = DriverProc(f"{netenv.tag}-other", host_ns)
    try:
        second, second_device, second_tap = port_and_names()
        assert other.plug(second, second_device, MAC, agent_ns, 1450) == {"ok": True}
        assert driver.unplug(second_device, agent_ns) == {"ok": True}
        assert second_device in links(agent_ns) and second_tap in links(host_ns)
        assert other.unplug(second_device, agent_ns) == {"ok": True}
        assert second_tap not in links(host_ns)
    finally:
        other.close()

    # A tap of that name in the host's namespace that is not the driver's: plug refuses.
    third, third_device, third_tap = port_and_names()
    in_ns(host_ns, "ip", "link", "add", third_tap, "type", "veth", "peer", "name", "stranger1")
    answer = driver.plug(third, third_device, MAC, agent_ns, 1450)
    assert answer["error"] == "ForeignDevice" and third_tap in answer["message"]
    assert third_tap in links(host_ns) and third_device not in links(agent_ns)


def test_plug_waits_for_the_node_agent_and_undoes_itself_without_it(
    spaces: tuple[str, str], netenv: NetEnv
) -> None:
    host_ns, agent_ns = spaces
    host = f"{netenv.tag}-h"
    driver = DriverProc(host, host_ns, adopt_timeout=1.0)
    try:
        port_id, device, tap = port_and_names()
        answer = driver.plug(port_id, device, MAC, agent_ns, 1450)
        assert answer["error"] == "TapNotAdopted"
        for part in (port_id, tap, host, host_ns, "binding_failed"):
            assert part in answer["message"]
        assert device not in links(agent_ns) and tap not in links(host_ns)

        # Adopted (a bridge takes the tap as the node agent would): the plug succeeds.
        in_ns(host_ns, "ip", "link", "add", "br0", "type", "bridge")
        adopter = subprocess.Popen(
            [
                "ip", "netns", "exec", host_ns, "sh", "-c",
                f"until ip link set {tap} master br0 2>/dev/null; do sleep 0.05; done",
            ]
        )  # fmt: skip
        try:
            assert driver.plug(port_id, device, MAC, agent_ns, 1450) == {"ok": True}
        finally:
            adopter.wait(timeout=10)
        assert links(host_ns)[tap]["master"] == "br0"
        assert driver.unplug(device, agent_ns) == {"ok": True}
        assert tap not in links(host_ns)
    finally:
        driver.close()
