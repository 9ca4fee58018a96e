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
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.agent_proc import PrebuiltVifs
from bench.controllers import controller_settings
from bench.harness import until
from bench.stats import row
from podwire.agent.app import Agent
from podwire.config import AgentSettings, EtcdSettings, Settings
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
            await until(lambda: controller.service.serving, GIVE_UP, 0.01, what="serving")
            await agent.parts.started.wait()
            for _ in range(stalls):
                took = await _one_stall(controller, proc, ready_url)
                controller_ms.append(took[0])
                agent_ms.append(took[1])
            for task in tasks:
                task.cancel()
    finally:
        await client.close()
    return controller_ms, agent_ms


async def _one_stall(
    controller: Controller, proc: subprocess.Popen[bytes], ready_url: str
) -> tuple[float, float]:
    """ms from SIGCONT until the controller serves again, and until the agent is ready."""

    def agent_ready() -> bool:
        return http_ok(ready_url, 0.5)

    await until(agent_ready, GIVE_UP, 0.01, thread=True, what="agent ready before the stall")
    losses = controller.leadership.losses

    def new_term() -> bool:  # the 10 s lease does not survive 20 s: a term won after it
        return bool(controller.service.serving and controller.leadership.losses > losses)

    os.kill(proc.pid, signal.SIGSTOP)
    await asyncio.sleep(STALL)
    os.kill(proc.pid, signal.SIGCONT)
    back = time.monotonic()
    controller_at, agent_at = await asyncio.gather(
        until(new_term, GIVE_UP, 0.01, what="controller serving"),
        until(agent_ready, GIVE_UP, 0.01, thread=True, what="agent ready"),
    )
    return (controller_at - back) * 1000, (agent_at - back) * 1000


def _settings(stack: dict[str, Any], etcd: EtcdSettings, work: Path, host_ns: str) -> Settings:
    agent = AgentSettings(
        host=f"bench-heal-{uuid.uuid4().hex[:6]}",
        cni_socket=str(work / "cni.sock"),
        state_dir=str(work / "state"),
        vtep_ip="192.0.2.1",
        host_netns=host_ns,
        ops_listen=f"127.0.0.1:{free_port()}",
    )
    settings = controller_settings(stack, {"bench-heal": "t"}, etcd=etcd, admin="bench")
    return replace(settings, agent=agent)
