"""Stand-in for the ml2 forwarder: desired-port keys written straight into etcd.

The real forwarder publishes ``/podwire/nodes/<host>/ports/<id>`` from Neutron's journal.
Until it is wired into the test stack, ``FakeForwarder`` mirrors bound Neutron ports into the
same keys (layout fixed in DESIGN §2). Switching to the real forwarder is swapping the
``forwarder`` fixture in conftest.py for one that starts it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from podwire import keys
from podwire.etcd import EtcdClient


def desired_value(
    port_id: str,
    network_id: str,
    mac: str,
    fixed_ips: list[dict[str, Any]],
    network_type: str = "vxlan",
    segmentation_id: int | None = 1000,
    physnet: str | None = None,
    mtu: int = 1450,
) -> bytes:
    body = {
        "v": 1,
        "port_id": port_id,
        "network_id": network_id,
        "mac_address": mac,
        "mtu": mtu,
        "network_type": network_type,
        "physnet": physnet,
        "segmentation_id": segmentation_id,
        "vif_type": "veth",
        "vif_details": {},
        "fixed_ips": fixed_ips,
        "security_groups": [],
        "device_owner": "compute:podwire",
        "device_id": "",
        "trunk": None,
    }
    return json.dumps(body).encode()


def value_from_neutron(conn: Any, port: Any) -> bytes:
    network = conn.network.get_network(port.network_id)
    subnets = {s.id: s for s in conn.network.subnets(network_id=port.network_id)}
    fixed = [
        {
            "ip_address": ip["ip_address"],
            "subnet_id": ip["subnet_id"],
            "cidr": subnets[ip["subnet_id"]].cidr,
            "gateway_ip": subnets[ip["subnet_id"]].gateway_ip,
        }
        for ip in port.fixed_ips
    ]
    return desired_value(
        port.id,
        port.network_id,
        port.mac_address,
        fixed,
        network.provider_network_type,
        network.provider_segmentation_id,
        network.provider_physical_network,
        network.mtu,
    )


class FakeForwarder:
    """Polls Neutron for podwire pod ports of one project bound to the given hosts."""

    def __init__(self, conn: Any, etcd: EtcdClient, project_id: str, hosts: list[str]) -> None:
        self._conn = conn
        self._etcd = etcd
        self._project = project_id
        self._hosts = hosts
        self._published: dict[str, str] = {}  # port id -> host

    async def run(self, interval: float = 0.1) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(interval)

    async def sync(self) -> None:
        ports = await asyncio.to_thread(self._list)
        for port_id, (host, port) in ports.items():
            if self._published.get(port_id) != host:
                value = await asyncio.to_thread(value_from_neutron, self._conn, port)
                await self._etcd.put(keys.node_port(host, port_id), value)
                self._published[port_id] = host
        for port_id in [p for p in self._published if p not in ports]:
            await self._etcd.delete(keys.node_port(self._published.pop(port_id), port_id))

    def _list(self) -> dict[str, tuple[str, Any]]:
        found = {}
        for port in self._conn.network.ports(project_id=self._project):
            host = port.binding_host_id
            if host in self._hosts and port.device_owner == "compute:podwire":
                found[port.id] = (host, port)
        return found
