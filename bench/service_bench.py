"""ClusterIP Services: the translation in the client pod against reaching the backend directly,
and the cost of one endpoint change among many Services.

Data path (two namespaces on a veth, the client's holding podwire's Services table for one
Service of three backends, as an agent writes it): TCP connection setup (connect until the
backend's first byte) to the ClusterIP and to a backend's own address, alternated in one
client process; iperf3 throughput through the ClusterIP and direct, alternated.

Control path from the API (``service_api.py``): the same Services made in the stack's
kube-apiserver, the controller with ``[kubernetes]`` in this process publishing them; from an
EndpointSlice patched until every pod's table holds the change.

Control path (the stack's real etcd, the agent's ``PodServices`` in this process, ``PODS`` pod
namespaces): ``SERVICES`` Services of 10 endpoints each are published and written into every
pod, then one endpoint of one Service is replaced: from the etcd put until every pod's table
holds the change (``PodServices.holds``, set once nftables has taken it). The same with a
tenth of the Services shows that a change's cost does not grow with the number of Services.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench import service_api as api_path
from bench.harness import iperf, iperf_server, running, stack_etcd, until
from bench.stats import row
from podwire import keys
from podwire.agent.services import table
from podwire.agent.services.pods import PodServices
from podwire.etcd import EtcdClient
from podwire.netfilter import Nftables
from podwire.schema.checkpoints import Attachment
from podwire.schema.services import Backend, ServiceEntry, ServicePort, read_service_entry
from tests.agent.netenv import in_ns, sh
from tests.agent.service_tables import holds
from tests.etcd_tools import delete_prefix

CLUSTER_IP = "10.96.88.8"
BACKENDS = ("10.202.0.2", "10.202.0.3", "10.202.0.4")
NETWORK = api_path.NETWORK
SERVICES = 1000
ENDPOINTS = 10
PODS = 10
CHANGES_MAX = 100
SERVER = """
import socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8080)); srv.listen(256)
print("ready", flush=True)
while True:
    conn, _ = srv.accept(); conn.sendall(b"x"); conn.close()
"""
CLIENT = """
import json, socket, sys, time
samples = int(sys.argv[1]); targets = sys.argv[2:]
out = {t: [] for t in targets}
for _ in range(samples):
    for target in targets:
        address, port = target.split(":")
        s = socket.socket()
        started = time.perf_counter()
        s.connect((address, int(port))); s.recv(1)
        out[target].append((time.perf_counter() - started) * 1000)
        s.close()
print(json.dumps(out))
"""


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    rows = []
    with _pair() as (client, server):
        rows += _setup_rows(client, server, max(50, samples))
        rows += _throughput_rows(client, server, max(3, min(samples // 50, 6)))
    changes = max(20, min(samples, CHANGES_MAX))
    rows += asyncio.run(_control(stack, changes))
    rows += asyncio.run(api_path.run(stack, SERVICES, ENDPOINTS, PODS, changes))
    return rows


@contextmanager
def _pair() -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:6]
    client, server = f"pwb-svc-c-{tag}", f"pwb-svc-s-{tag}"
    for ns in (client, server):
        sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", f"pwbs{tag}", "netns", client, "type", "veth", "peer", "name",
           f"pwbp{tag}", "netns", server)  # fmt: skip
        in_ns(client, "ip", "addr", "add", "10.202.0.1/24", "dev", f"pwbs{tag}")
        for ns, dev in ((client, f"pwbs{tag}"), (server, f"pwbp{tag}")):
            in_ns(ns, "ip", "link", "set", dev, "up")
            in_ns(ns, "ip", "link", "set", "lo", "up")
        in_ns(client, "ip", "route", "add", "default", "via", BACKENDS[0])
        for address in BACKENDS:
            in_ns(server, "ip", "addr", "add", f"{address}/24", "dev", f"pwbp{tag}")
        ports = (
            ServicePort("tcp", 80, tuple(Backend(a, 8080, NETWORK) for a in BACKENDS)),
            ServicePort("tcp", 5201, tuple(Backend(a, 5201, NETWORK) for a in BACKENDS)),
        )
        entry = ServiceEntry("bench/web", (CLUSTER_IP,), False, ports)
        asyncio.run(_apply(client, table.whole({"bench/web": table.for_network(entry, NETWORK)})))
        yield client, server
    finally:
        for ns in (client, server):
            sh("ip", "netns", "del", ns, check=False)


async def _apply(netns: str, text: str) -> None:
    nft = Nftables(netns)
    try:
        await nft.apply(text)
    finally:
        nft.close()


def _setup_rows(client: str, server: str, samples: int) -> list[dict[str, Any]]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", server, sys.executable, "-c", SERVER], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        targets = [f"{CLUSTER_IP}:80", f"{BACKENDS[1]}:8080"]
        done = in_ns(client, sys.executable, "-c", CLIENT, str(samples), *targets)
        found = json.loads(done.stdout)
    finally:
        proc.kill()
        proc.wait()
    return [
        row(
            "Service: TCP connection setup to a ClusterIP (3 backends, translated in the pod)",
            found[targets[0]],
            "the backend's own address",
            found[targets[1]],
        )
    ]


def _throughput_rows(client: str, server: str, rounds: int) -> list[dict[str, Any]]:
    through, direct = [], []
    with iperf_server(server):
        for _ in range(rounds):
            through.append(iperf(client, CLUSTER_IP))
            direct.append(iperf(client, BACKENDS[1]))
    # Higher is better here: the ratio is Service / direct, so below 1 is a loss.
    return [
        row(
            "Service: TCP throughput through a ClusterIP (Gbit/s, higher is better)",
            through,
            "the backend's own address",
            direct,
            unit="Gbit/s",
        )
    ]


async def _control(stack: dict[str, Any], changes: int) -> list[dict[str, Any]]:
    root = await stack_etcd(stack)
    etcd = root.within(f"/pwb-svc-{uuid.uuid4().hex[:8]}")
    try:
        with api_path.pods_attached(PODS) as pods:
            many = await _change_cost(etcd, pods, SERVICES, changes)
            await delete_prefix(etcd, keys.services_prefix())
            few = await _change_cost(etcd, pods, SERVICES // 10, changes)
    finally:
        await delete_prefix(etcd, keys.services_prefix())
        await root.close()
    name = f"Service: one endpoint changed -> in force in {PODS} pods' tables"
    return [
        row(
            f"{name}, {SERVICES} Services x {ENDPOINTS} endpoints",
            many,
            f"the same with {SERVICES // 10} Services",
            few,
        )
    ]


async def _change_cost(
    etcd: EtcdClient, pods: dict[str, Attachment], services: int, changes: int
) -> list[float]:
    follower = PodServices(etcd, lambda: pods)
    entries = {keys.service("bench", f"s{i}"): _entry(i, range(ENDPOINTS)) for i in range(services)}
    for key, entry in entries.items():
        await etcd.put(key, entry.encode())
    async with running(follower.run()):
        written = len(entries)
        await until(
            lambda: all(len(holds(follower, a)) == written for a in pods), 120, api_path.POLL
        )
        took = []
        for change in range(changes):
            index = change % services
            key = keys.service("bench", f"s{index}")
            entry = _entry(index, range(change + 1, change + 1 + ENDPOINTS))
            started = time.perf_counter()
            await etcd.put(key, entry.encode())
            wanted = table.for_network(read_service_entry(entry.encode(), key), NETWORK)
            await until(
                lambda k=key, w=wanted: all(holds(follower, a).get(k) == w for a in pods),
                120,
                api_path.POLL,
            )
            took.append((time.perf_counter() - started) * 1000)
        return took


def _entry(index: int, endpoints: range) -> ServiceEntry:
    backends = tuple(Backend(api_path.endpoint_address(index, n), 8080, NETWORK) for n in endpoints)
    ip = f"10.96.{index // 250}.{1 + index % 250}"
    return ServiceEntry(f"bench/s{index}", (ip,), False, (ServicePort("tcp", 80, backends),))
