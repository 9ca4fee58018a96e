"""Pools rebuilt from the ml2 forwarder's copy of bound ports in etcd: the fast recovery path.

Listing ports through Neutron's API costs about a millisecond per port in Neutron itself (ORM
loading and a policy check per port), so 10,000 pool ports take ~10 s to list however the
listing is split. Every port Neutron binds for podwire is mirrored under
``/podwire/nodes/<host>/ports/<id>`` by the journal written in the port's own transaction, so
when the forwarder reports an empty journal and a fresh report, that mirror is as current as a
listing would be (a listing is a snapshot too). Then the pools come from one etcd range read;
otherwise recovery lists Neutron as before. Either way Neutron is listed once more in the
background afterwards (``recovery.verify``): leftovers are deleted and any pooled port that
Neutron no longer has is dropped.
"""

from __future__ import annotations

import time
from collections import defaultdict

from podwire import keys
from podwire.controller.neutron_ops import DEVICE_OWNER
from podwire.controller.pools import PoolKey
from podwire.errors import ValidationError
from podwire.etcd.client import EtcdClient
from podwire.log import get_logger
from podwire.vif import Vif
from podwire.wire import load_object, parse_desired_port

log = get_logger(__name__)

# A forwarder report older than this means no forwarder is running (it reports every 2 s).
REPORT_MAX_AGE = 10.0


def forwarder_doubt(report: bytes | None, now: float) -> str | None:
    """Why the mirror cannot be trusted now, or None when the forwarder vouches for it."""
    if report is None:
        return "no ml2 forwarder has reported"
    try:
        value = load_object(report, "ml2 status")
        depth, updated_at = value.get("journal_depth"), value.get("updated_at")
        if not isinstance(depth, int) or not isinstance(updated_at, int | float):
            raise ValidationError("ml2 status: journal_depth or updated_at missing")
    except ValidationError as exc:
        return str(exc)
    if depth:
        return f"the ml2 journal holds {depth} rows not yet in etcd"
    age = now - float(updated_at)
    if age > REPORT_MAX_AGE:
        return f"the ml2 forwarder's last report is {age:.0f} s old"
    return None


def mirrored_vif(key: str, raw: bytes) -> tuple[PoolKey, Vif] | None:
    """A pool port from one mirror entry; None for ports that are not ours (VMs, subports).

    ValidationError when the entry is ours but unusable, e.g. written by an ml2 driver too old
    to record the project.
    """
    parsed = keys.parse_node_port_key(key)
    if parsed is None:
        return None
    value = parse_desired_port(raw, key)
    if value.get("device_owner") != DEVICE_OWNER:
        return None
    if not value.get("project_id"):
        raise ValidationError(f"{key}: no project_id (written by an older ml2 driver)")
    vif = Vif.from_json(value)
    return PoolKey(parsed[0], vif.project_id, vif.network_id), vif


async def pools_from_mirror(etcd: EtcdClient, in_use: set[str]) -> dict[PoolKey, list[Vif]] | None:
    """Free pool ports by key, or None (with the reason logged) to fall back to Neutron."""
    status = await etcd.get(keys.status("ml2"))
    doubt = forwarder_doubt(status.value if status else None, time.time())
    if doubt is not None:
        log.info("controller.recovery.neutron_listing", reason=doubt)
        return None
    items, _ = await etcd.get_prefix(keys.nodes_prefix())
    by_key: defaultdict[PoolKey, list[Vif]] = defaultdict(list)
    for kv in items:
        try:
            found = mirrored_vif(kv.key, kv.value)
        except ValidationError as exc:
            log.info("controller.recovery.neutron_listing", reason=str(exc))
            return None
        if found is not None and found[1].port_id not in in_use:
            by_key[found[0]].append(found[1])
    return by_key
