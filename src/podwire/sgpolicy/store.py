"""The cluster's policy as this agent has read it from ``/podwire/global/``.

Every value is read by its one reader in ``schema.secgroups``; a value that does not parse is
logged with what is wrong and forgotten (for a group: its rules are no longer enforced, which
denies), a rule that does not parse is logged and left out of its group. A key of another
layout is skipped. Nothing here raises on bad input.
"""

from __future__ import annotations

from podwire import keys
from podwire.errors import ValidationError
from podwire.etcd import WatchEvent
from podwire.log import get_logger
from podwire.schema.secgroups import (
    SecurityGroup,
    parse_address_group,
    parse_group_member,
    parse_security_group,
)
from podwire.sgpolicy.compile import PolicyInputs

log = get_logger(__name__)


class PolicyStore:
    def __init__(self) -> None:
        self.groups: dict[str, SecurityGroup] = {}
        self.members: dict[str, dict[str, tuple[str, ...]]] = {}
        self.address_groups: dict[str, tuple[str, ...]] = {}
        self.problems: dict[str, list[str]] = {}  # key -> what is wrong with its value

    def apply(self, event: WatchEvent) -> bool:
        """Take one watch event; True if the policy changed."""
        parsed = keys.parse_global_key(event.key)
        if parsed is None:
            log.warning("agent.policy.bad_key", key=event.key[:300])
            return False
        kind, names = parsed
        self.problems.pop(event.key, None)
        if event.kind == "delete":
            return self._forget(kind, names)
        try:
            self._put(kind, names, event.value, event.key)
        except ValidationError as exc:
            log.warning("agent.policy.bad_value", key=event.key, error=str(exc))
            self.problems[event.key] = [str(exc)]
            self._forget(kind, names)
        return True

    def _put(self, kind: str, names: tuple[str, ...], raw: bytes, key: str) -> None:
        if kind == "secgroups":
            found = parse_security_group(raw, names[0])
            if found.problems:
                for problem in found.problems:
                    log.warning("agent.policy.rule_left_out", key=key, error=problem)
                self.problems[key] = list(found.problems)
            self.groups[names[0]] = found.group
        elif kind == "remote_groups":
            member = parse_group_member(raw, names[1])
            self.members.setdefault(names[0], {})[names[1]] = member.addresses
        else:
            self.address_groups[names[0]] = parse_address_group(raw, names[0]).addresses

    def _forget(self, kind: str, names: tuple[str, ...]) -> bool:
        if kind == "secgroups":
            return self.groups.pop(names[0], None) is not None
        if kind == "remote_groups":
            members = self.members.get(names[0], {})
            gone = members.pop(names[1], None) is not None
            if not members:
                self.members.pop(names[0], None)
            return gone
        return self.address_groups.pop(names[0], None) is not None

    def inputs(self) -> PolicyInputs:
        return PolicyInputs(self.groups, self.members, self.address_groups)
