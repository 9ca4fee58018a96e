"""Healing bench: etcd frozen (SIGSTOP) for 20 s, then how long until everything serves again.

The etcd is a private one (freezing the stack's would stall the other sections); the controller
and an agent (on a host namespace of its own, no ports) run in-process with the production
TTLs: the controller's 10 s election lease is lost in every stall and re-campaigned, the agent's
30 s heartbeat survives it. Each sample is "SIGCONT -> the controller serves again (recovered,
leader)" and "SIGCONT -> the agent's /readyz answers 200". The issue's target: within 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.agent_proc import PrebuiltVifs
from bench.stats import row
from podwire.agent.app import Agent
from podwire.config import (
    AgentSettings,
    ControllerSettings,
    EtcdSettings,
    NeutronSettings,
    Settings,
)
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect
from podwire.stack import procs
from podwire.stack.etcd_server import EtcdServer
from podwire.stack.netutil import free_port, http_ok, wait_until

STALL = 20.0
GIVE_UP = 120.0


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    stalls = max(2, min(samples // 40, 5))
    with tempfile.TemporaryDirectory(prefix="pwb-heal-", dir="/tmp") as tmp:
        work = Path(tmp)
        server = EtcdServer(work / "etcd", free_port(), free_port())
        proc = procs.spawn(server.argv(), work / "etcd.log")
        host_ns = f"pwb-heal-{uuid.uuid4().hex[:6]}"
        try:
            wait_until(server.ready, "etcd", 30, alive=lambda: proc.poll() is None)
            subprocess.run(["ip", "netns", "add", host_ns], check=True)
            controller_s, agent_s = asyncio.run(_run(stack, server, proc, work, host_ns, stalls))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            procs.stop_child(proc)
            subprocess.run(["ip", "netns", "del", host_ns], check=False, capture_output=True)
    return [
        row(f"etcd back after a {STALL:.0f} s stall -> controller serving", controller_s),
        row(f"etcd back after a {STALL:.0f} s stall -> agent ready", agent_s),
    ]


async def _run(
    stack: dict[str, Any],
    server: EtcdServer,
    proc: subprocess.Popen[bytes],
    work: Path,
    host_ns: str,
    stalls: int,
) -> tuple[list[float], list[float]]:
    etcd = EtcdSettings(endpoints=[server.client_url])
    settings = _settings(stack, etcd, work, host_ns)
    client = await EtcdClient.connect(etcd)
    controller = Controller(settings, client, connect(settings.neutron))
    agent = Agent(settings, PrebuiltVifs([]))
    ready_url = f"http://{settings.agent.ops_listen}/readyz"
    controller_ms: list[float] = []
    agent_ms: list[float] = []
    try:
        async with asyncio.TaskGroup() as group:  # a component that fails ends the bench
            tasks = [group.create_task(controller.run()), group.create_task(agent.run())]
            await _until(lambda: _serving(controller), "controller serving")
            await agent.parts.started.wait()
            for _ in range(stalls):
                took = await _one_stall(controller, proc, ready_url)
                controller_ms.append(took[0] * 1000)
                agent_ms.append(took[1] * 1000)
            for task in tasks:
                task.cancel()
    finally:
        await client.close()
    return controller_ms, agent_ms


async def _one_stall(
    controller: Controller, proc: subprocess.Popen[bytes], ready_url: str
) -> tuple[float, float]:
    await _until(lambda: _agent_ready(ready_url), "agent ready before the stall")
    losses = controller.leadership.losses
    os.kill(proc.pid, signal.SIGSTOP)
    await asyncio.sleep(STALL)
    os.kill(proc.pid, signal.SIGCONT)
    back = time.monotonic()
    controller_s, agent_s = await asyncio.gather(
        _until(lambda: _new_term(controller, losses), "controller serving", back),
        _until(lambda: _agent_ready(ready_url), "agent ready", back),
    )
    return controller_s, agent_s


def _settings(stack: dict[str, Any], etcd: EtcdSettings, work: Path, host_ns: str) -> Settings:
    return Settings(
        etcd=etcd,
        neutron=NeutronSettings(endpoint=stack["neutron"]),
        controller=ControllerSettings(
            listen="127.0.0.1:0", admin_token="bench", node_tokens={"bench-heal": "t"}
        ),
        agent=AgentSettings(
            host=f"bench-heal-{uuid.uuid4().hex[:6]}",
            cni_socket=str(work / "cni.sock"),
            state_dir=str(work / "state"),
            vtep_ip="192.0.2.1",
            host_netns=host_ns,
            ops_listen=f"127.0.0.1:{free_port()}",
        ),
    )


async def _serving(controller: Controller) -> bool:
    return bool(controller.service.serving)


async def _new_term(controller: Controller, losses: int) -> bool:
    """Serving in a term won after the stall (the 10 s lease does not survive 20 s)."""
    return bool(controller.service.serving and controller.leadership.losses > losses)


async def _agent_ready(url: str) -> bool:
    return await asyncio.to_thread(http_ok, url, 0.5)


async def _until(
    check: Callable[[], Awaitable[bool]], what: str, since: float | None = None
) -> float:
    start = time.monotonic() if since is None else since
    while not await check():
        if time.monotonic() - start > GIVE_UP:
            raise RuntimeError(f"heal bench: {what} not reached within {GIVE_UP:.0f} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start
