"""The active ml2 worker's report for ``podwire status``: journal depth, lag, feedback revision.

Only the elected worker publishes, every few seconds; a reader treats a report older than a
few intervals as "no forwarder is running", which is exactly what an operator needs to see.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from podwire import keys
from podwire.errors import RetryableError
from podwire.etcd.client import EtcdClient
from podwire.log import get_inline_logger
from podwire.ml2.feedback import Feedback
from podwire.ml2.forwarder import Forwarder
from podwire.schema.records import Ml2Report

log = get_inline_logger(__name__)

STATUS_KEY = keys.status("ml2")
INTERVAL = 2.0


def report(
    identity: str, forwarder: Forwarder, feedback: Feedback, depth: tuple[int, float]
) -> bytes:
    watcher = feedback.watcher
    return Ml2Report(
        forwarder=identity,
        journal_depth=depth[0],
        journal_lag_seconds=depth[1],
        sent_rows=forwarder.sent_rows,
        feedback_revision=watcher.revision if watcher else 0,
        feedback_relists=watcher.relists if watcher else 0,
        policy_revision=forwarder.policy_revision,
        updated_at=time.time(),
    ).encode()


async def publish_forever(
    targets: Sequence[tuple[EtcdClient, Feedback]],
    identity: str,
    forwarder: Forwarder,
    depth: Callable[[], tuple[int, float]],
    interval: float = INTERVAL,
) -> None:
    """Into each deployment's namespace (a client in it, and the feedback following it); the
    journal's depth is read once for all of them."""
    while True:
        await asyncio.sleep(interval)
        if not forwarder.is_leader:
            continue
        try:
            measured = await asyncio.to_thread(depth)
            for client, feedback in targets:
                await client.put(STATUS_KEY, report(identity, forwarder, feedback, measured))
        except RetryableError as exc:
            log.warning("ml2.status.publish_failed", error=str(exc))
