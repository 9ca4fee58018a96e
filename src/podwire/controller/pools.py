"""In-memory pools of ready ports: pure, synchronous bookkeeping with no I/O.

Everything that talks to Neutron or etcd lives elsewhere; this module only decides *which*
port goes where, so its rules (exact SG match first, reuse of the least recently refreshed
group, first-come-first-served waiters, recyclable ports, max size) can be unit tested exactly.

With a ``MirrorView`` (the controller's copy of the ml2 forwarder's mirror in etcd), a port is
handed out only in the state the mirror shows: a port whose binding the mirror does not show
yet waits, *unseen*, counted in its pool's size but never taken; a port the mirror shows
changed (re-addressed, other groups) is taken as it is now; one the mirror shows on another
node is not pooled here. The agent wires a port from that same mirror entry, so a port handed
out is one its node can wire. (Trunk subports are wired by the trunk's host, not from a node's
entry: they are taken as they came.)
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from podwire.schema.inuse import PoolKey, SgKey, sg_key
from podwire.schema.vif import Vif


@dataclass(frozen=True)
class Taken:
    """A port leaving a pool; ``sg_update`` is set when its SGs must be changed first."""

    vif: Vif
    key: PoolKey
    wanted: SgKey
    sg_update: bool


def _unheard(error: Exception) -> None:
    """A waiter nobody tells of failures (unit tests of the serving order)."""


@dataclass
class Waiter:
    """A request that found its pool empty; served in arrival order when ports arrive, or
    failed (``fail``) when no refill can give it one."""

    wanted: SgKey
    deliver: Callable[[Taken], None]
    fail: Callable[[Exception], None] = _unheard
    cancelled: bool = False


@dataclass
class _Pool:
    groups: OrderedDict[SgKey, list[str]] = field(default_factory=OrderedDict)
    waiters: deque[Waiter] = field(default_factory=deque)
    unseen: dict[str, None] = field(default_factory=dict)  # in arrival order

    def size(self) -> int:
        return sum(len(ports) for ports in self.groups.values()) + len(self.unseen)


class MirrorView(Protocol):
    """What the ml2 forwarder's mirror in etcd shows of a port of ours, as its controller has
    read it: its pool and its VIF now, None while it shows no binding of it."""

    def current(self, port_id: str) -> tuple[PoolKey, Vif] | None: ...


class PoolsView(Protocol):
    """The queries of ``Pools``: what tests and operators may read, never change."""

    def pool_keys(self) -> list[PoolKey]: ...
    def size(self, key: PoolKey) -> int: ...
    def waiting(self, key: PoolKey) -> int: ...
    def groups(self, key: PoolKey) -> list[tuple[SgKey, list[str]]]: ...
    def unseen(self, key: PoolKey) -> list[str]: ...
    def vif(self, port_id: str) -> Vif | None: ...
    def recyclable(self) -> dict[str, PoolKey]: ...
    def known(self, port_id: str) -> bool: ...
    def pool_of(self, port_id: str) -> PoolKey | None: ...


def _ignore_size(key: PoolKey, size: int) -> None:
    """No one watches the sizes (unit tests of the rules)."""


class Pools:
    """All pools of one controller. Ports are known by id; their VIF is kept with them.

    ``on_size`` hears every change of a pool's size, so a gauge of it is set in one place
    and cannot miss a path that moves ports.
    """

    def __init__(
        self,
        on_size: Callable[[PoolKey, int], None] = _ignore_size,
        mirror: MirrorView | None = None,
    ) -> None:
        self._on_size = on_size
        self._mirror = mirror  # None: every port is taken as it was added (unit tests)
        self._pools: dict[PoolKey, _Pool] = {}
        self._vifs: dict[str, Vif] = {}
        self._owner: dict[str, PoolKey] = {}
        self._recyclable: dict[str, PoolKey] = {}

    # --- queries ---------------------------------------------------------------------------

    def pool_keys(self) -> list[PoolKey]:
        return list(self._pools)

    def size(self, key: PoolKey) -> int:
        pool = self._pools.get(key)
        return pool.size() if pool else 0

    def waiting(self, key: PoolKey) -> int:
        pool = self._pools.get(key)
        return sum(not w.cancelled for w in pool.waiters) if pool else 0

    def groups(self, key: PoolKey) -> list[tuple[SgKey, list[str]]]:
        """The SG groups, least recently refreshed first (the order reuse picks from)."""
        pool = self._pools.get(key)
        return [(sgs, list(ports)) for sgs, ports in pool.groups.items()] if pool else []

    def unseen(self, key: PoolKey) -> list[str]:
        """Ports of the pool waiting for the mirror to show their binding."""
        pool = self._pools.get(key)
        return list(pool.unseen) if pool else []

    def vif(self, port_id: str) -> Vif | None:
        return self._vifs.get(port_id)

    def recyclable(self) -> dict[str, PoolKey]:
        return dict(self._recyclable)

    def known(self, port_id: str) -> bool:
        return port_id in self._vifs

    def pool_of(self, port_id: str) -> PoolKey | None:
        """The pool holding the port free; None when handed out, recycling or unknown."""
        return self._owner.get(port_id)

    # --- taking ----------------------------------------------------------------------------

    def take(self, key: PoolKey, wanted: SgKey) -> Taken | None:
        """A port for ``wanted``: the exact group's longest-pooled one first, else another
        group's oldest-refreshed one.

        Returns None when the pool is empty or earlier requests are still waiting (they go
        first, so a newcomer never overtakes them).
        """
        pool = self._pools.get(key)
        if pool is None or self._has_waiters(pool):
            return None
        return self._pop(key, pool, wanted)

    def wait(self, key: PoolKey, waiter: Waiter) -> None:
        self._pools.setdefault(key, _Pool()).waiters.append(waiter)

    def _has_waiters(self, pool: _Pool) -> bool:
        while pool.waiters and pool.waiters[0].cancelled:
            pool.waiters.popleft()
        return bool(pool.waiters)

    def _pop(self, key: PoolKey, pool: _Pool, wanted: SgKey) -> Taken | None:
        ports = pool.groups.get(wanted)
        if ports:
            # The longest-pooled port first: the node has had the most time to wire it, while
            # a port of a refill that just landed may still be on its way to the agent.
            return self._taken(ports.pop(0), key, wanted, sg_update=False)
        for sgs, others in pool.groups.items():
            if others and sgs != wanted:
                return self._taken(others.pop(0), key, wanted, sg_update=True)
        return None

    def _taken(self, port_id: str, key: PoolKey, wanted: SgKey, sg_update: bool) -> Taken:
        self._owner.pop(port_id, None)
        self._on_size(key, self.size(key))
        return Taken(self._vifs[port_id], key, wanted, sg_update)

    # --- adding ----------------------------------------------------------------------------

    def add(self, key: PoolKey, vifs: Iterable[Vif], oldest: bool = False) -> int:
        """Put ports into their SG groups, then hand them to waiters in arrival order.

        The receiving group becomes the most recently refreshed, unless ``oldest`` (ports that
        should be reused first, e.g. stripped of a removed SG). Returns how many stayed pooled.
        """
        pool = self._pools.setdefault(key, _Pool())
        for vif in vifs:
            mirrored = self._current(key, vif)
            if mirrored is None:
                self._vifs[vif.port_id] = vif
                self._owner[vif.port_id] = key
                pool.unseen[vif.port_id] = None
            elif mirrored[0] != key:  # bound elsewhere now: not a port of this pool
                self.forget(vif.port_id)
            else:
                self._group(key, pool, mirrored[1], oldest)
        self._serve_waiters(key, pool)
        self._on_size(key, pool.size())
        return pool.size()

    def _current(self, key: PoolKey, vif: Vif) -> tuple[PoolKey, Vif] | None:
        """The port as the mirror shows it; a trunk subport (nested: it has a VLAN) is wired
        by the trunk's host, so no node's entry shows it and it is taken as it came."""
        if self._mirror is None or vif.vlan_id is not None:
            return key, vif
        return self._mirror.current(vif.port_id)

    def _group(self, key: PoolKey, pool: _Pool, vif: Vif, oldest: bool) -> None:
        group = sg_key(vif.security_groups)
        self._vifs[vif.port_id] = vif
        self._owner[vif.port_id] = key
        pool.groups.setdefault(group, []).append(vif.port_id)
        pool.groups.move_to_end(group, last=not oldest)

    def seen(self, key: PoolKey, vif: Vif) -> bool:
        """The mirror shows this port (anew, or changed): an unseen port of ``key`` may be
        taken now, a free one is taken as it is now, one pooled under another key leaves
        its pool. Returns whether a free port of this pool was affected."""
        owner = self._owner.get(vif.port_id)
        if owner is None:
            if vif.port_id in self._vifs:  # in use or recycling: its release re-reads it
                self._vifs[vif.port_id] = vif
            return False
        if owner != key:
            self.forget(vif.port_id)
            return True
        pool = self._pools[key]
        if vif.port_id in pool.unseen:
            del pool.unseen[vif.port_id]
        elif self._vifs.get(vif.port_id) == vif:
            return False
        else:
            self._ungroup(pool, vif.port_id)
        self._group(key, pool, vif, oldest=False)
        self._serve_waiters(key, pool)
        self._on_size(key, pool.size())
        return True

    def fail_waiters(self, key: PoolKey, error: Callable[[], Exception]) -> int:
        """Fail every request waiting for this pool, each with its own ``error()``: no refill
        can serve them now (the subnets are full), so none waits for a refill of its own.
        Returns how many were failed."""
        pool = self._pools.get(key)
        failed = 0
        while pool is not None and pool.waiters:
            waiter = pool.waiters.popleft()
            if not waiter.cancelled:
                waiter.fail(error())
                failed += 1
        return failed

    def _serve_waiters(self, key: PoolKey, pool: _Pool) -> None:
        while self._has_waiters(pool):
            taken = self._pop(key, pool, pool.waiters[0].wanted)
            if taken is None:
                return
            pool.waiters.popleft().deliver(taken)

    # --- releasing, recycling, removing -----------------------------------------------------

    def adopt(self, key: PoolKey, vif: Vif) -> None:
        """Remember a port that is in use (recovered) so its release can be recycled."""
        self._vifs[vif.port_id] = vif

    def release(self, key: PoolKey, port_id: str) -> None:
        if port_id in self._vifs:
            self._recyclable[port_id] = key

    def finish_recycle(self, port_id: str) -> None:
        self._recyclable.pop(port_id, None)

    def forget(self, port_id: str) -> None:
        """Drop every trace of a port (deleted in Neutron, or handed to the unpooled driver)."""
        self._recyclable.pop(port_id, None)
        self._vifs.pop(port_id, None)
        key = self._owner.pop(port_id, None)
        pool = self._pools.get(key) if key else None
        if key is None or pool is None:
            return
        pool.unseen.pop(port_id, None)
        self._ungroup(pool, port_id)
        self._on_size(key, pool.size())

    @staticmethod
    def _ungroup(pool: _Pool, port_id: str) -> None:
        for sgs, ports in list(pool.groups.items()):
            if port_id in ports:
                ports.remove(port_id)
            if not ports:
                del pool.groups[sgs]

    def take_surplus(self, key: PoolKey, count: int) -> list[Vif]:
        """Remove up to ``count`` free ports, least recently refreshed groups first (the
        caller deletes them in Neutron)."""
        pool = self._pools.get(key)
        if pool is None:
            return []
        taken: list[Vif] = []
        for port_id in list(pool.unseen)[:count]:  # of no use until the mirror shows them
            del pool.unseen[port_id]
            self._owner.pop(port_id, None)
            taken.append(self._vifs.pop(port_id))
        for sgs in list(pool.groups):
            ports = pool.groups[sgs]
            while ports and len(taken) < count:
                port_id = ports.pop(0)
                self._owner.pop(port_id, None)
                taken.append(self._vifs.pop(port_id))
            if not ports:
                del pool.groups[sgs]
        self._on_size(key, pool.size())
        return taken

    def remove_key(self, key: PoolKey) -> list[Vif]:
        """Empty one pool completely; returns its ports (the caller deletes them)."""
        pool = self._pools.pop(key, None)
        if pool is None:
            return []
        for waiter in pool.waiters:
            waiter.cancelled = True
        port_ids = [p for ports in pool.groups.values() for p in ports]
        port_ids += list(pool.unseen)
        port_ids += [p for p, k in self._recyclable.items() if k == key]
        vifs = [self._vifs[p] for p in port_ids if p in self._vifs]
        for port_id in port_ids:
            self.forget(port_id)
        self._on_size(key, 0)
        return vifs

    def strip_sg(self, sg_id: str, network_id: str | None) -> list[Vif]:
        """Move ports of groups containing ``sg_id`` to the no-SG group, to be reused first.

        Returns the moved ports; the caller clears their SGs in Neutron.
        """
        moved: list[Vif] = []
        for key, pool in self._pools.items():
            if network_id is not None and key.network_id != network_id:
                continue
            for sgs in [s for s in pool.groups if sg_id in s]:
                for port_id in pool.groups.pop(sgs):
                    vif = _with_sgs(self._vifs[port_id], [])
                    self._vifs[port_id] = vif
                    moved.append(vif)
                    pool.groups.setdefault((), []).append(port_id)
            if () in pool.groups:
                pool.groups.move_to_end((), last=False)
            for port_id in pool.unseen:  # they stay unseen: the mirror shows the change next
                if sg_id in self._vifs[port_id].security_groups:
                    self._vifs[port_id] = _with_sgs(self._vifs[port_id], [])
                    moved.append(self._vifs[port_id])
        return moved


def _with_sgs(vif: Vif, security_groups: list[str]) -> Vif:
    return replace(vif, security_groups=list(security_groups))


def with_sgs(vif: Vif, security_groups: Iterable[str]) -> Vif:
    """The same VIF carrying another SG set (after a re-SG in Neutron)."""
    return _with_sgs(vif, list(sg_key(security_groups)))
