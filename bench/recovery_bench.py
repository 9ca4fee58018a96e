"""Controller recovery: time until a fresh leader could serve, with N bound pool ports.

Two ways of rebuilding the pools are timed on the same ports in the same run: from the ml2
forwarder's mirror in etcd (what a controller does when the forwarder vouches for the mirror)
and from a Neutron listing (the fallback, and the reference). N is 1,000; with
``PODWIRE_BENCH_10K=1`` it is 10,000.

The ports live in a fixed layout (project, networks of 500 ports, ten nodes) that is completed
when short and never deleted, so ``bench.run --stack-dir DIR`` pays for creating them once:
Neutron here creates about 8 bound ports a second, so 10,000 take ~20 minutes the first time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import time
from typing import Any

from bench.controllers import controller_settings, register_node
from bench.harness import project_network, stack_etcd
from bench.stats import row
from podwire import keys
from podwire.controller.app import Controller
from podwire.controller.mirror import forwarder_doubt
from podwire.controller.recovery import recover
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect, neutron_connection
from podwire.schema.vif import DEVICE_OWNER

PROJECT = "podwire-bench-recovery"
PER_NETWORK = 500
NODES = [f"pw-bench-rec-node-{i}" for i in range(10)]
SAMPLES = 3


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    size = 10_000 if os.environ.get("PODWIRE_BENCH_10K") else 1_000
    return asyncio.run(_run(stack, size))


async def _run(stack: dict[str, Any], size: int) -> list[dict[str, Any]]:
    etcd = await stack_etcd(stack)
    try:
        for node in NODES:  # alive, so Neutron binds the ports created for them
            await register_node(etcd, node, "baremetal")
        await asyncio.to_thread(_ensure_ports, stack, size)
        await _wait_for_drained_journal(etcd)
        listing = [await _recover(stack, etcd, use_mirror=False) for _ in range(SAMPLES)]
        mirror = [await _recover(stack, etcd, use_mirror=True) for _ in range(SAMPLES)]
    finally:
        await etcd.close()
    pooled = {count for _, count in listing + mirror}
    if len(pooled) != 1:
        raise RuntimeError(f"the two recoveries disagree on the pool size: {sorted(pooled)}")
    return [
        row(
            f"controller: ready after recovering {pooled.pop()} pool ports (etcd mirror)",
            [ms for ms, _ in mirror],
            "same ports from a Neutron listing",
            [ms for ms, _ in listing],
        )
    ]


def _ensure_ports(stack: dict[str, Any], size: int) -> None:
    conn = neutron_connection(stack["neutron"])
    conn.network.update_quota(PROJECT, ports=-1)
    networks = {n.name: n for n in conn.network.networks(project_id=PROJECT)}
    wanted = []
    for i in range(size // PER_NETWORK):
        name = f"pw-bench-rec-{i}"
        if name not in networks:
            networks[name], _ = project_network(conn, PROJECT, name, f"10.{100 + i}.0.0/21")
        wanted.append((i, networks[name]))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda item: _fill_network(stack, *item), wanted))


def _fill_network(stack: dict[str, Any], index: int, network: Any) -> None:
    conn = neutron_connection(stack["neutron"])
    have = len(list(conn.network.ports(network_id=network.id, fields="id")))
    while have < PER_NETWORK:
        count = min(100, PER_NETWORK - have)
        node = NODES[(index + have // 100) % len(NODES)]
        body = {
            "network_id": network.id,
            "project_id": PROJECT,
            "device_owner": DEVICE_OWNER,
            "binding_host_id": node,
        }
        list(conn.network.create_ports([dict(body) for _ in range(count)]))
        have += count
        print(f"  recovery bench: {network.name} has {have} ports", file=sys.stderr, flush=True)


async def _wait_for_drained_journal(etcd: EtcdClient) -> None:
    """Until the forwarder vouches for the mirror, by the controller's own test."""
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        status = await etcd.get(keys.status("ml2"))
        if forwarder_doubt(status.value if status else None, time.time()) is None:
            return
        await asyncio.sleep(1.0)
    raise RuntimeError("the ml2 forwarder did not drain its journal")


async def _recover(stack: dict[str, Any], etcd: EtcdClient, use_mirror: bool) -> tuple[float, int]:
    """Milliseconds until a fresh controller could serve, and how many ports it pooled."""
    settings = controller_settings(stack, {})
    fresh = Controller(settings, etcd, connect(settings.neutron))
    fresh.term.begin(1)  # recovery runs in a leader term (its deletes check it)
    started = time.perf_counter()
    report = await recover(fresh.service, fresh.neutron, fresh.nested, etcd if use_mirror else None)
    elapsed = (time.perf_counter() - started) * 1000
    if report.source != ("etcd" if use_mirror else "neutron"):
        raise RuntimeError("the forwarder's mirror was not used: see the controller's log")
    return elapsed, report.pooled
