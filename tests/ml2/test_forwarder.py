"""The forwarder against the real etcd and MariaDB: order, fencing, takeover, outage."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.errors import NotLeader
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher, WatchEvent
from podwire.ml2.forwarder import Forwarder, ForwarderSettings
from podwire.ml2.journal import SqlJournal
from podwire.stack.mariadb import MariaDB
from tests.ml2.journal_copy import copy_table, drop_table
from tests.ml2.test_stack_binding import bound_on, vxlan_network
from tests.scripted_agent import ScriptedAgent, eventually

pytestmark = pytest.mark.stack


@pytest.fixture
def own_journal(stack: dict[str, Any]) -> Iterator[tuple[SqlJournal, str, str]]:
    """A journal table of this test's own, so Neutron's forwarders leave its rows alone."""
    name = f"pwj_{uuid.uuid4().hex[:12]}"
    url = MariaDB(Path(stack["data_dir"])).url
    table = copy_table(name)
    journal = SqlJournal(url, table)
    journal.create_table()
    yield journal, url, name
    journal.close()
    drop_table(url, table)


class Recorder:
    """Every change under a prefix, in revision order, as a watcher (an agent) sees them."""

    def __init__(self, etcd: EtcdClient, prefix: str) -> None:
        self.events: list[WatchEvent] = []
        self._watcher = PrefixWatcher(etcd, prefix)

    async def run(self) -> None:
        async for batch in self._watcher.batches():
            self.events.extend(batch.events)

    def history(self) -> dict[str, list[int]]:
        seen: dict[str, list[int]] = {}
        for event in self.events:
            if event.kind == "put":
                seen.setdefault(event.key, []).append(int(event.value))
        return seen


@contextlib.asynccontextmanager
async def recording(etcd: EtcdClient, prefix: str) -> AsyncIterator[Recorder]:
    recorder = Recorder(etcd, prefix)
    task = asyncio.create_task(recorder.run())
    try:
        yield recorder
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def assert_in_order(history: dict[str, list[int]], final: dict[str, int]) -> None:
    assert set(history) == set(final)
    for key, seen in history.items():
        assert seen == sorted(seen), f"{key} went backwards: {seen}"
        assert seen[-1] == final[key]


def settings_for(prefix: str, name: str) -> ForwarderSettings:
    return ForwarderSettings(
        identity=name, election_key=prefix + "election", kick_key=prefix + "kick", lease_ttl=2,
        batch_size=5, poll_interval=0.2,
    )  # fmt: skip


async def test_stale_leader_cannot_write(
    etcd: EtcdClient, prefix: str, own_journal: tuple[SqlJournal, str, str]
) -> None:
    journal = own_journal[0]
    journal.append(prefix + "data/x", "1")
    settings = settings_for(prefix, "a")
    stale = Forwarder(etcd, journal, settings)
    lease = await etcd.grant_lease(30)
    await etcd.put(settings.election_key, b"someone-else", lease=0)
    with pytest.raises(NotLeader):
        await stale.drain_once(lease)
    assert await etcd.get(prefix + "data/x") is None
    assert journal.count() == 1
    await etcd.put(settings.election_key, b"a", lease=lease.id)
    assert await stale.drain_once(lease) == 1
    assert (await etcd.get(prefix + "data/x")) is not None and journal.count() == 0
    await lease.revoke()


async def test_killed_forwarder_is_replaced_without_loss_or_reordering(
    etcd: EtcdClient, prefix: str, own_journal: tuple[SqlJournal, str, str], stack: dict[str, Any]
) -> None:
    journal, url, table = own_journal
    final: dict[str, int] = {}
    for index in range(400):
        key = f"{prefix}data/k{index % 15}"
        journal.append(key, str(index))
        final[key] = index
    settings = settings_for(prefix, "b")
    argv = [
        sys.executable, "-m", "tests.ml2.forwarder_proc", stack["etcd"], url, table,
        settings.election_key, settings.kick_key,
    ]  # fmt: skip
    async with recording(etcd, prefix + "data/") as recorder:
        first = await asyncio.create_subprocess_exec(*argv)
        try:
            await eventually(
                lambda: _some_sent(journal, 400), "the first forwarder started draining", 60
            )
        finally:
            os.kill(first.pid, signal.SIGKILL)
            await first.wait()
        left = journal.count()
        assert 0 < left < 400, "the kill must land mid-drain"
        second = Forwarder(etcd, journal, settings)
        task = asyncio.create_task(second.run())
        try:
            await eventually(lambda: _drained(journal), "journal drained by the successor", 60)
            await eventually(lambda: _caught_up(recorder, final), "watcher saw the final values")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert_in_order(recorder.history(), final)


async def _some_sent(journal: SqlJournal, total: int) -> bool:
    return await asyncio.to_thread(journal.count) < total - 20


async def _drained(journal: SqlJournal) -> bool:
    return await asyncio.to_thread(journal.count) == 0


async def _caught_up(recorder: Recorder, final: dict[str, int]) -> bool:
    history = recorder.history()
    return all(history.get(key, [-1])[-1] == value for key, value in final.items())


async def _outage_diagnosis(etcd: EtcdClient, journal: SqlJournal, final: dict[str, int]) -> str:
    stale = []
    for key in final:
        kv = await etcd.get(key)
        stale += [] if kv and json.loads(kv.value)["device_id"] == "10" else [key]
    report = await etcd.get(keys.status("ml2"))
    leader = await etcd.get(keys.election("forwarder"))
    return (
        f"{len(stale)} keys stale (e.g. {stale[:2]}), journal rows {journal.count()},"
        f" forwarder {leader.value if leader else None!r},"
        f" ml2 report {report.value[:300] if report else None!r}"
    )


@pytest.mark.slow
async def test_etcd_outage_during_200_port_updates(
    neutron: Any,
    project_id: str,
    agents: Callable[[], ScriptedAgent],
    etcd: EtcdClient,
    stack: dict[str, Any],
    journal: SqlJournal,
) -> None:
    agent = agents()
    await agent.register()
    network, _ = vxlan_network(neutron, project_id)
    ports = [
        await bound_on(neutron, network, project_id, agent.host, device_id="0") for _ in range(20)
    ]
    for port in ports:
        await eventually(lambda port=port: agent.desired(port.id), "initial desired key")

    async with recording(etcd, keys.node_ports_prefix(agent.host)) as recorder:
        etcd_pid = int(stack["pids"]["etcd"])
        os.kill(etcd_pid, signal.SIGSTOP)  # unreachable: connections hang, nothing is refused
        try:

            def update_all(port: Any) -> None:
                for index in range(1, 11):
                    neutron.network.update_port(port.id, device_id=str(index))

            with ThreadPoolExecutor(10) as pool:
                await asyncio.to_thread(lambda: list(pool.map(update_all, ports)))
            assert await asyncio.to_thread(journal.count) >= 200
        finally:
            os.kill(etcd_pid, signal.SIGCONT)

        final = {keys.node_port(agent.host, port.id): 10 for port in ports}

        async def converged() -> bool:
            for key in final:
                kv = await etcd.get(key)
                if kv is None or json.loads(kv.value)["device_id"] != "10":
                    return False
            return True

        try:
            await eventually(converged, "every key at its final value", 90)
        except AssertionError as exc:  # seen once in ~5 CI runs: say where it stuck
            raise AssertionError(
                f"{exc}; {await _outage_diagnosis(etcd, journal, final)}"
            ) from None
        await eventually(lambda: _drained(journal), "journal empty", 30)
        await eventually(lambda: _watched_final(recorder, final), "watcher saw the final values")
    history = _device_history(recorder)
    assert_in_order({key: history[key] for key in final}, final)


async def _watched_final(recorder: Recorder, final: dict[str, int]) -> bool:
    history = _device_history(recorder)
    return all(history.get(key, [-1])[-1] == value for key, value in final.items())


def _device_history(recorder: Recorder) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {}
    for event in recorder.events:
        if event.kind == "put":
            seen.setdefault(event.key, []).append(int(json.loads(event.value)["device_id"]))
    return seen
