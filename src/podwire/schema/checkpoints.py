"""What the agent keeps about the ports it plugged, so a restarted agent serves them again.

Two files, one shape (``files.StateFile``: a versioned object whose section maps ids to
entries): ``cni-attachments.json`` holds an ``Attachment`` per pod interface (DEL must work
after a restart and with the pod's namespace gone, a repeated ADD must return the same
result), ``memif-attachments.json`` a ``MemifEntry`` per memif the agent serves as master.
Each entry has one strict reader here: the files drive deletions of links, sockets and
processes, so nothing in them is taken on trust; a bad entry is refused by name.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, replace
from typing import Any

from podwire.schema import doc, fields
from podwire.schema.ports import HostRoute, host_routes
from podwire.schema.vif import Vif

MAX_ADDRESSES = 8


@dataclass(frozen=True)
class Address:
    address: str  # "10.0.0.5/24"
    gateway: str | None
    routes: tuple[HostRoute, ...] = ()  # the subnet's host routes


@dataclass(frozen=True)
class Attached:
    """The interfaces an ADD made, version-neutral (rendered per cniVersion by agent.cni.result)."""

    host_ifname: str
    host_mac: str  # empty in nested mode: the host side is the VM's uplink, not ours
    ifname: str
    mac: str
    mtu: int
    sandbox: str
    addresses: tuple[Address, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Attachment:
    attachment: str
    container_id: str
    ifname: str
    network_name: str
    netns: str
    pod: dict[str, str] | None
    vif: Vif
    attached: Attached

    def to_json(self) -> dict[str, Any]:
        return {
            "container_id": self.container_id,
            "ifname": self.ifname,
            "network_name": self.network_name,
            "netns": self.netns,
            "pod": self.pod,
            "vif": self.vif.to_json(),
            "attached": self.attached.to_json(),
        }


@dataclass(frozen=True)
class MemifEntry:
    attachment: str  # the pod's attachment whose ADD made this memif (<container>:<ifname>)
    vif_attachment: str  # the memif port's own attachment at the VIF source
    pod: dict[str, str]
    vif: Vif
    host_dir: str
    socket: str  # host path of the control socket
    container_socket: str
    secret: str
    tap: str
    bridge: str
    mtu: int
    addresses: tuple[Address, ...]
    pid: int = 0
    started: int = 0  # the master's start time (clock ticks since boot, /proc/PID/stat)

    def with_process(self, pid: int, started: int) -> MemifEntry:
        return replace(self, pid=pid, started=started)

    def to_json(self) -> dict[str, Any]:
        return {
            "vif_attachment": self.vif_attachment,
            "pod": self.pod,
            "vif": self.vif.to_json(),
            "host_dir": self.host_dir,
            "socket": self.socket,
            "container_socket": self.container_socket,
            "secret": self.secret,
            "tap": self.tap,
            "bridge": self.bridge,
            "mtu": self.mtu,
            "addresses": [asdict(a) for a in self.addresses],
            "pid": self.pid,
            "started": self.started,
        }


def attachment_entry(key: str, raw: Any) -> Attachment:
    """One entry of ``cni-attachments.json``; its id is canonical (``<container>:<ifname>``)
    whatever form its key had (agents before the ':' separator keyed ``<container>.<ifname>``)."""
    what = f"checkpoint entry {key[:300]}"
    obj = doc.Obj(doc.as_object(raw, what), what)
    container = obj.req("container_id", fields.container_id)
    interface = obj.req("ifname", fields.ifname)
    canonical = fields.attachment(key, what)
    if canonical != fields.attachment_id(container, interface):
        raise fields.fail(what, f"its key does not name container {container} and {interface}")
    return Attachment(
        attachment=canonical,
        container_id=container,
        ifname=interface,
        network_name=obj.req("network_name", fields.text),
        netns=obj.req("netns", abs_path),
        pod=_pod(obj, "pod") or None,
        vif=Vif.from_json(obj.req("vif", doc.as_object)),
        attached=attached(obj.req("attached", doc.as_object), f"{what}: attached"),
    )


def attached(raw: Any, what: str) -> Attached:
    obj = doc.Obj(doc.as_object(raw, what), what)
    host_mac = obj.opt("host_mac", lambda v, w: "" if v == "" else fields.mac(v, w), "")
    return Attached(
        host_ifname=obj.req("host_ifname", fields.ifname),
        host_mac=host_mac,
        ifname=obj.req("ifname", fields.ifname),
        mac=obj.req("mac", fields.mac),
        mtu=obj.req("mtu", fields.mtu),
        sandbox=obj.req("sandbox", abs_path),
        addresses=_addresses(obj),
    )


def memif_entry(key: str, raw: Any) -> MemifEntry:
    """One entry of ``memif-attachments.json``."""
    what = f"memif entry {key[:300]}"
    obj = doc.Obj(doc.as_object(raw, what), what)
    return MemifEntry(
        attachment=fields.attachment(key, what),
        vif_attachment=obj.req("vif_attachment", fields.attachment),
        pod=_pod(obj, "pod"),
        vif=Vif.from_json(obj.req("vif", doc.as_object)),
        host_dir=obj.req("host_dir", abs_path),
        socket=obj.req("socket", abs_path),
        container_socket=obj.req("container_socket", abs_path),
        secret=obj.req("secret", lambda v, w: fields.text(v, w, 24, empty=False)),
        tap=obj.req("tap", fields.ifname),
        bridge=obj.req("bridge", fields.ifname),
        mtu=obj.req("mtu", fields.mtu),
        addresses=_addresses(obj),
        pid=obj.opt("pid", lambda v, w: fields.integer(v, w, 0, 1 << 22), 0),
        started=obj.opt("started", lambda v, w: fields.integer(v, w, 0, 1 << 62), 0),
    )


def _pod(obj: doc.Obj, key: str) -> dict[str, str]:
    """The pod's namespace and name (and uid, when the runtime gave it)."""
    pod = obj.maybe(key, doc.as_object) or {}
    what = obj.field(key)
    found: dict[str, str] = {
        k: fields.k8s_name(pod[k], what) for k in ("namespace", "name") if k in pod
    }
    if pod.get("uid"):
        found["uid"] = fields.k8s_uid(pod["uid"], what)
    return found


def abs_path(value: Any, what: str) -> str:
    text = fields.text(value, what, 4096, empty=False)
    if not text.startswith("/"):
        raise fields.fail(what, "must be an absolute path")
    return text


def _interface(value: Any, what: str) -> str:
    text = fields.text(value, what, 64, empty=False)
    try:
        if "/" not in text:
            raise ValueError(text)
        return str(ipaddress.ip_interface(text))
    except ValueError as exc:
        raise fields.fail(what, f"{value!r} is not an address with a prefix length") from exc


def _address(raw: Any, what: str) -> Address:
    obj = doc.Obj(doc.as_object(raw, what), what)
    address = obj.req("address", _interface)
    gateway = obj.maybe("gateway", lambda v, w: str(fields.ip_address(v, w)))
    version = ipaddress.ip_interface(address).version
    no_routes: tuple[HostRoute, ...] = ()
    routes = obj.opt("routes", lambda v, w: host_routes(v, w, version), no_routes)
    return Address(address, gateway, routes)


def _addresses(obj: doc.Obj) -> tuple[Address, ...]:
    return tuple(obj.opt("addresses", lambda v, w: fields.each(v, w, _address, MAX_ADDRESSES), []))
