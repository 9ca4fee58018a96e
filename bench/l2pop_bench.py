"""Learning-free VXLAN: a port another node reports wired, until this node forwards to it.

The real agent in its own process on a simulated host, enforcing security groups, with one
VXLAN network; another node is played in etcd (alive, VTEP). Each sample writes that node's
wired-port state for a new port (what its agent writes when it wires one), and measures until
this node has the port's static forwarding entry and its MAC in the set of MACs frames from
other nodes may carry: from then on the port is reachable from here (target p99 <= 200 ms).
Then the state goes, and the removal is measured the same way.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.cni_bench import AgentProcess
from bench.stats import row
from podwire import keys
from podwire.agent import naming
from podwire.config import EtcdSettings
from podwire.etcd import EtcdClient
from podwire.schema import nodes as values
from podwire.schema.ports import parse_desired_port
from tests.agent.desired_keys import desired_value
from tests.agent.netenv import in_ns, sh

POLL = 0.005


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_measure(stack, min(samples, 100)))


async def _measure(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    tag = f"pwt-{uuid.uuid4().hex[:6]}"
    host_ns, host, peer = f"{tag}-h", f"{tag}-host", f"{tag}-peer"
    work = Path(tempfile.mkdtemp(prefix="pwb-l2-", dir="/tmp"))
    network = str(uuid.uuid4())
    etcd = await EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]]))
    sh("ip", "netns", "add", host_ns)
    agent = AgentProcess(_config(work, stack, host, host_ns), _no_vifs(work))
    lease = await etcd.grant_lease(120)
    try:
        in_ns(host_ns, "ip", "link", "set", "lo", "up")
        in_ns(host_ns, "ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
        await asyncio.to_thread(agent.start)
        local = str(uuid.uuid4())
        await etcd.put(
            keys.node_port(host, local),
            desired_value(local, network, "fa:16:3e:00:01:01", [_ip("10.60.0.1")]),
        )
        await etcd.put(keys.state_vtep(peer), values.vtep_value("192.0.2.2"))
        await etcd.put(keys.state_alive(peer), values.alive_value(0, "b"), lease=lease.id)
        await _until(lambda: _has(host_ns, network, "dst 192.0.2.2"), 30)  # plumbing, flood
        added, removed = await _samples(etcd, host_ns, peer, network, samples)
    finally:
        await lease.revoke()
        await etcd.delete_prefix(keys.state_node_prefix(peer))
        await etcd.delete_prefix(keys.node_prefix(host))
        await asyncio.to_thread(agent.stop)
        await etcd.delete_prefix(keys.state_node_prefix(host))
        await etcd.close()
        sh("ip", "netns", "del", host_ns, check=False)
    return [
        row("remote port wired (its state in etcd) -> forwarded to here (p99 <= 200 ms)", added),
        row("remote port unwired -> its entries gone here", removed),
    ]


async def _samples(
    etcd: EtcdClient, host_ns: str, peer: str, network: str, samples: int
) -> tuple[list[float], list[float]]:
    added: list[float] = []
    removed: list[float] = []
    for i in range(samples):
        mac = f"fa:16:3e:10:{i // 256:02x}:{i % 256:02x}"
        port = parse_desired_port(
            desired_value(
                str(uuid.uuid4()), network, mac, [_ip(f"10.60.{1 + i // 250}.{2 + i % 250}")]
            )
        )
        key = keys.state_port(peer, port.port_id)
        started = time.perf_counter()
        await etcd.put(key, values.port_state_value(time.time(), port))
        await _until(lambda mac=mac: _forwarded(host_ns, network, mac), 10)
        added.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await etcd.delete(key)
        await _until(lambda mac=mac: not _has(host_ns, network, mac), 10)
        removed.append((time.perf_counter() - started) * 1000)
    return added, removed


def _forwarded(host_ns: str, network: str, mac: str) -> bool:
    listed = subprocess.run(
        ["ip", "netns", "exec", host_ns, "nft", "list", "set", "bridge", "podwire", "remote_src"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    return mac in listed and _has(host_ns, network, f"{mac} dst 192.0.2.2")


def _has(host_ns: str, network: str, text: str) -> bool:
    fdb = in_ns(host_ns, "bridge", "fdb", "show", "dev", naming.vxlan(network), check=False)
    return text in fdb.stdout


async def _until(check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        await asyncio.sleep(POLL)


def _ip(address: str) -> dict[str, str]:
    net = address.rsplit(".", 1)[0]
    return {"ip_address": address, "subnet_id": "s", "cidr": f"{net}.0/24", "gateway_ip": None}


def _config(work: Path, stack: dict[str, Any], host: str, host_ns: str) -> Path:
    path = work / "agent.toml"
    path.write_text(
        f'[etcd]\nendpoints = ["{stack["etcd"]}"]\n'
        f'[agent]\nhost = "{host}"\ncni_socket = "{work}/agent.sock"\n'
        f'state_dir = "{work}/state"\nvtep_ip = "192.0.2.1"\nhost_netns = "{host_ns}"\n'
        'security_groups = "enforce"\n'
    )
    return path


def _no_vifs(work: Path) -> Path:
    path = work / "vifs.json"
    path.write_text("[]")
    return path
