"""What a stopped Neutron agent of the local stack leaves, removed: only what it made.

Neutron's DHCP agent leaves its dnsmasqs, ``qdhcp-`` namespaces and devices running when it
stops (so a restart does not interrupt DHCP); its L3 agent leaves its ``qrouter-`` namespaces
with their devices, addresses, NAT rules and conntrack state. ``podwire neutron-agent`` removes
them after the agent exits, and before it starts (a crashed run's): the dnsmasqs recorded in
this agent's own state dir (recognised by their command line, which names that dir), the veth
pairs whose agent end carries the interface driver's mark for this host, and a namespace of one
of its networks once nothing but ``lo`` is left in it. Agents of other hosts on the same machine
share the namespace names, never their marks or state dirs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

from podwire.ifdriver import naming
from podwire.log import get_logger
from podwire.netlink import NETNS_DIR, Netlink, PodNetlink, netns_path
from podwire.stack import procs

log = get_logger(__name__)

DHCP_NAMESPACE_PREFIX = "qdhcp-"
ROUTER_NAMESPACE_PREFIX = "qrouter-"


def clean_dhcp(state_path: Path, host: str) -> None:
    confs = state_path / "dhcp"
    networks = sorted(p.name for p in confs.iterdir() if p.is_dir()) if confs.is_dir() else []
    for network in networks:
        _stop_dnsmasq(confs / network)
    own = {DHCP_NAMESPACE_PREFIX + network for network in networks}
    asyncio.run(_clean_namespaces(DHCP_NAMESPACE_PREFIX, own, host))
    for network in networks:
        shutil.rmtree(confs / network, ignore_errors=True)


def clean_l3(state_path: Path, host: str) -> None:
    """The routers' marked pairs of ``host``; a router's namespace goes once it holds only
    ``lo`` (its iptables rules and conntrack entries go with it)."""
    asyncio.run(_clean_namespaces(ROUTER_NAMESPACE_PREFIX, set(), host))


def _stop_dnsmasq(conf_dir: Path) -> None:
    """Every dnsmasq whose command line names this network's conf dir: the agent records only
    the last one it started in the pid file, and a restart of it can leave an earlier one."""
    for pid in procs.pids_marked(str(conf_dir)):
        if not procs.cmdline(pid).startswith("dnsmasq"):
            continue
        if procs.terminate(pid, str(conf_dir), timeout=10):
            log.info("neutron_agent.dnsmasq_stopped", pid=pid, network=conf_dir.name)


async def _clean_namespaces(prefix: str, own: set[str], host: str) -> None:
    """Marked pairs of ``host`` in every ``prefix*`` namespace; then the emptied ones go."""
    names = sorted(n for n in _namespaces() if n.startswith(prefix))
    netlink = PodNetlink(threads=1)
    try:
        for name in names:
            removed = await netlink.run(netns_path(name), _remove_marked, host)
            for device in removed:
                log.info("neutron_agent.device_removed", namespace=name, device=device)
            left = await netlink.run(netns_path(name), Netlink.links)
            if (removed or name in own) and all(link.name == "lo" for link in left):
                _delete_namespace(name)
    finally:
        netlink.close()


def _remove_marked(nl: Netlink, host: str) -> list[str]:
    marked = [link.name for link in nl.links() if naming.marked_port(link.alias, host) is not None]
    return [name for name in marked if nl.remove_link(name)]


def _namespaces() -> list[str]:
    try:
        return os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []


def _delete_namespace(name: str) -> None:
    result = subprocess.run(
        ["ip", "netns", "delete", name], capture_output=True, text=True, check=False
    )
    if result.returncode == 0:
        log.info("neutron_agent.namespace_removed", namespace=name)
    else:
        log.warning("neutron_agent.namespace_left", namespace=name, error=result.stderr.strip())
