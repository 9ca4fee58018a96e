"""Field validators: the one definition of every kind of name, id, address and number podwire
accepts from outside.

Each takes the raw value and ``what`` (where it came from, for the message) and returns the
value in canonical form or raises ``ValidationError`` naming the problem. Patterns are matched
in full (``re.fullmatch``): ``$`` alone would accept a trailing newline, and a name with one
becomes a different etcd key or file name than the one checked.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

from podwire.errors import ValidationError

T = TypeVar("T")

# A name that becomes one etcd key segment (host, port id, physnet, attachment): no '/', no
# empty segment, so one node's key can never alias another node's.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
# A Neutron id or name as configs and API bodies may give it.
NEUTRON_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")
# Neutron ids: UUIDs, and project ids that are hex without dashes (Keystone's form).
NEUTRON_ID = re.compile(r"[0-9a-fA-F-]{1,64}")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
# Runtimes use 64 hex digits; the spec allows letters, digits, '_', '.', '-'. No ':' — it
# separates the container id from the ifname in an attachment id — and at most 237 characters,
# so that an attachment id (with ':' and a 15-character ifname) is still one key segment.
CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,236}")
# Linux allows almost any byte in an interface name; podwire takes the portable subset, which
# is also safe in an etcd key segment and in the attachment id.
IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
# Kubernetes object names and namespaces (RFC 1123 subdomains, up to 253 characters).
K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
K8S_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")

MAX_TEXT = 255
MTU_RANGE = (68, 65535)
VNI_RANGE = (1, 2**24 - 1)
VLAN_RANGE = (1, 4094)
NETWORK_TYPES = ("flat", "vlan", "vxlan")
ATTACHMENT_SEP = ":"


def fail(what: str, problem: str) -> ValidationError:
    return ValidationError(f"{what}: {problem}")


def _pattern(value: Any, what: str, pattern: re.Pattern[str], rule: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise fail(what, f"{_show(value)} is not {rule}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def name(value: Any, what: str) -> str:
    return _pattern(
        value,
        what,
        NAME,
        "a valid name: use letters, digits, '.', '_', ':' or '-', start with a letter or digit,"
        " at most 253 characters",
    )


def neutron_ref(value: Any, what: str) -> str:
    return _pattern(value, what, NEUTRON_REF, "a Neutron id or name")


def neutron_id(value: Any, what: str) -> str:
    return _pattern(value, what, NEUTRON_ID, "a Neutron id")


def project_id(value: Any, what: str) -> str:
    """Keystone's are hex, but Neutron takes any string (noauth clouds use names): any value
    that is safe as a key segment, since project ids become parts of pool keys and paths."""
    return _pattern(value, what, NAME, "a project id (letters, digits, '.', '_', ':', '-')")


def uuid(value: Any, what: str) -> str:
    return _pattern(value, what, UUID, "a UUID (lower-case, with dashes)")


def container_id(value: Any, what: str) -> str:
    return _pattern(
        value,
        what,
        CONTAINER_ID,
        "a container id: it must start with a letter or digit and contain only letters,"
        " digits, '_', '.' or '-', at most 237 characters",
    )


def ifname(value: Any, what: str) -> str:
    return _pattern(
        value,
        what,
        IFNAME,
        "a valid interface name: 1 to 15 letters, digits, '_', '.' or '-', starting with a"
        " letter or digit",
    )


def k8s_name(value: Any, what: str) -> str:
    return _pattern(value, what, K8S_NAME, "a Kubernetes name (lower-case RFC 1123)")


def k8s_uid(value: Any, what: str) -> str:
    return _pattern(value, what, K8S_UID, "a Kubernetes uid")


def text(value: Any, what: str, max_len: int = MAX_TEXT, *, empty: bool = True) -> str:
    """Free text that ends up in logs, names or descriptions: no control characters."""
    if not isinstance(value, str) or len(value) > max_len:
        raise fail(what, f"expected a string of at most {max_len} characters")
    if not empty and not value:
        raise fail(what, "must not be empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise fail(what, "must not contain control characters")
    return value


def http_url(value: Any, what: str) -> str:
    url = text(value, what, 2048, empty=False)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or any(c.isspace() for c in url):
        raise fail(what, f"{_show(value)} is not an http(s) URL")
    return url


def one_of(value: Any, what: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise fail(what, f"{_show(value)} is not one of {', '.join(choices)}")
    return value


def network_type(value: Any, what: str) -> str:
    return one_of(value, what, NETWORK_TYPES)


def boolean(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise fail(what, f"{_show(value)} is not true or false")
    return value


def integer(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise fail(what, f"expected an integer from {low} to {high}, got {_show(value)}")
    return value


def mtu(value: Any, what: str) -> int:
    return integer(value, what, *MTU_RANGE)


def vni(value: Any, what: str) -> int:
    return integer(value, what, *VNI_RANGE)


def vlan_id(value: Any, what: str) -> int:
    return integer(value, what, *VLAN_RANGE)


def timestamp(value: Any, what: str) -> float:
    """Seconds since the epoch: a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(what, f"expected a number, got {_show(value)}")
    if not math.isfinite(value) or value < 0:
        raise fail(what, f"expected a finite non-negative number, got {_show(value)}")
    return float(value)


def mac(value: Any, what: str) -> str:
    """A port's MAC, lower-case: unicast and not all zero (it is a source address)."""
    if not isinstance(value, str) or not MAC.fullmatch(value.lower()):
        raise fail(what, f"{_show(value)} is not a MAC address")
    canonical = value.lower()
    if int(canonical[:2], 16) & 1 or canonical == "00:00:00:00:00:00":
        raise fail(what, f"{canonical} is not a unicast MAC address")
    return canonical


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def ip_address(value: Any, what: str, version: int | None = None) -> IpAddress:
    if not isinstance(value, str) or len(value) > 64:
        raise fail(what, f"{_show(value)} is not an IP address")
    try:
        address = ipaddress.ip_address(value)
    except ValueError as exc:
        raise fail(what, f"{_show(value)} is not an IP address") from exc
    if version is not None and address.version != version:
        raise fail(what, f"{address} is not an IPv{version} address")
    return address


def host_address(value: Any, what: str, version: int | None = None) -> IpAddress:
    """An address a host may own and send from: not multicast, unspecified, broadcast or
    reserved — any of those as a VTEP or fixed IP would flood or black-hole traffic."""
    address = ip_address(value, what, version)
    bad = (
        address.is_multicast
        or address.is_unspecified
        or address.is_reserved
        or address == ipaddress.IPv4Address("255.255.255.255")
    )
    if bad:
        raise fail(what, f"{address} is not a unicast host address")
    return address


def vtep_address(value: Any, what: str) -> IpAddress:
    """A VXLAN endpoint another node floods to and learns from: a host address that reaches
    some other machine. Loopback would bounce every broadcast back into the local VXLAN
    socket, and a link-local one reaches no other node across the underlay."""
    address = host_address(value, what)
    if address.is_loopback or address.is_link_local:
        kind = "loopback" if address.is_loopback else "link-local"
        raise fail(what, f"{address} is a {kind} address, not another node's VTEP")
    return address


def cidr(value: Any, what: str, version: int | None = None) -> IpNetwork:
    """A subnet; host bits set are refused (Neutron never writes them)."""
    if not isinstance(value, str) or len(value) > 64:
        raise fail(what, f"{_show(value)} is not a CIDR")
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise fail(what, f"{_show(value)} is not a CIDR: {exc}") from exc
    if version is not None and network.version != version:
        raise fail(what, f"{network} is not an IPv{version} prefix")
    return network


def address_or_prefix(value: Any, what: str) -> str:
    """A CIDR or a host address, canonical; a bare address becomes /32 or /128."""
    if isinstance(value, str) and "/" not in value:
        address = ip_address(value, what)
        return f"{address}/{address.max_prefixlen}"
    return str(cidr(value, what))


def items(value: Any, what: str, max_items: int) -> list[Any]:
    if not isinstance(value, list):
        raise fail(what, "expected a list")
    if len(value) > max_items:
        raise fail(what, f"has more than {max_items} entries")
    return value


def each(value: Any, what: str, check: Callable[[Any, str], T], max_items: int) -> list[T]:
    return [check(item, f"{what}[{i}]") for i, item in enumerate(items(value, what, max_items))]


def optional(value: Any, what: str, check: Callable[[Any, str], T]) -> T | None:
    return None if value is None else check(value, what)


def attachment_id(container: str, interface: str) -> str:
    """The one name of a pod attachment: container id and ifname can contain no ':', so
    ``<container>:<ifname>`` is injective (``.``, the old separator, is in both alphabets)."""
    return f"{container}{ATTACHMENT_SEP}{interface}"


def attachment(value: Any, what: str) -> str:
    """An attachment id, canonical form. The earlier form ``<container>.<ifname>``, which
    agents and controllers wrote before the ':' separator, is read too (split at the last '.',
    as runtimes' hex ids have none) so their records keep their meaning."""
    if not isinstance(value, str) or len(value) > 270:
        raise fail(what, f"{_show(value)} is not an attachment id")
    container, sep, interface = value.partition(ATTACHMENT_SEP)
    if not sep:
        container, sep, interface = value.rpartition(".")
    if not sep:
        raise fail(what, f"{_show(value)} is not an attachment id <container id>:<ifname>")
    return attachment_id(container_id(container, what), ifname(interface, what))
