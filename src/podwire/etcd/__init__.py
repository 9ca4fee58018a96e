"""etcd access: a thin asyncio client on etcd's v3 gRPC API and a list-then-watch helper."""

from podwire.etcd.client import EtcdClient, KeyValue, Lease
from podwire.etcd.watch import PrefixWatcher, WatchBatch, WatchEvent

__all__ = ["EtcdClient", "KeyValue", "Lease", "PrefixWatcher", "WatchBatch", "WatchEvent"]
