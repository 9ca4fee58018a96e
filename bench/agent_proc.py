"""The agent as its own process for the CNI benchmark, as it runs in production.

Run in a thread of the benchmark's process, the agent would share a GIL with the threads that
exec the plugins, and the measured burst would mostly be that contention. Ports come from a
file of pre-built VIFs (what a warm pool hands out), so ADD measures the agent's work only.

``python -m bench.agent_proc CONFIG VIFS`` prints ``ready`` once the CNI socket is open and
stops on SIGTERM; ``AgentProcess`` starts it so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from podwire.agent.app import Agent
from podwire.config import load_settings
from podwire.log import setup_logging
from podwire.schema.vif import Vif, VifRequest

ROOT = Path(__file__).resolve().parents[1]


class PrebuiltVifs:
    """A VIF source over ports created before the clock starts."""

    def __init__(self, vifs: list[Vif]) -> None:
        self._free = list(vifs)
        self._used: dict[str, Vif] = {}

    async def request(self, req: VifRequest, deadline: float) -> Vif:
        if req.attachment not in self._used:
            self._used[req.attachment] = self._free.pop()
        return self._used[req.attachment]

    async def release(self, attachment: str, vif: Vif | None) -> None:
        taken = self._used.pop(attachment, None)
        if taken is not None:
            self._free.append(taken)

    async def healthy(self) -> tuple[bool, str]:
        return True, "prebuilt"


class AgentProcess:
    """This module in its own process, its config and VIFs written to ``work`` (the agent on
    a simulated host at ``host_ns``, VTEP 192.0.2.1); ``start`` returns once its socket is open."""

    def __init__(
        self,
        work: Path,
        stack: dict[str, Any],
        host: str,
        host_ns: str,
        enforce: bool = True,
        vifs: tuple[Vif, ...] = (),
    ) -> None:
        self.socket = str(work / "agent.sock")
        config, prebuilt = work / "agent.toml", work / "vifs.json"
        config.write_text(
            f'[etcd]\nendpoints = ["{stack["etcd"]}"]\n'
            f'[agent]\nhost = "{host}"\ncni_socket = "{self.socket}"\nstate_dir = "{work}/state"\n'
            f'vtep_ip = "192.0.2.1"\nhost_netns = "{host_ns}"\n'
            f'security_groups = "{"enforce" if enforce else "off"}"\n'
        )
        prebuilt.write_text(json.dumps([vif.to_json() for vif in vifs]))
        self._argv = [sys.executable, "-m", "bench.agent_proc", str(config), str(prebuilt)]
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            self._argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("the benchmark agent did not start")

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


async def _serve(config: str, vifs: list[Vif]) -> None:
    settings = load_settings(config)
    setup_logging(settings.log)  # logs cost time per ADD in production too
    agent = Agent(settings, PrebuiltVifs(vifs))
    task = asyncio.create_task(agent.run())
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    await agent.parts.started.wait()
    print("ready", flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await task


if __name__ == "__main__":
    prebuilt = [Vif.from_json(raw) for raw in json.loads(Path(sys.argv[2]).read_text())]
    asyncio.run(_serve(sys.argv[1], prebuilt))
