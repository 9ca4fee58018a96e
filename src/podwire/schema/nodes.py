"""What each agent publishes about its node under ``/podwire/state/nodes/<host>/``.

Every other agent, the ml2 driver and the controller read these values, and any node may have
written them, so they are untrusted input: a reader either returns a value that is safe to act
on (a VTEP that is a unicast host address, interface names the kernel accepts) or raises
``ValidationError``; callers log and skip.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from podwire.schema import doc, fields
from podwire.schema.ports import DesiredPort

POD_DRIVERS = ("baremetal", "nested", "unpooled")
# Earlier names of pod drivers, still accepted as the name they became (the controller logs that
# a configured one is deprecated).
RENAMED_POD_DRIVERS = {"noop": "unpooled"}
MAX_LIST = 32


MAX_TTL = 3600


@dataclass(frozen=True)
class Alive:
    """A node's heartbeat. The key is bound to the node's lease, but etcd lets any user
    refresh any lease, so the lease alone cannot say the node lives: its agent also rewrites
    ``beat_at`` at each refresh, a value only that node's user can write. Agents before the
    beat write neither field and are taken on the lease alone."""

    started_at: float
    version: str
    beat_at: float | None = None
    ttl: int | None = None

    def fresh(self, now: float) -> bool:
        """Beaten within two TTLs (three refreshes missed, and a TTL of clock skew)."""
        if self.beat_at is None or self.ttl is None:
            return True
        return now - self.beat_at <= 2 * self.ttl


@dataclass(frozen=True)
class Capabilities:
    vif_types: frozenset[str]
    network_types: frozenset[str]
    # How the controller makes this node's ports; None: the controller's configured default.
    pod_driver: str | None = None


def alive_value(
    started_at: float, version: str, beat_at: float | None = None, ttl: int | None = None
) -> bytes:
    body: dict[str, Any] = {"started_at": started_at, "version": version}
    if beat_at is not None and ttl is not None:
        body.update(beat_at=beat_at, ttl=ttl)
    return doc.encode_versioned(body)


def capabilities_value(
    vif_types: list[str], network_types: list[str], pod_driver: str | None = None
) -> bytes:
    body: dict[str, Any] = {"vif_types": vif_types, "network_types": network_types}
    if pod_driver is not None:
        body["pod_driver"] = pod_driver
    return doc.encode_versioned(body)


def parse_alive(raw: bytes, what: str = "alive") -> Alive:
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    ttl = obj.maybe("ttl", lambda value, where: fields.integer(value, where, 1, MAX_TTL))
    return Alive(
        obj.req("started_at", fields.timestamp),
        obj.opt("version", fields.text, ""),
        obj.req("beat_at", fields.timestamp) if ttl is not None else None,
        ttl,
    )


def parse_physnet(raw: bytes, what: str = "physnet") -> str:
    """The interface serving a physnet on that host."""
    return doc.Obj(doc.decode_versioned(raw, what), what).req("interface", fields.ifname)


def physnet_value(interface: str) -> bytes:
    return doc.encode_versioned({"interface": interface})


def parse_vtep(raw: bytes, what: str = "vtep") -> str:
    """A VXLAN endpoint: it becomes a flood entry on every other host, so only a unicast host
    address that is neither loopback nor link-local is accepted (the family and "not this
    node's own" are checked against the reader's own VTEP by the caller)."""
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    return str(obj.req("ip", fields.vtep_address))


def vtep_value(ip: str) -> bytes:
    return doc.encode_versioned({"ip": ip})


def pod_driver(value: Any, what: str) -> str:
    """A pod driver's name; an earlier name is read as the one it became."""
    name = fields.one_of(value, what, (*POD_DRIVERS, *RENAMED_POD_DRIVERS))
    return RENAMED_POD_DRIVERS.get(name, name)


def parse_capabilities(raw: bytes, what: str = "capabilities") -> Capabilities:
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    return Capabilities(
        frozenset(obj.req("vif_types", _vif_types)),
        frozenset(obj.req("network_types", _network_types)),
        obj.maybe("pod_driver", pod_driver),
    )


def _vif_types(value: Any, what: str) -> list[str]:
    return fields.each(value, what, fields.name, MAX_LIST)


def _network_types(value: Any, what: str) -> list[str]:
    return fields.each(value, what, fields.network_type, MAX_LIST)


MAX_PORT_IPS = 32


@dataclass(frozen=True)
class PortState:
    """A port wired on a node, as the node publishes it: when, and where it can be reached
    (its network, MAC and fixed IPs). Other nodes build their VXLAN forwarding and ARP/ND
    answers from it (Neutron's l2population model) instead of learning from frames, so a
    value from another node is untrusted input. Agents before that publish only
    ``wired_at``: such a port's MAC is not known here."""

    wired_at: float
    network_id: str | None = None
    mac: str | None = None
    ips: tuple[str, ...] = ()


def parse_port_state(raw: bytes, what: str = "port state") -> PortState:
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    return PortState(
        wired_at=obj.req("wired_at", fields.timestamp),
        network_id=obj.maybe("network_id", fields.uuid),
        mac=obj.maybe("mac", fields.mac),
        ips=tuple(obj.opt("ips", _port_ips, [])),
    )


def _port_ips(value: Any, what: str) -> list[str]:
    return [str(ip) for ip in fields.each(value, what, fields.host_address, MAX_PORT_IPS)]


def port_state_value(wired_at: float, port: DesiredPort | None = None) -> bytes:
    body: dict[str, Any] = {"wired_at": wired_at}
    if port is not None:
        body["network_id"] = port.network_id
        body["mac"] = port.mac_address
        body["ips"] = [ip.ip_address for ip in port.fixed_ips]
    return doc.encode_versioned(body)


@dataclass(frozen=True)
class PolicyState:
    """What the agent enforces: ports with port security, the etcd revision of
    ``/podwire/global/`` in force, how many problems (rules or values left out) it logged."""

    enforced_ports: int
    revision: int
    problems: int
    applied_at: float


def policy_state_value(
    enforced_ports: int, revision: int, problems: int, applied_at: float
) -> bytes:
    body = {
        "enforced_ports": enforced_ports,
        "revision": revision,
        "problems": problems,
        "applied_at": applied_at,
    }
    return doc.encode_versioned(body)


def parse_policy_state(raw: bytes, what: str = "policy state") -> PolicyState:
    obj = doc.Obj(doc.decode_versioned(raw, what), what)

    def count(value: Any, where: str) -> int:
        return fields.integer(value, where, 0, 2**63 - 1)

    return PolicyState(
        obj.req("enforced_ports", count),
        obj.req("revision", count),
        obj.opt("problems", count, 0),
        obj.req("applied_at", fields.timestamp),
    )


MAX_MEMIF_PORTS = 256  # the master's own limit
MEMIF_COUNTERS = ("from_client", "to_client", "to_kernel", "to_shared", "drops", "ring_full")
# The master's classifier's, by verdict; absent in an agent's value from before #38: 0.
FILTER_COUNTERS = ("admitted", "spoofed", "denied", "invalid", "flows_full")
MAX_WHY = 200


@dataclass(frozen=True)
class MemifPortState:
    """One memif port as ``podwire status`` shows it; counters are the master's since it
    started."""

    port_id: str
    tap: str
    path: str  # "kernel" or "shared"
    connected: bool
    from_client: int
    to_client: int
    to_kernel: int
    to_shared: int
    drops: int
    ring_full: int
    why: str = ""  # why the path: unfiltered, filtered in the master, or why not
    admitted: int = 0
    spoofed: int = 0
    denied: int = 0
    invalid: int = 0
    flows_full: int = 0


def memif_state_value(ports: list[MemifPortState], at: float) -> bytes:
    body = {"ports": [asdict(p) for p in ports], "at": at}
    return doc.encode_versioned(body)


def parse_memif_state(raw: bytes, what: str = "memif state") -> list[MemifPortState]:
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    obj.req("at", fields.timestamp)
    return obj.req("ports", _memif_ports)


def _memif_ports(value: Any, what: str) -> list[MemifPortState]:
    return fields.each(value, what, _memif_port, MAX_MEMIF_PORTS)


def _memif_port(value: Any, what: str) -> MemifPortState:
    obj = doc.Obj(doc.closed_object(value, what, MEMIF_FIELDS), what)

    def count(raw: Any, where: str) -> int:
        return fields.integer(raw, where, 0, 2**64 - 1)

    return MemifPortState(
        port_id=obj.req("port_id", fields.uuid),
        tap=obj.req("tap", fields.ifname),
        path=obj.req("path", lambda v, w: fields.one_of(v, w, ("kernel", "shared"))),
        connected=obj.req("connected", fields.boolean),
        **{name: obj.req(name, count) for name in MEMIF_COUNTERS},
        why=obj.opt("why", lambda v, w: fields.text(v, w, MAX_WHY), ""),
        **{name: obj.opt(name, count, 0) for name in FILTER_COUNTERS},
    )


MEMIF_FIELDS = frozenset(
    ("port_id", "tap", "path", "connected", "why", *MEMIF_COUNTERS, *FILTER_COUNTERS)
)
