"""ipBlock excepts expanded into complementary prefixes: exactly the block minus the holes."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from podwire.k8s.cidrs import allowed_prefixes


def _net(base: int, length: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network((base, length), strict=False)


blocks = st.builds(_net, st.integers(0, 2**32 - 1), st.integers(20, 28))


@given(blocks, st.lists(st.tuples(st.integers(0, 2**12 - 1), st.integers(0, 12)), max_size=4))
def test_prefixes_cover_exactly_the_block_minus_its_excepts(
    block: ipaddress.IPv4Network, holes: list[tuple[int, int]]
) -> None:
    size = block.num_addresses
    excepts = [
        _net(int(block.network_address) + offset % size, block.prefixlen + extra)
        for offset, extra in holes
        if block.prefixlen + extra <= 32
    ]
    prefixes = allowed_prefixes(block, excepts)
    inside = [int(a) for p in prefixes for a in p]
    holes_set = {int(a) for e in excepts for a in e}
    assert sorted(inside) == sorted({int(a) for a in block} - holes_set)  # no overlap either
    assert list(prefixes) == sorted(prefixes)
    assert len(prefixes) == len(set(prefixes))


def test_no_except_is_the_block_itself() -> None:
    block = ipaddress.ip_network("10.0.0.0/8")
    assert allowed_prefixes(block, []) == (block,)


def test_an_except_covering_the_block_leaves_nothing() -> None:
    block = ipaddress.ip_network("10.0.0.0/24")
    assert allowed_prefixes(block, [ipaddress.ip_network("10.0.0.0/24")]) == ()


def test_ipv6() -> None:
    block = ipaddress.ip_network("fd00::/64")
    prefixes = allowed_prefixes(block, [ipaddress.ip_network("fd00::/65")])
    assert [str(p) for p in prefixes] == ["fd00::8000:0:0:0/65"]
