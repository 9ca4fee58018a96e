"""The interface driver in a process of its own (``ifdriver_proc.py``), called line by line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

PROC = Path(__file__).with_name("ifdriver_proc.py")


class DriverProc:
    def __init__(self, host: str, host_netns: str, adopt_timeout: float = 0.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PROC), host, host_netns, str(adopt_timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def call(self, method: str, *args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"method": method, "args": list(args)}) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def plug(self, port_id: str, device: str, mac: str, namespace: str, mtu: int) -> Any:
        return self.call("plug", "net", port_id, device, mac, None, namespace, None, mtu)

    def unplug(self, device: str, namespace: str) -> Any:
        return self.call("unplug", device, None, namespace, None)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
