"""Recycling's logic on a fake Neutron (no stack): returned with current SGs, or deleted.

test_vif_api.py, test_lifecycle.py and test_port_debug.py check the same against the stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from podwire.config import PoolSettings
from podwire.controller.drivers import AVAILABLE_NAME
from podwire.controller.recovery import recover
from podwire.controller.recycler import recycle_once
from podwire.schema.inuse import PoolKey
from tests.controller.fakes import NET, PROJECT, World, in_use, port, world

KEY = PoolKey("n1", PROJECT, NET)


async def _released(w: World, *numbers: int) -> list[str]:
    """Ports in use after recovery, then released: recyclable, not yet back in the pool."""
    ids = []
    for n in numbers:
        summary = port(n)
        w.neutron.add(summary)
        w.store.records[("n1", f"c{n}:eth0")] = in_use(summary, f"c{n}:eth0")
        ids.append(summary.id)
    await recover(w.service, w.ops, None)
    w.service.serving = True
    for n in numbers:
        await w.broker.release("n1", f"c{n}:eth0")
    assert set(w.service.pools.recyclable()) == set(ids)
    return ids


async def test_a_released_port_returns_with_the_sgs_neutron_has_now() -> None:
    w = world()
    (port_id,) = await _released(w, 1)
    w.neutron.ports[port_id] = replace(w.neutron.ports[port_id], security_group_ids=["sg-b"])
    assert await recycle_once(w.service, w.ops, PoolSettings()) == (1, 0)
    assert w.service.snapshot(KEY).groups == [(("sg-b",), [port_id])]
    assert w.service.pools.recyclable() == {}
    assert w.gauge(KEY) == 1
    assert w.neutron.updates == []  # no port_debug: no renaming


async def test_a_port_deleted_meanwhile_is_forgotten() -> None:
    w = world()
    (port_id,) = await _released(w, 1)
    del w.neutron.ports[port_id]
    assert await recycle_once(w.service, w.ops, PoolSettings()) == (0, 0)
    assert not w.service.knows(port_id)


async def test_failed_binding_or_full_pool_deletes_instead() -> None:
    w = world()
    failed, extra = await _released(w, 1, 2)
    w.neutron.ports[failed] = replace(w.neutron.ports[failed], binding_vif_type="binding_failed")
    settings = PoolSettings(min=0, max=1)
    w.service.add_free(KEY, [])
    assert await recycle_once(w.service, w.ops, settings) == (1, 1)
    assert w.neutron.deleted == [failed]
    assert w.service.pool_size(KEY) == 1
    assert not w.service.knows(failed)
    # now the pool is full: the next released port is deleted, not pooled
    (third,) = await _released(w, 3)
    assert await recycle_once(w.service, w.ops, settings) == (0, 1)
    assert third in w.neutron.deleted
    assert extra not in w.neutron.deleted


async def test_port_debug_renames_the_returned_port() -> None:
    w = world()
    (port_id,) = await _released(w, 1)
    assert await recycle_once(w.service, w.ops, PoolSettings(port_debug=True)) == (1, 0)
    assert w.neutron.updates == [(port_id, {"name": AVAILABLE_NAME, "device_id": ""})]


class MirrorAnswers:
    """The forwarder's mirror as the recycler sees it: SGs of the ports it shows bound."""

    def __init__(self, sgs: dict[str, list[str]] | None) -> None:
        self.sgs = sgs
        self.asked: list[set[str]] = []

    async def bound_sgs(self, ports: Mapping[str, PoolKey]) -> dict[str, list[str]] | None:
        self.asked.append(set(ports))
        if self.sgs is None:
            return None
        return {p: sgs for p, sgs in self.sgs.items() if p in ports}


async def test_the_mirror_answers_and_neutron_is_not_listed() -> None:
    w = world()
    (port_id,) = await _released(w, 1)
    mirror = MirrorAnswers({port_id: ["sg-m"]})
    assert await recycle_once(w.service, w.ops, PoolSettings(), mirror) == (1, 0)
    assert mirror.asked == [{port_id}]
    assert w.neutron.listed == []
    assert w.service.snapshot(KEY).groups == [(("sg-m",), [port_id])]


async def test_neutron_answers_for_what_the_mirror_does_not_show_bound() -> None:
    w = world()
    shown, failed, gone = await _released(w, 1, 2, 3)
    w.neutron.ports[failed] = replace(w.neutron.ports[failed], binding_vif_type="binding_failed")
    del w.neutron.ports[gone]
    mirror = MirrorAnswers({shown: ["sg-m"]})
    assert await recycle_once(w.service, w.ops, PoolSettings(), mirror) == (1, 1)
    assert w.neutron.listed == [{failed, gone}]
    assert w.neutron.deleted == [failed]
    assert not w.service.knows(gone)
    assert w.service.snapshot(KEY).groups == [(("sg-m",), [shown])]


async def test_without_a_vouching_forwarder_neutron_is_listed_for_all() -> None:
    w = world()
    ids = await _released(w, 1, 2)
    w.neutron.ports[ids[0]] = replace(w.neutron.ports[ids[0]], security_group_ids=["sg-n"])
    assert await recycle_once(w.service, w.ops, PoolSettings(), MirrorAnswers(None)) == (2, 0)
    assert w.neutron.listed == [set(ids)]
    assert (("sg-n",), [ids[0]]) in w.service.snapshot(KEY).groups
