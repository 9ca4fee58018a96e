"""Scale: pod churn on several nodes (adaptive pools next to fixed ``min = 5``), 50 nodes, the
controller's HTTP API, and an etcd leader loss (issue #15).

Nodes are real agents with ``agent.dataplane = "none"`` (bench/fleet.py: heartbeat, the binder's
wired reports, peers; no kernel work). A pod is a VIF request through the controller's HTTP API
as the agent's CNI handler makes it, waiting until its node's binder has the port wired, living
``POD_SECONDS``, then released. ``samples`` is the number of pod cycles per mode. After each
mode the pools are freed and what is left is counted: in-use keys in etcd and the nodes' ports in
Neutron (both must be 0). The leader-loss leg starts a stack of its own (3 etcd members).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.fleet import ADMIN, Fleet
from bench.harness import bind_to_active, delete_project, project_network
from bench.stats import render, row
from podwire import keys
from podwire.agent.vifs.controller_vifs import ControllerVifSource
from podwire.config import PoolSettings
from podwire.errors import PodwireError
from podwire.neutron.client import neutron_connection
from podwire.schema.vif import VifRequest
from podwire.stack.client import start_background, stop_background

NODES = 4
RATE = 20.0  # pod ADDs per second across all nodes
POD_SECONDS = 0.5
WARM = 5  # ports per node before the churn, the same for both modes
MANY = 50
BIND_SAMPLES = 30
HTTP_PORTS = 200  # concurrent requests per round
CLUSTER_ARGS = ("--etcd-members", "3", "--workers", "1")


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    legs: list[Callable[[], list[dict[str, Any]]]] = [
        partial(asyncio.run, _churn_rows(stack, samples)),
        partial(asyncio.run, _many_rows(stack)),
        _leader_loss_rows,
    ]
    for leg in legs:
        done = leg()
        print(render(done), file=sys.stderr, flush=True)  # kept if a later leg fails
        rows += done
    return rows


class Network:
    def __init__(self, stack: dict[str, Any], cidr: str) -> None:
        self.conn = neutron_connection(stack["neutron"])
        self.project = uuid.uuid4().hex
        self.conn.network.update_quota(self.project, ports=-1)
        self.id = str(project_network(self.conn, self.project, "bench-scale", cidr)[0].id)

    def ports_on(self, hosts: list[str]) -> int:
        return sum(
            1 for p in self.conn.network.ports(network_id=self.id) if p.binding_host_id in hosts
        )

    def delete(self) -> None:
        delete_project(self.conn, self.project)


# --- churn on 4 nodes: adaptive vs fixed -----------------------------------------------------


async def _churn_rows(stack: dict[str, Any], cycles: int) -> list[dict[str, Any]]:
    network = Network(stack, "10.99.0.0/16")
    modes = {
        "adaptive": PoolSettings(min=1, batch=10, update_interval=1.0, idle_ttl=5.0),
        "fixed min=5": PoolSettings(min=5, batch=10, update_interval=1.0, adaptive=False),
    }
    adds: dict[str, list[float]] = {}
    rows = []
    try:
        for mode, pool in modes.items():
            adds[mode], hit_ratio = await _churn(stack, network, pool, cycles, mode)
            rows.append(hit_ratio)
    finally:
        network.delete()
    added = row(
        f"scale: pod ADD, {NODES} nodes, {cycles} cycles at {RATE:g}/s, adaptive pools",
        adds["adaptive"],
        "fixed min=5",
        adds["fixed min=5"],
    )
    return [added, *rows]


async def _churn(
    stack: dict[str, Any], network: Network, pool: PoolSettings, cycles: int, mode: str
) -> tuple[list[float], dict[str, Any]]:
    """The pods' ADD times, and the mode's row: its pool hit ratio, and what went wrong."""
    fleet = await Fleet.open(stack)
    try:
        url = await fleet.start_controller(pool, NODES)
        await fleet.add_agents(NODES, url)
        controller = fleet.controller
        assert controller is not None
        await controller.admin.populate(fleet.hosts, network.id, network.project, (), WARM)
        metrics = controller.metrics
        before = metrics.hits._value.get() + metrics.reuses._value.get()
        misses = metrics.misses._value.get()
        adds, errors = await _pods(fleet, url, network, cycles)
        hits = metrics.hits._value.get() + metrics.reuses._value.get() - before
        requests = hits + metrics.misses._value.get() - misses
        back = await _back_to_min(fleet, pool) if pool.adaptive else "-"
        await controller.service.drain()  # a refill under way would fill a pool after the free
        await controller.admin.free_nodes(fleet.hosts)
        keys_left = sum(
            [len((await fleet.etcd.get_prefix(keys.vifs_prefix(h)))[0]) for h in fleet.hosts]
        )
        ports_left = await asyncio.to_thread(network.ports_on, fleet.hosts)
        name = (
            f"scale: pool hit ratio (%), {mode}; failed ADDs / repeated DELs {len(errors)},"
            f" leaked keys {keys_left}, ports {ports_left}; idle at min after {back} s"
        )
        return adds, row(name, [100.0 * hits / max(requests, 1)], unit="%")
    finally:
        await fleet.close()


async def _pods(
    fleet: Fleet, url: str, network: Network, cycles: int, rate: float = RATE, tag: str = "p"
) -> tuple[list[float], list[str]]:
    sources = [ControllerVifSource(url, h, f"t-{h}") for h in fleet.hosts[:NODES]]
    adds: list[float] = []
    errors: list[str] = []

    async def pod(n: int) -> None:
        i = n % len(sources)
        req = VifRequest(f"{tag}{n}:eth0", network.id, network.project, ())
        started = time.monotonic()
        try:
            vif = await sources[i].request(req, asyncio.get_running_loop().time() + 120)
            binder = fleet.agents[i].parts.binder
            assert binder is not None
            await binder.wait_wired(vif.port_id, 120)
        except PodwireError as exc:  # counted in the table, not fatal to the bench
            errors.append(f"ADD: {exc}")
            await _release(sources[i], req.attachment, None, errors)  # a runtime DELs it
            return
        adds.append((time.monotonic() - started) * 1000)
        await asyncio.sleep(POD_SECONDS)
        await _release(sources[i], req.attachment, vif, errors)

    pods = []
    for n in range(cycles):
        pods.append(asyncio.create_task(pod(n)))
        await asyncio.sleep(1 / rate)
    await asyncio.gather(*pods)
    for source in sources:
        await source.close()
    return adds, errors


async def _release(
    source: ControllerVifSource, attachment: str, vif: Any, errors: list[str]
) -> None:
    """DEL as a runtime sends it: repeated until it succeeds (each failure is counted)."""
    async with asyncio.timeout(60):
        while True:
            try:
                await source.release(attachment, vif)
                return
            except PodwireError as exc:
                errors.append(f"DEL: {exc}")
                await asyncio.sleep(0.2)


async def _back_to_min(fleet: Fleet, pool: PoolSettings) -> str:
    """Seconds from the last pod until every pool is at min again (the TTL plus a pass)."""
    controller = fleet.controller
    assert controller is not None
    service = controller.service
    started = time.monotonic()
    limit = pool.idle_ttl + 30
    while time.monotonic() - started < limit:
        sizes = [service.pool_size(k) for k in service.pool_keys()]
        if not service.pools.recyclable() and all(s <= pool.min for s in sizes):
            return f"{time.monotonic() - started:.1f} (ttl {pool.idle_ttl:g})"
        await asyncio.sleep(0.2)
    return f"not within {limit:.0f}"


# --- 50 nodes: bind -> ACTIVE, warm HTTP requests -------------------------------------------


async def _many_rows(stack: dict[str, Any]) -> list[dict[str, Any]]:
    network = Network(stack, "10.98.0.0/16")
    fleet = await Fleet.open(stack)
    try:
        url = await fleet.start_controller(
            PoolSettings(min=0, batch=20, update_interval=3600.0, adaptive=False), MANY
        )
        await fleet.add_agents(1, url)
        one = await _bind_to_active(network, fleet.hosts[:1])
        await fleet.add_agents(MANY, url)
        many = await _bind_to_active(network, fleet.hosts)
        rates = await _http_warm(fleet, url, network)
    finally:
        await fleet.close()
        network.delete()
    return [
        row(f"scale: bind -> ACTIVE, {MANY} nodes", many, "1 node", one),
        row(f"scale: controller warm requests/s through HTTP, {MANY} nodes", rates, unit="req/s"),
    ]


async def _bind_to_active(network: Network, hosts: list[str]) -> list[float]:
    def once(host: str) -> float:
        port, took = bind_to_active(network.conn, network.id, network.project, host, 60)
        network.conn.network.delete_port(port)
        return took

    return [await asyncio.to_thread(once, hosts[i % len(hosts)]) for i in range(BIND_SAMPLES)]


async def _http_warm(fleet: Fleet, url: str, network: Network) -> list[float]:
    """Requests/s of concurrent warm requests (pool hits) through the HTTP API of one node,
    sent by a process of their own (bench/http_load.py), as agents on other machines would."""
    controller = fleet.controller
    assert controller is not None
    host = fleet.hosts[0]
    await controller.admin.populate([host], network.id, network.project, (), HTTP_PORTS)
    args = [url, host, f"t-{host}", ADMIN, network.id, network.project, str(HTTP_PORTS), "10"]
    load = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.http_load", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await load.communicate()
    if load.returncode != 0:
        raise RuntimeError(f"bench.http_load exited with {load.returncode}")
    return list(json.loads(out)["rates"])


# --- etcd leader loss during pod ADDs ------------------------------------------------------


def _leader_loss_rows() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="pwbc-", dir="/tmp") as tmp:
        proc, stack = start_background(Path(tmp) / "cluster", extra=CLUSTER_ARGS)
        try:
            during, errors = asyncio.run(_leader_loss(stack))
        finally:
            stop_background(proc)
    return [
        row(
            f"scale: pod ADD while the etcd leader is killed (3 members); failed ADDs"
            f" {sum(e.startswith('ADD') for e in errors)}, DELs repeated"
            f" {sum(e.startswith('DEL') for e in errors)}",
            during,
        )
    ]


async def _leader_loss(stack: dict[str, Any]) -> tuple[list[float], list[str]]:
    network = Network(stack, "10.97.0.0/16")
    # A call a dead leader would have answered fails after etcd.timeout and goes to another
    # member; 1 s keeps an ADD that meets the loss within the 2 s target.
    fleet = await Fleet.open(stack, etcd_timeout=1.0)
    try:
        url = await fleet.start_controller(
            PoolSettings(min=5, batch=10, update_interval=1.0, idle_ttl=60.0), 2
        )
        await fleet.add_agents(2, url)
        assert fleet.controller is not None
        await fleet.controller.admin.populate(fleet.hosts, network.id, network.project, (), 10)
        killer = asyncio.create_task(_kill_leader(stack, after=2.0))
        adds, errors = await _pods(fleet, url, network, 80, rate=10.0, tag="l")
        await killer
        return adds, errors
    finally:
        await fleet.close()
        network.delete()


async def _kill_leader(stack: dict[str, Any], after: float) -> None:
    await asyncio.sleep(after)
    os.kill(await asyncio.to_thread(_leader_pid, stack), signal.SIGKILL)


def _leader_pid(stack: dict[str, Any]) -> int:
    for i, url in enumerate(stack["etcd_endpoints"]):
        request = urllib.request.Request(f"{url}/v3/maintenance/status", data=b"{}")
        with urllib.request.urlopen(request, timeout=2) as response:
            status = json.loads(response.read())
        if status["leader"] == status["header"]["member_id"]:
            return int(stack["pids"][f"etcd-{i + 1}"])
    raise RuntimeError("the etcd cluster has no leader")
