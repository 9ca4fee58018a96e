"""Active/standby: the controller holding ``/podwire/election/controller`` serves, others wait.

The election itself is ``podwire.etcd.election`` (shared with the ml2 forwarder); this module
only names the key and what the leader writes into it (who it is, where it serves and since
when), which ``podwire status`` shows and standbys name in their refusals. In-use records
are written under the election's fence.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from podwire import keys
from podwire.backoff import Backoff
from podwire.config import ControllerSettings
from podwire.errors import PodwireError
from podwire.etcd.client import EtcdClient
from podwire.etcd.election import Election
from podwire.schema.records import leader_value, parse_leader_record

ELECTION = keys.election("controller")


def controller_election(
    etcd: EtcdClient, identity: str, url: Callable[[], str], ttl: int = 10
) -> Election:
    """``url``: where this controller serves, read when it is elected."""
    return Election(etcd, ELECTION, ttl, lambda: leader_value(identity, url()), Backoff(0.2, 2.0))


def advertised_url(settings: ControllerSettings, port: int) -> str:
    if settings.advertise_url:
        return settings.advertise_url
    host = settings.listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


async def leader_url(etcd: EtcdClient) -> str:
    """Where the leader says it serves; empty when unknown (no leader, etcd away, an older
    leader that did not say, a value that does not parse)."""
    try:
        found = await etcd.get(ELECTION)
        return parse_leader_record(found.value).url if found is not None else ""
    except PodwireError:
        return ""
