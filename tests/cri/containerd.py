"""A private containerd (Debian's 1.6 + runc) for the tests and the CRI benchmark.

Own socket, root, state and CNI directories under one work dir, so it shares nothing with a
containerd the machine may run. It runs inside a simulated host's network namespace (as on a
node: the CNI plugins it execs, portmap's rules and the reference bridge live there), in the
machine's mount namespace (the agent opens the pod namespaces containerd mounts). Its CRI
plugin reads conflists from ``conf_dir`` and execs plugins from ``bin_dir``: Debian's reference
plugins (the CRI also needs ``loopback``) and whatever ``podwire cni install`` puts there. The
sandbox image is the offline pause image from ``image.py``. ``restrict_oom_score_adj`` because
this VM lacks CAP_SYS_RESOURCE for containerd's default.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cri.image import IMAGE, build_archive

REFERENCE_PLUGINS = Path("/usr/lib/cni")


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
  sandbox_image = "{IMAGE}"
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
        (target / plugin.name).symlink_to(plugin)
    return target


@dataclass
class Containerd:
    """One private containerd; ``start`` returns once its CRI answers."""

    work: Path
    netns: str = ""  # a name under /run/netns; empty: the caller's namespace
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
        self.work.mkdir(parents=True, exist_ok=True)
        reference_plugins(self.bin_dir)
        self.conf_dir.mkdir(exist_ok=True)
        self.config_file.write_text(_config(self.work, self.bin_dir, self.conf_dir))

    def start(self, timeout: float = 30.0) -> None:
        log = self.work / f"containerd-{len(self.log_files)}.log"
        self.log_files.append(log)
        with log.open("wb") as out:
            enter = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
            self.proc = subprocess.Popen(
                [*enter, "containerd", "--config", str(self.config_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not answer in {timeout} s: {self.log_tail()}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        if not os.path.exists(self.socket):
            return False
        return self.ctr("version", check=False).returncode == 0

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", self.socket, "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def import_image(self, archive: Path | None = None) -> None:
        """The pause image (``archive``, else built here), imported (and unpacked) into the
        CRI's namespace."""
        self.ctr("images", "import", str(archive or build_archive(self.work)))

    def stop(self) -> None:
        """SIGTERM containerd only: its shims and the sandboxes they run keep running."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_files:
            return ""
        text = self.log_files[-1].read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def write_conflist(self, conflist: dict[str, Any]) -> Path:
        """Make ``conflist`` the only one (written atomically: the CRI watches the dir)."""
        path = self.conf_dir / f"10-{conflist['name']}.conflist"
        for old in self.conf_dir.iterdir():
            if old != path:
                old.unlink()
        tmp = self.conf_dir / f".{path.name}.tmp"
        tmp.write_text(json.dumps(conflist))
        tmp.rename(path)
        return path

    def cleanup(self) -> None:
        """After every sandbox is removed: stop containerd, end shims it left, unmount, rm."""
        self.stop()
        for pid in self._shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mount in reversed(self._mounts()):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
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

    def _mounts(self) -> list[str]:
        prefix = str(self.work) + "/"
        with open("/proc/self/mounts") as fh:
            return [line.split()[1] for line in fh if line.split()[1].startswith(prefix)]
