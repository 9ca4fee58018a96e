"""Brings the policy keys in etcd back to Neutron's tables when a forwarder starts leading.

Rows can be lost where no transaction covers them (address groups, see ``policy_callbacks``),
keys can be deleted by hand, and a database restored from backup leaves keys of groups that
no longer exist. The leader reads a consistent snapshot of Neutron's tables, compares it with
everything under the three policy prefixes, and puts what differs and deletes what is stale,
fenced like every journal batch.

Why it cannot undo a newer change: it runs on the forwarder's own loop between two drains. A
change committed before the snapshot is in it; one committed after has a journal row that the
next drain sends after the resync's writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from podwire import keys
from podwire.etcd.client import Compare, EtcdClient, Op, delete_op, put_op

POLICY_PREFIXES = (
    keys.secgroups_prefix(),
    keys.remote_groups_prefix(),
    keys.address_groups_prefix(),
)


class PolicySource(Protocol):
    def read(self) -> dict[str, str]:
        """Every policy key and value Neutron's tables give (blocking)."""
        ...


@dataclass(frozen=True)
class ResyncResult:
    put: int
    deleted: int
    unchanged: int
    # etcd revision the policy keys now stand at: the last write, else the newest key.
    revision: int


async def current_keys(client: EtcdClient, namespace: str = "") -> tuple[dict[str, bytes], int]:
    """Every policy key's value in ``namespace`` (keys as stored), and the newest mod
    revision among them."""
    found: dict[str, bytes] = {}
    newest = 0
    for prefix in POLICY_PREFIXES:
        values, _revision = await client.get_prefix(namespace + prefix)
        found.update({kv.key: kv.value for kv in values})
        newest = max([newest, *(kv.mod_revision for kv in values)])
    return found, newest


def resync_ops(wanted: dict[str, str], present: dict[str, bytes]) -> tuple[list[Op], int, int]:
    """Ops taking ``present`` to ``wanted``, with how many are puts and deletes."""
    puts = [
        put_op(key, value.encode())
        for key, value in sorted(wanted.items())
        if present.get(key) != value.encode()
    ]
    deletes = [delete_op(key) for key in sorted(present) if key not in wanted]
    return puts + deletes, len(puts), len(deletes)


async def resync(
    client: EtcdClient,
    wanted: dict[str, str],
    guards: Sequence[Compare],
    batch_size: int,
    namespace: str = "",
) -> ResyncResult | None:
    """Write the difference into ``namespace`` in fenced txns; None when the fence failed (no
    longer leader)."""
    present, revision = await current_keys(client, namespace)
    stored = {namespace + key: value for key, value in wanted.items()}
    ops, puts, deletes = resync_ops(stored, present)
    for start in range(0, len(ops), batch_size):
        accepted, revision = await client.txn(guards, ops[start : start + batch_size])
        if not accepted:
            return None
    return ResyncResult(puts, deletes, len(wanted) - puts, revision)
