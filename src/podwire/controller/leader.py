"""Active/standby: the controller holding ``/podwire/election/controller`` serves, others wait.

The election itself is ``podwire.etcd.election`` (shared with the ml2 forwarder); this module
only names the key and what the leader writes into it (who it is and since when), which
``podwire status`` shows. In-use records are written under the election's fence.
"""

from __future__ import annotations

from podwire import keys
from podwire.backoff import Backoff
from podwire.etcd.client import EtcdClient
from podwire.etcd.election import Election
from podwire.schema.records import leader_value

ELECTION = keys.election("controller")


def controller_election(etcd: EtcdClient, identity: str, ttl: int = 10) -> Election:
    return Election(etcd, ELECTION, ttl, lambda: leader_value(identity), Backoff(0.2, 2.0))
