"""Real QEMU VMs on taps QEMU creates in a simulated host, on a bridge with a real dnsmasq.

The test plays the agent's part (it puts the tap on the bridge); podwire's adoption of taps is
tested in the agent's suite. Each boot takes a few seconds with KVM and 5-15 s with TCG on a
busy machine, hence ``slow``; the boot and lease times are printed (``pytest -s``).
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest

from podwire.errors import VmCommandTimeout
from podwire.schema.ports import tap_name
from podwire.vm import image, launcher
from tests.agent.netenv import in_ns, links_in, pings
from tests.vm import lan as lans

pytestmark = pytest.mark.slow


def _spec(run_dir: Path, host: str, port_id: str, mac: str, dhcp: bool = True) -> launcher.VmSpec:
    tap = tap_name(port_id)
    return launcher.VmSpec("vm-" + port_id[:8], tap, mac, run_dir, host, dhcp=dhcp)


def _boot(
    spec: launcher.VmSpec, lan: lans.Lan, vm_image: image.Image, vms: list[launcher.Vm]
) -> launcher.Vm:
    vm = launcher.launch(spec, vm_image)
    vms.append(vm)
    lan.plug(spec.tap)
    vm.wait_ready()
    return vm


def _report(vm: launcher.Vm, lease: launcher.DhcpLease) -> None:
    times = vm.boot_times()
    print(
        f"\n{vm.accel.name} ({vm.accel.reason}): init {times.init:.2f} s, ready"
        f" {times.ready:.2f} s, first DISCOVER {times.discover:.2f} s, lease"
        f" {times.lease:.2f} s; DISCOVER -> lease {lease.discover_to_lease * 1000:.0f} ms"
    )


def test_vm_gets_its_lease_pings_and_restarts_on_the_same_tap(
    vm_image: image.Image,
    lan: lans.Lan,
    dnsmasq: Path,
    short_dir: Path,
    port_id: str,
    mac: str,
    vms: list[launcher.Vm],
) -> None:
    spec = _spec(short_dir / "vm", lan.host, port_id, mac)
    vm = _boot(spec, lan, vm_image, vms)
    details = in_ns(lan.host, "ip", "-d", "link", "show", spec.tap).stdout
    assert "tun type tap" in details and "persist off" in details  # QEMU's own tap

    lease = vm.wait_lease(timeout=60)
    _report(vm, lease)
    assert lease.address == ipaddress.IPv4Interface(f"{lans.VM_ADDRESS}/24")
    assert (lease.router, lease.server, lease.mtu) == (lans.SERVER, lans.SERVER, 1400)
    assert 0 < lease.discover_to_lease < lease.bound_at - vm.started_at
    assert vm.addresses() == [lease.address]
    assert "mtu 1400" in vm.check("ip link show eth0")
    assert mac in (dnsmasq / "leases").read_text()

    rc, output = vm.run(f"ping -c 3 -W 2 {lans.SERVER}")
    assert rc == 0 and "3 packets received" in output, output
    assert pings(lan.server, lans.VM_ADDRESS)

    vm.kill()
    assert not vm.alive()
    assert spec.tap not in links_in(lan.host)  # the tap went with QEMU
    assert not pings(lan.server, lans.VM_ADDRESS, timeout=1.0)

    again = _boot(spec, lan, vm_image, vms)  # a "restarted" VM: new QEMU, same tap and MAC
    assert again.pid != vm.pid
    relet = again.wait_lease(timeout=60)
    _report(again, relet)
    assert relet.address == lease.address
    assert pings(lan.server, lans.VM_ADDRESS)
    rc, output = again.run(f"ping -c 1 -W 2 {lans.SERVER}")
    assert rc == 0, output


def test_command_channel_returns_output_and_exit_codes(
    vm_image: image.Image,
    lan: lans.Lan,
    short_dir: Path,
    port_id: str,
    mac: str,
    vms: list[launcher.Vm],
) -> None:
    vm = _boot(_spec(short_dir / "vm", lan.host, port_id, mac, dhcp=False), lan, vm_image, vms)
    assert vm.wait_event("dhcp off", timeout=5).text == "dhcp off"
    assert tuple(vm.run("echo out; echo err >&2; exit 7")) == (7, "out\nerr\n")
    assert vm.run("true") == (0, "")
    tricky = "a'b\"c $HOME `x` \\ %s"
    assert vm.run(f"printf '%s\\n' {_quote(tricky)}").output == tricky + "\n"
    assert vm.run("for i in 1 2 3; do\n  echo line $i\ndone").output == "line 1\nline 2\nline 3\n"
    big = vm.run("head -c 100000 /dev/zero | tr '\\0' a").output
    assert big == "a" * 65536  # output is capped at 64 KiB
    assert vm.run("printf '\\001\\377'").output == "\x01\ufffd"  # bytes, decoded leniently
    rc, _ = vm.run("sleep 300 >/dev/null 2>&1 &")  # a daemon left behind answers at once
    assert rc == 0
    with pytest.raises(VmCommandTimeout):
        vm.run("sleep 30", timeout=2)
    assert vm.run("echo still here") == (0, "still here\n")
    assert vm.run("uname -r").output.strip() == vm_image.manifest.kernel.release


def test_guest_serves_dhcp_and_sends_from_a_second_address(
    vm_image: image.Image,
    lan: lans.Lan,
    short_dir: Path,
    port_id: str,
    mac: str,
    vms: list[launcher.Vm],
) -> None:
    """What the hostile-VM tests need: udhcpd in the guest answers a client on the LAN, and
    the guest can add an address and send from it."""
    vm = _boot(_spec(short_dir / "vm", lan.host, port_id, mac, dhcp=False), lan, vm_image, vms)
    own, spoofed = f"{lans.SUBNET}.7", f"{lans.SUBNET}.99"
    vm.check(f"ip addr add {own}/24 dev eth0")
    vm.check(_udhcpd_config(own) + "udhcpd /tmp/udhcpd.conf")  # daemonises
    client = lan.peer_namespace("c1")
    offer = in_ns(
        client,
        "busybox",
        "udhcpc",
        "-i",
        "eth0",
        "-n",
        "-q",
        "-t",
        "5",
        "-T",
        "1",
        "-s",
        "/bin/true",
        check=False,
    )
    assert f"obtained from {own}" in offer.stdout + offer.stderr, offer

    vm.check(f"ip addr add {spoofed}/24 dev eth0")
    assert [str(a.ip) for a in vm.addresses()] == [own, spoofed]
    rc, output = vm.run(f"ping -c 2 -W 2 -I {spoofed} {lans.SERVER}")
    assert rc == 0, output
    neighbour = in_ns(lan.server, "ip", "neigh", "show", spoofed).stdout
    assert mac in neighbour  # the server saw the spoofed source from the VM's MAC


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _udhcpd_config(router: str) -> str:
    lines = [
        f"start {lans.SUBNET}.200",
        f"end {lans.SUBNET}.210",
        "interface eth0",
        "lease_file /tmp/udhcpd.leases",
        "opt subnet 255.255.255.0",
        f"opt router {router}",
    ]
    body = "\\n".join(lines)
    return f"printf '{body}\\n' >/tmp/udhcpd.conf && touch /tmp/udhcpd.leases && "


def test_start_command_runs_stdin_in_the_guest_and_stops_at_its_end(
    vm_image: image.Image, lan: lans.Lan, short_dir: Path, port_id: str, mac: str
) -> None:
    argv = [
        *(sys.executable, "-m", "podwire.cli.main", "vm", "start", "--port-id", port_id),
        *("--mac", mac, "--netns", lan.host, "--run-dir", str(short_dir / "cli"), "--no-dhcp"),
        *("--image", str(vm_image.directory)),
    ]
    result = subprocess.run(
        argv,
        input="echo hello from $(uname -n)\nexit 3\n",
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    tap = tap_name(port_id)
    assert lines[0].startswith("vm podwire-vm: pid ") and f"tap {tap} in {lan.host}" in lines[0]
    assert lines[1:] == ["hello from podwire-vm", "[exit 3]"]
    assert tap not in links_in(lan.host)  # stopped at the end of stdin; the tap went with it
