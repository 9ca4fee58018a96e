"""The launcher's logic without QEMU: names, QEMU's command line, the spec's validation, the
accelerator choice, and the channel and console protocols against a scripted peer (the real
guest answers them in tests/vm)."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Callable, Iterator
from ipaddress import IPv4Interface
from pathlib import Path

import pytest

from podwire.errors import ConfigError, ValidationError, VmCommandTimeout, VmError
from podwire.schema.ports import tap_name
from podwire.schema.vmguest import LeaseReport, parse_lease
from podwire.schema.vmimage import ImageManifest, KernelRecord
from podwire.vm import accel, launcher
from podwire.vm.channel import ControlChannel
from podwire.vm.console import ConsoleFollower
from podwire.vm.image import Image

PORT_ID = "3f2a9c1e-5b7d-4e0f-9a8b-1c2d3e4f5a6b"


def test_tap_name_is_novas_tap_plus_the_first_eleven_characters() -> None:
    assert tap_name(PORT_ID) == "tap3f2a9c1e-5b"
    assert len(tap_name(PORT_ID)) == 14


def _image(tmp: Path) -> Image:
    record = KernelRecord("linux-image-x", "1", "r", ("virtio_net",), True, ("virtio_net",))
    return Image(tmp, ImageManifest(record, "1", "0" * 64))


def _spec(tmp: Path, **changes: object) -> launcher.VmSpec:
    values: dict[str, object] = {
        "name": "vm1",
        "tap": tap_name(PORT_ID),
        "mac": "FA:16:3E:00:00:01",
        "run_dir": tmp,
    }
    values.update(changes)
    return launcher.VmSpec(**values)  # type: ignore[arg-type]


def test_qemu_creates_the_tap_as_libvirt_does_with_the_ports_mac(tmp_path: Path) -> None:
    spec = _spec(tmp_path).validated()
    argv = launcher.qemu_argv(spec, _image(tmp_path), accel.Accel("tcg", "test"))
    joined = " ".join(argv)
    assert "-netdev tap,id=net0,ifname=tap3f2a9c1e-5b,script=no,downscript=no" in joined
    assert "-device virtio-net-pci,netdev=net0,mac=fa:16:3e:00:00:01,romfile=" in joined
    assert "-accel tcg" in joined and "-cpu host" not in joined
    assert f"-kernel {tmp_path}/kernel/vmlinux" in joined  # the PVH ELF
    assert "server=on,wait=on" in joined  # QEMU waits for the console and the channel
    assert "podwire_vm.dhcp=off" not in joined
    kvm = launcher.qemu_argv(_spec(tmp_path, dhcp=False), _image(tmp_path), accel.Accel("kvm", "t"))
    assert (
        "-cpu" in kvm and "host" in kvm and "podwire_vm.dhcp=off" in kvm[kvm.index("-append") + 1]
    )


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"mac": "01:00:5e:00:00:01"}, "not a unicast MAC"),
        ({"mac": "nope"}, "not a MAC address"),
        ({"tap": "tap" + "x" * 13}, "tap name"),
        ({"memory_mb": 16}, "memory"),
        ({"netns": "pwvm-no-such-namespace"}, "does not exist"),
        ({"run_dir": Path("/tmp/" + "d" * 100)}, "too long for a unix socket"),
    ],
)
def test_bad_specs_are_refused_naming_the_problem(
    tmp_path: Path, changes: dict[str, object], problem: str
) -> None:
    with pytest.raises(VmError, match=problem):
        _spec(tmp_path, **changes).validated()


def test_accelerator_is_kvm_only_with_a_hardware_kvm_module(tmp_path: Path) -> None:
    assert accel.choose("tcg") == accel.Accel("tcg", "asked for")
    with pytest.raises(ConfigError, match="not one of"):
        accel.choose("hvf")
    (tmp_path / "kvm_pvm").mkdir()
    assert "PVM" in (accel.hardware_problem(tmp_path) or "")
    (tmp_path / "kvm_intel").mkdir()
    assert accel.hardware_problem(tmp_path) is None
    assert accel.hardware_problem(tmp_path / "empty") == (
        "no hardware KVM module (kvm_intel, kvm_amd) is loaded"
    )


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    host, guest = socket.socketpair()
    yield host, guest
    host.close()
    guest.close()


def _guest(sock: socket.socket, answer: Callable[[bytes], bytes]) -> threading.Thread:
    """A scripted guest: reads request lines and writes whatever ``answer`` makes of each."""

    def serve() -> None:
        buffer = b""
        while True:
            try:
                chunk = sock.recv(4096)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                sock.sendall(answer(line))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _result(request_id: bytes, rc: int, output: bytes) -> bytes:
    return b"podwire-vm result %s %d %s\n" % (request_id, rc, base64.b64encode(output))


def test_channel_pairs_answers_with_requests_and_skips_noise(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    host, guest = pair
    seen: list[str] = []

    def answer(line: bytes) -> bytes:
        request_id, _, script = line.split(b" ")
        seen.append(base64.b64decode(script).decode())
        stale = _result(b"999", 0, b"an answer nobody waits for")
        return b"kernel noise\r\n" + stale + _result(request_id, 3, b"out\n")

    guest.sendall(b"garbage\npodwire-vm ready\r\n")
    _guest(guest, answer)
    channel = ControlChannel(host, "vm1")
    channel.wait_ready(5)
    assert tuple(channel.call("echo 'x y'", 5)) == (3, "out\n")
    assert channel.call("true", 5).rc == 3
    assert seen == ["echo 'x y'", "true"]


def test_channel_reports_a_guest_that_is_gone_or_silent(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    host, guest = pair
    channel = ControlChannel(host, "vm1")
    with pytest.raises(VmError, match="took too long to start"):
        channel.wait_ready(0.2)
    with pytest.raises(VmError, match="outside"):
        channel.call("true", 0)
    guest.sendall(b"podwire-vm result 1 0 !!notbase64\n")
    with pytest.raises(VmError, match="malformed answer"):
        channel.call("true", 5)
    guest.close()
    with pytest.raises(VmError, match="closed"):
        channel.call("true", 5)


def test_channel_turns_a_kill_at_the_limit_into_a_timeout(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    host, guest = pair

    def killed_late(line: bytes) -> bytes:
        time.sleep(1.05)
        return _result(line.split(b" ")[0], 137, b"")

    _guest(guest, killed_late)
    with pytest.raises(VmCommandTimeout, match="ran over its 1 s"):
        ControlChannel(host, "vm1").call("sleep 9", 1)


def test_console_stamps_lines_keeps_events_and_ends_with_the_socket(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    host, guest = pair
    started = time.monotonic()
    follower = ConsoleFollower(host, tmp_path / "console.log", started)
    guest.sendall(b"[    1.0] kernel says hi\r\npodwire-vm: init 6.1\r\n[  2.0] x podwire-vm: dhcp")
    assert follower.wait("dhcp", 0.2) is None  # the line is not complete yet
    guest.sendall(b" discover eth0\r\n")
    event = follower.wait("dhcp discover", 5)
    assert event is not None and event.text == "dhcp discover eth0" and event.at >= started
    assert [e.text for e in follower.events()] == ["init 6.1", "dhcp discover eth0"]
    guest.close()
    follower.join()
    assert follower.wait("dhcp bound", 5) is None  # closed: no waiting for what cannot come
    log = (tmp_path / "console.log").read_text().splitlines()
    assert log[0].startswith("[+") and log[0].endswith("kernel says hi")
    assert len(log) == 3


def test_lease_reports_from_the_guest_are_read_strictly() -> None:
    report = parse_lease("dhcp bound ip=10.99.0.5/24 router=10.99.0.1 server=10.99.0.1 mtu=1400")
    assert report == LeaseReport(IPv4Interface("10.99.0.5/24"), "10.99.0.1", "10.99.0.1", 1400)
    assert parse_lease("dhcp renew ip=10.0.0.9/8 router= server=10.0.0.1 mtu=").mtu is None
    for bad, problem in [
        ("dhcp bound ip=10.99.0.5 router=", "prefix length"),
        ("dhcp bound ip=224.0.0.1/24", "unicast"),
        ("dhcp bound ip=10.0.0.9/24 mtu=12", "mtu"),
        ("dhcp bound ip=10.0.0.9/24 mtu=x", "not a number"),
        ("dhcp bound ip=10.0.0.9/24 router=300.1.1.1", "router"),
        ("dhcp discover eth0", "not a lease event"),
    ]:
        with pytest.raises(ValidationError, match=problem):
            parse_lease(bad)


def test_unavailable_says_what_is_missing(tmp_path: Path) -> None:
    reason = launcher.unavailable(tmp_path / "no-image")
    assert reason is not None
    assert "no VM image in" in reason or "is not installed" in reason or "/dev/net/tun" in reason
