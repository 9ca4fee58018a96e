"""The real Neutron of the local stack, driven with openstacksdk as podwire will drive it."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import neutron_connection
from tests.scripted_agent import ScriptedAgent, bound_on


def make_network(neutron: Any, project_id: str) -> tuple[Any, Any]:
    network = neutron.network.create_network(name="smoke", project_id=project_id)
    subnet = neutron.network.create_subnet(
        network_id=network.id, cidr="10.20.0.0/24", ip_version=4, project_id=project_id
    )
    return network, subnet


def test_network_is_vxlan_with_real_mtu(neutron: Any, project_id: str) -> None:
    network, subnet = make_network(neutron, project_id)
    assert network.provider_network_type == "vxlan"
    assert network.mtu == 1450
    assert subnet.gateway_ip == "10.20.0.1"


async def test_bulk_ports_filters_update_delete(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent]
) -> None:
    network, _ = make_network(neutron, project_id)
    host1, host2 = agents(), agents()
    for agent in (host1, host2):
        await agent.register()
    await bound_on(neutron, network, project_id, host1.host)  # the API workers know the hosts
    bodies = [
        {
            "network_id": network.id,
            "project_id": project_id,
            "device_owner": "compute:podwire",
            "binding_host_id": host1.host if index < 3 else host2.host,
        }
        for index in range(5)
    ]
    created = list(neutron.network.create_ports(bodies))
    assert len(created) == 5
    on_host1 = list(
        neutron.network.ports(
            project_id=project_id,
            device_owner="compute:podwire",
            **{"binding:host_id": host1.host},
        )
    )
    assert len(on_host1) == 4
    assert {port.binding_vif_type for port in on_host1} == {"veth"}

    neutron.network.set_tags(created[0], ["pool", "podwire"])
    tagged = list(neutron.network.ports(project_id=project_id, tags="pool"))
    assert [port.id for port in tagged] == [created[0].id]

    updated = neutron.network.update_port(created[1], device_id="pod-1", name="renamed")
    assert (updated.device_id, updated.name) == ("pod-1", "renamed")

    neutron.network.delete_port(created[2])
    remaining = {port.id for port in neutron.network.ports(project_id=project_id)}
    assert created[2].id not in remaining and created[1].id in remaining


async def test_pod_ports_bind_as_veth_and_infrastructure_as_tap(
    neutron: Any, project_id: str, agents: Callable[[], ScriptedAgent]
) -> None:
    network, _ = make_network(neutron, project_id)
    host = agents()
    await host.register()
    pod = await bound_on(neutron, network, project_id, host.host)
    assert pod.binding_vif_type == "veth"
    dhcp = await bound_on(neutron, network, project_id, host.host, device_owner="network:dhcp")
    assert dhcp.binding_vif_type == "tap"


def test_trunk_with_subports(neutron: Any, project_id: str) -> None:
    network, _ = make_network(neutron, project_id)
    parent, child1, child2 = (
        neutron.network.create_port(network_id=network.id, project_id=project_id) for _ in range(3)
    )
    trunk = neutron.network.create_trunk(
        port_id=parent.id,
        project_id=project_id,
        sub_ports=[{"port_id": child1.id, "segmentation_type": "vlan", "segmentation_id": 101}],
    )
    neutron.network.add_trunk_subports(
        trunk, [{"port_id": child2.id, "segmentation_type": "vlan", "segmentation_id": 102}]
    )
    subports = neutron.network.get_trunk_subports(trunk)["sub_ports"]
    assert sorted((s["port_id"], s["segmentation_id"]) for s in subports) == sorted(
        [(child1.id, 101), (child2.id, 102)]
    )


@pytest.mark.slow
def test_twenty_clients_create_ports_at_once(
    neutron_endpoint: str, neutron: Any, project_id: str
) -> None:
    network, _ = make_network(neutron, project_id)

    def create_three(_: int) -> list[str]:
        client = neutron_connection(neutron_endpoint)
        return [
            client.network.create_port(network_id=network.id, project_id=project_id).id
            for _ in range(3)
        ]

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(create_three, range(20)))
    ids = [port_id for batch in results for port_id in batch]
    assert len(set(ids)) == 60
    listed = {port.id for port in neutron.network.ports(project_id=project_id)}
    assert set(ids) <= listed
