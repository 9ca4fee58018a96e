"""Why pools exist: what one port costs in the real Neutron, single and in bulk."""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.harness import delete_project, project_network
from bench.stats import row
from podwire.neutron.client import neutron_connection


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    neutron = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    network, _ = project_network(neutron, project, "bench", "10.99.0.0/16")
    body = {"network_id": network.id, "project_id": project, "device_owner": "compute:podwire"}
    count = max(10, samples // 10)
    single = []
    for _ in range(count):
        started = time.perf_counter()
        neutron.network.create_port(**body, binding_host_id="bench-host")
        single.append((time.perf_counter() - started) * 1000)
    per_port_bulk = []
    for _ in range(3):
        started = time.perf_counter()
        list(neutron.network.create_ports([dict(body, binding_host_id="bench-host")] * 10))
        per_port_bulk.append((time.perf_counter() - started) * 100)
    delete_project(neutron, project)
    return [
        row("Neutron port create + bind, one call", single),
        row("Neutron port create + bind, per port in bulk of 10", per_port_bulk),
    ]
