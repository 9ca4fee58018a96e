"""Journals security groups, their rules and address groups from Neutron's callbacks.

Groups and rules: the ``PRECOMMIT_*`` callbacks, which Neutron publishes inside the
transaction of the change, mark the groups it touches; when that transaction commits (still
inside it) each marked group is read once and journaled whole. So a group's key changes if and
only if the change commits, and each row carries the group exactly as it committed.

Address groups: Neutron 29 publishes only ``AFTER_*`` events for them, after its own commit.
The row is written in a transaction of its own from the group as it is then; a process that
dies in between loses the row, and the forwarder's resync at its next election repairs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from neutron_lib.callbacks import events, registry, resources
from neutron_lib.db import api as db_api

from podwire import keys
from podwire.log import get_inline_logger
from podwire.ml2 import journal, policy_db

log = get_inline_logger(__name__)

AFTER_EVENTS = (events.AFTER_CREATE, events.AFTER_UPDATE, events.AFTER_DELETE)
# Session.info entries: the groups to journal at this transaction's commit, and whether the
# session's before_commit listener is installed.
PENDING = "podwire_pending_groups"
LISTENING = "podwire_commit_listener"


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
        _journal_at_commit(payload.context, [payload.resource_id])

    def group_deleted(self, _resource: str, _event: str, _trigger: Any, payload: Any) -> None:
        context, sg_id = payload.context, payload.resource_id
        with db_api.CONTEXT_WRITER.using(context):
            # Rules elsewhere that name this group go with it (a foreign-key cascade that
            # publishes nothing): their groups are journaled again, read at commit.
            others = policy_db.groups_referencing(context.session, sg_id)
        _journal_at_commit(context, [sg_id, *others])

    def rule_created(self, _resource: str, _event: str, _trigger: Any, payload: Any) -> None:
        _journal_at_commit(payload.context, [payload.states[0]["security_group_id"]])

    def rule_deleted(self, _resource: str, _event: str, _trigger: Any, payload: Any) -> None:
        _journal_at_commit(payload.context, [payload.metadata["security_group_id"]])

    def address_group_changed(
        self, _resource: str, _event: str, _trigger: Any, payload: Any
    ) -> None:
        context, ag_id = payload.context, payload.resource_id
        with db_api.CONTEXT_WRITER.using(context):
            value = policy_db.read_address_group_value(context.session, ag_id)
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


def _journal_at_commit(context: Any, sg_ids: list[str]) -> None:
    """Journal these groups as the transaction commits them, once each.

    Read when the transaction commits (SQLAlchemy's ``before_commit``, still inside it), not
    at each callback: a bulk create of N rules publishes N events in one transaction, and
    reading and encoding the growing group each time would cost O(N^2). At commit the
    group is exactly what commits: rules deleted, cascades done, the group gone or not.
    """
    with db_api.CONTEXT_WRITER.using(context):
        session = context.session
        transaction = session.get_transaction()
        held = session.info.get(PENDING)
        if held is None or held[0] is not transaction:
            held = (transaction, set())
            session.info[PENDING] = held
        held[1].update(sg_ids)
        if not session.info.get(LISTENING):
            sa.event.listen(session, "before_commit", _journal_pending)
            session.info[LISTENING] = True


def _journal_pending(session: Any) -> None:
    held = session.info.pop(PENDING, None)
    if held is None or held[0] is not session.get_transaction():
        return  # marked in a transaction that rolled back
    session.flush()  # rows this transaction changed are rows the query must see
    _add_rows(session, policy_db.group_values(session, held[1]))


def _add_rows(session: Any, values: dict[str, str | None]) -> None:
    for key, value in values.items():
        journal.add(session, key, value)
        log.debug("ml2.policy.journaled", key=key, deleted=value is None)
