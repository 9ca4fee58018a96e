"""Tap ports: a VM's device appearing until Neutron says ACTIVE, and Neutron's DHCP agent.

The whole system a compute node runs: the real agent in its own process on a simulated host,
enforcing security groups, the stack's real Neutron with the ml2 forwarder and feedback, and
``podwire neutron-agent dhcp`` (the real ``neutron-dhcp-agent`` on the stack's RPC bus).

- tap appears -> port ACTIVE: a ``compute:nova`` port bound to the host, then a device named
  as Nova names it appears (``ip link add tap… type veth``, as QEMU or the interface driver
  makes one); until the agent reports it wired (its etcd state key), and until Neutron's port
  status is ACTIVE (polled every 10 ms). Nova waits for the latter (``network-vif-plugged``);
  the published reference is OVN's bind -> ``ovn-installed``, 1.15 s on average.
- subnet created -> DHCP port wired: from the create call's return until the DHCP agent's port
  on that network is ACTIVE (Neutron schedules the network, the DHCP agent creates and plugs
  its port, the node agent adopts the tap).
- DISCOVER -> lease: busybox ``udhcpc`` on a guest's tap (``-q``: it starts with DISCOVER and
  ends with the lease), through the port's rules and dnsmasq.
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
from podwire.config import EtcdSettings
from podwire.etcd import EtcdClient
from podwire.neutron.client import neutron_connection
from podwire.schema.ports import tap_name
from tests.agent.netenv import in_ns, sh
from tests.etcd_tools import delete_prefix
from tests.neutron_agents.agents import NeutronAgentRun, dhcp_port

BUSYBOX = "/bin/busybox"
POLL = 0.01


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    if "transport_url" not in stack:
        return []  # the DHCP agent needs the RPC bus (bench.run starts the stack with --rpc)
    with _Node(stack) as node:
        rows = node.tap_rows(min(samples, 30))
        rows += node.dhcp_rows(min(samples, 10))
    return rows


class _Node:
    """A simulated host with the agent and the DHCP agent, and a network of its own."""

    def __init__(self, stack: dict[str, Any]) -> None:
        self.stack = stack
        self.tag = f"pwt-{uuid.uuid4().hex[:6]}"
        self.host_ns, self.host = f"{self.tag}-h", f"{self.tag}-host"
        self.conn = neutron_connection(stack["neutron"])
        self.project = uuid.uuid4().hex
        self.work = Path(tempfile.mkdtemp(prefix="pwb-tap-", dir="/tmp"))
        self.namespaces: list[str] = []
        self.agent: AgentProcess | None = None
        self.dhcp: NeutronAgentRun | None = None
        self.loop = asyncio.new_event_loop()
        self.etcd = self.loop.run_until_complete(
            EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]]))
        )

    def __enter__(self) -> _Node:
        self._namespace(self.host_ns)
        in_ns(self.host_ns, "ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
        self.agent = AgentProcess(self._config(), self._no_vifs())
        self.agent.start()
        self.dhcp = NeutronAgentRun(
            Path(self.stack["data_dir"]), self.host, self.host_ns, self.work / "dhcp.out"
        )
        self._wait(lambda: any(a.is_alive for a in self.conn.network.agents(host=self.host)))
        return self

    def __exit__(self, *exc: object) -> None:
        for port in list(self.conn.network.ports(project_id=self.project)):
            self.conn.network.delete_port(port)
        for network in list(self.conn.network.networks(project_id=self.project)):
            self.conn.network.delete_network(network)
        if self.dhcp is not None:
            self.dhcp.stop()
        if self.agent is not None:
            self.agent.stop()
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)
        self.loop.run_until_complete(self._forget_host())
        self.loop.run_until_complete(self.etcd.close())
        self.loop.close()

    def _namespace(self, name: str) -> str:
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        in_ns(name, "ip", "link", "set", "lo", "up")
        return name

    def _config(self) -> Path:
        path = self.work / "agent.toml"
        path.write_text(
            f'[etcd]\nendpoints = ["{self.stack["etcd"]}"]\n'
            f'[agent]\nhost = "{self.host}"\ncni_socket = "{self.work}/agent.sock"\n'
            f'state_dir = "{self.work}/state"\nvtep_ip = "192.0.2.1"\n'
            f'host_netns = "{self.host_ns}"\nsecurity_groups = "enforce"\n'
        )
        return path

    def _no_vifs(self) -> Path:
        path = self.work / "vifs.json"
        path.write_text("[]")
        return path

    async def _forget_host(self) -> None:
        await delete_prefix(self.etcd, keys.node_prefix(self.host))
        await delete_prefix(self.etcd, keys.state_node_prefix(self.host))

    @staticmethod
    def _wait(ready: Any, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = ready()
            if found:
                return found
            time.sleep(POLL)
        raise RuntimeError("timed out")

    def _network(self, cidr: str, dhcp: bool) -> tuple[Any, float]:
        """A network with one subnet; and when its subnet's create call returned."""
        network = self.conn.network.create_network(name=self.tag, project_id=self.project)
        self.conn.network.create_subnet(
            network_id=network.id, cidr=cidr, ip_version=4, project_id=self.project,
            enable_dhcp=dhcp,
        )  # fmt: skip
        return network, time.perf_counter()

    # -- tap appears -> ACTIVE -----------------------------------------------------------

    def tap_rows(self, samples: int) -> list[dict[str, Any]]:
        network, _ = self._network("10.97.0.0/24", dhcp=False)
        wired: list[float] = []
        active: list[float] = []
        for _ in range(samples):
            port = self.conn.network.create_port(
                network_id=network.id, project_id=self.project, device_owner="compute:nova",
                device_id=str(uuid.uuid4()), binding_host_id=self.host,
            )  # fmt: skip
            self._wait(lambda port=port: self._desired(port.id))
            guest = self._namespace(f"{self.tag}-g{len(self.namespaces)}")
            started = time.perf_counter()
            in_ns(self.host_ns, "ip", "link", "add", tap_name(port.id), "type", "veth",
                  "peer", "eth0", "netns", guest)  # fmt: skip
            self._wait(lambda port=port: self._wired(port.id))
            wired.append((time.perf_counter() - started) * 1000)
            self._wait(lambda port=port: self.conn.network.get_port(port.id).status == "ACTIVE")
            active.append((time.perf_counter() - started) * 1000)
            self.conn.network.delete_port(port)
            in_ns(self.host_ns, "ip", "link", "del", tap_name(port.id), check=False)
        return [
            row("tap appears -> agent reports it wired (rules in force, on the bridge)", wired),
            row(
                "tap appears -> Neutron port ACTIVE (target p50 <= 300 ms)",
                active,
                "OVN bind -> ovn-installed, published: 1150 ms avg",
            ),
        ]

    def _desired(self, port_id: str) -> bool:
        return self._key(keys.node_port(self.host, port_id))

    def _wired(self, port_id: str) -> bool:
        return self._key(keys.state_port(self.host, port_id))

    def _key(self, key: str) -> bool:
        return self.loop.run_until_complete(self.etcd.get(key)) is not None

    # -- DHCP ----------------------------------------------------------------------------

    def dhcp_rows(self, samples: int) -> list[dict[str, Any]]:
        served: list[float] = []
        leases: list[float] = []
        for i in range(samples):
            network, started = self._network(f"10.98.{i}.0/24", dhcp=True)
            self._wait(lambda network=network: _active(dhcp_port(self.conn, network.id)))
            served.append((time.perf_counter() - started) * 1000)
            leases.append(self._lease(network))
            for port in list(self.conn.network.ports(network_id=network.id)):
                self.conn.network.delete_port(port)
            self.conn.network.delete_network(network)
        return [
            row("subnet created -> its DHCP port wired on the node (target p50 <= 2 s)", served),
            row("guest DISCOVER -> DHCP lease (udhcpc, through the port's rules)", leases),
        ]

    def _lease(self, network: Any) -> float:
        port = self.conn.network.create_port(
            network_id=network.id, project_id=self.project, device_owner="compute:nova",
            device_id=str(uuid.uuid4()), binding_host_id=self.host,
        )  # fmt: skip
        guest = self._namespace(f"{self.tag}-l{len(self.namespaces)}")
        in_ns(self.host_ns, "ip", "link", "add", tap_name(port.id), "type", "veth", "peer",
              "eth0", "netns", guest)  # fmt: skip
        in_ns(guest, "ip", "link", "set", "eth0", "address", port.mac_address, "up")
        self._wait(lambda: self.conn.network.get_port(port.id).status == "ACTIVE")
        started = time.perf_counter()
        result = subprocess.run(
            ["ip", "netns", "exec", guest, BUSYBOX, "udhcpc", "-i", "eth0", "-n", "-q",
             "-t", "20", "-T", "1", "-s", "/bin/true"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        took = (time.perf_counter() - started) * 1000
        if "obtained" not in result.stdout + result.stderr:
            raise RuntimeError(f"no lease: {result.stdout} {result.stderr}")
        return took


def _active(port: Any) -> bool:
    return port is not None and port.status == "ACTIVE"
