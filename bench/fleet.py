"""Simulated nodes for the scale bench: real agents with ``agent.dataplane = "none"``, and a
controller, in this process against one stack."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.controllers import controller_settings
from bench.harness import forget_nodes
from podwire.agent.app import Agent
from podwire.config import AgentSettings, EtcdSettings, PoolSettings, Settings
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect

ADMIN = "bench-admin"


@dataclass
class Fleet:
    """Agents (hosts ``bs-<id>-<n>``) and at most one controller; ``close()`` removes all."""

    stack: dict[str, Any]
    etcd: EtcdClient
    hosts: list[str] = field(default_factory=list)
    agents: list[Agent] = field(default_factory=list)
    controller: Controller | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pwscale-")))
    prefix: str = field(default_factory=lambda: f"bs-{uuid.uuid4().hex[:6]}")
    etcd_timeout: float = 5.0

    @classmethod
    async def open(cls, stack: dict[str, Any], etcd_timeout: float = 5.0) -> Fleet:
        etcd = await EtcdClient.connect(etcd_settings(stack, etcd_timeout))
        return cls(stack, etcd, etcd_timeout=etcd_timeout)

    def names(self, count: int) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(count)]

    async def start_controller(self, pool: PoolSettings, nodes: int) -> str:
        tokens = {h: f"t-{h}" for h in self.names(nodes)}
        etcd = etcd_settings(self.stack, self.etcd_timeout)
        settings = controller_settings(self.stack, tokens, pool, etcd, ADMIN)
        self.controller = Controller(settings, self.etcd, connect(settings.neutron))
        self.tasks.append(asyncio.create_task(self.controller.run()))
        async with asyncio.timeout(120):
            while not (await self.controller.ready())[0]:  # noqa: ASYNC110 (a query)
                await asyncio.sleep(0.05)
        return f"http://127.0.0.1:{self.controller.port}"

    async def add_agents(self, count: int, url: str = "http://127.0.0.1:1") -> None:
        """Start agents up to ``count`` in all (their VTEPs distinct: peers must accept them)."""
        for i in range(len(self.agents), count):
            host = self.names(count)[i]
            agent = Agent(
                Settings(
                    etcd=etcd_settings(self.stack, self.etcd_timeout),
                    agent=AgentSettings(
                        host=host,
                        token=f"t-{host}",
                        controller_url=url,
                        state_dir=str(self.tmp / host),
                        vtep_ip=f"10.200.{i // 250}.{i % 250 + 1}",
                        dataplane="none",
                    ),
                )
            )
            self.hosts.append(host)
            self.agents.append(agent)
            self.tasks.append(asyncio.create_task(agent.run()))
            await asyncio.wait_for(agent.parts.started.wait(), 60)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await forget_nodes(self.etcd, *self.hosts)
        await self.etcd.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def etcd_settings(stack: dict[str, Any], timeout: float = 5.0) -> EtcdSettings:
    endpoints = list(stack.get("etcd_endpoints") or [stack["etcd"]])
    return EtcdSettings(endpoints=endpoints, timeout=timeout)
