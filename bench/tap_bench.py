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

from bench.agent_proc import AgentProcess
from bench.harness import delete_project, forget_nodes, project_network, stack_etcd, wait_for
from bench.stats import row
from podwire import keys
from podwire.neutron.client import neutron_connection
from podwire.schema.ports import tap_name
from tests.agent.netenv import NetEnv, in_ns
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
        self.env = NetEnv()
        self.tag, self.host = self.env.tag, f"{self.env.tag}-host"
        self.conn = neutron_connection(stack["neutron"])
        self.project = uuid.uuid4().hex
        self.work = Path(tempfile.mkdtemp(prefix="pwb-tap-", dir="/tmp"))
        self.agent: AgentProcess | None = None
        self.dhcp: NeutronAgentRun | None = None
        self.loop = asyncio.new_event_loop()
        self.etcd = self.loop.run_until_complete(stack_etcd(stack))

    def __enter__(self) -> _Node:
        self.host_ns = self.env.namespace("h")
        in_ns(self.host_ns, "ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
        self.agent = AgentProcess(self.work, self.stack, self.host, self.host_ns)
        self.agent.start()
        self.dhcp = NeutronAgentRun(
            Path(self.stack["data_dir"]), self.host, self.host_ns, self.work / "dhcp.out"
        )
        _wait(lambda: any(a.is_alive for a in self.conn.network.agents(host=self.host)))
        return self

    def __exit__(self, *exc: object) -> None:
        delete_project(self.conn, self.project)
        if self.dhcp is not None:
            self.dhcp.stop()
        if self.agent is not None:
            self.agent.stop()
        self.env.cleanup()
        self.loop.run_until_complete(forget_nodes(self.etcd, self.host))
        self.loop.run_until_complete(self.etcd.close())
        self.loop.close()

    # -- tap appears -> ACTIVE -----------------------------------------------------------

    def tap_rows(self, samples: int) -> list[dict[str, Any]]:
        network, _ = project_network(self.conn, self.project, self.tag, "10.97.0.0/24", False)
        wired: list[float] = []
        active: list[float] = []
        for _ in range(samples):
            port = self.conn.network.create_port(
                network_id=network.id, project_id=self.project, device_owner="compute:nova",
                device_id=str(uuid.uuid4()), binding_host_id=self.host,
            )  # fmt: skip
            _wait(lambda port=port: self._key(keys.node_port(self.host, port.id)))
            guest = self.env.namespace(f"g{len(self.env.namespaces)}")
            started = time.perf_counter()
            in_ns(self.host_ns, "ip", "link", "add", tap_name(port.id), "type", "veth",
                  "peer", "eth0", "netns", guest)  # fmt: skip
            _wait(lambda port=port: self._key(keys.state_port(self.host, port.id)))
            wired.append((time.perf_counter() - started) * 1000)
            _wait(lambda port=port: self.conn.network.get_port(port.id).status == "ACTIVE")
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

    def _key(self, key: str) -> bool:
        return self.loop.run_until_complete(self.etcd.get(key)) is not None

    # -- DHCP ----------------------------------------------------------------------------

    def dhcp_rows(self, samples: int) -> list[dict[str, Any]]:
        served: list[float] = []
        leases: list[float] = []
        for i in range(samples):
            network, _ = project_network(self.conn, self.project, self.tag, f"10.98.{i}.0/24")
            started = time.perf_counter()  # the subnet's create call returned
            _wait(lambda network=network: _active(dhcp_port(self.conn, network.id)))
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
        guest = self.env.namespace(f"l{len(self.env.namespaces)}")
        in_ns(self.host_ns, "ip", "link", "add", tap_name(port.id), "type", "veth", "peer",
              "eth0", "netns", guest)  # fmt: skip
        in_ns(guest, "ip", "link", "set", "eth0", "address", port.mac_address, "up")
        _wait(lambda: self.conn.network.get_port(port.id).status == "ACTIVE")
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


def _wait(ready: Any) -> Any:
    return wait_for(ready, 120.0, POLL)


def _active(port: Any) -> bool:
    return port is not None and port.status == "ACTIVE"
