"""The demo's TCP probe reports what it saw, however fast the answer comes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podwire.demo import probes
from tests.agent.netenv import NetEnv


@pytest.fixture
def netns() -> Iterator[str]:
    env = NetEnv()
    try:
        yield env.namespace("probe")
    finally:
        env.cleanup()


def test_a_refusal_at_once_is_reported_not_lost(netns: str) -> None:
    # Nothing listens on loopback: each refusal comes back before the probe's first line is
    # read, so both of its lines may reach the demo in one read.
    for _ in range(20):
        assert probes.connect(netns, "127.0.0.1", 9, each=1.0).outcome == "refused"


def test_a_listener_is_connected_to(netns: str) -> None:
    listener = probes.start_listener(netns, 8080)
    try:
        assert probes.connect(netns, "127.0.0.1", 8080, each=1.0).outcome == "connected"
    finally:
        probes.stop(listener)
