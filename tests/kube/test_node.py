"""``podwire kube-node`` itself: what it announces, what it refuses, and that neither a stop nor
a kill followed by the next start leaves anything behind (processes, mounts, the link to the
apiserver, kubelet's netfilter chains, pods' ports and veths)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from podwire.kube import apilink, mounts, nsfilter
from podwire.kube.node import node_dir
from podwire.stack import procs
from tests.agent.harness import HostAgent
from tests.agent.netenv import NetEnv, links_in
from tests.conftest import PODWIRE
from tests.kube.conftest import Cluster
from tests.scripted_agent import eventually


def kube_node(
    data_dir: Path, host: str, netns: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    argv = [
        *PODWIRE, "kube-node", "--data-dir", str(data_dir), "--host", host, "--netns", netns,
        "--agent-socket", "/run/podwire/none.sock", "--network", "n1", *extra,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def fake_stack_json(data_dir: Path, **entries: Any) -> None:
    """A stack.json whose supervisor is this process: a stack that counts as running."""
    pid = os.getpid()
    body = {"pids": {"supervisor": pid}, "cmdlines": {"supervisor": procs.cmdline(pid)}}
    (data_dir / "stack.json").write_text(json.dumps({**body, **entries}))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("bad-host", "--host 'Bad_Host': a Node name is lower case letters, digits"),
        ("no-netns", "--netns: no network namespace named pwt-missing"),
        ("bad-node-ip", "--node-ip '192.0.2.300': not an IPv4 address"),
        ("no-stack", "no stack is running on"),
        ("no-kubernetes", "runs without Kubernetes: start it with podwire stack up --kubernetes"),
        ("no-binaries", "kubelet is not in"),
        ("bad-cluster-dns", "stack.json: cluster_dns: 224.0.0.1 is not a unicast host address"),
    ],
)
def test_refusals_are_one_line_naming_the_cause(
    case: str, message: str, netenv: NetEnv, tmp_path: Path
) -> None:
    ns = netenv.namespace("h")
    host, netns = ("Bad_Host" if case == "bad-host" else "h1"), ns
    if case == "no-netns":
        netns = "pwt-missing"
    if case == "no-kubernetes":
        fake_stack_json(tmp_path)
    if case in ("no-binaries", "bad-cluster-dns"):
        dns = {"cluster_dns": "224.0.0.1"} if case == "bad-cluster-dns" else {}
        fake_stack_json(
            tmp_path, kube_apiserver="https://192.0.2.2:1", kube_bin_dir=str(tmp_path), **dns
        )
    extra = ("--node-ip", "192.0.2.300") if case == "bad-node-ip" else ()
    done = kube_node(tmp_path, host, netns, *extra)
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("podwire kube-node: error: ")
    if case == "no-binaries":
        assert "run scripts/setup" in done.stderr


def machine_leftovers(data_dir: Path, agent: HostAgent) -> list[str]:
    """What a node of ``agent``'s host left on the machine: processes (kubelet, containerd and
    its shims name the node's dir), mounts below it, the link and the route to the host."""
    top = node_dir(data_dir, agent.host)
    found = [f"process {procs.cmdline(pid)[:80]}" for pid in procs.pids_marked(str(top))]
    found += [f"mount {point}" for point in mounts.under(top, include_self=True)]
    if apilink.exists(agent.netns):
        found.append(f"link {apilink.machine_end(agent.netns)}")
    route = subprocess.run(["ip", "route", "show", f"{agent.vtep}/32"], capture_output=True)
    found += [f"route {line}" for line in route.stdout.decode().splitlines()]
    return found


@pytest.mark.stack
@pytest.mark.netns
async def test_a_killed_node_is_cleaned_by_the_next_and_a_stopped_one_leaves_nothing(
    cluster: Cluster,
) -> None:
    agent = await cluster.add_agent(3)
    tables = nsfilter.tables(agent.netns)
    node = await cluster.start_node(agent)
    data_dir = Path(cluster.info["data_dir"])
    assert node.announced["node"] == agent.host
    assert node.announced["kubelet_root"] == str(node_dir(data_dir, agent.host) / "kubelet")
    assert (Path(node.announced["kubelet_root"]) / "device-plugins").is_dir()
    assert Path(node.announced["kubeconfig"]).is_file()
    await cluster.create_pod("pk", agent.host)
    uid = (await cluster.running("pk"))["metadata"]["uid"]
    first = await cluster.port_of(uid)
    assert first is not None

    node.proc.kill()  # kubelet and containerd end with it; the pod's sandbox stays
    await node.proc.wait()
    again = await cluster.start_node(agent)  # removes that sandbox through the CRI first

    async def replaced() -> bool:
        port = await cluster.port_of(uid)
        renewed = port is not None and port.id != first.id
        return renewed and len(cluster.pod_veths(agent.host)) == 1

    await eventually(replaced, "the killed run's port released, the pod wired anew", 60)

    assert await cluster.retire(again) == 0
    assert await cluster.port_of(uid) is None
    assert cluster.pod_veths(agent.host) == set()
    assert apilink.HOST_END not in links_in(agent.netns)  # the agent's bridge may stay
    assert nsfilter.tables(agent.netns) == tables
    assert machine_leftovers(data_dir, agent) == []
    await cluster.delete_pod("pk", "--grace-period=0", "--force")
