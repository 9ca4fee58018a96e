"""Recovery's logic on a fake Neutron (no stack): what is pooled, adopted, deleted, dropped.

test_recovery.py and test_bindings.py check the same against the real stack.
"""

from __future__ import annotations

import time

from podwire.controller.recovery import RecoveryReport, recover, verify
from podwire.schema.inuse import PoolKey
from podwire.schema.vif import VifRequest
from tests.controller.fakes import NET, PROJECT, in_use, port, vif_of, world

KEY = PoolKey("n1", PROJECT, NET)


async def test_bound_ports_are_pooled_leftovers_deleted_in_use_adopted() -> None:
    w = world()
    free, other_host, unbound, failed, used = (
        port(1),
        port(2, host="n2"),
        port(3, host=""),
        port(4, vif_type="binding_failed"),
        port(5),
    )
    w.neutron.add(free, other_host, unbound, failed, used)
    w.store.records[("n1", "c1:eth0")] = in_use(used, "c1:eth0")
    report = await recover(w.service, w.ops, None)
    assert (report.source, report.pooled, report.in_use, report.deleted) == ("neutron", 2, 1, 2)
    assert sorted(w.neutron.deleted) == sorted([unbound.id, failed.id])
    assert w.service.snapshot(KEY).groups == [((), [free.id])]
    assert w.service.pool_size(PoolKey("n2", PROJECT, NET)) == 1
    assert {r.vif.port_id for r in w.service.attachments.values()} == {used.id}
    assert w.service.knows(used.id)  # adopted: its release can be recycled


async def test_the_pool_gauge_follows_recovery_takes_and_releases() -> None:
    w = world()
    w.neutron.add(port(1), port(2))
    await recover(w.service, w.ops, None)
    assert w.gauge(KEY) == 2
    w.service.serving = True
    vif = await w.broker.request("n1", VifRequest("c1:eth0", NET, PROJECT, ()))
    assert w.gauge(KEY) == 1
    assert w.metrics.registry.get_sample_value("podwire_vifs_in_use") == 1
    await w.broker.release("n1", "c1:eth0")
    assert w.service.pools.recyclable() == {vif.port_id: KEY}
    assert w.metrics.registry.get_sample_value("podwire_vifs_in_use") == 0


async def test_a_port_on_an_unknown_subnet_is_skipped_not_fatal() -> None:
    w = world()
    good = port(1)
    odd = port(2, fixed_ips=[{"ip_address": "10.9.0.5", "subnet_id": "elsewhere"}])
    w.neutron.add(good, odd)
    report = await recover(w.service, w.ops, None)
    assert report.pooled == 1
    assert w.service.snapshot(KEY).groups == [((), [good.id])]
    assert w.neutron.deleted == []  # bound, so not a leftover either


async def test_verify_drops_vanished_mirrored_ports_and_old_leftovers_only() -> None:
    w = world()
    kept, vanished = port(1), port(2)
    old_leftover = port(3, host="")
    young_leftover = port(4, host="", created_at=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()))
    w.neutron.add(kept, old_leftover, young_leftover)
    w.service.add_free(KEY, [vif_of(kept), vif_of(vanished)])  # as the mirror had them
    report = RecoveryReport(
        source="etcd", started_at=time.time(), mirrored={kept.id, vanished.id}, networks={NET}
    )
    await verify(w.service, w.ops, report)
    assert report.verified
    assert not w.service.knows(vanished.id)
    assert w.service.knows(kept.id)
    assert w.gauge(KEY) == 1
    assert w.neutron.deleted == [old_leftover.id]  # the young one may be under creation
