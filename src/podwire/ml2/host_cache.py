"""What each host reported under ``/podwire/state/nodes/<host>/``, kept in memory.

``bind_port`` runs inside a Neutron request and must not wait on etcd, so it reads this cache;
the feedback watcher feeds it. Readers and the single writer are on different threads, hence
the lock. Every value is validated on the way in: a malformed value is logged and treated as
absent, so a broken agent can only make its own host unbindable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from podwire import keys
from podwire.errors import ValidationError
from podwire.log import get_inline_logger
from podwire.schema import nodes as values
from podwire.schema.deployment import Deployment

log = get_inline_logger(__name__)


@dataclass(frozen=True)
class HostState:
    """A consistent copy of one host's state for a binding decision."""

    host: str
    alive: bool = False
    physnets: dict[str, str] = field(default_factory=dict)
    vtep: str | None = None
    capabilities: values.Capabilities | None = None


@dataclass(frozen=True)
class StateChange:
    """What a state event means for Neutron; the feedback loop acts on these."""

    kind: Literal["port_wired", "port_unwired", "host_up", "host_down"]
    host: str
    port_id: str | None = None


@dataclass
class _Host:
    alive: bool = False
    physnets: dict[str, str] = field(default_factory=dict)
    vtep: str | None = None
    capabilities: values.Capabilities | None = None
    ports: set[str] = field(default_factory=set)


class HostCache:
    """Thread-safe; ``apply`` is called by one feeder, ``get`` by any request thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hosts: dict[str, _Host] = {}
        self.synced = threading.Event()

    def get(self, host: str) -> HostState:
        with self._lock:
            entry = self._hosts.get(host)
            if entry is None:
                return HostState(host)
            return HostState(
                host, entry.alive, dict(entry.physnets), entry.vtep, entry.capabilities
            )

    def knows(self, host: str) -> bool:
        with self._lock:
            return host in self._hosts

    def hosts(self) -> list[str]:
        with self._lock:
            return sorted(self._hosts)

    def wired_ports(self, host: str | None = None) -> list[tuple[str, str]]:
        """(host, port id) for every port state key seen, for resyncs."""
        with self._lock:
            return [
                (name, port)
                for name, entry in sorted(self._hosts.items())
                if host is None or name == host
                for port in sorted(entry.ports)
            ]

    def is_wired(self, host: str, port_id: str) -> bool:
        """Whether ``host`` is alive and reports ``port_id`` wired."""
        with self._lock:
            entry = self._hosts.get(host)
            return entry is not None and entry.alive and port_id in entry.ports

    def dead_hosts(self) -> list[str]:
        with self._lock:
            return sorted(name for name, entry in self._hosts.items() if not entry.alive)

    def apply(self, kind: Literal["put", "delete"], key: str, raw: bytes) -> list[StateChange]:
        """Fold one watch event in; returns what changed for Neutron (maybe nothing)."""
        parsed = keys.parse_state_key(key)
        if parsed is None:
            log.warning("ml2.state.unknown_key", key=key)
            return []
        host, what, name = parsed
        try:
            keys.check_segment(host, "host")
            if name is not None:
                keys.check_segment(name, what)
        except ValueError as exc:
            log.warning("ml2.state.bad_key", key=key, error=str(exc))
            return []
        deleted = kind == "delete"
        try:
            with self._lock:
                entry = self._hosts.setdefault(host, _Host())
                return self._apply(entry, host, what, name, None if deleted else raw, key)
        except ValidationError as exc:
            log.warning("ml2.state.bad_value", key=key, error=str(exc))
            return self._apply_invalid(host, what, name)

    def _apply(
        self, entry: _Host, host: str, what: str, name: str | None, raw: bytes | None, key: str
    ) -> list[StateChange]:
        if what == "alive":
            was = entry.alive
            if raw is not None:
                values.parse_alive(raw, key)
            entry.alive = raw is not None
            if entry.alive != was:
                return [StateChange("host_up" if entry.alive else "host_down", host)]
            return []
        if what == "physnets":
            assert name is not None
            if raw is None:
                entry.physnets.pop(name, None)
            else:
                entry.physnets[name] = values.parse_physnet(raw, key)
            return []
        if what == "vtep":
            entry.vtep = None if raw is None else values.parse_vtep(raw, key)
            return []
        if what == "capabilities":
            entry.capabilities = None if raw is None else values.parse_capabilities(raw, key)
            return []
        if what != "ports" or name is None:
            # The agent's reports for podwire status (policy, memif), and any kind a newer
            # agent adds: nothing Neutron is told depends on them.
            return []
        if raw is None:
            if name in entry.ports:
                entry.ports.discard(name)
                return [StateChange("port_unwired", host, name)]
            return []
        values.parse_port_state(raw, key)
        entry.ports.add(name)
        return [StateChange("port_wired", host, name)]

    def _apply_invalid(self, host: str, what: str, name: str | None) -> list[StateChange]:
        """An unreadable value counts as absent: never bind or go ACTIVE on a guess."""
        with self._lock:
            entry = self._hosts.setdefault(host, _Host())
            if what == "physnets" and name is not None:
                entry.physnets.pop(name, None)
            elif what == "vtep":
                entry.vtep = None
            elif what == "capabilities":
                entry.capabilities = None
            elif what == "ports" and name is not None and name in entry.ports:
                entry.ports.discard(name)
                return [StateChange("port_unwired", host, name)]
            elif what == "alive" and entry.alive:
                entry.alive = False
                return [StateChange("host_down", host)]
            return []


class HostDirectory:
    """The host caches of every deployment the driver serves, as one view for bindings.

    A host belongs to the deployment under whose namespace its agent registered (its alive
    key). A host alive in two deployments at once is a misconfiguration that would send its
    ports to two controllers: it is not bound until one of them lets it go.
    """

    def __init__(self, deployments: Sequence[Deployment]) -> None:
        self.deployments = list(deployments)
        self.home = self.deployments[0]  # where the forwarder's own keys live
        self.caches = {d.name: HostCache() for d in self.deployments}

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(
            cache.synced.wait(max(0.0, deadline - time.monotonic()))
            for cache in self.caches.values()
        )

    def _claims(self, host: str) -> list[tuple[Deployment, HostState]]:
        states = [(d, self.caches[d.name].get(host)) for d in self.deployments]
        return [(d, state) for d, state in states if state.alive]

    def get(self, host: str) -> HostState:
        claims = self._claims(host)
        if len(claims) == 1:
            return claims[0][1]
        if len(claims) > 1:
            log.error(
                "ml2.host.in_two_deployments",
                host=host,
                deployments=[d.name for d, _ in claims],
            )
        return HostState(host)

    def deployment_of(self, host: str) -> Deployment:
        """Where ``host``'s desired ports go: its deployment, else the home deployment."""
        return self.claimed_by(host) or self.home

    def claimed_by(self, host: str) -> Deployment | None:
        """The deployment ``host`` belongs to: the one it is alive in, else the one it left
        state in; None when no deployment, or more than one, says so (another mechanism
        driver's host, or one registered twice)."""
        claims = self._claims(host)
        if len(claims) == 1:
            return claims[0][0]
        known = [d for d in self.deployments if self.caches[d.name].knows(host)]
        return known[0] if len(known) == 1 else None

    def key(self, host: str, key: str) -> str:
        """``key`` (a key of ``host``'s) as etcd stores it in ``host``'s deployment."""
        return self.deployment_of(host).etcd_namespace + key
