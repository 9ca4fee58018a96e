"""Active/standby: the controller holding ``/podwire/election/controller`` serves, others wait.

The election itself is ``podwire.etcd.election`` (shared with the ml2 forwarder); this module
only names the key and what the leader writes into it (who it is and since when), which
``podwire status`` shows. In-use records are written under the election's fence.
"""

from __future__ import annotations

import json
import time

from podwire import keys
from podwire.backoff import Backoff
from podwire.etcd.client import EtcdClient
from podwire.etcd.election import Election

ELECTION = keys.election("controller")


def controller_election(etcd: EtcdClient, identity: str, ttl: int = 10) -> Election:
    def value() -> bytes:
        return json.dumps({"v": 1, "identity": identity, "since": time.time()}).encode()

    return Election(etcd, ELECTION, ttl, value, Backoff(0.2, 2.0))
