"""Which other hosts are alive and where their VTEPs are, from ``/podwire/state/nodes/``.

VXLAN flood entries must follow hosts as they come and go; a host counts only while its
heartbeat key (bound to its lease) exists, so a dead host drops out when its lease expires.
Any node can write its own VTEP, so each one is checked before it becomes a flood entry here:
a unicast host address of this node's own VTEP family (the kernel refuses the other family on
a VXLAN device), not this node's own address; a bad one is logged and that peer left out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from podwire import keys
from podwire.errors import ValidationError
from podwire.etcd import EtcdClient, PrefixWatcher, WatchEvent
from podwire.log import get_logger
from podwire.schema import nodes as values

log = get_logger(__name__)

PeersChanged = Callable[[set[str]], Awaitable[None]]


class PeerTracker:
    def __init__(
        self, etcd: EtcdClient, host: str, on_change: PeersChanged, vtep_ip: str = ""
    ) -> None:
        self._etcd = etcd
        self._host = host
        self._own = ipaddress.ip_address(vtep_ip) if vtep_ip else None
        self._on_change = on_change
        self._alive: set[str] = set()
        self._vteps: dict[str, str] = {}
        self.peers: set[str] = set()
        self.watcher = PrefixWatcher(etcd, keys.state_prefix() + "nodes/")

    async def run(self) -> None:
        async for batch in self.watcher.batches():
            for event in batch.events:
                self._apply(event)
            await self._publish()

    def _apply(self, event: WatchEvent) -> None:
        parsed = keys.parse_state_key(event.key)
        if parsed is None or parsed[0] == self._host:
            return
        host, kind, _ = parsed
        if kind == "alive":
            if event.kind == "put":
                self._alive.add(host)
            else:
                self._alive.discard(host)
        elif kind == "vtep":
            self._apply_vtep(host, event)

    def _apply_vtep(self, host: str, event: WatchEvent) -> None:
        if event.kind == "delete":
            self._vteps.pop(host, None)
            return
        try:
            self._vteps[host] = self._check(values.parse_vtep(event.value, f"vtep of {host}"))
        except ValidationError as exc:
            log.warning("agent.peer.bad_vtep", host=host, error=str(exc))
            self._vteps.pop(host, None)

    def _check(self, vtep: str) -> str:
        if self._own is None:
            return vtep
        address = ipaddress.ip_address(vtep)
        if address.version != self._own.version:
            raise ValidationError(f"{vtep} is not IPv{self._own.version} like this node's VTEP")
        if address == self._own:
            raise ValidationError(f"{vtep} is this node's own VTEP")
        return vtep

    async def _publish(self) -> None:
        peers = {ip for host, ip in self._vteps.items() if host in self._alive}
        if peers != self.peers:
            log.info("agent.peers", peers=sorted(peers))
            self.peers = peers
            await self._on_change(set(peers))
