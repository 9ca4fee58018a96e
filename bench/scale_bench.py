"""Pod churn across several nodes, adaptive pools next to fixed ``min = 5`` in the same run.

Nodes are real agents with ``agent.dataplane = "none"`` (their etcd and controller side: the
heartbeat, the binder's wired reports, peers; no kernel work), pods are VIF requests through the
controller's HTTP API as the agent's CNI handler makes them, each waiting until its node's binder
has the port wired, living ``POD_SECONDS`` and released. ``samples`` is the number of pod
cycles per mode. After each mode the pools are freed and what is left is counted: in-use keys in
etcd and the nodes' ports in Neutron (both must be 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.stats import row
from podwire import keys
from podwire.agent.controller_vifs import ControllerVifSource
from podwire.agent.service import Agent
from podwire.config import (
    AgentSettings,
    ControllerSettings,
    EtcdSettings,
    NeutronSettings,
    PoolSettings,
    Settings,
)
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect
from podwire.schema.vif import VifRequest
from podwire.stack.client import neutron_connection

NODES = 4
RATE = 20.0  # pod ADDs per second across all nodes
POD_SECONDS = 0.5
ADMIN = "bench-admin"


async def _serving(controller: Controller) -> None:
    async with asyncio.timeout(60):
        while not (await controller.ready())[0]:  # noqa: ASYNC110 (readiness is a query)
            await asyncio.sleep(0.05)


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack, samples))


async def _run(stack: dict[str, Any], cycles: int) -> list[dict[str, Any]]:
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    net = conn.network.create_network(project_id=project, name="bench-scale")
    conn.network.create_subnet(
        network_id=net.id, project_id=project, ip_version=4, cidr="10.99.0.0/16"
    )
    rows: list[dict[str, Any]] = []
    try:
        results = {}
        for mode, pool in (
            ("adaptive", PoolSettings(min=1, batch=10, update_interval=1.0, idle_ttl=5.0)),
            ("fixed min=5", PoolSettings(min=5, batch=10, update_interval=1.0, adaptive=False)),
        ):
            results[mode] = await _mode(stack, net.id, project, replace(pool), cycles)
        ada, fixed = results["adaptive"], results["fixed min=5"]
        rows.append(
            row(
                f"scale: pod ADD, {NODES} nodes at {RATE:g}/s, adaptive pools",
                ada["add_ms"],
                "fixed min=5",
                fixed["add_ms"],
            )
        )
        for mode, result in results.items():
            rows.append(
                row(
                    f"scale: pool hit ratio (%), {mode}; leaked keys {result['leaked_keys']},"
                    f" ports {result['leaked_ports']}",
                    [100.0 * result["hits"] / max(result["requests"], 1)],
                    unit="%",
                )
            )
    finally:
        for port in conn.network.ports(network_id=net.id):
            with contextlib.suppress(Exception):
                conn.network.delete_port(port)
        conn.network.delete_network(net)
    return rows


async def _mode(
    stack: dict[str, Any], network: str, project: str, pool: PoolSettings, cycles: int
) -> dict[str, Any]:
    hosts = [f"bs-{uuid.uuid4().hex[:6]}-{i}" for i in range(NODES)]
    etcd_settings = EtcdSettings(endpoints=list(stack.get("etcd_endpoints", [stack["etcd"]])))
    settings = Settings(
        etcd=etcd_settings,
        neutron=NeutronSettings(endpoint=stack["neutron"]),
        controller=ControllerSettings(
            listen="127.0.0.1:0", admin_token=ADMIN, node_tokens={h: f"t-{h}" for h in hosts}
        ),
        pool=pool,
    )
    etcd = await EtcdClient.connect(etcd_settings)
    controller = Controller(settings, etcd, connect(settings.neutron))
    tasks = [asyncio.create_task(controller.run())]
    tmp = Path(tempfile.mkdtemp(prefix="pwscale-"))
    try:
        await _serving(controller)
        url = f"http://127.0.0.1:{controller.port}"
        agents = []
        for i, host in enumerate(hosts):
            agent = Agent(
                Settings(
                    etcd=etcd_settings,
                    agent=AgentSettings(
                        host=host,
                        token=f"t-{host}",
                        controller_url=url,
                        state_dir=str(tmp / host),
                        vtep_ip=f"10.200.{i // 250}.{i % 250 + 1}",
                        dataplane="none",
                    ),
                )
            )
            agents.append(agent)
            tasks.append(asyncio.create_task(agent.run()))
            await asyncio.wait_for(agent.parts.started.wait(), 30)
        sources = [ControllerVifSource(url, h, f"t-{h}") for h in hosts]
        adds: list[float] = []

        async def pod(n: int) -> None:
            i = n % NODES
            req = VifRequest(f"p{n}:eth0", network, project, ())
            started = time.monotonic()
            vif = await sources[i].request(req, asyncio.get_running_loop().time() + 60)
            binder = agents[i].parts.binder
            assert binder is not None
            await binder.wait_wired(vif.port_id, 60)
            adds.append((time.monotonic() - started) * 1000)
            await asyncio.sleep(POD_SECONDS)
            await sources[i].release(req.attachment, vif)

        pods = []
        for n in range(cycles):
            pods.append(asyncio.create_task(pod(n)))
            await asyncio.sleep(1 / RATE)
        await asyncio.gather(*pods)
        metrics = controller.metrics
        hits = metrics.hits._value.get() + metrics.reuses._value.get()
        requests = hits + metrics.misses._value.get()
        for _ in range(50):  # released ports go back on the recycle interval
            if not controller.service.recyclable():
                break
            await asyncio.sleep(0.2)
        await controller.service.free_nodes(hosts)
        leaked_keys = sum(len((await etcd.get_prefix(keys.vifs_prefix(h)))[0]) for h in hosts)
        conn = neutron_connection(stack["neutron"])
        leaked_ports = sum(
            1 for p in conn.network.ports(network_id=network) if p.binding_host_id in hosts
        )
        for source in sources:
            await source.close()
        return {
            "add_ms": adds,
            "hits": hits,
            "requests": requests,
            "leaked_keys": leaked_keys,
            "leaked_ports": leaked_ports,
        }
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for host in hosts:
            await etcd.delete_prefix(keys.state_node_prefix(host))
        await etcd.close()
