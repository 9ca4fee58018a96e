"""The desired Neutron objects a set of NetworkPolicies compiles to, as values.

Names are derived from what they stand for, so the reconciler finds its own objects again
after a restart without a table of its own; every name starts with ``podwire-np-`` (groups)
or ``podwire-ag-`` (address groups), podwire's mark beside its tag."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from podwire.k8s.objects import ObjectKey

INGRESS = "ingress"
EGRESS = "egress"
IPV4 = "IPv4"
IPV6 = "IPv6"
ETHERTYPES = (IPV4, IPV6)
GROUP_PREFIX = "podwire-np-"
ADDRESS_GROUP_PREFIX = "podwire-ag-"
OPEN_INGRESS = GROUP_PREFIX + "open-ingress"
OPEN_EGRESS = GROUP_PREFIX + "open-egress"


@dataclass(frozen=True)
class SgRule:
    """One Neutron security-group rule; a remote of neither kind is any address."""

    direction: str
    ethertype: str
    protocol: str | None = None
    port_min: int | None = None
    port_max: int | None = None
    remote_ip_prefix: str | None = None
    remote_address_group: str | None = None

    @property
    def order(self) -> tuple[str, str, str, int, int, str, str]:
        """A total order (fields may be None) so that calls go out in a repeatable order."""
        return (
            self.direction,
            self.ethertype,
            self.protocol or "",
            self.port_min or 0,
            self.port_max or 0,
            self.remote_ip_prefix or "",
            self.remote_address_group or "",
        )


@dataclass(frozen=True)
class DesiredGroup:
    name: str
    description: str
    rules: frozenset[SgRule]
    # The NetworkPolicy it is made for (its own group and its named ports' groups); None for
    # the open groups. What a refusal or the rule budget names when it concerns the group.
    policy: ObjectKey | None = None


@dataclass(frozen=True)
class DesiredAddressGroup:
    name: str
    description: str
    addresses: frozenset[str]


@dataclass(frozen=True)
class PodPolicies:
    """The policies that select a pod per direction, and the groups its port carries: those
    policies' groups plus an open group for each direction no policy isolates."""

    ingress: frozenset[ObjectKey]
    egress: frozenset[ObjectKey]
    groups: frozenset[str]


@dataclass(frozen=True)
class DesiredPolicy:
    groups: dict[str, DesiredGroup] = field(default_factory=dict)
    address_groups: dict[str, DesiredAddressGroup] = field(default_factory=dict)
    pods: dict[ObjectKey, PodPolicies] = field(default_factory=dict)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def group_name(policy: ObjectKey) -> str:
    """Fixed length whatever the policy's name: Neutron names stop at 255 characters."""
    return GROUP_PREFIX + _digest(f"{policy.namespace}/{policy.name}")


def named_port_group_name(policy: ObjectKey, numbers: tuple[tuple[str, str, int], ...]) -> str:
    """The policy's ingress rules on named ports, for the pods that give those names these
    numbers (name, protocol, number): a name means what each selected pod says it means."""
    return GROUP_PREFIX + _digest(f"{policy.namespace}/{policy.name}#{numbers}")


def address_group_name(identity: str) -> str:
    return ADDRESS_GROUP_PREFIX + _digest(identity)


def open_group(direction: str) -> DesiredGroup:
    """Everything allowed in one direction: what a pod no policy isolates there carries."""
    name = OPEN_INGRESS if direction == INGRESS else OPEN_EGRESS
    rules = frozenset(SgRule(direction, ethertype) for ethertype in ETHERTYPES)
    return DesiredGroup(name, f"podwire: {direction} not isolated by any NetworkPolicy", rules)
