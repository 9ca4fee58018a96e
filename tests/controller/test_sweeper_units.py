"""The sweeper's grace on a fake Neutron (no stack): freed or deleted only when seen twice.

test_lifecycle.py checks node removal against the real stack.
"""

from __future__ import annotations

from podwire.controller.sweeper import NodeSweeper
from podwire.schema.inuse import PoolKey
from tests.controller.fakes import NET, PROJECT, port, vif_of, world


async def test_a_dead_node_and_an_unbound_port_go_on_the_second_pass() -> None:
    w = world()
    dead_key = PoolKey("gone", PROJECT, NET)
    pooled, unbound = port(1, host="gone"), port(2, host="")
    w.neutron.add(pooled, unbound)
    w.service.add_free(dead_key, [vif_of(pooled)])
    sweeper = NodeSweeper(w.service, w.broker, w.admin, w.ops, 0)
    assert await sweeper.sweep_once() == (set(), 0)
    assert w.service.pool_size(dead_key) == 1
    assert await sweeper.sweep_once() == ({"gone"}, 1)
    assert w.service.pool_size(dead_key) == 0
    assert w.gauge(dead_key) == 0
    assert sorted(w.neutron.deleted) == sorted([pooled.id, unbound.id])
    assert w.drivers.forgotten == ["gone"]
