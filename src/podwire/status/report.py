"""Gathers every part's state into one report; a part that cannot be read says why."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from podwire import keys
from podwire.config import ControllerSettings, Settings
from podwire.errors import PodwireError, ValidationError
from podwire.etcd.client import EtcdClient
from podwire.schema.records import parse_ml2_report
from podwire.status.nodes import NodeStatus, collect_leaders, collect_nodes

STALE_AFTER = 10.0  # seconds: a component report older than this means it is not running


@dataclass
class Report:
    etcd: dict[str, Any] = field(default_factory=dict)
    nodes: list[NodeStatus] = field(default_factory=list)
    leaders: dict[str, str | None] = field(default_factory=dict)
    ml2: dict[str, Any] = field(default_factory=dict)
    pools: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def ml2_report(etcd: EtcdClient) -> dict[str, Any]:
    kv = await etcd.get(keys.status("ml2"))
    if kv is None:
        return {"state": "no report"}
    try:
        value: dict[str, Any] = asdict(parse_ml2_report(kv.value, kv.key))
    except ValidationError as exc:
        return {"state": "unreadable report", "error": str(exc)}
    age = time.time() - value["updated_at"]
    value["state"] = "stale" if age > STALE_AFTER else "ok"
    value["age_seconds"] = round(age, 1)
    return value


async def collect_pools(controller: ControllerSettings) -> dict[str, Any]:
    """Pools as the active controller sees them, through its admin API."""
    if not controller.admin_token:
        return {"state": "not configured (set controller.listen and controller.admin_token)"}
    url = f"http://{controller.listen}/v1/pools"
    headers = {"Authorization": f"Bearer {controller.admin_token}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(url, headers=headers) as response,
        ):
            body = await response.json(content_type=None)
            if response.status != 200:
                return {"state": "error", "error": f"HTTP {response.status}: {body}"}
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {"state": "unreachable", "error": f"{url}: {exc or type(exc).__name__}"}
    return {"state": "ok", "pools": body.get("pools", [])}


async def collect(settings: Settings) -> Report:
    report = Report()
    try:
        etcd = await EtcdClient.connect(settings.etcd, namespace=settings.deployment.etcd_namespace)
    except PodwireError as exc:
        report.etcd = {"state": "unreachable", "error": str(exc)}
        report.problems.append(f"etcd unreachable: {exc}")
        return report
    async with etcd:
        report.etcd = {"state": "ok", "revision": await etcd.status()}
        report.nodes = await collect_nodes(etcd)
        report.leaders = await collect_leaders(etcd, ("forwarder", "controller"))
        report.ml2 = await ml2_report(etcd)
        if report.leaders.get("forwarder") is None and report.ml2.get("state") == "ok":
            # The forwarder's election is in the first deployment the ml2 driver serves; in
            # the others, its fresh report (published in every one) names it.
            report.leaders["forwarder"] = str(report.ml2["forwarder"])
    report.pools = await collect_pools(settings.controller)
    report.problems += _problems(report)
    return report


def _problems(report: Report) -> list[str]:
    problems = [f"node {n.host} is not alive" for n in report.nodes if not n.alive]
    problems += [
        f"node {n.host}: {n.ports_desired - n.ports_wired} desired ports not wired"
        for n in report.nodes
        if n.alive and n.ports_wired < n.ports_desired
    ]
    problems += [
        f"node {n.host}: {n.bad_values} unreadable state values"
        for n in report.nodes
        if n.bad_values
    ]
    if report.leaders.get("forwarder") is None:
        problems.append(
            "no forwarder is elected: is neutron-server with the podwire driver running?"
        )
    if report.pools.get("state") in ("unreachable", "error"):
        problems.append(f"controller: {report.pools.get('error')}")
    if report.ml2.get("state") == "stale":
        problems.append("the ml2 forwarder report is stale")
    if report.ml2.get("journal_depth", 0) and report.ml2.get("journal_lag_seconds", 0) > 30:
        problems.append(
            f"journal lag {report.ml2['journal_lag_seconds']} s: is etcd refusing writes?"
        )
    return problems
