"""Active/standby: the controller holding ``/podwire/election/controller`` serves, others wait.

The key is created only if absent, bound to a lease that the leader keeps alive; if the leader
dies the lease expires and the key goes, and a standby watching the key creates it. The lease
id is also the fencing token: in-use records are written in transactions that require the key
to still carry this lease.
"""

from __future__ import annotations

import json
import time

from podwire import keys
from podwire.errors import EtcdUnavailable
from podwire.etcd.client import Compare, EtcdClient, Lease, lease_is
from podwire.etcd.watch import PrefixWatcher
from podwire.log import get_logger

log = get_logger(__name__)

ELECTION = keys.election("controller")


class Leadership:
    def __init__(self, etcd: EtcdClient, identity: str, ttl: int = 10) -> None:
        self._etcd = etcd
        self.identity = identity
        self._ttl = ttl
        self.lease: Lease | None = None

    def fence(self) -> list[Compare]:
        lease_id = self.lease.id if self.lease is not None else -1
        return [lease_is(ELECTION, lease_id)]

    async def campaign(self) -> None:
        """Return once this process is the leader; wait on the key's deletion otherwise."""
        value = json.dumps({"v": 1, "identity": self.identity, "since": time.time()}).encode()
        watcher = PrefixWatcher(self._etcd, ELECTION)
        async for _ in watcher.batches():  # the listing, then every change of the key
            if await self._try(value):
                return
            log.info("controller.leader.standby", identity=self.identity)
        raise AssertionError("unreachable: the watcher never ends")

    async def _try(self, value: bytes) -> bool:
        lease = await self._etcd.grant_lease(self._ttl)
        if await self._etcd.create_if_absent(ELECTION, value, lease.id):
            self.lease = lease
            log.info("controller.leader.elected", identity=self.identity)
            return True
        await lease.revoke()
        return False

    async def hold(self) -> None:
        """Keep the lease alive; raises LeaseLost when leadership is gone."""
        if self.lease is None:
            raise EtcdUnavailable("not the leader")
        await self.lease.keepalive()

    async def resign(self) -> None:
        if self.lease is not None:
            await self.lease.revoke()
            self.lease = None

    async def leader(self) -> str | None:
        kv = await self._etcd.get(ELECTION)
        if kv is None:
            return None
        try:
            return str(json.loads(kv.value)["identity"])
        except (ValueError, KeyError, TypeError):
            return None
