"""Security-group policy: Neutron API call -> the value agents read is in etcd.

Two paths through the same journal and forwarder as ports: a rule create (the whole group's
value is rewritten) and a member port create (its remote-group member key). The reference,
measured in the same run against the same stack, is the port path: a bound port's update ->
its desired key in etcd. Arrival is taken from a watch, as an agent sees it.

Each path is reported twice: from the request being sent (the whole path, API included), and
the lag after the API call returned, which is what an operator waits on top of the API
(0 when the value landed before the HTTP response: the forwarder is kicked at commit).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.run import main as run_main
from bench.stats import row
from podwire import keys
from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher
from podwire.neutron.client import neutron_connection
from podwire.schema import nodes as values
from podwire.schema.ports import parse_desired_port
from podwire.schema.secgroups import parse_security_group
from tests.etcd_tools import delete_prefix

TIMEOUT = 30.0


class Arrivals:
    """First time a watched value satisfying a test was seen, per awaited token."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._changed = asyncio.Event()

    def saw(self, token: str) -> None:
        self._seen.setdefault(token, time.perf_counter())
        self._changed.set()

    async def wait(self, token: str) -> float:
        deadline = time.perf_counter() + TIMEOUT
        while token not in self._seen:
            self._changed.clear()
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise RuntimeError(f"{token} not in etcd after {TIMEOUT:.0f} s")
            await asyncio.wait_for(self._changed.wait(), remaining)
        return self._seen[token]


async def _follow(
    client: EtcdClient, prefix: str, arrivals: Arrivals, tokens: Callable[[str, bytes], list[str]]
) -> None:
    async for batch in PrefixWatcher(client, prefix).batches():
        for event in batch.events:
            if event.kind == "put":
                for token in tokens(event.key, event.value):
                    arrivals.saw(token)


def _rule_ids(_key: str, raw: bytes) -> list[str]:
    return [rule.rule_id for rule in parse_security_group(raw).group.rules]


def _member_ports(key: str, _raw: bytes) -> list[str]:
    return [key.rsplit("/", 1)[1]]


def _device_ids(key: str, raw: bytes) -> list[str]:
    return [parse_desired_port(raw, key.rsplit("/", 1)[1]).device_id]


async def _timed(
    call: Callable[[], Any], arrivals: Arrivals, token: Callable[[Any], str], out: list[Sample]
) -> None:
    sent = time.perf_counter()
    result = await asyncio.to_thread(call)
    returned = time.perf_counter()
    arrived = await arrivals.wait(token(result))
    out.append(Sample((arrived - sent) * 1000, max(0.0, arrived - returned) * 1000))


@dataclass(frozen=True)
class Sample:
    from_request_ms: float
    after_return_ms: float


async def _measure(stack: dict[str, Any], samples: int) -> dict[str, list[Sample]]:
    neutron = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    host = f"bench-sg-{uuid.uuid4().hex[:8]}"
    results: dict[str, list[Sample]] = {"rule": [], "member": [], "port": []}
    async with await EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]])) as client:
        lease = await client.grant_lease(600)
        await client.put(keys.state_vtep(host), values.vtep_value("192.0.2.60"))
        await client.put(keys.state_alive(host), values.alive_value(time.time(), "bench"), lease.id)
        await asyncio.sleep(0.5)  # the API workers' host caches see the node
        group = await asyncio.to_thread(
            neutron.network.create_security_group, name="bench-sg", project_id=project
        )
        network = await asyncio.to_thread(
            neutron.network.create_network, name="bench-sg", project_id=project
        )
        await asyncio.to_thread(
            neutron.network.create_subnet,
            network_id=network.id, cidr="10.78.0.0/16", ip_version=4, project_id=project,
        )  # fmt: skip
        arrivals = Arrivals()
        followers = [
            asyncio.create_task(_follow(client, keys.secgroup(group.id), arrivals, _rule_ids)),
            asyncio.create_task(
                _follow(client, keys.remote_groups_prefix(group.id), arrivals, _member_ports)
            ),
            asyncio.create_task(
                _follow(client, keys.node_ports_prefix(host), arrivals, _device_ids)
            ),
        ]
        try:
            await _rules(neutron, group.id, arrivals, samples, results["rule"])
            await _members(neutron, network.id, project, group.id, arrivals, samples, results)
            await _port_updates(neutron, network.id, project, host, arrivals, samples, results)
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
            await asyncio.to_thread(_cleanup, neutron, project)
            await lease.revoke()
            await delete_prefix(client, keys.state_node_prefix(host))
            await delete_prefix(client, keys.node_ports_prefix(host))
    return results


async def _rules(
    neutron: Any, sg_id: str, arrivals: Arrivals, samples: int, out: list[Sample]
) -> None:
    for index in range(samples):

        def create(port: int = 1000 + index) -> Any:
            return neutron.network.create_security_group_rule(
                security_group_id=sg_id, direction="ingress", ethertype="IPv4",
                protocol="tcp", port_range_min=port, port_range_max=port,
            )  # fmt: skip

        await _timed(create, arrivals, lambda rule: str(rule.id), out)


async def _members(
    neutron: Any,
    network_id: str,
    project: str,
    sg_id: str,
    arrivals: Arrivals,
    samples: int,
    results: dict[str, list[Sample]],
) -> None:
    def create() -> Any:
        return neutron.network.create_port(
            network_id=network_id, project_id=project, security_groups=[sg_id]
        )

    for _ in range(samples):
        await _timed(create, arrivals, lambda port: str(port.id), results["member"])


async def _port_updates(
    neutron: Any,
    network_id: str,
    project: str,
    host: str,
    arrivals: Arrivals,
    samples: int,
    results: dict[str, list[Sample]],
) -> None:
    port = await asyncio.to_thread(
        neutron.network.create_port,
        network_id=network_id, project_id=project, binding_host_id=host,
        device_owner="compute:podwire", security_groups=[],
    )  # fmt: skip
    for index in range(samples):
        device = f"bench-{index}"

        def update(device_id: str = device) -> Any:
            return neutron.network.update_port(port.id, device_id=device_id)

        await _timed(update, arrivals, lambda _port, d=device: d, results["port"])


def _cleanup(neutron: Any, project: str) -> None:
    for port in list(neutron.network.ports(project_id=project)):
        neutron.network.delete_port(port)
    for network in list(neutron.network.networks(project_id=project)):
        neutron.network.delete_network(network)
    for group in list(neutron.network.security_groups(project_id=project)):
        neutron.network.delete_security_group(group)


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    results = asyncio.run(_measure(stack, samples))
    port = [sample.from_request_ms for sample in results["port"]]
    lag = [sample.after_return_ms for sample in results["port"]]
    reference = "port update -> desired key"
    rows = [row("ml2 port update sent -> desired key in etcd", port)]
    for name, what in (("rule", "sg rule create"), ("member", "sg member port create")):
        full = [sample.from_request_ms for sample in results[name]]
        rows.append(row(f"{what} sent -> value in etcd", full, reference, port))
        after = [sample.after_return_ms for sample in results[name]]
        rows.append(row(f"{what} returns -> value in etcd (lag)", after, f"{reference} lag", lag))
    return rows


def main() -> int:
    """``python -m bench.policy_bench [N]``: this section alone, through the common entry."""
    samples = sys.argv[1] if len(sys.argv) > 1 else "200"
    return run_main(["--only", "policy_bench", "--samples", samples])


if __name__ == "__main__":
    sys.exit(main())
