"""Reads Neutron's security-group tables for the policy values, in one place.

Plain SQL on Neutron's own tables, through whatever SQLAlchemy session or connection the
caller holds: inside ML2's transaction (the driver; it sees the change being made) or on the
forwarder's engine (the resync; it sees everything committed). No Neutron objects: those
filter by the request's project, and a rule an admin added to a project's group is policy too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from podwire import keys
from podwire.errors import RetryableError
from podwire.ml2 import policy

GROUP = sa.text(
    "SELECT g.id, g.project_id, g.stateful, s.revision_number FROM securitygroups g"
    " JOIN standardattributes s ON s.id = g.standard_attr_id WHERE g.id IN :ids"
).bindparams(sa.bindparam("ids", expanding=True))
ALL_GROUPS = sa.text(
    "SELECT g.id, g.project_id, g.stateful, s.revision_number FROM securitygroups g"
    " JOIN standardattributes s ON s.id = g.standard_attr_id"
)
RULE_COLUMNS = "id, security_group_id, " + ", ".join(policy.RULE_FIELDS[1:])
RULES = sa.text(
    f"SELECT {RULE_COLUMNS} FROM securitygrouprules WHERE security_group_id IN :ids"
).bindparams(sa.bindparam("ids", expanding=True))
ALL_RULES = sa.text(f"SELECT {RULE_COLUMNS} FROM securitygrouprules")
REFERENCING = sa.text(
    "SELECT DISTINCT security_group_id FROM securitygrouprules"
    " WHERE remote_group_id = :sg_id AND security_group_id != :sg_id"
)
BINDINGS = sa.text("SELECT security_group_id, port_id FROM securitygroupportbindings")
FIXED_IPS = sa.text("SELECT port_id, ip_address FROM ipallocations")
PAIRS = sa.text("SELECT port_id, ip_address FROM allowedaddresspairs")
ADDRESS_GROUP = sa.text("SELECT id FROM address_groups WHERE id = :ag_id")
ALL_ADDRESS_GROUPS = sa.text("SELECT id FROM address_groups")
ADDRESSES = sa.text("SELECT address FROM address_associations WHERE address_group_id = :ag_id")
ALL_ADDRESSES = sa.text("SELECT address_group_id, address FROM address_associations")


class PolicyUnavailable(RetryableError):
    """Neutron's tables could not be read for a resync; the forwarder retries later."""


def _group_row(row: Any) -> policy.GroupRow:
    return policy.GroupRow(
        sg_id=str(row.id),
        project_id=row.project_id or None,
        stateful=bool(row.stateful),
        revision=int(row.revision_number or 0),
    )


def group_values(db: Any, sg_ids: Iterable[str]) -> dict[str, str | None]:
    """The current value of each group (None: the group is gone)."""
    wanted = sorted(set(sg_ids))
    if not wanted:
        return {}
    groups = {str(row.id): _group_row(row) for row in db.execute(GROUP, {"ids": wanted})}
    rules: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in db.execute(RULES, {"ids": wanted}):
        rules[str(row.security_group_id)].append(dict(row._mapping))
    return {
        keys.secgroup(sg_id): (
            policy.group_value(groups[sg_id], rules[sg_id]) if sg_id in groups else None
        )
        for sg_id in wanted
    }


def groups_referencing(db: Any, sg_id: str) -> list[str]:
    """Other groups with rules naming ``sg_id`` as remote group (the database deletes those
    rules with the group, without a callback)."""
    return sorted(str(row[0]) for row in db.execute(REFERENCING, {"sg_id": sg_id}))


def read_address_group_value(db: Any, ag_id: str) -> str | None:
    """The group's current value (None: it is gone), read in the caller's transaction; the
    value itself is ``policy.address_group_value``'s, as the resync's."""
    if db.execute(ADDRESS_GROUP, {"ag_id": ag_id}).first() is None:
        return None
    addresses = [str(row[0]) for row in db.execute(ADDRESSES, {"ag_id": ag_id})]
    return policy.address_group_value(ag_id, addresses)


def snapshot(db: Any) -> dict[str, str]:
    """Every policy key with its value, as the journal would have left them."""
    values: dict[str, str] = {}
    values.update(_all_groups(db))
    values.update(_all_members(db))
    values.update(_all_address_groups(db))
    return values


def _all_groups(db: Any) -> dict[str, str]:
    rules: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in db.execute(ALL_RULES):
        rules[str(row.security_group_id)].append(dict(row._mapping))
    groups = [_group_row(row) for row in db.execute(ALL_GROUPS)]
    return {keys.secgroup(g.sg_id): policy.group_value(g, rules[g.sg_id]) for g in groups}


def _all_members(db: Any) -> dict[str, str]:
    fixed: dict[str, list[str]] = defaultdict(list)
    for row in db.execute(FIXED_IPS):
        fixed[str(row.port_id)].append(str(row.ip_address))
    pairs: dict[str, list[str]] = defaultdict(list)
    for row in db.execute(PAIRS):
        pairs[str(row.port_id)].append(str(row.ip_address))
    groups: dict[str, set[str]] = defaultdict(set)
    for row in db.execute(BINDINGS):
        groups[str(row.port_id)].add(str(row.security_group_id))
    values: dict[str, str] = {}
    for port_id, port_groups in groups.items():
        addresses = policy.member_addresses(fixed[port_id], pairs[port_id])
        values.update(policy.Membership(port_id, frozenset(port_groups), addresses).puts())
    return values


def _all_address_groups(db: Any) -> dict[str, str]:
    addresses: dict[str, list[str]] = defaultdict(list)
    for row in db.execute(ALL_ADDRESSES):
        addresses[str(row.address_group_id)].append(str(row.address))
    return {
        keys.address_group(str(row[0])): policy.address_group_value(
            str(row[0]), addresses[str(row[0])]
        )
        for row in db.execute(ALL_ADDRESS_GROUPS)
    }


class PolicySnapshot:
    """The resync's source: Neutron's tables read on an engine of the forwarder's own, in one
    read transaction (a consistent picture). Blocking; called through ``asyncio.to_thread``."""

    def __init__(self, url: str) -> None:
        self._engine = sa.create_engine(url, pool_size=1, pool_pre_ping=True)

    def read(self) -> dict[str, str]:
        try:
            with self._engine.connect() as conn, conn.begin():
                return snapshot(conn)
        except sa_exc.SQLAlchemyError as exc:
            raise PolicyUnavailable(f"policy snapshot failed: {exc}") from exc

    def close(self) -> None:
        self._engine.dispose()
