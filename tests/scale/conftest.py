"""A stack of its own for this package: 3 etcd members, two neutron-servers (one module)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import neutron_connection
from podwire.stack.client import start_background, stop_background
from tests.scale.cluster import CLUSTER_ARGS, Cluster


@pytest.fixture(scope="module")
def cluster_stack(work_dir: Path) -> Iterator[Cluster]:
    proc, info = start_background(work_dir / "cluster", extra=CLUSTER_ARGS)
    cluster = Cluster(info)
    try:
        yield cluster
    finally:
        cluster.close()
        stop_background(proc)


@pytest.fixture
def cluster(cluster_stack: Cluster) -> Iterator[Cluster]:
    """The module's cluster, every member running again after each test."""
    yield cluster_stack
    cluster_stack.heal()


@pytest.fixture
async def cluster_etcd(cluster_stack: Cluster) -> AsyncIterator[EtcdClient]:
    """A client of all three members (timeout short: a frozen member costs one call that)."""
    settings = EtcdSettings(endpoints=cluster_stack.endpoints, timeout=2.0)
    async with await EtcdClient.connect(settings) as client:
        yield client


@pytest.fixture
def cluster_neutron(cluster_stack: Cluster) -> list[Any]:
    return [neutron_connection(url) for url in cluster_stack.info["neutron_servers"]]
