"""A Kubernetes node without kubelet: a real agent and a private containerd driven over CRI.

One simulated host (a namespace on the underlay) runs the agent's kernel work and containerd;
the agent takes a Neutron port per pod (the stack's Neutron binds it, the ml2 forwarder
writes the desired key), and the CNI config is the one ``podwire cni install`` writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from podwire.agent import naming
from podwire.cni.install import InstallSpec, conflist, install
from podwire.config import EtcdSettings
from podwire.kube.containerd import Containerd
from podwire.kube.images import build_pause_archive
from tests.agent.conftest import hostnames  # noqa: F401  (a fixture used here)
from tests.agent.harness import HostAgent
from tests.agent.netenv import NetEnv, links_in, sh
from tests.cri.cri import Cri, write_conflist
from tests.scripted_agent import eventually


@dataclass
class Node:
    agent: HostAgent
    containerd: Containerd
    cri: Cri
    network: Any
    neutron: Any

    @property
    def host_ns(self) -> str:
        return self.agent.netns

    def spec(self, **overrides: Any) -> InstallSpec:
        base: dict[str, Any] = {
            "bin_dir": self.containerd.bin_dir,
            "conf_dir": self.containerd.conf_dir,
            "network": self.network.id,
            "project": self.network.project_id,
            "agent_socket": self.agent.socket,
        }
        return InstallSpec(**{**base, **overrides})

    async def install(self, **overrides: Any) -> dict[str, Any]:
        """``podwire cni install`` into containerd's dirs; returns once the CRI loaded it."""
        spec = self.spec(**overrides)
        _, written = install(spec)
        for other in self.containerd.conf_dir.iterdir():
            if other != written:  # the CRI reads one conflist: the first by name
                other.unlink()
        wanted = conflist(spec)
        await self.cri.wait_loaded(wanted)
        return wanted

    async def use_conflist(self, body: dict[str, Any]) -> None:
        write_conflist(self.containerd.conf_dir, body)
        await self.cri.wait_loaded(body)

    def pod_veths(self) -> list[str]:
        return [name for name in links_in(self.host_ns) if naming.is_pod_veth(name)]

    def ports(self) -> list[Any]:
        return list(self.neutron.network.ports(project_id=self.network.project_id))

    async def ports_active(self, ips: list[str]) -> None:
        """The ports holding these pod addresses go ACTIVE in Neutron: what the node says it
        wired is what Neutron is told (after restarts too). How fast is the benches' business."""

        async def active() -> bool:
            ports = await asyncio.to_thread(self.ports)
            held = {p.fixed_ips[0]["ip_address"]: p.status for p in ports if p.fixed_ips}
            return all(held.get(ip) == "ACTIVE" for ip in ips)

        await eventually(active, f"the ports of {ips} ACTIVE in Neutron")

    async def port_ips(self) -> dict[str, str]:
        """Neutron's view: the address of each port in the test's project, by port id."""
        ports = await asyncio.to_thread(self.ports)
        return {p.id: p.fixed_ips[0]["ip_address"] for p in ports if p.fixed_ips}


def _require_containerd() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: runs containerd and creates network namespaces")


@pytest.fixture
def network(neutron: Any, project_id: str) -> Any:
    """A VXLAN network with a /24 in this test's project (removed with the project)."""
    net = neutron.network.create_network(name="pw-cri", project_id=project_id)
    neutron.network.create_subnet(
        network_id=net.id,
        cidr="10.78.0.0/24",
        ip_version=4,
        project_id=project_id,
        gateway_ip="10.78.0.1",
    )
    return net


@pytest.fixture(scope="session")
def pause_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The offline sandbox image, built once per session (gcc -static, then packed)."""
    return build_pause_archive(tmp_path_factory.mktemp("pause-image"))


@pytest.fixture
async def node(
    pause_image: Path,
    netenv: NetEnv,
    hostnames: list[str],  # noqa: F811
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    neutron: Any,
    network: Any,
    tmp_path: Path,
) -> AsyncIterator[Node]:
    _require_containerd()
    ns, vtep = netenv.host(1)
    agent = HostAgent(hostnames[0], ns, vtep, tmp_path, etcd_settings, neutron_endpoint)
    # A short base: containerd's socket path must stay under 108 characters.
    runtime = Containerd(Path(tempfile.mkdtemp(prefix="pwc-", dir="/tmp")), netns=ns)
    cri: Cri | None = None
    try:
        await agent.start()
        runtime.prepare()
        await asyncio.to_thread(runtime.start)
        await asyncio.to_thread(runtime.import_image, pause_image)
        cri = Cri(runtime.socket)
        made = Node(agent, runtime, cri, network, neutron)
        await made.install()
        yield made
    finally:
        netns: list[str] = []
        if cri is not None:
            with contextlib.suppress(Exception):  # the test's own failure is what matters
                netns = [await cri.netns(s) for s in await cri.sandboxes()]
                if agent.task is None:  # a test left it stopped: the sandboxes' DELs need it
                    await agent.start()
                await cri.remove_all()
            await cri.close()
        await asyncio.to_thread(runtime.cleanup)
        for path in netns:  # left only when removing the sandboxes failed
            if os.path.exists(path):
                sh("ip", "netns", "del", os.path.basename(path), check=False)
        await agent.stop()
