"""A stack with a 3-member etcd and two neutron-servers, and the faults the tests inject.

Members are found by their pids in stack.json; a killed member is started again from the
command line the stack recorded for it (the test owns that process and stops it at the end).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from podwire.stack import procs

CLUSTER_ARGS = ("--etcd-members", "3", "--neutron-servers", "2", "--workers", "1")


class Cluster:
    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.endpoints: list[str] = list(info["etcd_endpoints"])
        self.pids: dict[str, int] = {
            f"etcd-{i}": int(info["pids"][f"etcd-{i}"]) for i in range(1, len(self.endpoints) + 1)
        }
        self.restarted: list[subprocess.Popen[bytes]] = []
        self.stopped: set[str] = set()

    def member_status(self, name: str) -> dict[str, Any] | None:
        url = self.endpoints[int(name.split("-")[1]) - 1] + "/v3/maintenance/status"
        request = urllib.request.Request(url, data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=1) as response:
                body: dict[str, Any] = json.loads(response.read())
                return body
        except OSError:
            return None

    def leader(self) -> str:
        """The member that is the raft leader now (waits for one)."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for name in self.pids:
                status = self.member_status(name) if name not in self.stopped else None
                if status and status.get("leader") == status["header"]["member_id"]:
                    return name
            time.sleep(0.1)
        raise AssertionError("the etcd cluster has no leader")

    def follower(self) -> str:
        leader = self.leader()
        return next(name for name in self.pids if name != leader and name not in self.stopped)

    def kill(self, name: str) -> None:
        os.kill(self.pids[name], signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pids[name], os.WNOHANG)
        self.stopped.add(name)

    def freeze(self, name: str) -> None:
        os.kill(self.pids[name], signal.SIGSTOP)
        self.stopped.add(name)

    def thaw(self, name: str) -> None:
        os.kill(self.pids[name], signal.SIGCONT)
        self.stopped.discard(name)

    def restart(self, name: str) -> None:
        """Start a killed member again from its recorded command line (data dir kept)."""
        argv = self.info["cmdlines"][name].split()
        log = Path(self.info["data_dir"]) / "logs" / f"{name}.restarted.out"
        proc = procs.spawn(argv, log)
        self.restarted.append(proc)
        self.pids[name] = proc.pid
        self.stopped.discard(name)
        deadline = time.monotonic() + 30
        while self.member_status(name) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not come back; see {log}")
            time.sleep(0.1)

    def heal(self) -> None:
        """Every member running again (after a test that failed half-way)."""
        for name in list(self.stopped):
            try:
                self.thaw(name)
            except ProcessLookupError:
                self.restart(name)
            if self.member_status(name) is None:
                self.restart(name)

    def close(self) -> None:
        for name in list(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                self.thaw(name)
        for proc in self.restarted:
            procs.stop_child(proc, timeout=10)
