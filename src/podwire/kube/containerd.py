"""A private containerd (Debian's 1.6 + runc) for a local Kubernetes node, the containerd tests
and the CRI benchmark.

Own socket, root, state and CNI directories under one work dir, so it shares nothing with a
containerd the machine may run. It runs inside a simulated host's network namespace (as on a
node: the CNI plugins it execs, portmap's rules and the reference bridge live there), in the
machine's mount namespace (the agent opens the pod namespaces containerd mounts). Its CRI
plugin reads conflists from ``conf_dir`` and execs plugins from ``bin_dir``: Debian's reference
plugins (the CRI also needs ``loopback``) and whatever ``podwire cni install`` puts there. The
sandbox image is the offline pause image from ``images``. ``restrict_oom_score_adj`` because
a VM may lack CAP_SYS_RESOURCE for containerd's default. The streaming server (exec, attach,
port-forward) listens on the namespace's loopback, where a kubelet of that namespace reaches it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from podwire.errors import KubeError
from podwire.kube import mounts
from podwire.kube.images import PAUSE_IMAGE, build_pause_archive
from podwire.stack import procs

REFERENCE_PLUGINS = Path("/usr/lib/cni")
# The longest path containerd binds below its work dir; a unix socket path has 108 bytes.
LONGEST_SOCKET = "containerd.sock.ttrpc"
SOCKET_PATH_MAX = 107


def _config(work: Path, bin_dir: Path, conf_dir: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{work}/root"
state = "{work}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{work}/containerd.sock"
[ttrpc]
  address = "{work}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{work}/opt"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [{cri}.cni]
    bin_dir = "{bin_dir}"
    conf_dir = "{conf_dir}"
    max_conf_num = 1
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
"""


def reference_plugins(target: Path) -> Path:
    """A CNI bin dir with every reference plugin (symlinks)."""
    target.mkdir(parents=True, exist_ok=True)
    for plugin in REFERENCE_PLUGINS.iterdir():
        link = target / plugin.name
        if not link.is_symlink():
            link.symlink_to(plugin)
    return target


def check_installed() -> None:
    """containerd, runc and ctr, as scripts/setup installs them from Debian."""
    missing = [name for name in ("containerd", "runc", "ctr") if shutil.which(name) is None]
    if missing:
        raise KubeError(
            f"{', '.join(missing)} not found on PATH: run scripts/setup"
            " (it installs Debian's containerd and runc)"
        )


@dataclass
class Containerd:
    """One private containerd; ``start`` returns once its CRI answers."""

    work: Path
    netns: str = ""  # a name under /run/netns; empty: the caller's namespace
    log_dir: Path | None = None  # default: the work dir (removed by ``cleanup``)
    proc: subprocess.Popen[bytes] | None = None
    log_files: list[Path] = field(default_factory=list)

    @property
    def socket(self) -> str:
        return str(self.work / "containerd.sock")

    @property
    def bin_dir(self) -> Path:
        return self.work / "cni-bin"

    @property
    def conf_dir(self) -> Path:
        return self.work / "cni-conf"

    @property
    def config_file(self) -> Path:
        return self.work / "config.toml"

    def prepare(self) -> None:
        longest = self.work / LONGEST_SOCKET
        if len(str(longest)) > SOCKET_PATH_MAX:
            raise KubeError(
                f"containerd's socket path {longest} is longer than a unix socket path may be"
                f" ({SOCKET_PATH_MAX} bytes): use a shorter data dir"
            )
        self.work.mkdir(parents=True, exist_ok=True)
        reference_plugins(self.bin_dir)
        self.conf_dir.mkdir(exist_ok=True)
        self.config_file.write_text(_config(self.work, self.bin_dir, self.conf_dir))

    def start(self, timeout: float = 30.0) -> None:
        log = (self.log_dir or self.work) / f"containerd-{len(self.log_files)}.log"
        self.log_files.append(log)
        enter = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        argv = [*enter, "containerd", "--config", str(self.config_file)]
        self.proc = procs.spawn(argv, log, new_session=True)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise KubeError(f"containerd exited {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise KubeError(f"containerd did not answer in {timeout} s: {self.log_tail()}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        if not os.path.exists(self.socket):
            return False
        return self.ctr("version", check=False).returncode == 0

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["ctr", "--address", self.socket, "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if check and done.returncode != 0:
            raise KubeError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done

    def import_image(self, archive: Path | None = None) -> None:
        """An image archive (default: the pause image, built here), imported (and unpacked)
        into the CRI's namespace."""
        self.ctr("images", "import", str(archive or build_pause_archive(self.work)))

    def stop(self) -> None:
        """SIGTERM containerd only: its shims and the sandboxes they run keep running."""
        if self.proc is None:
            return
        procs.stop_child(self.proc, timeout=30)
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_files:
            return ""
        text = self.log_files[-1].read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def cleanup(self) -> None:
        """After every sandbox is removed (or after a crash): stop containerd, end shims it
        left, unmount what it mounted, remove its work dir."""
        self.stop()
        for pid in self._shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        mounts.unmount_under(self.work)
        shutil.rmtree(self.work, ignore_errors=True)

    def _shims(self) -> list[int]:
        """Shims of this containerd (their command line names its socket)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"containerd-shim-runc-v2" in argv[0] and self.socket.encode() in argv:
                    found.append(int(entry.name))
        return found
