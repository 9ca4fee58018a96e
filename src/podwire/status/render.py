"""The one-screen text form of a status report."""

from __future__ import annotations

import time

from podwire.status.nodes import NodeStatus
from podwire.status.report import Report


def render(report: Report) -> str:
    lines = [_etcd_line(report)]
    if report.etcd.get("state") == "ok":
        leaders = [f"  {name:11} {who or '(none)'}" for name, who in report.leaders.items()]
        lines += ["", "NODES", *_node_lines(report), *_memif_lines(report)]
        lines += ["", "ML2", *_ml2_lines(report)]
        lines += ["", "POOLS", *_pool_lines(report), "", "LEADERS", *leaders]
    problems = [f"  - {problem}" for problem in report.problems] or ["  none"]
    lines += ["", "PROBLEMS", *problems]
    return "\n".join(lines)


def _etcd_line(report: Report) -> str:
    if report.etcd.get("state") == "ok":
        return f"etcd: ok (revision {report.etcd['revision']})"
    return f"etcd: UNREACHABLE ({report.etcd.get('error', '')})"


def _node_lines(report: Report) -> list[str]:
    if not report.nodes:
        return ["  (no node has registered)"]
    lines = [
        f"  {'host':24} {'alive':5}  {'vtep':15}  {'physnets':24} {'ports wired/desired':20}"
        " security groups"
    ]
    for node in report.nodes:
        physnets = ",".join(f"{k}={v}" for k, v in sorted(node.physnets.items())) or "-"
        wired = f"{node.ports_wired}/{node.ports_desired}"
        lines.append(
            f"  {node.host:24} {'yes' if node.alive else 'NO':5}  {node.vtep or '-':15}"
            f"  {physnets:24} {wired:20} {_policy_text(node)}"
        )
    return lines


def _memif_lines(report: Report) -> list[str]:
    """Per memif port: the path its frames take, frames each way, drops (shown only when a
    node serves memif)."""
    rows = [(node.host, port) for node in report.nodes for port in node.memif]
    if not rows:
        return []
    lines = ["", "MEMIF PORTS",
             f"  {'host':24} {'port':36} {'path':6} {'client':6} {'from CNF':>12} {'to CNF':>12}"
             f" {'via shared':>12} {'drops':>10} {'ring full':>10}"]  # fmt: skip
    for host, p in rows:
        lines.append(
            f"  {host:24} {p.port_id:36} {p.path:6} {'yes' if p.connected else 'no':6}"
            f" {p.from_client:12} {p.to_client:12} {p.to_shared:12} {p.drops:10}"
            f" {p.ring_full:10}"
        )
        if p.why:
            lines.append(
                f"  {'':24} {p.path} path: {p.why}; classifier admitted {p.admitted},"
                f" dropped {p.spoofed} spoofed, {p.denied} denied, {p.invalid} invalid,"
                f" {p.flows_full} with the flow table full"
            )
    return lines


def _policy_text(node: NodeStatus) -> str:
    policy = node.policy
    if policy is None:
        return "not enforced"
    problems = f", {policy.problems} problems (see the agent's log)" if policy.problems else ""
    return f"{policy.enforced_ports} ports enforced at revision {policy.revision}{problems}"


def _ml2_lines(report: Report) -> list[str]:
    ml2 = report.ml2
    if ml2.get("state") in ("no report", "unreadable report"):
        return [f"  forwarder: {ml2['state']}"]
    return [
        f"  forwarder {ml2.get('forwarder')} ({ml2['state']}, {ml2.get('age_seconds')} s ago):"
        f" journal {ml2.get('journal_depth')} rows, lag {ml2.get('journal_lag_seconds')} s,"
        f" {ml2.get('sent_rows')} rows sent",
        f"  feedback at revision {ml2.get('feedback_revision')},"
        f" {ml2.get('feedback_relists')} re-lists",
        f"  security-group policy forwarded up to revision {ml2.get('policy_revision', 0)}",
    ]


def _pool_lines(report: Report) -> list[str]:
    pools = report.pools
    if pools.get("state") != "ok":
        return [f"  {pools.get('state')}" + (f": {pools['error']}" if pools.get("error") else "")]
    if not pools["pools"]:
        return ["  (no pools)"]
    lines = [
        f"  {'node':20} {'project':10} {'network':10} free target in-use recyclable last refill"
    ]
    now = time.time()
    for pool in pools["pools"]:
        key = pool["key"]
        refill = pool.get("last_refill")
        age = f"{now - refill:.0f} s ago" if refill else "never"
        sizing = pool.get("sizing") or {}
        lines.append(
            f"  {key['node']:20} {key['project_id'][:8]:10} {key['network_id'][:8]:10}"
            f" {pool['size']:4} {sizing.get('target', '-'):>6} {pool.get('in_use', 0):6}"
            f" {pool.get('recyclable', 0):10} {age}"
        )
        if sizing.get("reason"):
            lines.append(f"      target: {sizing['reason']}")
    return lines
