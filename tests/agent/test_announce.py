"""A remote port that appears is announced to this node's ports (real kernel, no agent).

Neighbour suppression keeps gratuitous ARP from crossing VXLAN, so ``plumbing.sync_peers``
relays it: a pod that holds an address's old MAC (a router interface removed and added again
gets the same gateway address on a new port) learns the new one at once, not when its cache
entry expires. Here the bridge, the VXLAN device and the pod are set up by hand, as the agent
sets them up, and ``sync_peers`` runs on the host's namespace through ``HostNetlink``.
"""

from __future__ import annotations

from podwire.agent import naming
from podwire.agent.fabric.plumbing import sync_peers
from podwire.netlink import HostNetlink, Netlink, RemoteMac
from tests.agent.netenv import NetEnv, in_ns

GATEWAY, GATEWAY6 = "10.9.0.1", "fd00:9::1"
OLD_MAC, NEW_MAC = "fa:16:3e:00:00:0a", "fa:16:3e:00:00:0b"


def _pod_neighbour(pod: str, address: str = GATEWAY) -> str:
    return in_ns(pod, "ip", "neigh", "show", address, "dev", "eth0").stdout


def _stale(pod: str) -> None:
    for address in (GATEWAY, GATEWAY6):
        in_ns(pod, "ip", "neigh", "replace", address, "lladdr", OLD_MAC, "dev", "eth0", "nud",
              "reachable")  # fmt: skip


async def test_a_new_remote_port_corrects_a_pods_stale_neighbour(netenv: NetEnv) -> None:
    host, pod = netenv.namespace("h"), netenv.namespace("p")
    bridge, vxlan = "pwbr-t", "pwvx-t"
    in_ns(host, "ip", "link", "add", bridge, "address", naming.bridge_mac(bridge), "type",
          "bridge")  # fmt: skip
    in_ns(host, "ip", "link", "add", vxlan, "type", "vxlan", "id", "42", "local", "192.0.2.1",
          "dstport", "4789", "nolearning")  # fmt: skip
    in_ns(host, "ip", "link", "add", "pwp-t", "type", "veth", "peer", "eth0", "netns", pod)
    for link in (vxlan, "pwp-t"):
        in_ns(host, "ip", "link", "set", link, "master", bridge, "up")
    in_ns(host, "ip", "link", "set", bridge, "up")
    in_ns(pod, "ip", "addr", "add", "10.9.0.5/24", "dev", "eth0")
    in_ns(pod, "ip", "addr", "add", "fd00:9::5/64", "dev", "eth0", "nodad")
    in_ns(pod, "ip", "link", "set", "eth0", "up")
    _stale(pod)
    assert OLD_MAC in _pod_neighbour(pod) and OLD_MAC in _pod_neighbour(pod, GATEWAY6)

    remote = {NEW_MAC: RemoteMac(NEW_MAC, "192.0.2.2", frozenset({GATEWAY, GATEWAY6}))}
    nl = HostNetlink(host)
    try:
        await nl.run(_sync, vxlan, bridge, remote)
        assert NEW_MAC in _pod_neighbour(pod) and NEW_MAC in _pod_neighbour(pod, GATEWAY6)
        # Already known: nothing is announced again (the pod's entries are left as they are).
        _stale(pod)
        await nl.run(_sync, vxlan, bridge, remote)
        assert OLD_MAC in _pod_neighbour(pod) and OLD_MAC in _pod_neighbour(pod, GATEWAY6)
    finally:
        nl.close()


def _sync(nl: Netlink, vxlan: str, bridge: str, remote: dict[str, RemoteMac]) -> None:
    sync_peers(nl, vxlan, bridge, {"192.0.2.2"}, remote)
