"""What tests and benchmarks do to etcd that podwire itself never does: clear a prefix of
their own, compact the history.

Production deletes only keys it names (each under its own guard), and leaves compaction to
etcd's own schedule, so these live here, built on the client's public calls.
"""

from __future__ import annotations

from aetcd import rpc

from podwire.etcd.client import EtcdClient, delete_op

TXN_OPS = 100  # under etcd's --max-txn-ops (128 by default)


async def delete_prefix(etcd: EtcdClient, prefix: str) -> int:
    """Delete every key under ``prefix``; how many there were."""
    found, _ = await etcd.get_prefix(prefix)
    names = [kv.key for kv in found]
    for start in range(0, len(names), TXN_OPS):
        await etcd.txn([], [delete_op(name) for name in names[start : start + TXN_OPS]])
    return len(names)


async def compact(etcd: EtcdClient, revision: int) -> None:
    """Compact etcd's history up to ``revision``: a watch resuming before it must re-list."""
    request = rpc.CompactionRequest(revision=revision, physical=True)
    await etcd.endpoint.kv.Compact(request, metadata=await etcd.auth_metadata())
