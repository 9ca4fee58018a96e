"""Journals security groups, their rules and address groups from Neutron's callbacks.

Groups and rules: in the ``PRECOMMIT_*`` callbacks, which Neutron publishes inside the
transaction of the change, so a group's key changes if and only if the change commits (a
raise here rolls it back). Each journal row carries the whole group as the transaction sees
it, so replaying rows in order always ends at the committed group.

Address groups: Neutron 29 publishes only ``AFTER_*`` events for them, after its own commit.
The row is written in a transaction of its own from the group as it is then; a process that
dies in between loses the row, and the forwarder's resync at its next election repairs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neutron_lib.callbacks import events, registry, resources
from neutron_lib.db import api as db_api

from podwire import keys
from podwire.ml2 import journal, policy_db
from podwire.ml2.mlog import get_logger

log = get_logger(__name__)

AFTER_EVENTS = (events.AFTER_CREATE, events.AFTER_UPDATE, events.AFTER_DELETE)


class PolicyJournal:
    def __init__(self, kick: Callable[[], None]) -> None:
        self._kick = kick

    def subscribe(self) -> None:
        sg, rule = resources.SECURITY_GROUP, resources.SECURITY_GROUP_RULE
        for event in (events.PRECOMMIT_CREATE, events.PRECOMMIT_UPDATE):
            registry.subscribe(self.group_changed, sg, event)
        registry.subscribe(self.group_deleted, sg, events.PRECOMMIT_DELETE)
        registry.subscribe(self.rule_created, rule, events.PRECOMMIT_CREATE)
        registry.subscribe(self.rule_deleted, rule, events.PRECOMMIT_DELETE)
        ag = getattr(resources, "ADDRESS_GROUP", None)
        if ag is not None:
            for event in (events.AFTER_CREATE, events.AFTER_UPDATE):
                registry.subscribe(self.address_group_changed, ag, event)
            registry.subscribe(self.address_group_deleted, ag, events.AFTER_DELETE)
        for resource in (sg, rule):
            for event in AFTER_EVENTS:
                registry.subscribe(self.committed, resource, event)

    # Neutron calls every callback with (resource, event, trigger, payload).

    def group_changed(self, _resource: str, _event: str, _trigger: Any, payload: Any) -> None:
        self._journal_groups(payload.context, [payload.resource_id])

    def group_deleted(self, _resource: str, _event: str, _trigger: Any, payload: Any) -> None:
        context, sg_id = payload.context, payload.resource_id
        with db_api.CONTEXT_WRITER.using(context):
            session = context.session
            session.flush()
            # Rules elsewhere that name this group go with it (a foreign-key cascade that
            # publishes nothing), so their groups are journaled without them.
            others = policy_db.groups_referencing(session, sg_id)
            values = policy_db.group_values(session, others, gone_group=sg_id)
            values[keys.secgroup(sg_id)] = None
            _add_rows(session, values)

    def rule_created(self, _resource: str, _event: str, _trigger: Any, payload: Any) -> None:
        self._journal_groups(payload.context, [payload.states[0]["security_group_id"]])

    def rule_deleted(self, _resource: str, _event: str, _trigger: Any, payload: Any) -> None:
        sg_id = payload.metadata["security_group_id"]
        skip = frozenset({payload.resource_id})
        self._journal_groups(payload.context, [sg_id], skip)

    def address_group_changed(
        self, _resource: str, _event: str, _trigger: Any, payload: Any
    ) -> None:
        context, ag_id = payload.context, payload.resource_id
        with db_api.CONTEXT_WRITER.using(context):
            value = policy_db.address_group_value(context.session, ag_id)
            _add_rows(context.session, {keys.address_group(ag_id): value})
        self._kick()

    def address_group_deleted(
        self, _resource: str, _event: str, _trigger: Any, payload: Any
    ) -> None:
        context = payload.context
        with db_api.CONTEXT_WRITER.using(context):
            _add_rows(context.session, {keys.address_group(payload.resource_id): None})
        self._kick()

    def committed(self, _resource: str, _event: str, _trigger: Any, payload: Any) -> None:
        self._kick()

    @staticmethod
    def _journal_groups(
        context: Any, sg_ids: list[str], skip_rules: frozenset[str] = frozenset()
    ) -> None:
        with db_api.CONTEXT_WRITER.using(context):
            session = context.session
            session.flush()  # rules this transaction added are rows the query must see
            _add_rows(session, policy_db.group_values(session, sg_ids, skip_rules))


def _add_rows(session: Any, values: dict[str, str | None]) -> None:
    for key, value in values.items():
        journal.add(session, key, value)
        log.debug("ml2.policy.journaled", key=key, deleted=value is None)
