"""CNI ADD/DEL wall time, exec to exit: podwire vs Debian's ``bridge`` + ``host-local``.

Both run in the same simulated host namespace in the same run. podwire is measured on its warm
path: ports are pre-created, pre-bound and their desired keys already in etcd (pools are not
wired to the agent yet), so ADD measures the agent's work only, not Neutron. Every plugin is
exec'd from a thread that sits in the host namespace, so the reference plugins create their
bridge there without paying for ``ip netns exec``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.agent_proc import ROOT, AgentProcess
from bench.harness import delete_project, forget_nodes, project_network, stack_etcd
from bench.stats import row
from podwire import keys
from podwire.neutron.client import neutron_connection
from podwire.schema.ports import FixedIp
from podwire.schema.secgroups import SecurityGroup
from podwire.schema.vif import Vif
from tests.agent.desired_keys import desired_value

PLUGIN = ROOT / ".venv" / "bin" / "podwire-cni"
REFERENCE_DIR = Path("/usr/lib/cni")
BURST = 30
_libc = ctypes.CDLL(None, use_errno=True)


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _env(command: str, cid: str, pod: str, ifname: str) -> dict[str, str]:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": f"/run/netns/{pod}",
        "CNI_IFNAME": ifname,
        "CNI_PATH": str(REFERENCE_DIR),
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }


def _vif(port: Any, network: Any, subnet: Any, sgs: tuple[str, ...] = ()) -> Vif:
    fixed = [
        FixedIp(ip["ip_address"], subnet.id, subnet.cidr, subnet.gateway_ip)
        for ip in port.fixed_ips
    ]
    return Vif(
        port.id,
        network.id,
        port.project_id,
        port.mac_address,
        network.mtu,
        fixed,
        segmentation_id=network.provider_segmentation_id,
        security_groups=list(sgs),
    )


class Plugins:
    """podwire's plugin (warm ports, the agent process) and the reference ``bridge`` with
    ``host-local``, for the bench's pod namespaces. Each is exec'd from a thread that has
    entered the host namespace (children inherit it): a plugin that makes host-side objects
    (the reference's bridge) makes them there, never where the bench itself runs."""

    def __init__(self, host_ns: str, pods: list[str], network: str, socket: str, work: Path):
        self.host_ns = host_ns
        self.pool = concurrent.futures.ThreadPoolExecutor(BURST, initializer=self._enter)
        self.pods = pods
        self.ours = {
            "cniVersion": "1.0.0",
            "name": "pw",
            "type": "podwire",
            "network": network,
            "agentSocket": socket,
        }
        self.ref = {
            "cniVersion": "1.0.0",
            "name": "ref",
            "type": "bridge",
            "bridge": "pwbref0",
            "ipam": {"type": "host-local", "subnet": "10.99.0.0/16", "dataDir": str(work / "ipam")},
        }
        bridge = REFERENCE_DIR / "bridge"
        self.sides: list[tuple[str, Path, dict[str, Any], str]] = [
            ("", PLUGIN, self.ours, "eth0"),
            ("ref_", bridge, self.ref, "ref0"),
        ]

    def _enter(self) -> None:
        fd = os.open(f"/run/netns/{self.host_ns}", os.O_RDONLY)
        try:
            if _libc.setns(fd, 0x40000000) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)

    def _timed(self, binary: Path, env: dict[str, str], conf: dict[str, Any]) -> float:
        started = time.perf_counter()
        proc = subprocess.run(
            [str(binary)], input=json.dumps(conf).encode(), env=env, capture_output=True
        )
        elapsed = (time.perf_counter() - started) * 1000
        if proc.returncode != 0:
            raise RuntimeError(f"{binary.name} {env['CNI_COMMAND']}: {proc.stdout!r}")
        return elapsed

    def singles(self, samples: int) -> dict[str, list[float]]:
        """One pod at a time: ADD then DEL through podwire, then through the reference."""
        times: dict[str, list[float]] = {k: [] for k in ("add", "del", "ref_add", "ref_del")}
        for i in range(samples):
            pod, cid = self.pods[i % len(self.pods)], f"s{i}"
            for kind, binary, conf, ifname in self.sides:
                for verb in ("ADD", "DEL"):
                    env = _env(verb, cid, pod, ifname)
                    took = self.pool.submit(self._timed, binary, env, conf).result()
                    times[f"{kind}{verb.lower()}"].append(took)
        return times

    def bursts(self, rounds: int) -> dict[str, list[float]]:
        """Every pod at once, ADD then DEL, each side in turn."""
        times: dict[str, list[float]] = {k: [] for k in ("add", "del", "ref_add", "ref_del")}
        for round_ in range(rounds):
            for kind, binary, conf, ifname in self.sides:
                for verb in ("ADD", "DEL"):
                    futures = [
                        self.pool.submit(
                            self._timed, binary, _env(verb, f"b{round_}-{j}", pod, ifname), conf
                        )
                        for j, pod in enumerate(self.pods)
                    ]
                    times[f"{kind}{verb.lower()}"].extend(f.result() for f in futures)
        return times


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return with_agent(stack, samples, None, _measure)


def with_agent(
    stack: dict[str, Any],
    samples: int,
    group: SecurityGroup | None,
    measure: Callable[[Plugins, int], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """A host namespace, warm ports and an agent process; with ``group``, every port is in
    it and the agent enforces it (the group is published as the ml2 forwarder would)."""
    tag = f"pwt-{uuid.uuid4().hex[:6]}"
    host_ns, host = f"{tag}-h", f"{tag}-host"
    pods = [f"{tag}-p{i}" for i in range(BURST)]
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    created: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="pwb-cni-", dir="/tmp"))
    agent: AgentProcess | None = None
    sgs = (group.sg_id,) if group else ()
    try:
        for ns in [host_ns, *pods]:
            _sh("ip", "netns", "add", ns)
            created.append(ns)
        _sh("ip", "netns", "exec", host_ns, "ip", "link", "set", "lo", "up")
        network, subnet = project_network(conn, project, "pw-bench-cni", "10.66.0.0/22")
        body = {
            "network_id": network.id,
            "project_id": project,
            "device_owner": "compute:podwire",
            "binding_host_id": host,
        }
        ports = conn.network.create_ports([dict(body) for _ in range(BURST)])
        vifs = tuple(_vif(p, network, subnet, sgs) for p in ports)
        asyncio.run(_publish(stack, host, vifs, network, group))
        agent = AgentProcess(work, stack, host, host_ns, group is not None, vifs)
        agent.start()
        plugins = Plugins(host_ns, pods, network.id, agent.socket, work)
        return measure(plugins, min(samples, 100))
    finally:
        if agent is not None:
            agent.stop()
        asyncio.run(_unpublish(stack, host, group))
        delete_project(conn, project)
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


async def _publish(
    stack: dict[str, Any],
    host: str,
    vifs: tuple[Vif, ...],
    network: Any,
    group: SecurityGroup | None = None,
) -> None:
    async with await stack_etcd(stack) as etcd:
        if group is not None:
            await etcd.put(keys.secgroup(group.sg_id), group.encode().encode())
        for vif in vifs:
            fixed = [vars(ip) for ip in vif.fixed_ips]
            value = desired_value(
                vif.port_id,
                vif.network_id,
                vif.mac_address,
                fixed,
                segmentation_id=network.provider_segmentation_id,
                mtu=vif.mtu,
                security_groups=tuple(vif.security_groups),
            )
            await etcd.put(keys.node_port(host, vif.port_id), value)


async def _unpublish(stack: dict[str, Any], host: str, group: SecurityGroup | None = None) -> None:
    async with await stack_etcd(stack) as etcd:
        if group is not None:
            await etcd.delete(keys.secgroup(group.sg_id))
        await forget_nodes(etcd, host)


def _measure(plugins: Plugins, samples: int) -> list[dict[str, Any]]:
    times = plugins.singles(samples)
    burst = plugins.bursts(max(1, samples // 30))
    reference = f"bridge+host-local {BURST} at once"
    return [
        row(
            "cni ADD, warm port (podwire, C plugin)",
            times["add"],
            "bridge+host-local ADD",
            times["ref_add"],
        ),
        row("cni DEL (podwire)", times["del"], "bridge+host-local DEL", times["ref_del"]),
        row(f"cni ADD, {BURST} at once (podwire)", burst["add"], reference, burst["ref_add"]),
        row(f"cni DEL, {BURST} at once (podwire)", burst["del"], reference, burst["ref_del"]),
    ]
