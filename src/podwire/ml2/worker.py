"""The background thread each Neutron API worker runs: feedback and forwarder on asyncio.

Neutron serves requests on plain threads (no eventlet monkey patching under gunicorn), so the
worker owns a private event loop in a daemon thread. Every API worker runs one; the election
inside the forwarder makes exactly one of them active Neutron-wide. Request threads talk to
it only through thread-safe, non-blocking calls (``kick``).

One connection serves every deployment the driver lists: the forwarder writes keys as etcd
stores them (namespaces included) under one election, and each deployment's state is followed
through a view of the connection in that deployment's namespace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable

from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.log import get_inline_logger
from podwire.ml2.feedback import Feedback, PortStatusSink
from podwire.ml2.forwarder import Forwarder, ForwarderSettings, Journal
from podwire.ml2.host_cache import HostDirectory
from podwire.ml2.policy_resync import PolicySource
from podwire.ml2.status import publish_forever

log = get_inline_logger(__name__)

RESTART_DELAY = 1.0


class Worker:
    def __init__(
        self,
        etcd: EtcdSettings,
        hosts: HostDirectory,
        journal: Journal,
        sink: PortStatusSink,
        forwarder_settings: ForwarderSettings,
        journal_depth: Callable[[], tuple[int, float]] | None = None,
        policy: PolicySource | None = None,
    ) -> None:
        self._journal_depth = journal_depth
        self._policy = policy
        self._etcd = etcd
        self._hosts = hosts
        self._journal = journal
        self._sink = sink
        self._forwarder_settings = forwarder_settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: EtcdClient | None = None
        self._forwarder: Forwarder | None = None
        self._feedbacks: list[Feedback] = []
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._thread_main, name="podwire-ml2", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        loop = self._loop
        if loop is not None:
            for task in asyncio.all_tasks(loop):
                loop.call_soon_threadsafe(task.cancel)
        if self._thread is not None:
            self._thread.join(timeout)

    def kick(self) -> None:
        """Ask the active forwarder to drain now; never blocks the calling request thread."""
        loop, client, forwarder = self._loop, self._client, self._forwarder
        if loop is None or client is None or loop.is_closed():
            return  # the slow poll still picks the rows up
        if forwarder is not None and forwarder.is_leader:
            loop.call_soon_threadsafe(forwarder.wake)
            return
        coro = client.put(self._forwarder_settings.kick_key, b"")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        future.add_done_callback(_log_kick_failure)

    def _thread_main(self) -> None:
        while not self._stopping.is_set():
            try:
                asyncio.run(self._main())
            except asyncio.CancelledError:
                if self._stopping.is_set():
                    return  # stop() cancelled every task: the normal way out
                log.warning("ml2.worker.cancelled")
            except Exception:  # top level of the thread: log, then start over
                log.exception("ml2.worker.crashed")
            if not self._stopping.wait(RESTART_DELAY):
                log.info("ml2.worker.restarting")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        client = await EtcdClient.connect(self._etcd, check=False)
        self._client = client
        try:
            namespaces = [d.etcd_namespace for d in self._hosts.deployments]
            forwarder = Forwarder(
                client,
                self._journal,
                self._forwarder_settings,
                self._on_leadership,
                self._policy,
                namespaces,
            )
            views = {d.name: client.within(d.etcd_namespace) for d in self._hosts.deployments}
            feedbacks = {
                name: Feedback(
                    view, self._hosts.caches[name], self._sink, lambda: forwarder.is_leader
                )
                for name, view in views.items()
            }
            self._forwarder = forwarder
            self._feedbacks = list(feedbacks.values())
            async with asyncio.TaskGroup() as group:
                group.create_task(forwarder.run())
                for feedback in feedbacks.values():
                    group.create_task(feedback.run())
                if self._journal_depth is not None:
                    targets = [(views[name], feedback) for name, feedback in feedbacks.items()]
                    identity = self._forwarder_settings.identity
                    report = publish_forever(targets, identity, forwarder, self._journal_depth)
                    group.create_task(report)
        finally:
            self._forwarder = None
            self._feedbacks = []
            self._client = None
            await client.close()

    def _on_leadership(self, leader: bool) -> None:
        log.info("ml2.worker.leadership", leader=leader)
        for feedback in self._feedbacks if leader else []:
            if feedback.cache.synced.is_set():
                # Whatever the previous leader left undone is redone from the full picture.
                feedback.request_resync()


def _log_kick_failure(future: concurrent.futures.Future[int]) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.warning("ml2.kick.failed", error=str(exc))
