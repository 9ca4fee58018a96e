"""Routers on a podwire node: floating IPs followed, and routed against switched throughput.

The test suite's routed site (tests/neutron_agents/routing.py), all real: podwire's agents on
two simulated hosts joined by VXLAN, ``podwire neutron-agent l3`` (Neutron's L3 agent) on host
1 with the external physnet, an outside namespace on it, pods from CNI ADDs.

- floating IP associated -> first answer from outside: from the return of the Neutron call
  that associates a floating IP with a pod's port (on host 2: the path crosses the router's
  DNAT and VXLAN) until a TCP connection from the outside to that address is answered (polled
  every 50 ms, each probe one connection from a fresh client process). Beside it, the L3
  agent's own figure for the same update ("Finished a router update ... Time elapsed", from
  its log): the part of the wait that is Neutron's processing. Each sample then disassociates
  and waits until the address stops answering.
- podwire's agent on the router's host restarted -> the floating IP answers: from the start of
  the agent's start-up (it was stopped just before) until the outside's connection through
  the floating IP is answered again (the router's taps adopted again).
- pod -> router -> pod TCP throughput (iperf3, 3 s): a pod on host 1 to a pod on host 2 on
  the other network, through the router on host 1; the reference is a pod on host 1 to a pod
  on host 2 on the same network (VXLAN, no router). Target: routed >= 0.5x switched.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import forget_nodes, until
from bench.stats import row
from podwire.config import EtcdSettings
from podwire.demo.router import router_updates
from podwire.etcd import EtcdClient
from podwire.neutron.client import neutron_connection
from tests.agent.harness import cni_pod
from tests.agent.netenv import NetEnv, in_ns
from tests.conftest import delete_project_resources
from tests.neutron_agents.agents import NeutronAgentRun
from tests.neutron_agents.conftest import L3_AGENT
from tests.neutron_agents.routing import WEB_PORT, Site, answer, build_site, pod

IPERF_SECONDS = 3
IPERF_RUNS = 3
AGENT_RESTARTS = 3


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    if "transport_url" not in stack:
        return []  # the L3 agent needs the RPC bus (bench.run starts the stack with --rpc)
    return asyncio.run(_run(stack, min(samples, 20)))


async def _run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    netenv = NetEnv()
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    work = Path(tempfile.mkdtemp(prefix="pwb-l3-", dir="/tmp"))
    hostnames = [f"{netenv.tag}-h1", f"{netenv.tag}-h2"]
    l3_runs: list[NeutronAgentRun] = []

    def l3_agent(host: str, netns: str) -> NeutronAgentRun:
        out = work / f"l3-{host}.err"
        l3_runs.append(NeutronAgentRun(Path(stack["data_dir"]), host, netns, out, kind="l3"))
        return l3_runs[-1]

    etcd = EtcdSettings(endpoints=[stack["etcd"]])
    site: Site | None = None
    try:
        site = await build_site(netenv, hostnames, etcd, stack["neutron"], conn, project,
                                l3_agent, work)  # fmt: skip
        return await _floating_rows(site, conn, project, netenv, work, samples) + (
            await _throughput_rows(site, netenv, work)
        )
    finally:
        if site is not None:
            await site.close()
        for agent_run in l3_runs:
            agent_run.stop()
        for host in hostnames:
            for record in conn.network.agents(host=host, agent_type=L3_AGENT):
                conn.network.delete_agent(record)
        delete_project_resources(conn, project)
        netenv.cleanup()
        async with await EtcdClient.connect(etcd) as client:
            await forget_nodes(client, *hostnames)


async def _floating_rows(
    site: Site, conn: Any, project: str, netenv: NetEnv, work: Path, samples: int
) -> list[dict[str, Any]]:
    target = await pod(site, 1, 1, netenv, work)
    (port,) = conn.network.ports(mac_address=target["mac"])
    floating = conn.network.create_ip(floating_network_id=site.external.id, project_id=project)
    address = floating.floating_ip_address
    answered: list[float] = []
    processing: list[float] = []
    for _ in range(samples):
        seen = len(_elapsed(site.l3, site.router.id))
        conn.network.update_ip(floating, port_id=port.id)
        started = time.perf_counter()
        await _until(lambda: answer(site.outside, address, WEB_PORT) is not None)
        answered.append((time.perf_counter() - started) * 1000)
        await _until(lambda seen=seen: len(_elapsed(site.l3, site.router.id)) > seen)
        processing.append(_elapsed(site.l3, site.router.id)[seen] * 1000)
        conn.network.update_ip(floating, port_id=None)
        await _until(lambda: answer(site.outside, address, WEB_PORT) is None)
    conn.network.update_ip(floating, port_id=port.id)
    await _until(lambda: answer(site.outside, address, WEB_PORT) is not None)
    resumed = []
    for _ in range(AGENT_RESTARTS):
        await site.hosts[0].stop()
        started = time.perf_counter()
        await site.hosts[0].start()
        await _until(lambda: answer(site.outside, address, WEB_PORT) is not None)
        resumed.append((time.perf_counter() - started) * 1000)
    return [
        row(
            "floating IP associated -> first answer from outside (target p50 <= 2 s)",
            answered,
        ),
        row("  of which Neutron's L3 agent processing the router update", processing),
        row(
            "podwire's agent on the router's host restarted -> floating IP answers (target 2 s)",
            resumed,
        ),
    ]


def _elapsed(l3: NeutronAgentRun, router_id: str) -> list[float]:
    return router_updates(Path(l3.info["log"]), router_id)


async def _until(done: Any) -> None:
    await until(done, 60, 0.05, thread=True, what="the router's update")


async def _throughput_rows(site: Site, netenv: NetEnv, work: Path) -> list[dict[str, Any]]:
    async def bare_pod(host: int, network: int) -> dict[str, str]:
        """A pod of the site's group serving nothing yet (iperf3 takes the admitted port)."""
        return await cni_pod(
            site.hosts[host], netenv, site.networks[network].id, site.group.id, work
        )

    client = await bare_pod(0, 0)
    switched = await bare_pod(1, 0)  # host 2, the client's network
    routed = await bare_pod(1, 1)  # host 2, the other network
    for server in (switched, routed):
        site.servers.append(_iperf_server(server["ns"]))
    direct = [_iperf(client["ns"], switched["ip"]) for _ in range(IPERF_RUNS)]
    through = [_iperf(client["ns"], routed["ip"]) for _ in range(IPERF_RUNS)]
    return [
        row(
            "pod -> router -> pod TCP throughput, across VXLAN (target >= 0.5x)",
            through,
            "pod -> pod on one network between the same hosts",
            direct,
            unit="Mbit/s",
        )
    ]


def _iperf_server(ns: str) -> subprocess.Popen[str]:
    argv = ["ip", "netns", "exec", ns, "iperf3", "-s", "-p", str(WEB_PORT)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)


def _iperf(ns: str, address: str) -> float:
    """Mbit/s received, retried while the server is still starting."""
    for _ in range(50):
        out = in_ns(ns, "iperf3", "-c", address, "-p", str(WEB_PORT), "-t", str(IPERF_SECONDS),
                    "-J", check=False)  # fmt: skip
        received = json.loads(out.stdout or "{}").get("end", {}).get("sum_received")
        if out.returncode == 0 and received:
            return float(received["bits_per_second"]) / 1e6
        time.sleep(0.1)
    raise RuntimeError(f"iperf3 to {address} failed: {out.stdout[-300:]}")
