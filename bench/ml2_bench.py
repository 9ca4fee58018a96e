"""ml2: bind-to-ACTIVE latency through Neutron + etcd, and forwarder throughput.

Bind-to-ACTIVE is what a pool refill waits for: port create with a host, the driver binds it,
the journal row commits, the forwarder publishes the desired key, an (instant, scripted) agent
writes the state key, feedback completes the provisioning block and Neutron sets ACTIVE.
Forwarder throughput is compared with the fastest possible writer: a loop of direct puts.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import bind_to_active, delete_project, forget_nodes, project_network, running
from bench.stats import row
from podwire import keys
from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher
from podwire.ml2.forwarder import Forwarder, ForwarderSettings
from podwire.ml2.journal import SqlJournal
from podwire.neutron.client import neutron_connection
from podwire.schema import nodes as values
from podwire.stack.mariadb import MariaDB
from tests.etcd_tools import delete_prefix
from tests.ml2.journal_copy import copy_table, drop_table

FORWARDER_ROWS = 1000
FORWARDER_ROUNDS = 5


async def _instant_agent(url: str, host: str, ready: threading.Event, stop: asyncio.Event) -> None:
    """Registers ``host`` and marks every desired port wired as soon as it appears."""
    async with await EtcdClient.connect(EtcdSettings(endpoints=[url])) as client:
        lease = await client.grant_lease(600)
        await client.put(keys.state_vtep(host), values.vtep_value("192.0.2.50"))
        await client.put(keys.state_alive(host), values.alive_value(time.time(), "bench"), lease.id)
        ready.set()
        batches = PrefixWatcher(client, keys.node_ports_prefix(host)).batches()
        try:
            while not stop.is_set():
                batch = await batches.__anext__()
                for event in batch.events:
                    if event.kind == "put":
                        port_id = event.key.rsplit("/", 1)[1]
                        raw = values.port_state_value(time.time())
                        await client.put(keys.state_port(host, port_id), raw)
        finally:
            await lease.revoke()
            await forget_nodes(client, host)


def _bind_to_active(stack: dict[str, Any], samples: int) -> list[float]:
    host = f"bench-{uuid.uuid4().hex[:8]}"
    project = uuid.uuid4().hex
    neutron = neutron_connection(stack["neutron"])
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    agent = threading.Thread(
        target=loop.run_until_complete,
        args=(_instant_agent(stack["etcd"], host, ready, stop),),
        daemon=True,
    )
    agent.start()
    ready.wait(30)
    time.sleep(0.5)  # the API workers' caches see the host
    network, _ = project_network(neutron, project, "bench-ml2", "10.77.0.0/16")
    try:
        return [bind_to_active(neutron, network.id, project, host, 30)[1] for _ in range(samples)]
    finally:
        loop.call_soon_threadsafe(stop.set)
        delete_project(neutron, project)


async def _throughput(stack: dict[str, Any]) -> tuple[list[float], list[float]]:
    url = MariaDB(Path(stack["data_dir"])).url
    forwarded: list[float] = []
    direct: list[float] = []
    async with await EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]])) as client:
        for _ in range(FORWARDER_ROUNDS):
            prefix = f"/podwire-bench/{uuid.uuid4().hex}/"
            table = copy_table(f"pwb_{uuid.uuid4().hex[:12]}")
            journal = SqlJournal(url, table)
            journal.create_table()
            try:
                for index in range(FORWARDER_ROWS):
                    journal.append(f"{prefix}f/{index}", '{"v":1}')
                settings = ForwarderSettings(
                    identity="bench", election_key=prefix + "election", kick_key=prefix + "kick",
                    lease_ttl=5, poll_interval=0.05,
                )  # fmt: skip
                forwarder = Forwarder(client, journal, settings)
                started = time.perf_counter()
                async with running(forwarder.run()):
                    while forwarder.sent_rows < FORWARDER_ROWS:  # noqa: ASYNC110  (sampling)
                        await asyncio.sleep(0.002)
                    forwarded.append((time.perf_counter() - started) * 1000 / FORWARDER_ROWS)
                started = time.perf_counter()
                for index in range(FORWARDER_ROWS):
                    await client.put(f"{prefix}d/{index}", b'{"v":1}')
                direct.append((time.perf_counter() - started) * 1000 / FORWARDER_ROWS)
            finally:
                journal.close()
                drop_table(url, table)
                await delete_prefix(client, prefix)
    return forwarded, direct


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    latencies = _bind_to_active(stack, max(samples, 200))
    forwarded, direct = asyncio.run(_throughput(stack))
    return [
        row("ml2 bind (port update with host) -> ACTIVE, instant agent", latencies),
        row(
            f"ml2 forwarder, {FORWARDER_ROWS} journal rows -> etcd",
            forwarded,
            "direct etcd put loop",
            direct,
            unit="ms/row",
        ),
    ]
