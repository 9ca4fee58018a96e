"""Runs the driver's group callback inside a real Neutron DB transaction, outside any server:
``commit`` lets the transaction commit, ``rollback`` raises after the journal row was added.
Prints whether the group was marked for journaling inside the transaction (its row is added
when the transaction commits)."""

from __future__ import annotations

import json
import sys

from neutron_lib import context
from neutron_lib.callbacks import events, resources
from neutron_lib.db import api as db_api
from oslo_config import cfg
from oslo_db import options

from podwire.ml2.policy_callbacks import PENDING, PolicyJournal


class RolledBack(Exception):
    """Raised inside the transaction, as a failing later step of Neutron's would."""


def main(url: str, sg_id: str, mode: str) -> None:
    cfg.CONF([], project="podwire-test", default_config_files=[])
    options.set_defaults(cfg.CONF, connection=url)
    admin = context.get_admin_context()
    payload = events.DBEventPayload(admin, resource_id=sg_id)
    seen = 0
    try:
        with db_api.CONTEXT_WRITER.using(admin):
            PolicyJournal(lambda: None).group_changed(
                resources.SECURITY_GROUP, events.PRECOMMIT_UPDATE, None, payload=payload
            )
            seen = int(sg_id in admin.session.info[PENDING][1])
            if mode == "rollback":
                raise RolledBack
    except RolledBack:
        pass
    print(json.dumps({"marked_in_transaction": seen}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
