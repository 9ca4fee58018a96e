"""Running real agents in-process on simulated hosts, and invoking the CNI plugin binaries."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import PIPE
from typing import Any

from podwire.agent.app import Agent
from podwire.agent.vifs.vifsource import VifSource
from podwire.cni.build import PYTHON_PLUGIN, build, prebuilt
from podwire.config import (
    AgentSettings,
    DevicePluginSettings,
    EtcdSettings,
    NeutronSettings,
    Settings,
)
from tests.agent.netenv import NetEnv


def plugin_binary(kind: str, tmp: Path) -> Path:
    """The C build from scripts/setup (built here if missing) or the Python fallback."""
    if kind == "python":
        return PYTHON_PLUGIN
    return prebuilt() or build(tmp / "podwire-cni").path


@dataclass
class CniCall:
    code: int
    stdout: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


def _invocation(
    binary: Path,
    command: str,
    conf: dict[str, Any] | str,
    container_id: str,
    netns: str,
    ifname: str,
    args: str,
    extra_env: dict[str, str] | None,
    path: str,
) -> tuple[list[str], dict[str, str], str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command}
    for key, value in (
        ("CNI_CONTAINERID", container_id),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", ifname),
        ("CNI_ARGS", args),
        ("CNI_PATH", path),
    ):
        if value:
            env[key] = value
    env.update(extra_env or {})
    stdin = conf if isinstance(conf, str) else json.dumps(conf)
    argv = [sys.executable, str(binary)] if binary.suffix == ".py" else [str(binary)]
    return argv, env, stdin


def cni(
    binary: Path,
    command: str,
    conf: dict[str, Any] | str,
    container_id: str = "",
    netns: str = "",
    ifname: str = "eth0",
    args: str = "",
    extra_env: dict[str, str] | None = None,
    path: str = "/usr/lib/cni",
) -> CniCall:
    """Run a plugin like a runtime would: env + config on stdin; returns exit code and stdout."""
    argv, env, stdin = _invocation(
        binary, command, conf, container_id, netns, ifname, args, extra_env, path
    )
    proc = subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True, timeout=120)
    return CniCall(proc.returncode, proc.stdout)


async def acni(
    binary: Path,
    command: str,
    conf: dict[str, Any] | str,
    container_id: str = "",
    netns: str = "",
    ifname: str = "eth0",
    args: str = "",
    extra_env: dict[str, str] | None = None,
    path: str = "/usr/lib/cni",
) -> CniCall:
    """``cni`` without a thread: agents under test share this event loop and its executor."""
    argv, env, stdin = _invocation(
        binary, command, conf, container_id, netns, ifname, args, extra_env, path
    )
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=PIPE, stdout=PIPE, stderr=PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin.encode()), 120)
    assert proc.returncode is not None
    return CniCall(proc.returncode, out.decode())


STOP_TIMEOUT = 30.0


@dataclass
class HostAgent:
    """One agent on one simulated host."""

    host: str
    netns: str
    vtep: str
    work: Path
    etcd: EtcdSettings
    neutron_endpoint: str
    vifs: VifSource | None = None
    physnets: dict[str, str] = field(default_factory=dict)
    ops_listen: str = ""
    heartbeat_ttl: int = 10
    deviceplugin: DevicePluginSettings = field(default_factory=DevicePluginSettings)
    # Security groups need the ml2 forwarder to publish them; tests of them turn this on.
    security_groups: str = "off"
    # Seconds from a pod's last DEL to releasing its memif grant (agent.pod_release_grace).
    pod_release_grace: float = 30.0
    task: asyncio.Task[None] | None = None
    agent: Agent | None = None

    @property
    def socket(self) -> str:
        return str(self.work / f"{self.host}.sock")

    def settings(self) -> Settings:
        return Settings(
            etcd=self.etcd,
            neutron=NeutronSettings(endpoint=self.neutron_endpoint),
            agent=AgentSettings(
                host=self.host,
                cni_socket=self.socket,
                state_dir=str(self.work / f"{self.host}-state"),
                vtep_ip=self.vtep,
                physnet_mappings=self.physnets,
                heartbeat_ttl=self.heartbeat_ttl,
                host_netns=self.netns,
                vif_source="neutron",
                cni_timeout=30.0,
                ops_listen=self.ops_listen,
                security_groups=self.security_groups,
                security_group_wait=2.0,
                pod_release_grace=self.pod_release_grace,
            ),
            deviceplugin=self.deviceplugin,
        )

    async def start(self) -> None:
        self.agent = Agent(self.settings(), self.vifs)
        self.task = asyncio.create_task(self.agent.run())
        started = asyncio.create_task(self.agent.parts.started.wait())
        done, _ = await asyncio.wait({self.task, started}, return_when=asyncio.FIRST_COMPLETED)
        if self.task in done:
            started.cancel()
            await self.task  # raises the start-up error
            raise AssertionError("agent stopped during start-up")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            done, _ = await asyncio.wait({self.task}, timeout=STOP_TIMEOUT)
            if not done:  # say where it hangs: pytest-timeout would show only threads
                for task in asyncio.all_tasks():
                    frames = [f"{f.f_code.co_filename}:{f.f_lineno}" for f in task.get_stack()]
                    print(f"{task!r}\n    " + "\n    ".join(frames))
                raise AssertionError(f"agent {self.host} did not stop in {STOP_TIMEOUT} s")
            self.task = None

    def conf(self, network: str, version: str = "1.1.0", **extra: Any) -> dict[str, Any]:
        return {
            "cniVersion": version,
            "name": "podwire-test",
            "type": "podwire",
            "network": network,
            "agentSocket": self.socket,
            **extra,
        }


async def cni_pod(
    agent: HostAgent, netenv: NetEnv, network: str, group: str, tmp: Path
) -> dict[str, str]:
    """A pod namespace given a port of ``network`` in security group ``group`` by a real CNI
    ADD through ``agent``; returns its namespace, address and MAC."""
    ns = netenv.namespace(f"p{uuid.uuid4().hex[:4]}")
    call = await acni(
        plugin_binary("c", tmp), "ADD", agent.conf(network, securityGroups=[group]),
        container_id=uuid.uuid4().hex, netns=f"/run/netns/{ns}",
    )  # fmt: skip
    assert call.code == 0, call.stdout
    pod = next(i for i in call.json["interfaces"] if i.get("sandbox"))
    return {"ns": ns, "ip": call.json["ips"][0]["address"].split("/")[0], "mac": pod["mac"]}
