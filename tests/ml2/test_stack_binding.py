"""The driver inside the real Neutron: binding, desired keys, feedback, against the real etcd."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from podwire import keys
from podwire.etcd.client import EtcdClient
from tests.ml2.conftest import port_binding, status_is
from tests.ml2.provisioning_blocks import ProvisioningBlocks
from tests.scripted_agent import ScriptedAgent, bound_on, eventually

pytestmark = pytest.mark.stack


def flat_network(neutron: Any, project_id: str) -> Any:
    network = neutron.network.create_network(
        name="ml2-flat",
        project_id=project_id,
        provider_network_type="flat",
        provider_physical_network="physnet1",
    )
    neutron.network.create_subnet(
        network_id=network.id, cidr="10.30.0.0/24", ip_version=4, project_id=project_id
    )
    return network


def vxlan_network(neutron: Any, project_id: str, cidr: str = "10.31.0.0/24") -> tuple[Any, Any]:
    network = neutron.network.create_network(name="ml2-vx", project_id=project_id)
    subnet = neutron.network.create_subnet(
        network_id=network.id, cidr=cidr, ip_version=4, project_id=project_id
    )
    return network, subnet


async def test_binds_only_on_alive_hosts_serving_the_segment(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent]
) -> None:
    wrong_physnet, not_alive, good = agents(), agents(), agents()
    await wrong_physnet.register(physnets={"physnet2": "eth2"})
    await not_alive.register(physnets={"physnet1": "eth1"}, alive=False)
    await good.register(physnets={"physnet1": "eth1"})
    network = flat_network(neutron, project_id)

    port = await bound_on(neutron, network, project_id, good.host)
    assert port.binding_vif_type == "veth"
    for host in (wrong_physnet.host, not_alive.host, "no-such-host"):
        other = neutron.network.create_port(
            network_id=network.id, project_id=project_id, binding_host_id=host
        )
        assert other.binding_vif_type == "binding_failed", host

    await good.die()

    async def refused() -> bool:
        probe = neutron.network.create_port(
            network_id=network.id, project_id=project_id, binding_host_id=good.host
        )
        return bool(probe.binding_vif_type == "binding_failed")

    await eventually(refused, "bindings refused on a dead host")


async def test_vxlan_needs_a_vtep(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent]
) -> None:
    no_vtep, with_vtep = agents(), agents()
    await no_vtep.register(vtep=None)
    await with_vtep.register(vtep="192.0.2.20")
    network, _ = vxlan_network(neutron, project_id)
    port = await bound_on(neutron, network, project_id, with_vtep.host, device_owner="network:dhcp")
    assert port.binding_vif_type == "tap"
    refused = neutron.network.create_port(
        network_id=network.id, project_id=project_id, binding_host_id=no_vtep.host
    )
    assert refused.binding_vif_type == "binding_failed"


async def test_desired_key_feedback_active_and_delete(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent], etcd: EtcdClient
) -> None:
    agent = agents()
    await agent.register()
    network, subnet = vxlan_network(neutron, project_id)
    port = await bound_on(neutron, network, project_id, agent.host, device_id="pod-a")
    assert port.status == "DOWN"

    desired = await eventually(lambda: agent.desired(port.id), "desired key")
    assert desired["port_id"] == port.id and desired["network_id"] == network.id
    assert desired["mac_address"] == port.mac_address
    assert desired["mtu"] == 1450 == network.mtu
    assert desired["network_type"] == "vxlan"
    assert desired["segmentation_id"] == network.provider_segmentation_id
    assert desired["vif_type"] == "veth" and desired["device_owner"] == "compute:podwire"
    assert desired["device_id"] == "pod-a" and desired["trunk"] is None
    assert desired["fixed_ips"] == [
        {
            "ip_address": port.fixed_ips[0]["ip_address"],
            "subnet_id": subnet.id,
            "cidr": "10.31.0.0/24",
            "gateway_ip": "10.31.0.1",
        }
    ]
    assert desired["security_groups"] == sorted(port.security_group_ids)

    await agent.wire(port.id)
    await eventually(
        lambda: status_is(neutron, port.id, "ACTIVE"), "port ACTIVE after the agent wired it"
    )

    neutron.network.update_port(port.id, device_id="pod-b")

    async def updated() -> bool:
        value = await agent.desired(port.id)
        return value is not None and value["device_id"] == "pod-b"

    await eventually(updated, "desired key updated")

    neutron.network.update_port(port.id, binding_host_id="")

    async def gone() -> bool:
        return await agent.desired(port.id) is None

    await eventually(gone, "key removed on unbind")
    neutron.network.update_port(port.id, binding_host_id=agent.host)
    await eventually(lambda: agent.desired(port.id), "key back after rebind")
    neutron.network.delete_port(port.id)
    await eventually(gone, "key removed on delete")


async def test_host_move_and_host_death(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent]
) -> None:
    first, second = agents(), agents()
    await first.register()
    await second.register()
    network, _ = vxlan_network(neutron, project_id)
    port = await bound_on(neutron, network, project_id, first.host)
    await eventually(lambda: first.desired(port.id), "key on the first host")
    await first.wire(port.id)
    await eventually(lambda: status_is(neutron, port.id, "ACTIVE"), "ACTIVE on the first host")

    neutron.network.update_port(port.id, binding_host_id=second.host)

    async def moved() -> bool:
        return await first.desired(port.id) is None and await second.desired(port.id) is not None

    await eventually(moved, "key moved to the second host")
    # The first host's stale state key must not make the moved port ACTIVE.
    await first.wire(port.id)
    await second.wire(port.id)
    await eventually(lambda: status_is(neutron, port.id, "ACTIVE"), "ACTIVE on the second host")

    await second.die()
    await eventually(lambda: status_is(neutron, port.id, "DOWN"), "DOWN when the host died")


async def test_state_key_for_unknown_port_and_garbage_values_change_nothing(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent], etcd: EtcdClient
) -> None:
    agent = agents()
    await agent.register()
    await agent.wire("00000000-0000-0000-0000-000000000000")
    await etcd.put(keys.state_port(agent.host, "garbage"), b"{not json")
    await etcd.put(keys.state_vtep(agent.host), b'{"v": 7, "ip": "192.0.2.1"}')
    network, _ = vxlan_network(neutron, project_id)
    port = neutron.network.create_port(
        network_id=network.id, project_id=project_id, binding_host_id=agent.host
    )
    # Wrong schema version on the VTEP: the host cannot serve vxlan.
    await eventually(
        lambda: _vif(neutron, port.id, "binding_failed"), "binding refused without a valid VTEP"
    )
    await etcd.put(keys.state_vtep(agent.host), b'{"v": 1, "ip": "192.0.2.1"}')
    bound = await bound_on(neutron, network, project_id, agent.host)
    # A malformed state value for this very port must not make it ACTIVE.
    await etcd.put(keys.state_port(agent.host, bound.id), b'{"v": 1, "wired_at": "soon"}')
    await agent.wire(port.id)  # a port that is not bound there
    assert neutron.network.get_port(bound.id).status == "DOWN"
    await agent.wire(bound.id)
    await eventually(lambda: status_is(neutron, bound.id, "ACTIVE"), "ACTIVE after a valid value")


async def _vif(neutron: Any, port_id: str, vif_type: str) -> bool:
    return bool(port_binding(neutron, port_id)[1] == vif_type)


async def test_a_port_no_completion_announced_goes_active(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent], stack: dict[str, Any]
) -> None:
    """Neutron's completions race: the DHCP agent's and ours a few milliseconds apart can each
    still see the other's block, and neither announces the port ACTIVE. Played here by a DHCP
    block that goes away behind Neutron's back after ours was completed."""
    agent = agents()
    await agent.register(physnets={"physnet1": "eth1"})
    port = await bound_on(neutron, flat_network(neutron, project_id), project_id, agent.host)
    blocks = ProvisioningBlocks(stack, port.id)
    blocks.add("DHCP")
    try:
        await agent.wire(port.id)

        async def l2_completed() -> bool:
            return blocks.entities() == ["DHCP"]

        await eventually(l2_completed, "podwire's L2 block completed, DHCP's left")
        blocks.remove("DHCP")
        await eventually(lambda: status_is(neutron, port.id, "ACTIVE"), "ACTIVE with no block left")
    finally:
        blocks.close()
