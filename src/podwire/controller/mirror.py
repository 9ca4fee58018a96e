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
from collections.abc import Mapping

from podwire import keys
from podwire.errors import ValidationError
from podwire.etcd.client import EtcdClient, KeyValue
from podwire.log import get_logger
from podwire.schema.inuse import PoolKey
from podwire.schema.ports import DesiredPort, parse_desired_port
from podwire.schema.records import parse_ml2_report
from podwire.schema.vif import DEVICE_OWNER, Vif

log = get_logger(__name__)

# A forwarder report older than this means no forwarder is running (it reports every 2 s).
REPORT_MAX_AGE = 10.0


def forwarder_doubt(report: bytes | None, now: float, backlog_ok: bool = False) -> str | None:
    """Why the mirror cannot be trusted now, or None when the forwarder vouches for it.

    ``backlog_ok``: a running forwarder with rows still to send is good enough for facts about
    single ports (the rows go out in order within moments, like a change that lands just after
    a Neutron listing); recovery, which takes every port at once, wants an empty journal.
    """
    if report is None:
        return "no ml2 forwarder has reported"
    try:
        value = parse_ml2_report(report)
    except ValidationError as exc:
        return str(exc)
    if value.journal_depth and not backlog_ok:
        return f"the ml2 journal holds {value.journal_depth} rows not yet in etcd"
    age = now - value.updated_at
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
    port = parse_desired_port(raw, parsed[1])
    if port.device_owner != DEVICE_OWNER:
        return None
    if not port.project_id:
        raise ValidationError(f"{key}: no project_id (written by an older ml2 driver)")
    vif = vif_of(port, port.project_id)
    return PoolKey(parsed[0], vif.project_id, vif.network_id), vif


def vif_of(port: DesiredPort, project_id: str) -> Vif:
    return Vif(
        port_id=port.port_id,
        network_id=port.network_id,
        project_id=project_id,
        mac_address=port.mac_address,
        mtu=port.mtu,
        fixed_ips=list(port.fixed_ips),
        network_type=port.network_type,
        segmentation_id=port.segmentation_id,
        vif_type=port.vif_type,
        security_groups=list(port.security_groups),
    )


class MirrorFacts:
    """Current SGs of released ports from the mirror: a recycling pass costs etcd reads, not a
    Neutron listing (which takes seconds while Neutron is busy creating a burst's ports)."""

    def __init__(self, etcd: EtcdClient) -> None:
        self._etcd = etcd
        self.vouched = True  # whether the last answer came from the mirror (hoped at first)
        # Per node, port -> (mod revision, SGs): a value is parsed once, not at every recycle.
        self._parsed: dict[str, dict[str, tuple[int, list[str]]]] = {}

    async def bound_sgs(self, ports: Mapping[str, PoolKey]) -> dict[str, list[str]] | None:
        """SGs of those ports the mirror shows bound to their pool's node; None when no running
        forwarder vouches for the mirror. A port left out (unbound, failed, deleted, or a value
        that does not parse) is for Neutron to answer."""
        status = await self._etcd.get(keys.status("ml2"))
        doubt = forwarder_doubt(status.value if status else None, time.time(), backlog_ok=True)
        self.vouched = doubt is None
        if doubt is not None:
            log.info("pool.recycle_from_neutron", reason=doubt)
            return None
        found: dict[str, list[str]] = {}
        for node in sorted({key.node for key in ports.values()}):
            items, _ = await self._etcd.get_prefix(keys.node_ports_prefix(node))
            found.update(self._node_sgs(node, items, ports))
        return found

    def _node_sgs(
        self, node: str, items: list[KeyValue], wanted: Mapping[str, PoolKey]
    ) -> dict[str, list[str]]:
        """The wanted ports' SGs from one node's listing; the cache keeps what it listed."""
        before = self._parsed.get(node, {})
        kept: dict[str, tuple[int, list[str]]] = {}
        for kv in items:
            parsed = keys.parse_node_port_key(kv.key)
            if parsed is None:
                continue
            port_id = parsed[1]
            known = before.get(port_id)
            if known is not None and known[0] == kv.mod_revision:
                kept[port_id] = known
            elif port_id in wanted:
                try:
                    sgs = list(parse_desired_port(kv.value, port_id).security_groups)
                except ValidationError as exc:
                    log.warning("pool.mirror_value_unusable", key=kv.key, error=str(exc))
                    continue
                kept[port_id] = (kv.mod_revision, sgs)
        self._parsed[node] = kept
        return {port_id: kept[port_id][1] for port_id in wanted if port_id in kept}


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
