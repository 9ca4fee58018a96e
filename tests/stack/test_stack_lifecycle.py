"""`podwire stack up/down` as a user runs it: restart without loss, no leftovers, clear errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.stack import procs
from podwire.stack.client import start_background
from tests.conftest import PODWIRE, neutron_connection, start_stack


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODWIRE, *args], capture_output=True, text=True, timeout=120)


def wait_gone(pids: list[int], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(procs.running(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


async def etcd_roundtrip(url: str, value: bytes | None) -> bytes | None:
    async with await EtcdClient.connect(EtcdSettings(endpoints=[url])) as client:
        if value is not None:
            await client.put("/podwire-test/stack-restart", value)
        kv = await client.get("/podwire-test/stack-restart")
        return kv.value if kv else None


@pytest.mark.slow
def test_restart_keeps_data_and_leaves_nothing_behind(work_dir: Path) -> None:
    data_dir = work_dir / "lifecycle"
    proc, info = start_stack(data_dir)
    children = [pid for name, pid in info["pids"].items() if name != "supervisor"]
    network = neutron_connection(info["neutron"]).network.create_network(
        name="survivor", project_id="lifecycle"
    )
    assert asyncio.run(etcd_roundtrip(info["etcd"], b"kept")) == b"kept"

    second = run_cli("stack", "up", "--data-dir", str(data_dir))
    assert second.returncode == 2
    assert "already running" in second.stderr and "Traceback" not in second.stderr
    assert json.loads((data_dir / "stack.json").read_text())["pids"] == info["pids"]

    down = run_cli("stack", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stderr
    assert proc.wait(timeout=30) == 0
    assert wait_gone(children)
    assert not (data_dir / "stack.json").exists()

    with socket.socket() as squatter:  # the old Neutron port is now taken by someone else
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", info["ports"]["neutron"]))
        squatter.listen()
        proc, again = start_stack(data_dir)
    try:
        assert again["ports"]["neutron"] != info["ports"]["neutron"]
        assert again["etcd"] == info["etcd"]
        found = neutron_connection(again["neutron"]).network.get_network(network.id)
        assert found.name == "survivor"
        assert asyncio.run(etcd_roundtrip(again["etcd"], None)) == b"kept"
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # a crash: the children must not outlive it
    proc.wait()
    assert wait_gone([pid for name, pid in again["pids"].items() if name != "supervisor"])
    assert (data_dir / "stack.json").exists()  # stale, to be cleaned by the next command
    assert run_cli("stack", "down", "--data-dir", str(data_dir)).returncode == 0
    assert not (data_dir / "stack.json").exists()


def test_stale_stack_json_children_are_stopped_but_strangers_are_not(tmp_path: Path) -> None:
    ours = subprocess.Popen(["sleep", "300"])
    stranger = subprocess.Popen(["sleep", "301"])
    try:
        (tmp_path / "stack.json").write_text(
            json.dumps(
                {
                    "pids": {"supervisor": 999999, "etcd": ours.pid, "neutron": stranger.pid},
                    "cmdlines": {
                        "supervisor": "gone",
                        "etcd": procs.cmdline(ours.pid),
                        "neutron": "a command line that pid never had",
                    },
                }
            )
        )
        result = run_cli("stack", "down", "--data-dir", str(tmp_path))
        assert result.returncode == 0
        assert ours.wait(timeout=10) == -signal.SIGTERM
        assert stranger.poll() is None
        assert not (tmp_path / "stack.json").exists()
    finally:
        stranger.kill()
        ours.kill()
        stranger.wait()


def test_data_dir_that_is_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run_cli("stack", "up", "--data-dir", str(blocker / "stack"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"podwire stack: error: data dir {blocker / 'stack'} is not writable: Not a directory"
    ]


def test_data_dir_too_long_for_the_database_socket(tmp_path: Path) -> None:
    data_dir = tmp_path / ("d" * 100)
    result = run_cli("stack", "up", "--data-dir", str(data_dir))
    assert result.returncode == 2
    assert "too long" in result.stderr and "Traceback" not in result.stderr
    assert not (data_dir / "mysql").exists()


def test_down_without_a_stack(tmp_path: Path) -> None:
    result = run_cli("stack", "down", "--data-dir", str(tmp_path))
    assert result.returncode == 0
    assert "no stack running" in result.stderr


def test_version() -> None:
    result = subprocess.run([*PODWIRE, "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("podwire ")
    assert sys.executable


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


@pytest.mark.slow
def test_rpc_bus_runs_private_and_leaves_nothing_behind(work_dir: Path) -> None:
    import pwd

    from podwire.stack.netutil import port_open

    data_dir = work_dir / "lifecycle-rpc"
    proc, info = start_stack(data_dir, extra=("--rpc",))
    bus_ports = [info["ports"][name] for name in ("rabbitmq", "rabbitmq_dist", "epmd")]
    try:
        assert info["transport_url"] == f"rabbit://guest:guest@127.0.0.1:{bus_ports[0]}/"
        rabbitmq = pwd.getpwnam("rabbitmq").pw_uid
        assert _uid(info["pids"]["rabbitmq"]) == rabbitmq and _uid(info["pids"]["epmd"]) == rabbitmq
        listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
        for port in bus_ports:  # every socket of the bus on loopback only
            bound = [line.split()[3] for line in listening.splitlines() if f":{port} " in line]
            assert bound and all(a.startswith(("127.0.0.1:", "[::1]:")) for a in bound), bound
        assert (data_dir / "rabbitmq" / ".erlang.cookie").stat().st_uid == rabbitmq
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # a crash: neither the broker nor its epmd survive
    proc.wait()
    assert wait_gone([pid for name, pid in info["pids"].items() if name != "supervisor"])
    deadline = time.monotonic() + 30
    while any(port_open(port) for port in bus_ports) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(port_open(port) for port in bus_ports)
    assert run_cli("stack", "down", "--data-dir", str(data_dir)).returncode == 0

    # Without --rpc the same data dir is today's stack: no bus, no transport_url.
    proc, plain = start_stack(data_dir)
    try:
        assert "transport_url" not in plain
        assert not {"rabbitmq", "epmd", "rpc-server"} & set(plain["pids"])
    finally:
        assert run_cli("stack", "down", "--data-dir", str(data_dir)).returncode == 0
        proc.wait(timeout=60)


def test_a_start_interrupted_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or any error) while ``start_background`` waits for the stack: the supervisor
    is stopped with everything it started, not left running without its parent."""
    data_dir = tmp_path / "interrupted"
    waits = []

    def interrupted(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) > 5:
            raise KeyboardInterrupt

    monkeypatch.setattr("podwire.stack.client.time.sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        start_background(data_dir)
    monkeypatch.undo()
    assert wait_gone(procs.pids_marked(str(data_dir)))  # its children go as it goes
