"""Starting a VM whose NIC is a tap QEMU creates, as libvirt does for ``<interface
type='ethernet'>``, inside a host's network namespace; and stopping it by its PID.

QEMU gets ``-netdev tap,ifname=<tap>,script=no,downscript=no``: it opens /dev/net/tun in the
namespace it runs in (``ip netns exec``), so the tap appears there, down, with no address and
on no bridge; whoever serves the port (podwire's agent, or a test playing its part) brings it
up and plugs it. The tap lives as long as QEMU: killing QEMU removes it, and a VM "restarted"
is a new QEMU on the same tap name and MAC.

Both serial ports are unix sockets QEMU listens on and *waits* on (``wait=on``) before it
creates the NIC and starts the guest: ttyS0, the console (``console.ConsoleFollower``), and
ttyS1, the command channel (``channel.ControlChannel``). Nothing the guest writes is lost.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import StackError, ValidationError, VmError
from podwire.log import get_logger
from podwire.netlink import is_netns, netns_path
from podwire.schema import fields
from podwire.schema.vmguest import parse_lease
from podwire.stack import procs
from podwire.stack.netutil import wait_until
from podwire.vm import accel as accelerators
from podwire.vm.channel import CommandResult, ControlChannel
from podwire.vm.console import ConsoleEvent, ConsoleFollower
from podwire.vm.image import Image, default_dir, find, load

log = get_logger("podwire.vm")

QEMU = "qemu-system-x86_64"
TUN_DEVICE = "/dev/net/tun"
MEMORY_RANGE = (96, 4096)  # MiB; the kernel (a 60 MB image in memory) needs ~96 at boot
UNIX_PATH_MAX = 107
KERNEL_ARGS = (
    "console=ttyS0",
    "panic=-1",  # with -no-reboot: if init dies, QEMU exits instead of hanging
    "quiet",  # warnings and worse only: the console is for podwire's events and errors
    "cryptomgr.notests",  # the crypto self-tests cost TCG ~0.4 s
    "no_timer_check",  # the IO-APIC timer check, pointless in QEMU
    "i8042.noaux",  # no PS/2 mouse or keyboard to probe
    "i8042.nokbd",
    "i8042.nopnp",
    "8250.nr_uarts=2",  # ttyS0 and ttyS1 only
)


def unavailable(image_dir: Path | None = None) -> str | None:
    """Why no VM can start here (for a demo or test to say in one line), or None."""
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (Debian qemu-system-x86; scripts/setup installs it)"
    if not os.path.exists(TUN_DEVICE):
        return f"{TUN_DEVICE} is missing: QEMU cannot create taps"
    if find(image_dir) is None:
        return f"no VM image in {image_dir or default_dir()} (run `podwire vm build`)"
    return None


@dataclass(frozen=True)
class VmSpec:
    name: str  # for QEMU's -name and the logs
    tap: str  # the tap QEMU creates (tap_name(port_id) for a Neutron port)
    mac: str  # the NIC's MAC (the port's)
    run_dir: Path  # the sockets, console.log and qemu.log; a short path (unix sockets)
    netns: str | None = None  # the host's namespace (ip netns name); None: this process's
    memory_mb: int = 128
    accel: str = "auto"  # auto (KVM if it can run the guest, else TCG), kvm, tcg
    dhcp: bool = True  # the guest runs udhcpc on eth0 at boot

    def validated(self) -> VmSpec:
        try:
            fields.name(self.name, "VM name")
            fields.ifname(self.tap, "tap name")
            mac = fields.mac(self.mac, "MAC")
            fields.integer(self.memory_mb, "VM memory (MiB)", *MEMORY_RANGE)
        except ValidationError as exc:
            raise VmError(str(exc)) from exc
        if len(str(self.run_dir / "control.sock")) > UNIX_PATH_MAX:
            raise VmError(f"VM run directory {self.run_dir} is too long for a unix socket")
        if self.netns is not None and not is_netns(netns_path(self.netns)):
            raise VmError(f"network namespace {self.netns!r} does not exist")
        return VmSpec(**{**self.__dict__, "mac": mac})


@dataclass(frozen=True)
class DhcpLease:
    address: ipaddress.IPv4Interface
    router: str
    server: str
    mtu: int | None
    discover_at: float  # host monotonic time of the first DISCOVER (udhcpc's deconfig)
    bound_at: float  # host monotonic time the guest applied the lease

    @property
    def discover_to_lease(self) -> float:
        return self.bound_at - self.discover_at


@dataclass(frozen=True)
class BootTimes:
    """Seconds from QEMU's start; None for what has not happened (yet)."""

    accel: str
    init: float | None  # the guest's init began
    ready: float | None  # the command channel answered
    discover: float | None  # the first DHCP DISCOVER
    lease: float | None  # the lease was applied

    @property
    def discover_to_lease(self) -> float | None:
        return None if self.lease is None or self.discover is None else self.lease - self.discover


def qemu_argv(spec: VmSpec, image: Image, accel: accelerators.Accel) -> list[str]:
    """QEMU's command line (without the ``ip netns exec`` in front)."""
    kernel_args = [*KERNEL_ARGS, *([] if spec.dhcp else ["podwire_vm.dhcp=off"])]
    return [
        QEMU,
        *("-name", spec.name, "-machine", "pc", "-accel", accel.name),
        *(("-cpu", "host") if accel.name == "kvm" else ()),
        *("-m", str(spec.memory_mb), "-smp", "1"),
        *("-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"),
        *("-kernel", str(image.kernel), "-initrd", str(image.initrd)),
        *("-append", " ".join(kernel_args)),
        *_serial("console", spec.run_dir / "console.sock"),
        *_serial("control", spec.run_dir / "control.sock"),
        *("-netdev", f"tap,id=net0,ifname={spec.tap},script=no,downscript=no"),
        # romfile= : no iPXE option ROM to load and initialise (the VM boots its -kernel)
        *("-device", f"virtio-net-pci,netdev=net0,mac={spec.mac},romfile="),
    ]


def _serial(name: str, path: Path) -> list[str]:
    return [
        *("-chardev", f"socket,id={name},path={path},server=on,wait=on"),
        *("-serial", f"chardev:{name}"),
    ]


class Vm:
    """A running QEMU. Thread-safe; blocking calls (run an async test's through a thread)."""

    def __init__(
        self,
        spec: VmSpec,
        accel: accelerators.Accel,
        proc: subprocess.Popen[bytes],
        started_at: float,
    ) -> None:
        self.spec = spec
        self.accel = accel
        self.started_at = started_at  # host monotonic time QEMU was started
        self._proc = proc
        self._console: ConsoleFollower | None = None
        self._channel: ControlChannel | None = None
        self.ready_at = 0.0
        self._stopped = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait_exit(self, timeout: float | None = None) -> int:
        """QEMU's exit code once it has exited (the guest powered off, or a signal)."""
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise VmError(f"VM {self.spec.name} still runs after {timeout} s") from exc

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        """Run a shell command in the guest: its exit code and output (stdout + stderr)."""
        return self._control().call(command, timeout)

    def check(self, command: str, timeout: float = 30.0) -> str:
        """Like ``run``, but a non-zero exit code is a VmError carrying the output."""
        rc, output = self.run(command, timeout)
        if rc != 0:
            raise VmError(f"VM {self.spec.name}: {command!r} exited {rc}: {output.strip()}")
        return output

    def addresses(self) -> list[ipaddress.IPv4Interface]:
        """The IPv4 addresses on the guest's eth0."""
        out = self.check("ip -o -4 addr show dev eth0")
        words = [line.split() for line in out.splitlines()]
        return [ipaddress.IPv4Interface(w[w.index("inet") + 1]) for w in words if "inet" in w]

    def wait_event(self, prefix: str, timeout: float, after: float = 0.0) -> ConsoleEvent:
        found = self._follower().wait(prefix, timeout, after)
        if found is None:
            state = "running" if self.alive() else "exited"
            raise VmError(f"VM {self.spec.name} ({state}): no {prefix!r} within {timeout:.0f} s")
        return found

    def wait_lease(self, timeout: float = 60.0, after: float = 0.0) -> DhcpLease:
        """The first lease the guest applied after ``after`` (host monotonic time)."""
        bound = self.wait_event("dhcp bound ", timeout, after)
        discover = self._follower().wait("dhcp discover", 0, after)
        return _lease(bound, discover.at if discover else bound.at)

    def boot_times(self) -> BootTimes:
        follower = self._follower()

        def since_start(prefix: str) -> float | None:
            event = follower.wait(prefix, 0)
            return None if event is None else event.at - self.started_at

        return BootTimes(
            accel=self.accel.name,
            init=since_start("init "),
            ready=self.ready_at - self.started_at if self.ready_at else None,
            discover=since_start("dhcp discover"),
            lease=since_start("dhcp bound "),
        )

    def stop(self) -> None:
        """SIGTERM (QEMU exits at once), SIGKILL after 5 s; the tap goes with QEMU."""
        procs.stop_child(self._proc, timeout=5.0)
        self._closed()

    def kill(self) -> None:
        """SIGKILL, as a crash would end it."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._closed()

    def __enter__(self) -> Vm:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _closed(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._channel is not None:
            self._channel.close()
        if self._console is not None:
            self._console.join()
        log.info("vm.stopped", name=self.spec.name, pid=self.pid, rc=self._proc.returncode)

    def _control(self) -> ControlChannel:
        if self._channel is None:
            raise VmError(f"VM {self.spec.name} has no command channel")
        return self._channel

    def _follower(self) -> ConsoleFollower:
        if self._console is None:
            raise VmError(f"VM {self.spec.name} has no console")
        return self._console

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Return once the guest's command channel answers (its init has run)."""
        try:
            self._control().wait_ready(timeout)
        except VmError as exc:
            raise VmError(f"{exc}; qemu.log: {_tail(self.spec.run_dir / 'qemu.log')}") from exc
        self.ready_at = time.monotonic()
        log.info("vm.ready", name=self.spec.name, ready_s=round(self.ready_at - self.started_at, 3))

    def _connect(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        console = self._accept("console.sock", deadline)
        self._console = ConsoleFollower(console, self.spec.run_dir / "console.log", self.started_at)
        self._channel = ControlChannel(self._accept("control.sock", deadline), self.spec.name)

    def _accept(self, name: str, deadline: float) -> socket.socket:
        """Connect to a socket QEMU listens on (and waits on before it goes further)."""
        path = str(self.spec.run_dir / name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)

        def connected() -> bool:
            try:
                sock.connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                return False
            return True

        try:
            wait_until(connected, "QEMU", max(0.0, deadline - time.monotonic()), self.alive)
        except StackError as exc:
            sock.close()
            raise VmError(f"VM {self.spec.name}: {exc}") from exc
        return sock


def _lease(bound: ConsoleEvent, discover_at: float) -> DhcpLease:
    try:
        report = parse_lease(bound.text)
    except ValidationError as exc:
        raise VmError(f"the guest reported a malformed lease: {exc}") from exc
    return DhcpLease(
        report.address, report.router, report.server, report.mtu, discover_at, bound.at
    )


def launch(spec: VmSpec, image: Image | None = None, timeout: float = 30.0) -> Vm:
    """Start QEMU and return once it has both serial sockets connected: it is creating the
    tap and starting the guest. ``Vm.wait_ready`` waits for the guest; ``start`` does both.

    Start VMs from a thread that outlives them: QEMU gets a parent-death signal
    (``procs.spawn``), which Linux sends when the *thread* that started it ends.
    """
    spec = spec.validated()
    image = image or load()
    accel = accelerators.choose(spec.accel)
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("console.sock", "control.sock"):
        (spec.run_dir / name).unlink(missing_ok=True)
    netns = ["ip", "netns", "exec", spec.netns] if spec.netns else []
    started_at = time.monotonic()
    proc = procs.spawn([*netns, *qemu_argv(spec, image, accel)], spec.run_dir / "qemu.log")
    vm = Vm(spec, accel, proc, started_at)
    try:
        vm._connect(timeout)
    except BaseException as exc:
        vm.kill()
        if isinstance(exc, VmError):
            raise VmError(f"{exc}; qemu.log: {_tail(spec.run_dir / 'qemu.log')}") from exc
        raise
    log.info(
        "vm.launched",
        name=spec.name,
        pid=vm.pid,
        accel=accel.name,
        accel_reason=accel.reason,
        tap=spec.tap,
        mac=spec.mac,
        netns=spec.netns or "",
    )
    return vm


def start(spec: VmSpec, image: Image | None = None, ready_timeout: float = 120.0) -> Vm:
    """``launch``, then wait until the guest's command channel answers."""
    vm = launch(spec, image)
    try:
        vm.wait_ready(ready_timeout)
    except BaseException:
        vm.kill()
        raise
    return vm


def _tail(path: Path) -> str:
    """QEMU's last error line (``KVM internal error ...``, ``could not configure /dev/net/tun
    ...``), else its last line."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(none)"
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (errors or lines or ["(empty)"])[-1]
