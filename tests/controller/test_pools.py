"""Pure pool rules, no I/O."""

from __future__ import annotations

import uuid
from dataclasses import replace

from podwire.config import PoolSettings
from podwire.controller.pools import Pools, Taken, Waiter
from podwire.controller.refill import batches, refill_count
from podwire.schema.inuse import PoolKey, sg_key
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


def test_failing_waiters_tells_each_its_own_error_and_frees_the_line() -> None:
    pools = Pools()
    told: list[tuple[int, Exception]] = []
    waiters = [Waiter((), lambda t: None, lambda e, i=i: told.append((i, e))) for i in range(3)]
    for waiter in waiters:
        pools.wait(KEY, waiter)
    waiters[1].cancelled = True
    assert pools.fail_waiters(KEY, lambda: RuntimeError("full")) == 2
    assert [i for i, _ in told] == [0, 2] and told[0][1] is not told[1][1]
    assert pools.waiting(KEY) == 0
    pools.add(KEY, [vif()])
    assert pools.take(KEY, ()) is not None  # nobody is in line any more
    assert pools.fail_waiters(PoolKey("other", "p", "n"), lambda: RuntimeError("x")) == 0


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


class _Mirror:
    """What the forwarder's mirror shows (the follower's map), set by the test."""

    def __init__(self) -> None:
        self.ports: dict[str, tuple[PoolKey, Vif]] = {}

    def current(self, port_id: str) -> tuple[PoolKey, Vif] | None:
        return self.ports.get(port_id)


def test_a_port_the_mirror_does_not_show_is_counted_but_never_taken() -> None:
    mirror = _Mirror()
    pools = Pools(mirror=mirror)
    port = vif()
    pools.add(KEY, [port])
    assert pools.size(KEY) == 1 and pools.unseen(KEY) == [port.port_id]
    assert pools.take(KEY, ()) is None
    served: list[Taken] = []
    pools.wait(KEY, Waiter((), served.append))
    now = replace(port, fixed_ips=[FixedIp("10.0.0.9", "s", "10.0.0.0/24", "10.0.0.1")])
    mirror.ports[port.port_id] = (KEY, now)
    assert pools.seen(KEY, now)
    assert [t.vif for t in served] == [now]  # the waiter gets it as the mirror shows it
    assert pools.size(KEY) == 0 and pools.unseen(KEY) == []


def test_a_pooled_port_is_taken_as_the_mirror_shows_it_now() -> None:
    mirror = _Mirror()
    pools = Pools(mirror=mirror)
    port = vif("sg1")
    mirror.ports[port.port_id] = (KEY, port)
    pools.add(KEY, [port])
    readdressed = replace(
        port,
        fixed_ips=[FixedIp("10.0.0.77", "s", "10.0.0.0/24", "10.0.0.1")],
        security_groups=["sg2"],
    )
    assert pools.seen(KEY, readdressed)
    assert not pools.seen(KEY, readdressed)  # the same value again changes nothing
    assert pools.groups(KEY) == [(("sg2",), [port.port_id])]
    taken = pools.take(KEY, ("sg2",))
    assert taken is not None and taken.vif == readdressed and not taken.sg_update


def test_a_port_the_mirror_shows_on_another_node_leaves_its_pool() -> None:
    mirror = _Mirror()
    pools = Pools(mirror=mirror)
    port, moved = vif(), vif()
    mirror.ports[port.port_id] = (KEY, port)
    other = KEY._replace(node="node-2")
    mirror.ports[moved.port_id] = (other, moved)
    pools.add(KEY, [port, moved])  # the moved one is not pooled here at all
    assert pools.size(KEY) == 1 and not pools.known(moved.port_id)
    assert pools.seen(other, port)
    assert pools.size(KEY) == 0 and not pools.known(port.port_id)


def test_subports_are_taken_as_they_came() -> None:
    """A trunk subport is wired by the trunk's host: no node's mirror entry shows it."""
    pools = Pools(mirror=_Mirror())
    sub = replace(vif(), vlan_id=7)
    pools.add(KEY, [sub])
    taken = pools.take(KEY, ())
    assert taken is not None and taken.vif == sub


def test_unseen_ports_go_first_when_a_pool_shrinks() -> None:
    mirror = _Mirror()
    pools = Pools(mirror=mirror)
    seen, unseen = vif(), vif()
    mirror.ports[seen.port_id] = (KEY, seen)
    pools.add(KEY, [seen, unseen])
    assert pools.take_surplus(KEY, 1) == [unseen]
    assert pools.size(KEY) == 1 and not pools.known(unseen.port_id)
