"""A scripted node agent for tests: writes the state keys a real agent writes.

Shared by every test suite that needs hosts the ml2 driver will bind to, without running a
real agent.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from podwire import keys
from podwire.etcd.client import EtcdClient, Lease
from podwire.schema import nodes as values
from podwire.schema.ports import parse_desired_port
from tests.etcd_tools import delete_prefix

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 30.0
) -> T:
    """Poll until ``probe`` returns something truthy (the system is asynchronous by design)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last={last!r}")


class ScriptedAgent:
    """Plays a node agent: heartbeat with a lease, physnets, VTEP, capabilities, port states."""

    def __init__(self, etcd: EtcdClient, host: str) -> None:
        self.etcd = etcd
        self.host = host
        self.lease: Lease | None = None

    async def register(
        self,
        physnets: dict[str, str] | None = None,
        vtep: str | None = "192.0.2.10",
        capabilities: tuple[list[str], list[str]] | None = None,
        ttl: int = 60,
        alive: bool = True,
    ) -> None:
        for name, interface in (physnets or {}).items():
            await self.etcd.put(
                keys.state_physnet(self.host, name), values.physnet_value(interface)
            )
        if vtep:
            await self.etcd.put(keys.state_vtep(self.host), values.vtep_value(vtep))
        if capabilities:
            raw = values.capabilities_value(*capabilities)
            await self.etcd.put(keys.state_capabilities(self.host), raw)
        if alive:
            self.lease = await self.etcd.grant_lease(ttl)
            raw = values.alive_value(time.time(), "test")
            await self.etcd.put(keys.state_alive(self.host), raw, lease=self.lease.id)

    async def die(self) -> None:
        """What an expired heartbeat lease looks like to the server."""
        if self.lease is not None:
            await self.lease.revoke()
            self.lease = None

    async def wire(self, port_id: str) -> None:
        await self.etcd.put(
            keys.state_port(self.host, port_id), values.port_state_value(time.time())
        )

    async def unwire(self, port_id: str) -> None:
        await self.etcd.delete(keys.state_port(self.host, port_id))

    async def desired(self, port_id: str) -> dict[str, Any] | None:
        kv = await self.etcd.get(keys.node_port(self.host, port_id))
        return None if kv is None else parse_desired_port(kv.value, port_id).to_dict()

    async def cleanup(self) -> None:
        await self.die()
        await delete_prefix(self.etcd, keys.state_node_prefix(self.host))
        await delete_prefix(self.etcd, keys.node_ports_prefix(self.host))


@pytest.fixture
async def agents(etcd: EtcdClient) -> AsyncIterator[Callable[[], ScriptedAgent]]:
    """A factory of agents on fresh host names, cleaned up afterwards."""
    made: list[ScriptedAgent] = []

    def make() -> ScriptedAgent:
        agent = ScriptedAgent(etcd, f"h-{uuid.uuid4().hex[:10]}")
        made.append(agent)
        return agent

    yield make
    for agent in made:
        await agent.cleanup()


async def bound_on(neutron: Any, network: Any, project_id: str, host: str, **body: Any) -> Any:
    """Create a port on ``host``; retry the binding while the workers' caches catch up."""
    port = neutron.network.create_port(
        network_id=network.id,
        project_id=project_id,
        device_owner=body.pop("device_owner", "compute:podwire"),
        binding_host_id=host,
        **body,
    )

    async def bound() -> Any:
        current = neutron.network.get_port(port.id)
        if current.binding_vif_type == "binding_failed":
            neutron.network.update_port(port.id, binding_host_id="")
            neutron.network.update_port(port.id, binding_host_id=host)
            return None
        return current

    return await eventually(bound, f"port bound on {host}")
