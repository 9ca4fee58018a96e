"""What podwire's test VM says about itself on its console (``podwire.vm.console``).

The DHCP hook reports ``dhcp bound ip=A/P router=R server=S mtu=M`` (``renew`` likewise). A
guest is a machine anyone may run anything in, so its lines are read as strictly as any other
value from outside: unknown keys are ignored, a bad value is refused naming it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from podwire.schema import fields

LEASE_EVENTS = ("dhcp bound", "dhcp renew")
MAX_EVENT = 1024


@dataclass(frozen=True)
class LeaseReport:
    address: ipaddress.IPv4Interface
    router: str  # "" when the server named none
    server: str
    mtu: int | None  # None when the server sent no MTU option


def parse_lease(text: str, what: str = "lease event") -> LeaseReport:
    if len(text) > MAX_EVENT or not text.startswith(LEASE_EVENTS):
        raise fields.fail(what, f"{text[:80]!r} is not a lease event")
    values = dict(word.partition("=")[::2] for word in text.split()[2:])
    return LeaseReport(
        address=_interface(values.get("ip", ""), f"{what}: ip"),
        router=_optional_host(values.get("router", ""), f"{what}: router"),
        server=_optional_host(values.get("server", ""), f"{what}: server"),
        mtu=_optional_mtu(values.get("mtu", ""), f"{what}: mtu"),
    )


def _interface(value: str, what: str) -> ipaddress.IPv4Interface:
    address, slash, prefix = value.partition("/")
    fields.host_address(address, what, 4)
    if not slash or not prefix.isdigit() or not 0 < int(prefix) <= 32:
        raise fields.fail(what, f"{value!r} is not an IPv4 address with a prefix length")
    return ipaddress.IPv4Interface(value)


def _optional_host(value: str, what: str) -> str:
    return str(fields.host_address(value, what, 4)) if value else ""


def _optional_mtu(value: str, what: str) -> int | None:
    if not value:
        return None
    if not value.isdigit():
        raise fields.fail(what, f"{value!r} is not a number")
    return fields.mtu(int(value), what)
