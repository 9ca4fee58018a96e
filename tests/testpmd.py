"""DPDK's testpmd as a CNF run by a test or a benchmark: the real memif client (and the
af_packet reference for the bench). The demo and Kubernetes run it in a pod instead
(``podwire.kube.cnf``).

One forwarding lcore pinned with the main lcore on one CPU (``cpu``, default 1: ``--lcores=
0@1,1@1``): testpmd busy-polls, and the test machine's two cores are shared. Always stopped by
its pid.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

BINARY = "dpdk-testpmd"


def available() -> bool:
    return shutil.which(BINARY) is not None


def memif_vdev(socket: str, secret: str, mac: str, log2_ring: int | None = None) -> str:
    """DPDK's memif PMD as a client of ``socket`` (a path, not DPDK's default abstract name);
    ``log2_ring``: its rings' size, log2 of the slots (DPDK's default: 10)."""
    vdev = f"net_memif0,role=client,socket={socket},socket-abstract=no,secret={secret},mac={mac}"
    return vdev if log2_ring is None else f"{vdev},rsize={log2_ring}"


@dataclass
class Testpmd:
    __test__ = False
    vdev: str
    mode: str = "icmpecho"
    extra: tuple[str, ...] = ()
    log: Path | None = None
    netns: str = ""  # run inside this named namespace (the af_packet reference's veth is there)
    nice: int = 0  # below 0: a CNF with a core of its own, as in production (the bench's RTT)
    cpu: int = 1
    prefix: str = field(default_factory=lambda: f"pw{uuid.uuid4().hex[:8]}")
    proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def memif_client(cls, socket: str, secret: str, mac: str, **kw: object) -> Testpmd:
        return cls(memif_vdev(socket, secret, mac), **kw)  # type: ignore[arg-type]

    def start(self) -> None:
        argv = [
            *(["ip", "netns", "exec", self.netns] if self.netns else []),
            *(["nice", "-n", str(self.nice)] if self.nice else []),
            BINARY,
            f"--lcores=0@{self.cpu},1@{self.cpu}",
            "--no-huge",
            "-m",
            "256",
            "--no-pci",
            "--file-prefix",
            self.prefix,
            f"--vdev={self.vdev}",
            "--",
            "--no-mlockall",
            "--total-num-mbufs=4096",
            f"--forward-mode={self.mode}",
            "-a",
            *self.extra,
        ]
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115
        # stdin stays open: testpmd exits at EOF on stdin ("Press enter to exit").
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=out)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        shutil.rmtree(f"/var/run/dpdk/{self.prefix}", ignore_errors=True)
