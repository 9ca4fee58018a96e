from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podwire.stack import procs
from podwire.stack.etcd_server import EtcdServer
from podwire.stack.netutil import free_port, wait_until


@dataclass
class PrivateEtcd:
    """An etcd server of one test's own, which the test may stop and restart."""

    server: EtcdServer
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = procs.spawn(self.server.argv(), self.log)
        proc = self.proc
        wait_until(self.server.ready, "etcd", 30, alive=lambda: proc.poll() is None)

    async def stall(self, seconds: float) -> float:
        """Freeze the server (SIGSTOP) like a hung disk or a paused VM; the monotonic resume time.

        Connections stay open and nothing answers: clients see timeouts, not refusals.
        """
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)
        return time.monotonic()

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop_child(self.proc)
            self.proc = None


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[PrivateEtcd]:
    etcd = PrivateEtcd(
        EtcdServer(tmp_path / "etcd", free_port(), free_port()), tmp_path / "etcd.log"
    )
    etcd.start()
    yield etcd
    etcd.stop()
