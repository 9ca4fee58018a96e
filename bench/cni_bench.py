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
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.stats import row
from podwire import keys
from podwire.config import EtcdSettings
from podwire.etcd import EtcdClient
from podwire.neutron.client import neutron_connection
from podwire.schema.ports import FixedIp
from podwire.schema.secgroups import SecurityGroup
from podwire.schema.vif import Vif
from tests.etcd_tools import delete_prefix

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / ".venv" / "bin" / "podwire-cni"
REFERENCE_DIR = Path("/usr/lib/cni")
BURST = 30
_libc = ctypes.CDLL(None, use_errno=True)


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class HostThreadRunner:
    """Execs plugins from a thread that has entered the host namespace (children inherit it)."""

    def __init__(self, host_ns: str, threads: int) -> None:
        self._ns = host_ns
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, initializer=self._enter)

    def _enter(self) -> None:
        fd = os.open(f"/run/netns/{self._ns}", os.O_RDONLY)
        try:
            if _libc.setns(fd, 0x40000000) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)

    def timed(self, binary: Path, env: dict[str, str], conf: dict[str, Any]) -> float:
        """One plugin run, from a thread in the host namespace: a plugin that makes host-side
        objects (the reference ``bridge`` plugin's bridge) makes them there, never in the
        namespace the bench itself runs in."""
        return self.pool.submit(self._timed, binary, env, conf).result()

    def _timed(self, binary: Path, env: dict[str, str], conf: dict[str, Any]) -> float:
        started = time.perf_counter()
        proc = subprocess.run(
            [str(binary)], input=json.dumps(conf).encode(), env=env, capture_output=True
        )
        elapsed = (time.perf_counter() - started) * 1000
        if proc.returncode != 0:
            raise RuntimeError(f"{binary.name} {env['CNI_COMMAND']}: {proc.stdout!r}")
        return elapsed

    def many(self, jobs: list[tuple[Path, dict[str, str], dict[str, Any]]]) -> list[float]:
        futures = [self.pool.submit(self._timed, *job) for job in jobs]
        return [f.result() for f in futures]


def _env(command: str, cid: str, pod: str, ifname: str) -> dict[str, str]:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": f"/run/netns/{pod}",
        "CNI_IFNAME": ifname,
        "CNI_PATH": str(REFERENCE_DIR),
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }


def _prepare_ports(conn: Any, project: str, host: str, count: int) -> tuple[Any, list[Any]]:
    network = conn.network.create_network(name="pw-bench-cni", project_id=project)
    subnet = conn.network.create_subnet(
        network_id=network.id, cidr="10.66.0.0/22", ip_version=4, project_id=project
    )
    bodies = [
        {
            "network_id": network.id,
            "project_id": project,
            "device_owner": "compute:podwire",
            "binding_host_id": host,
        }
        for _ in range(count)
    ]
    ports = list(conn.network.create_ports(bodies))
    return (network, subnet), ports


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


def _desired(vif: Vif, network: Any) -> bytes:
    return json.dumps(
        {
            "v": 1,
            "port_id": vif.port_id,
            "network_id": vif.network_id,
            "mac_address": vif.mac_address,
            "mtu": vif.mtu,
            "network_type": "vxlan",
            "physnet": None,
            "segmentation_id": network.provider_segmentation_id,
            "vif_type": "veth",
            "vif_details": {},
            "fixed_ips": [vars(ip) for ip in vif.fixed_ips],
            "security_groups": list(vif.security_groups),
            "device_owner": "compute:podwire",
            "device_id": "",
            "trunk": None,
        }
    ).encode()


class AgentProcess:
    """``bench.agent_proc`` in its own process; ``start`` returns once its socket is open."""

    def __init__(self, config: Path, vifs: Path) -> None:
        self._argv = [sys.executable, "-m", "bench.agent_proc", str(config), str(vifs)]
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            self._argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("the benchmark agent did not start")

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return with_agent(stack, samples, None, _measure)


Measure = Callable[[HostThreadRunner, Path, str, str, list[str], int], list[dict[str, Any]]]


def with_agent(
    stack: dict[str, Any], samples: int, group: SecurityGroup | None, measure: Measure
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
        (network, subnet), ports = _prepare_ports(conn, project, host, BURST)
        vifs = [_vif(p, network, subnet, sgs) for p in ports]
        asyncio.run(_publish(stack, host, vifs, network, group))
        socket = str(work / "agent.sock")
        config = _agent_config(work, stack, host, host_ns, socket, group is not None)
        agent = AgentProcess(config, _vifs_file(work, vifs))
        agent.start()
        runner = HostThreadRunner(host_ns, BURST)
        return measure(runner, work, socket, network.id, pods, min(samples, 100))
    finally:
        if agent is not None:
            agent.stop()
        asyncio.run(_unpublish(stack, host, group))
        for port in conn.network.ports(project_id=project):
            conn.network.delete_port(port)
        for net in conn.network.networks(project_id=project):
            conn.network.delete_network(net)
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def _agent_config(
    work: Path,
    stack: dict[str, Any],
    host: str,
    host_ns: str,
    socket: str,
    enforce: bool = False,
) -> Path:
    path = work / "agent.toml"
    path.write_text(
        f'[etcd]\nendpoints = ["{stack["etcd"]}"]\n'
        f'[agent]\nhost = "{host}"\ncni_socket = "{socket}"\nstate_dir = "{work}/state"\n'
        f'vtep_ip = "192.0.2.1"\nhost_netns = "{host_ns}"\n'
        f'security_groups = "{"enforce" if enforce else "off"}"\n'
    )
    return path


def _vifs_file(work: Path, vifs: list[Vif]) -> Path:
    path = work / "vifs.json"
    path.write_text(json.dumps([vif.to_json() for vif in vifs]))
    return path


async def _publish(
    stack: dict[str, Any],
    host: str,
    vifs: list[Vif],
    network: Any,
    group: SecurityGroup | None = None,
) -> None:
    etcd = await EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]]))
    try:
        if group is not None:
            await etcd.put(keys.secgroup(group.sg_id), group.encode().encode())
        for vif in vifs:
            await etcd.put(keys.node_port(host, vif.port_id), _desired(vif, network))
    finally:
        await etcd.close()


async def _unpublish(stack: dict[str, Any], host: str, group: SecurityGroup | None = None) -> None:
    etcd = await EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]]))
    try:
        if group is not None:
            await etcd.delete(keys.secgroup(group.sg_id))
        await delete_prefix(etcd, keys.node_ports_prefix(host))
        await delete_prefix(etcd, keys.state_node_prefix(host))
    finally:
        await etcd.close()


def _measure(
    runner: HostThreadRunner, work: Path, socket: str, network: str, pods: list[str], samples: int
) -> list[dict[str, Any]]:
    ours_conf = {
        "cniVersion": "1.0.0",
        "name": "pw",
        "type": "podwire",
        "network": network,
        "agentSocket": socket,
    }
    ref_conf = {
        "cniVersion": "1.0.0",
        "name": "ref",
        "type": "bridge",
        "bridge": "pwbref0",
        "ipam": {"type": "host-local", "subnet": "10.99.0.0/16", "dataDir": str(work / "ipam")},
    }
    bridge = REFERENCE_DIR / "bridge"
    times: dict[str, list[float]] = {k: [] for k in ("add", "del", "ref_add", "ref_del")}
    burst: dict[str, list[float]] = {k: [] for k in times}
    for i in range(samples):
        pod, cid = pods[i % len(pods)], f"s{i}"
        times["add"].append(runner.timed(PLUGIN, _env("ADD", cid, pod, "eth0"), ours_conf))
        times["del"].append(runner.timed(PLUGIN, _env("DEL", cid, pod, "eth0"), ours_conf))
        times["ref_add"].append(runner.timed(bridge, _env("ADD", cid, pod, "ref0"), ref_conf))
        times["ref_del"].append(runner.timed(bridge, _env("DEL", cid, pod, "ref0"), ref_conf))
    for round_ in range(max(1, samples // 30)):
        for kind, binary, conf, ifname in (
            ("", PLUGIN, ours_conf, "eth0"),
            ("ref_", bridge, ref_conf, "ref0"),
        ):
            for verb in ("ADD", "DEL"):
                jobs = [
                    (binary, _env(verb, f"b{round_}-{j}", pod, ifname), conf)
                    for j, pod in enumerate(pods)
                ]
                burst[f"{kind}{verb.lower()}"].extend(runner.many(jobs))
    return [
        row(
            "cni ADD, warm port (podwire, C plugin)",
            times["add"],
            "bridge+host-local ADD",
            times["ref_add"],
        ),
        row("cni DEL (podwire)", times["del"], "bridge+host-local DEL", times["ref_del"]),
        row(
            f"cni ADD, {BURST} at once (podwire)",
            burst["add"],
            f"bridge+host-local {BURST} at once",
            burst["ref_add"],
        ),
        row(
            f"cni DEL, {BURST} at once (podwire)",
            burst["del"],
            f"bridge+host-local {BURST} at once",
            burst["ref_del"],
        ),
    ]
