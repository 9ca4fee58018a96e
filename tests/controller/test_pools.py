"""Pure pool rules, no I/O."""

from __future__ import annotations

import uuid

from podwire.config import PoolSettings
from podwire.controller.pools import PoolKey, Pools, Taken, Waiter, sg_key
from podwire.controller.refill import batches, refill_count
from podwire.schema.ports import FixedIp
from podwire.schema.vif import Vif

KEY = PoolKey("node-1", "proj", "net")


def vif(*sgs: str) -> Vif:
    return Vif(
        port_id=str(uuid.uuid4()),
        network_id=str(uuid.uuid4()),
        project_id="proj",
        mac_address="fa:16:3e:00:00:01",
        mtu=1450,
        fixed_ips=[FixedIp("10.0.0.5", "s", "10.0.0.0/24", "10.0.0.1")],
        security_groups=list(sgs),
    )


def test_exact_match_needs_no_sg_update() -> None:
    pools = Pools()
    a, b = vif("sg1"), vif("sg2")
    pools.add(KEY, [a, b])
    taken = pools.take(KEY, ("sg2",))
    assert taken is not None and taken.vif == b and not taken.sg_update
    assert pools.size(KEY) == 1


def test_reuse_takes_least_recently_refreshed_group() -> None:
    pools = Pools()
    old, newer = vif("sg-old"), vif("sg-new")
    pools.add(KEY, [old])
    pools.add(KEY, [newer])
    taken = pools.take(KEY, ("sg-x",))
    assert taken is not None and taken.vif == old and taken.sg_update
    assert taken.wanted == ("sg-x",)


def test_empty_pool_and_sg_key_normalisation() -> None:
    pools = Pools()
    assert pools.take(KEY, ()) is None
    assert sg_key(["b", "a", "b"]) == ("a", "b")


def test_waiters_served_in_arrival_order_and_block_newcomers() -> None:
    pools = Pools()
    served: list[tuple[int, Taken]] = []
    for index in range(3):
        pools.wait(KEY, Waiter((), lambda t, i=index: served.append((i, t))))
    pools.add(KEY, [vif(), vif()])
    assert [i for i, _ in served] == [0, 1]
    assert pools.take(KEY, ()) is None  # waiter 2 is still first in line
    pools.add(KEY, [vif()])
    assert [i for i, _ in served] == [0, 1, 2]
    assert len({t.vif.port_id for _, t in served}) == 3


def test_cancelled_waiter_is_skipped() -> None:
    pools = Pools()
    got: list[Taken] = []
    gone = Waiter((), got.append)
    pools.wait(KEY, gone)
    gone.cancelled = True
    pools.add(KEY, [vif()])
    assert got == [] and pools.take(KEY, ()) is not None


def test_release_is_recyclable_then_forget() -> None:
    pools = Pools()
    port = vif()
    pools.add(KEY, [port])
    assert pools.take(KEY, ()) is not None
    pools.release(KEY, port.port_id)
    assert pools.recyclable() == {port.port_id: KEY}
    pools.forget(port.port_id)
    assert pools.recyclable() == {} and not pools.known(port.port_id)


def test_strip_sg_moves_ports_to_front_default_group() -> None:
    pools = Pools()
    pools.add(KEY, [vif("keep")])
    pools.add(KEY, [vif("gone", "other"), vif("gone", "other")])
    moved = pools.strip_sg("gone", KEY.network_id)
    assert len(moved) == 2 and all(m.security_groups == [] for m in moved)
    groups = pools.groups(KEY)
    assert groups[0][0] == () and len(groups[0][1]) == 2
    other = PoolKey("n", "p", "elsewhere")
    pools.add(other, [vif("gone")])
    assert pools.strip_sg("gone", KEY.network_id) == []


def test_remove_key_returns_pooled_and_recyclable_ports() -> None:
    pools = Pools()
    a, b = vif(), vif()
    pools.add(KEY, [a, b])
    taken = pools.take(KEY, ())
    assert taken is not None
    pools.release(KEY, taken.vif.port_id)
    removed = pools.remove_key(KEY)
    assert {v.port_id for v in removed} == {a.port_id, b.port_id}
    assert pools.pool_keys() == [] and pools.recyclable() == {}


def test_refill_count_and_batches() -> None:
    settings = PoolSettings(min=5, batch=10, max=0)
    assert refill_count(5, 0, settings) == 0
    assert refill_count(4, 0, settings) == 10
    assert refill_count(0, 30, settings) == 35
    assert refill_count(0, 0, PoolSettings(min=5, batch=10, max=6)) == 6
    assert batches(25, 10) == [10, 10, 5]
