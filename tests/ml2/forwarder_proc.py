"""A forwarder in a process of its own, so a test can SIGKILL it mid-drain."""

from __future__ import annotations

import asyncio
import sys

from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.ml2.forwarder import Forwarder, ForwarderSettings
from podwire.ml2.journal import SqlJournal
from tests.ml2.journal_copy import copy_table


async def main(etcd_url: str, db_url: str, table: str, election: str, kick: str) -> None:
    client = await EtcdClient.connect(EtcdSettings(endpoints=[etcd_url]))
    settings = ForwarderSettings(
        identity=f"proc-{table}", election_key=election, kick_key=kick, lease_ttl=2,
        batch_size=5, poll_interval=0.2,
    )  # fmt: skip
    await Forwarder(client, SqlJournal(db_url, copy_table(table)), settings).run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
