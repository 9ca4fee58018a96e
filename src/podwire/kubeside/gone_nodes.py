"""A Node deleted from the Kubernetes API releases what podwire held for it, through the
node-removal path an operator's ``podwire nodes remove`` takes (``VifBroker.remove_node``):
its pods went with it, so their ports are deleted at once instead of waiting out
``pool.node_release_after`` for a dead agent.

Only a deletion seen by this term's Node informer counts (a watch event, or a relist's
difference): a node the API never had (a VM host, a scripted node) is never judged, and a
Node deleted while no controller led is left to what covers it anyway (its pods' deletion
releases their ports through ``gone_pods``, the sweeper frees a dead agent's pools). A
removal that fails (Neutron away, not serving yet) is kept and tried again after a
backoff."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from podwire.backoff import Backoff, passes_on_wake
from podwire.errors import PodwireError
from podwire.k8s.cache import DELETED, Event
from podwire.k8s.nodes import K8sNode
from podwire.kubeside.pools import TermPorts
from podwire.log import get_logger

log = get_logger(__name__)

REASON = "deleted"  # podwire_nodes_released_total's label for these
RemoveNode = Callable[[str, str], Awaitable[list[str]]]


class GoneNodes:
    def __init__(self, service: TermPorts, remove_node: RemoveNode) -> None:
        """``remove_node``: ``VifBroker.remove_node`` (ports deleted, records dropped, pools
        freed; repeating it is harmless)."""
        self._service = service
        self._remove_node = remove_node
        self._backoff = Backoff(1.0, 30.0)
        self._deleted: set[str] = set()
        self._wake = asyncio.Event()

    def on_event(self, event: Event[K8sNode]) -> None:
        """The Node informer's listener."""
        if event.type == DELETED:
            self._deleted.add(event.key.name)
            self._wake.set()
        elif event.key.name in self._deleted:  # made again before its removal ran
            self._deleted.discard(event.key.name)

    async def run(self) -> None:
        def retry(exc: PodwireError, delay: float) -> None:
            log.warning("controller.gone_nodes.retry", error=str(exc), delay=delay)

        await passes_on_wake(self.release_deleted, self._wake, self._backoff, retry)

    async def release_deleted(self) -> None:
        for node in sorted(self._deleted):
            if self._holds(node):
                await self._remove_node(node, REASON)
            self._deleted.discard(node)

    def _holds(self, node: str) -> bool:
        """Whether podwire holds anything for the node: a Node it never served is no news."""
        service = self._service
        return any(n == node for n, _ in service.attachments) or any(
            key.node == node for key in service.pools.pool_keys()
        )
