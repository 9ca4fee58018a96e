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
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from bench.harness import delete_project, forget_nodes, project_network, stack_etcd
from bench.stats import row
from podwire import keys
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher
from podwire.neutron.client import neutron_connection
from podwire.schema import nodes as values
from podwire.schema.ports import parse_desired_port
from podwire.schema.secgroups import parse_security_group

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
    client: EtcdClient, prefix: str, tokens: Callable[[str, bytes], list[str]], arrivals: Arrivals
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
    call: Callable[[], Any], arrivals: Arrivals, token: Callable[[Any], str]
) -> Sample:
    """``call`` (a Neutron request) from its sending until ``token`` of what it returned
    arrived in etcd, and from its return."""
    sent = time.perf_counter()
    result = await asyncio.to_thread(call)
    returned = time.perf_counter()
    arrived = await arrivals.wait(token(result))
    return Sample((arrived - sent) * 1000, max(0.0, arrived - returned) * 1000)


@dataclass(frozen=True)
class Sample:
    from_request_ms: float
    after_return_ms: float


async def _measure(stack: dict[str, Any], samples: int) -> dict[str, list[Sample]]:
    neutron = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    host = f"bench-sg-{uuid.uuid4().hex[:8]}"
    results: dict[str, list[Sample]] = {"rule": [], "member": [], "port": []}
    async with await stack_etcd(stack) as client:
        lease = await client.grant_lease(600)
        await client.put(keys.state_vtep(host), values.vtep_value("192.0.2.60"))
        await client.put(keys.state_alive(host), values.alive_value(time.time(), "bench"), lease.id)
        await asyncio.sleep(0.5)  # the API workers' host caches see the node
        group = await asyncio.to_thread(
            neutron.network.create_security_group, name="bench-sg", project_id=project
        )
        network, _ = await asyncio.to_thread(
            project_network, neutron, project, "bench-sg", "10.78.0.0/16"
        )
        arrivals = Arrivals()
        watched = (
            (keys.secgroup(group.id), _rule_ids),
            (keys.remote_groups_prefix(group.id), _member_ports),
            (keys.node_ports_prefix(host), _device_ids),
        )
        followers = [asyncio.create_task(_follow(client, *w, arrivals)) for w in watched]
        net = neutron.network
        try:
            for index in range(samples):
                rule = partial(
                    net.create_security_group_rule, security_group_id=group.id,
                    direction="ingress", ethertype="IPv4", protocol="tcp",
                    port_range_min=1000 + index, port_range_max=1000 + index,
                )  # fmt: skip
                results["rule"].append(await _timed(rule, arrivals, lambda made: str(made.id)))
            member = partial(
                net.create_port,
                network_id=network.id,
                project_id=project,
                security_groups=[group.id],
            )
            for _ in range(samples):
                results["member"].append(await _timed(member, arrivals, lambda made: str(made.id)))
            port = await asyncio.to_thread(
                net.create_port, network_id=network.id, project_id=project, binding_host_id=host,
                device_owner="compute:podwire", security_groups=[],
            )  # fmt: skip
            for index in range(samples):
                device = f"bench-{index}"
                update = partial(net.update_port, port.id, device_id=device)
                results["port"].append(await _timed(update, arrivals, lambda _, d=device: d))
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
            await asyncio.to_thread(delete_project, neutron, project)
            await lease.revoke()
            await forget_nodes(client, host)
    return results


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
