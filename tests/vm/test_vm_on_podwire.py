"""A real QEMU VM on a podwire network, served end to end.

Two simulated hosts with real agents enforcing security groups; Neutron's real DHCP agent on
host 1 (``podwire neutron-agent dhcp`` on the session's RPC bus); a VM (QEMU, TCG here) on a
``compute:nova`` port bound to host 1, on the tap QEMU makes as libvirt does; pods on host 2
through the real CNI plugin. Everything the guest does is through its command channel.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from podwire.schema.ports import tap_name
from podwire.vm import image, launcher
from tests.agent.conftest import enforcing_agents, hostnames  # noqa: F401
from tests.agent.harness import HostAgent, acni, plugin_binary
from tests.agent.netenv import NetEnv, in_ns, ping_settles
from tests.neutron_agents.agents import NeutronAgentRun, dhcp_port
from tests.neutron_agents.conftest import alive_in_neutron, dhcp_agents  # noqa: F401
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.slow, pytest.mark.stack]

CIDR = "10.79.0.0/24"


async def _status(neutron: Any, port_id: str, wanted: str, timeout: float = 60) -> float:
    """Seconds until the port's status is ``wanted``."""
    started = time.monotonic()

    async def probe() -> bool:
        return (await asyncio.to_thread(neutron.network.get_port, port_id)).status == wanted

    await eventually(probe, f"port {port_id} {wanted}", timeout=timeout)
    return time.monotonic() - started


async def _boot(spec: launcher.VmSpec, vm_image: image.Image, vms: list[launcher.Vm]) -> Any:
    vm = await asyncio.to_thread(launcher.launch, spec, vm_image)
    vms.append(vm)
    await asyncio.to_thread(vm.wait_ready)
    return vm


def _udhcpc(ns: str) -> str:
    """What a DHCP client in ``ns`` obtained, and from whom."""
    result = in_ns(
        ns, "busybox", "udhcpc", "-i", "eth0", "-n", "-q", "-t", "4", "-T", "2",
        "-s", "/bin/true", check=False,
    )  # fmt: skip
    return next((line for line in (result.stdout + result.stderr).splitlines()
                 if "obtained" in line), "")  # fmt: skip


@pytest.mark.skipif(launcher.unavailable() is not None, reason=str(launcher.unavailable()))
async def test_vm_gets_its_lease_is_filtered_and_survives_restarts(
    enforcing_agents: list[HostAgent],  # noqa: F811
    netenv: NetEnv,
    neutron: Any,
    project_id: str,
    dhcp_agents: Callable[..., NeutronAgentRun],  # noqa: F811
    vm_image: image.Image,
    short_dir: Path,
    vms: list[launcher.Vm],
    tmp_path: Path,
) -> None:
    h1, h2 = enforcing_agents
    net = neutron.network
    dhcp = dhcp_agents(h1.host, h1.netns)
    await alive_in_neutron(neutron, h1.host)
    network = net.create_network(name="pw-vm", project_id=project_id)
    net.create_subnet(network_id=network.id, cidr=CIDR, ip_version=4, project_id=project_id)

    async def served() -> Any:
        found = await asyncio.to_thread(dhcp_port, neutron, network.id)
        return found if found is not None and found.status == "ACTIVE" else None

    server = await eventually(served, "the DHCP port ACTIVE", timeout=90)
    server_ip = server.fixed_ips[0]["ip_address"]
    open_group = net.create_security_group(name="pw-vm-open", project_id=project_id)
    net.create_security_group_rule(
        security_group_id=open_group.id, direction="ingress", ethertype="IPv4", protocol="icmp"
    )
    closed = net.create_security_group(name="pw-vm-closed", project_id=project_id)
    port = net.create_port(
        network_id=network.id, project_id=project_id, device_owner="compute:nova",
        device_id=str(uuid.uuid4()), binding_host_id=h1.host, security_group_ids=[closed.id],
    )  # fmt: skip
    vm_ip = port.fixed_ips[0]["ip_address"]
    spec = launcher.VmSpec("pw-vm", tap_name(port.id), port.mac_address, short_dir / "vm", h1.netns)

    # Booted on the tap QEMU makes; adopted; its address from Neutron's DHCP agent.
    vm = await _boot(spec, vm_image, vms)
    lease = await asyncio.to_thread(vm.wait_lease, 120)
    assert str(lease.address.ip) == vm_ip and str(lease.server) == server_ip
    times = vm.boot_times()
    print(f"\nVM ({vm.accel.name}): QEMU start -> lease {times.lease:.2f} s,"
          f" DISCOVER -> lease {lease.discover_to_lease * 1000:.0f} ms")  # fmt: skip
    await _status(neutron, port.id, "ACTIVE")

    # A pod on host 2, across VXLAN: the VM's group has no ingress rule, so only the VM's
    # own (egress) pings pass; the rule created through Neutron admits the pod's.
    plugin = plugin_binary("c", tmp_path)
    pod_ns = netenv.namespace("pod")
    add = await acni(
        plugin, "ADD", h2.conf(network.id, securityGroups=[open_group.id]),
        container_id=uuid.uuid4().hex, netns=f"/run/netns/{pod_ns}",
    )  # fmt: skip
    assert add.code == 0, add.stdout
    pod_ip = add.json["ips"][0]["address"].split("/")[0]
    rc, out = await asyncio.to_thread(vm.run, f"ping -c 2 -W 2 {pod_ip}")
    assert rc == 0, out
    assert not await ping_settles(pod_ns, vm_ip, False, within=2.0)
    net.create_security_group_rule(
        security_group_id=closed.id, direction="ingress", ethertype="IPv4", protocol="icmp"
    )
    assert await ping_settles(pod_ns, vm_ip, True, within=10.0)

    # A spoofed source from the VM is dropped at its bridge port.
    rc, out = await asyncio.to_thread(
        vm.run, f"ip addr add 10.79.0.250/24 dev eth0; ping -c 2 -W 1 -I 10.79.0.250 {pod_ip}"
    )
    assert rc != 0, out
    # A DHCP server in the VM never answers: the pod's client gets Neutron's own answer.
    await asyncio.to_thread(vm.check, _udhcpd_in_guest(vm_ip))
    answered = await asyncio.to_thread(_udhcpc, pod_ns)
    assert f"lease of {pod_ip} obtained from {server_ip}" in answered, answered

    # The VM killed: DOWN; started again on the same tap: ACTIVE and pinging.
    await asyncio.to_thread(vm.kill)
    down = await _status(neutron, port.id, "DOWN")
    print(f"VM killed -> port DOWN: {down:.2f} s")
    vm = await _boot(spec, vm_image, vms)
    await asyncio.to_thread(vm.wait_lease, 120)
    await _status(neutron, port.id, "ACTIVE")
    assert await ping_settles(pod_ns, vm_ip, True, within=10.0)

    # The agent of the VM's host restarted while the VM runs: pings go on.
    flood = await asyncio.create_subprocess_exec(
        *("ip", "netns", "exec", pod_ns, "ping", "-q", "-i", "0.1", "-w", "12", vm_ip),
        stdout=asyncio.subprocess.PIPE,
    )
    await asyncio.sleep(1.0)
    await h1.stop()
    await h1.start()
    raw, _ = await asyncio.wait_for(flood.communicate(), 30)
    sent, got = _ping_counts(raw.decode())
    print(f"agent restart under pings: {got} of {sent} answered")
    assert sent - got <= sent // 10, raw

    # The DHCP agent restarted: leases still served.
    assert dhcp.stop() == 0
    dhcp_agents(h1.host, h1.netns)
    await alive_in_neutron(neutron, h1.host)
    await eventually(served, "the DHCP port ACTIVE again", timeout=90)

    async def renewed() -> bool:
        rc, _ = await asyncio.to_thread(vm.run, "udhcpc -i eth0 -n -q -t 3 -T 2 -s /bin/true", 30)
        return rc == 0

    await eventually(renewed, "a lease from the restarted DHCP agent", timeout=90)


def _udhcpd_in_guest(own: str) -> str:
    lines = [
        "start 10.79.0.200", "end 10.79.0.210", "interface eth0",
        "lease_file /tmp/udhcpd.leases", "opt subnet 255.255.255.0", f"opt router {own}",
    ]  # fmt: skip
    body = "\\n".join(lines)
    return (
        f"printf '{body}\\n' >/tmp/udhcpd.conf && touch /tmp/udhcpd.leases"
        " && udhcpd /tmp/udhcpd.conf"
    )


def _ping_counts(out: str) -> tuple[int, int]:
    sent = int(out.split(" packets transmitted")[0].rsplit("\n", 1)[1])
    got = int(out.split(" received")[0].rsplit(" ", 1)[1])
    return sent, got
