"""The etcd key layout (docs/architecture.md §3). Every key podwire reads or writes is built here.

Host names and port ids become path segments, so they are validated: a ``/`` or an empty
segment would let one node's key alias another node's.
"""

from podwire.errors import ValidationError
from podwire.schema import fields

ROOT = "/podwire"
KICK = f"{ROOT}/kick"


class BadKey(ValidationError, ValueError):
    """A name that cannot be a key segment; a ValueError too, for callers validating config."""


def check_segment(value: str, what: str) -> str:
    """Return ``value`` if it is safe as one key path segment, else raise ``BadKey``."""
    try:
        return fields.name(value, what)
    except ValidationError as exc:
        raise BadKey(str(exc)) from None


def node_prefix(host: str) -> str:
    return f"{ROOT}/nodes/{check_segment(host, 'host')}/"


def node_ports_prefix(host: str) -> str:
    return node_prefix(host) + "ports/"


def node_port(host: str, port_id: str) -> str:
    return node_ports_prefix(host) + check_segment(port_id, "port id")


def nodes_prefix() -> str:
    return f"{ROOT}/nodes/"


def state_prefix() -> str:
    return f"{ROOT}/state/"


def state_node_prefix(host: str) -> str:
    return f"{ROOT}/state/nodes/{check_segment(host, 'host')}/"


def state_alive(host: str) -> str:
    return state_node_prefix(host) + "alive"


def state_physnet(host: str, physnet: str) -> str:
    return state_node_prefix(host) + "physnets/" + check_segment(physnet, "physnet")


def state_vtep(host: str) -> str:
    return state_node_prefix(host) + "vtep"


def state_capabilities(host: str) -> str:
    return state_node_prefix(host) + "capabilities"


def state_memif(host: str) -> str:
    """The agent's memif ports as its master serves them: path, frames, drops."""
    return state_node_prefix(host) + "memif"


def state_policy(host: str) -> str:
    """The agent's security-group enforcement: ports enforced, policy revision in force."""
    return state_node_prefix(host) + "policy"


def state_ports_prefix(host: str) -> str:
    return state_node_prefix(host) + "ports/"


def state_port(host: str, port_id: str) -> str:
    return state_ports_prefix(host) + check_segment(port_id, "port id")


def vifs_prefix(host: str | None = None) -> str:
    if host is None:
        return f"{ROOT}/vifs/"
    return f"{ROOT}/vifs/{check_segment(host, 'host')}/"


def vif(host: str, attachment: str) -> str:
    return vifs_prefix(host) + check_segment(attachment, "attachment")


def election(name: str) -> str:
    return f"{ROOT}/election/{check_segment(name, 'election')}"


def status(component: str) -> str:
    """A component's self-reported status for ``podwire status`` (written by its leader)."""
    return f"{ROOT}/status/{check_segment(component, 'component')}"


def parse_state_key(key: str) -> tuple[str, str, str | None] | None:
    """Split a ``/podwire/state/nodes/<host>/<kind>[/<name>]`` key.

    Returns ``(host, kind, name)`` or None for keys outside the layout, which readers skip.
    """
    prefix = f"{ROOT}/state/nodes/"
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix) :].split("/")
    if not all(fields.NAME.fullmatch(part) for part in parts):
        return None
    if len(parts) == 2 and parts[1] in ("alive", "vtep", "capabilities", "policy", "memif"):
        return parts[0], parts[1], None
    if len(parts) == 3 and parts[1] in ("physnets", "ports"):
        return parts[0], parts[1], parts[2]
    return None


def parse_node_port_key(key: str) -> tuple[str, str] | None:
    """Split a ``/podwire/nodes/<host>/ports/<id>`` key into ``(host, port_id)``; None for
    keys outside the layout or whose names are not valid segments (skipped by readers: a
    port id holding a '/' must not become a key of another layout)."""
    if not key.startswith(nodes_prefix()):
        return None
    parts = key[len(nodes_prefix()) :].split("/")
    if len(parts) == 3 and parts[1] == "ports" and all(fields.NAME.fullmatch(p) for p in parts):
        return parts[0], parts[2]
    return None


def global_prefix() -> str:
    """Cluster-wide values every agent reads (security groups)."""
    return f"{ROOT}/global/"


def secgroups_prefix() -> str:
    return global_prefix() + "secgroups/"


def secgroup(sg_id: str) -> str:
    return secgroups_prefix() + check_segment(sg_id, "security group id")


def remote_groups_prefix(sg_id: str | None = None) -> str:
    if sg_id is None:
        return global_prefix() + "remote_groups/"
    return global_prefix() + "remote_groups/" + check_segment(sg_id, "security group id") + "/"


def remote_group_member(sg_id: str, port_id: str) -> str:
    return remote_groups_prefix(sg_id) + check_segment(port_id, "port id")


def address_groups_prefix() -> str:
    return global_prefix() + "address_groups/"


def address_group(ag_id: str) -> str:
    return address_groups_prefix() + check_segment(ag_id, "address group id")


def services_prefix() -> str:
    """Kubernetes Services, written by the leader controller, read by every agent."""
    return f"{ROOT}/services/"


def service(namespace: str, name: str) -> str:
    return (
        services_prefix()
        + check_segment(namespace, "namespace")
        + "/"
        + check_segment(name, "service name")
    )


def parse_service_key(key: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of a Service's key; None outside the layout (skipped)."""
    if not key.startswith(services_prefix()):
        return None
    parts = key[len(services_prefix()) :].split("/")
    if len(parts) != 2 or not all(fields.NAME.fullmatch(p) for p in parts):
        return None
    return parts[0], parts[1]


def parse_global_key(key: str) -> tuple[str, tuple[str, ...]] | None:
    """Split a ``/podwire/global/<kind>/<name>[/<name>]`` key into ``(kind, names)``; None for
    keys outside the layout (readers skip them: a peer may write anything it is allowed to)."""
    if not key.startswith(global_prefix()):
        return None
    parts = key[len(global_prefix()) :].split("/")
    if not all(fields.NAME.fullmatch(part) for part in parts[1:]):
        return None
    kind, names = parts[0], tuple(parts[1:])
    expected = {"secgroups": 1, "remote_groups": 2, "address_groups": 1}.get(kind)
    if expected is None or len(names) != expected:
        return None
    return kind, names
