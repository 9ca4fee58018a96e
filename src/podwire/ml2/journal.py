"""The journal: podwire's table in Neutron's database, one row per desired etcd change.

Rows are added inside ML2's own transaction (``*_precommit``), so a change reaches etcd if and
only if the port change committed. The autoincrement id is the order in which the forwarder
replays them; a NULL value means "delete the key".
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from neutron_lib.db import model_base
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql

from podwire.errors import RetryableError

TABLE = "podwire_journal"


class JournalRow(model_base.BASEV2):  # type: ignore[misc]
    __tablename__ = TABLE

    id = sa.Column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)
    key = sa.Column(sa.String(512), nullable=False)
    # MEDIUMTEXT on MySQL/MariaDB: a security group's value holds all its rules (~300 bytes
    # each), past TEXT's 64 KiB at a few hundred rules.
    value = sa.Column(sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb"), nullable=True)
    created_at = sa.Column(sa.DateTime(), nullable=False)
    attempts = sa.Column(sa.Integer(), nullable=False, default=0)


class JournalUnavailable(RetryableError):
    """The database could not be read or written; the forwarder retries later."""


@dataclass(frozen=True)
class Entry:
    id: int
    key: str
    value: str | None


def add(session: Any, key: str, value: str | None) -> None:
    """Queue one change in the caller's (ML2's) transaction.

    A key written again in the same transaction updates that transaction's row instead of
    adding one: a bulk create of N rules would otherwise journal the whole group N times
    (quadratic in the group's size). Nothing else sees the rows before the commit, so only
    the last value of a key in one transaction can ever matter.
    """
    transaction = session.get_transaction()
    rows = _rows_of(session, transaction)
    row = rows.get(key)
    if row is not None:
        row.value = value  # type: ignore[assignment]
        return
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    row = JournalRow(key=key, value=value, created_at=now, attempts=0)
    session.add(row)
    rows[key] = row


def _rows_of(session: Any, transaction: Any) -> dict[str, JournalRow]:
    """The rows this transaction added, kept in the session's ``info`` (the transaction is
    held there too, so a later transaction, a different object, starts afresh)."""
    held = session.info.get(TABLE)
    if held is None or held[0] is not transaction:
        held = (transaction, {})
        session.info[TABLE] = held
    rows: dict[str, JournalRow] = held[1]
    return rows


class SqlJournal:
    """Journal access for the forwarder, on an engine of its own outside ML2's sessions.

    Every method is blocking; the forwarder calls them through ``asyncio.to_thread``.
    """

    def __init__(self, url: str, table: sa.Table | None = None) -> None:
        self._engine = sa.create_engine(url, pool_size=2, pool_pre_ping=True)
        self._table = JournalRow.__table__ if table is None else table

    def fetch(self, limit: int) -> list[Entry]:
        query = sa.select(self._table.c.id, self._table.c.key, self._table.c.value)
        query = query.order_by(self._table.c.id).limit(limit)
        try:
            with self._engine.connect() as conn:
                return [Entry(int(r.id), str(r.key), r.value) for r in conn.execute(query)]
        except sa_exc.SQLAlchemyError as exc:
            raise JournalUnavailable(f"journal read failed: {exc}") from exc

    def delete(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        try:
            with self._engine.begin() as conn:
                conn.execute(sa.delete(self._table).where(self._table.c.id.in_(list(ids))))
        except sa_exc.SQLAlchemyError as exc:
            raise JournalUnavailable(f"journal delete failed: {exc}") from exc

    def mark_attempt(self, ids: Sequence[int]) -> None:
        """Count failed sends, so an operator can see rows that etcd keeps refusing."""
        if not ids:
            return
        statement = (
            sa.update(self._table)
            .where(self._table.c.id.in_(list(ids)))
            .values(attempts=self._table.c.attempts + 1)
        )
        try:
            with self._engine.begin() as conn:
                conn.execute(statement)
        except sa_exc.SQLAlchemyError as exc:
            raise JournalUnavailable(f"journal update failed: {exc}") from exc

    def append(self, key: str, value: str | None) -> None:
        """Add a row outside any Neutron transaction (tools and tests)."""
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        row = {"key": key, "value": value, "created_at": now, "attempts": 0}
        try:
            with self._engine.begin() as conn:
                conn.execute(sa.insert(self._table).values(**row))
        except sa_exc.SQLAlchemyError as exc:
            raise JournalUnavailable(f"journal insert failed: {exc}") from exc

    def create_table(self) -> None:
        self._table.create(self._engine, checkfirst=True)

    def count(self) -> int:
        try:
            with self._engine.connect() as conn:
                counted = conn.execute(sa.select(sa.func.count()).select_from(self._table))
                return int(counted.scalar() or 0)
        except sa_exc.SQLAlchemyError as exc:
            raise JournalUnavailable(f"journal count failed: {exc}") from exc

    def depth(self) -> tuple[int, float]:
        """Rows waiting and the age in seconds of the oldest one (0 when empty)."""
        query = sa.select(sa.func.count(), sa.func.min(self._table.c.created_at))
        try:
            with self._engine.connect() as conn:
                count, oldest = conn.execute(query).one()
        except sa_exc.SQLAlchemyError as exc:
            raise JournalUnavailable(f"journal depth failed: {exc}") from exc
        if not count or oldest is None:
            return 0, 0.0
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        return int(count), max(0.0, (now - oldest).total_seconds())

    def close(self) -> None:
        self._engine.dispose()
