"""`podwire stack up --etcd-auth`: its etcd refuses anonymous clients, its neutron-server's ml2
driver works as the stack's server user, and ``grant-node --data-dir`` users see only their own
desired ports."""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.config import ControllerSettings, EtcdSettings, NeutronSettings, Settings
from podwire.controller.app import Controller
from podwire.errors import ConfigError
from podwire.etcd.client import EtcdClient
from podwire.etcd.errors import EtcdPermissionDenied
from podwire.neutron.client import connect
from podwire.stack.etcd_auth import AUTH_DIR
from tests.conftest import PODWIRE, neutron_connection, start_stack, stop_stack
from tests.ml2.conftest import status_is
from tests.ml2.test_stack_binding import vxlan_network
from tests.scripted_agent import ScriptedAgent, bound_on, eventually

pytestmark = pytest.mark.stack


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODWIRE, *args], capture_output=True, text=True, timeout=120)


def grant(data_dir: Path, *args: str) -> EtcdSettings:
    done = cli("etcd", *args, "--data-dir", str(data_dir))
    assert done.returncode == 0, done.stderr
    fields = dict(line.split(" = ", 1) for line in done.stdout.splitlines())
    assert list(fields) == ["user", "password"]
    info = json.loads((data_dir / "stack.json").read_text())
    return EtcdSettings(
        endpoints=[info["etcd"]],
        user=json.loads(fields["user"]),
        password=json.loads(fields["password"]),
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_stack_with_etcd_auth(work_dir: Path) -> None:
    data_dir = work_dir / "authstack"
    proc, info = start_stack(data_dir, extra=("--etcd-auth", "--workers", "1"))
    try:
        assert info["etcd_auth"] is True
        assert mode(data_dir / AUTH_DIR) == 0o700
        assert {mode(p) for p in (data_dir / AUTH_DIR).iterdir()} == {0o600}
        assert mode(data_dir / "neutron-etc" / "neutron.conf") == 0o600
        async with await EtcdClient.connect(EtcdSettings(endpoints=[info["etcd"]])) as anonymous:
            with pytest.raises(ConfigError, match="requires authentication"):
                await anonymous.get(keys.KICK)
        await bind_through_the_server_user(data_dir, info)
    finally:
        assert stop_stack(proc) == 0
    refused = cli("stack", "up", "--data-dir", str(data_dir))
    assert refused.returncode == 2
    assert "has authentication enabled: add --etcd-auth" in refused.stderr
    stopped = cli("etcd", "grant-node", "n1", "--data-dir", str(data_dir))
    assert stopped.returncode == 2
    expected = f"podwire etcd: error: --data-dir: no stack is running on {data_dir}"
    assert stopped.stderr.strip() == expected


async def bind_through_the_server_user(data_dir: Path, info: dict[str, Any]) -> None:
    host, other = f"auth-{data_dir.stat().st_ino}", "auth-other"
    node = grant(data_dir, "grant-node", host)
    assert grant(data_dir, "grant-node", host) == node  # a re-run prints the same lines
    controller = grant(data_dir, "grant-server", "ctl-1", "--component", "controller")
    neutron = neutron_connection(info["neutron"])
    async with (
        await EtcdClient.connect(node) as node_etcd,
        await EtcdClient.connect(controller) as controller_etcd,
    ):
        agent = ScriptedAgent(node_etcd, host)
        await agent.register()
        network, _ = vxlan_network(neutron, "authstack")
        port = await bound_on(neutron, network, "authstack", host)
        desired = await eventually(lambda: agent.desired(port.id), "desired key for the node")
        assert desired["port_id"] == port.id
        await agent.wire(port.id)
        await eventually(lambda: status_is(neutron, port.id, "ACTIVE"), "ACTIVE")
        mirrored, _ = await controller_etcd.get_prefix(keys.nodes_prefix())
        assert keys.node_port(host, port.id) in {kv.key for kv in mirrored}
        await node_etcd.get_prefix(keys.node_ports_prefix(other))  # what backs its claims
        with pytest.raises(EtcdPermissionDenied):
            await node_etcd.put(keys.node_port(other, port.id), b"{}")
        with pytest.raises(EtcdPermissionDenied):
            await node_etcd.put(keys.state_alive(other), b"{}")
        with pytest.raises(EtcdPermissionDenied):
            await controller_etcd.put(keys.node_port(host, port.id), b"{}")
        await controller_recovers(controller_etcd, info["neutron"], host)


async def controller_recovers(etcd: EtcdClient, neutron: str, host: str) -> None:
    """A controller with the controller role campaigns, recovers and serves."""
    settings = Settings(
        neutron=NeutronSettings(endpoint=neutron),
        controller=ControllerSettings(
            listen="127.0.0.1:0", admin_token="admin", node_tokens={host: "t"}
        ),
    )
    controller = Controller(settings, etcd, connect(settings.neutron))
    task = asyncio.create_task(controller.run())
    try:

        async def serving() -> bool:
            if task.done():
                task.result()  # raises what stopped it
            return (await controller.ready())[0]

        await eventually(serving, "controller ready", timeout=60)
        leader = await etcd.get(keys.election("controller"))
        assert leader is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
