"""ml2 behaviours at the edges: trunks, compaction under feedback, deletes racing binds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from podwire.etcd.client import EtcdClient
from podwire.ml2.journal import SqlJournal
from tests.etcd_tools import compact
from tests.ml2.conftest import status_is
from tests.ml2.test_stack_binding import vxlan_network
from tests.scripted_agent import ScriptedAgent, bound_on, eventually

pytestmark = pytest.mark.stack


async def test_trunk_subports_follow_the_parent_with_their_vlan(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent]
) -> None:
    node = agents()
    await node.register()
    network, _ = vxlan_network(neutron, project_id, "10.41.0.0/24")
    parent = await bound_on(neutron, network, project_id, node.host, device_owner="compute:nova")
    child = neutron.network.create_port(network_id=network.id, project_id=project_id)
    trunk = neutron.network.create_trunk(
        port_id=parent.id,
        project_id=project_id,
        sub_ports=[{"port_id": child.id, "segmentation_type": "vlan", "segmentation_id": 123}],
    )

    async def subport_desired() -> dict[str, Any] | None:
        return await node.desired(child.id)

    desired = await eventually(subport_desired, "subport desired on the parent's host")
    assert desired["trunk"] == {
        "parent_port_id": parent.id,
        "segmentation_type": "vlan",
        "segmentation_id": 123,
    }
    assert desired["device_owner"] == "trunk:subport" and desired["vif_type"] == "veth"
    assert neutron.network.get_trunk(trunk.id).status == "ACTIVE"
    await node.wire(child.id)
    await eventually(lambda: status_is(neutron, child.id, "ACTIVE"), "subport ACTIVE")


async def test_detached_subports_are_released_and_foreign_trunks_left_alone(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent]
) -> None:
    node = agents()
    await node.register()
    network, _ = vxlan_network(neutron, project_id, "10.42.0.0/24")
    parent = await bound_on(neutron, network, project_id, node.host, device_owner="compute:nova")
    child = neutron.network.create_port(network_id=network.id, project_id=project_id)
    trunk = neutron.network.create_trunk(
        port_id=parent.id,
        project_id=project_id,
        sub_ports=[{"port_id": child.id, "segmentation_type": "vlan", "segmentation_id": 124}],
    )
    await eventually(lambda: node.desired(child.id), "subport desired on the parent's host")
    neutron.network.delete_trunk_subports(trunk, [{"port_id": child.id}])

    async def released() -> Any:
        port = neutron.network.get_port(child.id)
        gone = await node.desired(child.id) is None
        return gone and port.binding_host_id == "" and port.device_owner == "compute:podwire"

    await eventually(released, "the detached subport unbound and the controller's again")

    # A trunk whose parent podwire did not bind (here: a host it does not serve) is another
    # driver's: its subports are not touched.
    foreign = neutron.network.create_port(
        network_id=network.id, project_id=project_id, device_owner="compute:nova"
    )
    other = neutron.network.create_port(network_id=network.id, project_id=project_id)
    neutron.network.create_trunk(
        port_id=foreign.id,
        project_id=project_id,
        sub_ports=[{"port_id": other.id, "segmentation_type": "vlan", "segmentation_id": 125}],
    )
    neutron.network.update_port(foreign.id, binding_host_id=f"{node.host}-not-podwire")
    assert neutron.network.get_port(foreign.id).binding_vif_type == "binding_failed"
    await asyncio.sleep(1.0)  # the driver's handlers ran in the update call; nothing follows
    untouched = neutron.network.get_port(other.id)
    assert untouched.binding_host_id == "" and untouched.device_owner == ""
    neutron.network.update_port(foreign.id, binding_host_id="")  # so the trunk can go


def test_vlan_transparent_networks_are_refused(neutron: Any, project_id: str) -> None:
    with pytest.raises(Exception, match=r"(?i)vlan transparen"):
        neutron.network.create_network(
            name="pw-transparent", project_id=project_id, is_vlan_transparent=True
        )


async def test_compaction_while_feedback_is_behind(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent], etcd: EtcdClient
) -> None:
    """State written and compacted in a burst still ends with every port ACTIVE."""
    node = agents()
    await node.register()
    network, _ = vxlan_network(neutron, project_id, "10.42.0.0/24")
    await bound_on(neutron, network, project_id, node.host)
    body = {
        "network_id": network.id,
        "project_id": project_id,
        "device_owner": "compute:podwire",
        "binding_host_id": node.host,
    }
    ports = list(neutron.network.create_ports([body] * 6))
    for port in ports:
        await eventually(lambda port=port: node.desired(port.id), "desired key")
    for port in ports:
        await node.wire(port.id)
        await node.unwire(port.id)
        await node.wire(port.id)
        await compact(etcd, await etcd.status())
    for port in ports:
        await eventually(lambda port=port: status_is(neutron, port.id, "ACTIVE"), "ACTIVE")


async def test_port_deleted_while_its_bind_is_in_flight(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent], journal: SqlJournal
) -> None:
    """Whichever of bind and delete wins, no desired key is left behind for a gone port."""
    node = agents()
    await node.register()
    network, _ = vxlan_network(neutron, project_id, "10.43.0.0/24")
    await bound_on(neutron, network, project_id, node.host)
    ports = list(
        neutron.network.create_ports([{"network_id": network.id, "project_id": project_id}] * 5)
    )

    def bind(port_id: str) -> None:
        try:
            neutron.network.update_port(port_id, binding_host_id=node.host)
        except Exception as exc:
            if "404" not in str(exc) and "not be found" not in str(exc):
                raise

    def delete(port_id: str) -> None:
        neutron.network.delete_port(port_id)

    await asyncio.gather(
        *(asyncio.to_thread(bind, port.id) for port in ports),
        *(asyncio.to_thread(delete, port.id) for port in ports),
    )
    assert not {p.id for p in neutron.network.ports(project_id=project_id)} & {p.id for p in ports}

    async def drained() -> bool:
        return await asyncio.to_thread(journal.count) == 0

    await eventually(drained, "the forwarder drained every row of the race")

    async def no_keys_left() -> bool:
        found = [await node.desired(port.id) for port in ports]
        return all(value is None for value in found)

    await eventually(no_keys_left, "no desired key for deleted ports")
