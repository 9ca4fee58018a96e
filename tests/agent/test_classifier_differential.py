"""Differential: the memif classifier's reference evaluator (tests/classifier_ref.py) gives the
verdict the kernel's nftables path gives, on the same port, for random rule sets and frames.

One bridge in a host namespace (the agent's names, so podwire's tables apply to it) with two
ports: P, the port under test (port security on, the random groups, maybe allowed address
pairs), and Q, a peer with port security off. For each example the port's policy is compiled
twice from the same ``PolicyInputs``: to nftables (``compile_ruleset``, put in force in the
host namespace as the agent's enforcer does) and to a classifier (``compile_classifier``,
encoded and decoded, so the evaluator reads what the master would). Each frame is written on a
raw socket in P's (egress) or Q's (ingress) namespace and looked for on the other side;
a sentinel frame that always passes, sent right after on the same CPU, says when to stop
looking.

Stateless verdicts only: conntrack is flushed before every frame, so each frame is the first
packet of its flow (state new, or invalid when conntrack refuses to open a flow with it).
Replies to admitted flows are the master's connection tracking, a later slice of #38.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from podwire.agent import naming
from podwire.netlink import netns_path, open_netns, setns
from podwire.schema.ports import AddressPair, DesiredPort, FixedIp
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy import ruleset
from podwire.sgpolicy.classifier import compile_classifier, decode, encode
from podwire.sgpolicy.compile import PolicyInputs, PortPolicy, compile_ruleset, link_local
from tests.agent.ndframes import checksum
from tests.agent.netenv import NetEnv, in_ns
from tests.classifier_ref import parse, verdict

pytestmark = pytest.mark.netns

NETWORK = "d1ff0000-0000-4000-8000-000000000000"
SG = "d1ff0000-0000-4000-8000-000000000001"
PEERS = "d1ff0000-0000-4000-8000-000000000002"  # a remote group: its members' addresses
AG = "d1ff0000-0000-4000-8000-000000000003"
P_MAC, Q_MAC, PAIR_MAC, ALIEN_MAC = (f"fa:16:3e:d1:00:{i:02x}" for i in (1, 2, 11, 99))
P_IP4, P_IP6 = "10.9.0.1", "fd00:9::1"
BRIDGE = f"{naming.BRIDGE_PREFIX}d1ff00000"
P_DEV, Q_DEV = "pwpd1ff00000001", "pwpd1ff00000002"
SENTINEL = 0x88B5  # an ethertype no rule reads: always passes to the port

V4 = ["10.9.0.1", "10.9.0.2", "10.9.0.100", "10.9.1.7", "10.0.0.0", "10.255.255.255"]
V4 += ["11.0.0.0", "9.255.255.255", "192.168.5.5", "0.0.0.0", "255.255.255.255", "172.16.0.1"]
V6 = ["fd00:9::1", "fd00:9::2", "fd00:9::100", link_local(P_MAC), link_local(PAIR_MAC)]
V6 += ["fd00:8::1", "2001:db8::1", "::", "ff02::1", "fd00:9:0:1::5"]
PREFIXES = {
    4: ["10.0.0.0/8", "10.9.0.0/24", "10.9.0.2/32", "192.168.0.0/16", "0.0.0.0/0"],
    6: ["fd00:9::/64", "fd00::/8", "2001:db8::/32", "::/0"],
}
PORTS = [1, 22, 67, 68, 79, 80, 443, 546, 547, 5000, 65535]
PAIRS = [
    AddressPair("10.9.0.100/32", None),
    AddressPair("10.9.1.0/24", PAIR_MAC),
    AddressPair("fd00:9::100/128", None),
]


def _port(port_id: int, mac: str, security: bool, pairs: tuple[AddressPair, ...]) -> DesiredPort:
    ips = (FixedIp(f"10.9.0.{port_id}", "s4", "10.9.0.0/24", None),)
    ips += (FixedIp(f"fd00:9::{port_id}", "s6", "fd00:9::/64", None),)
    return DesiredPort(
        f"d1ff0000-0000-4000-9000-{port_id:012d}",
        NETWORK,
        mac,
        1500,
        "vxlan",
        None,
        100,
        "vhostuser",
        ips,
        (SG,) if security else (),
        port_security_enabled=security,
        allowed_address_pairs=pairs,
    )


# -- random policies ------------------------------------------------------------------


@st.composite
def rules(draw: st.DrawFn, index: int) -> Rule:
    version = draw(st.sampled_from([4, 6]))
    icmp = 1 if version == 4 else 58
    protocol = draw(st.sampled_from([None, 6, 17, icmp, 253]))
    low = high = None
    if protocol in (6, 17) and draw(st.booleans()):
        low, high = sorted(draw(st.lists(st.sampled_from(PORTS), min_size=2, max_size=2)))
    elif protocol == icmp and draw(st.booleans()):
        low = draw(st.sampled_from([0, 3, 8, 128, 129, 135] if version == 6 else [0, 3, 8, 13]))
        high = draw(st.sampled_from([None, 0, 1]))
    remote = draw(st.sampled_from(["any", "prefix", "group", "address group"]))
    return Rule(
        f"d1ff0000-0000-4000-a000-{index:012d}",
        draw(st.sampled_from(["ingress", "egress"])),
        f"IPv{version}",
        protocol,
        low,
        high,
        draw(st.sampled_from(PREFIXES[version])) if remote == "prefix" else None,
        PEERS if remote == "group" else None,
        AG if remote == "address group" else None,
    )


@dataclass
class Policy:
    inputs: PolicyInputs
    port: DesiredPort


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    found = tuple(draw(rules(i)) for i in range(draw(st.integers(0, 6))))
    group = SecurityGroup(SG, found, stateful=draw(st.booleans()))
    members = draw(st.lists(st.sampled_from(V4 + V6), max_size=4, unique=True))
    host = [f"{a}/{128 if ':' in a else 32}" for a in members if a not in ("::", "0.0.0.0")]
    prefixes = draw(st.lists(st.sampled_from(PREFIXES[4] + PREFIXES[6]), max_size=3))
    pairs = tuple(draw(st.lists(st.sampled_from(PAIRS), max_size=2, unique=True)))
    port = _port(1, P_MAC, True, pairs)
    peer = _port(2, Q_MAC, False, ())
    inputs = PolicyInputs(
        {SG: group},
        {PEERS: {"m": tuple(host)}} if host else {},
        {AG: tuple(prefixes)},
        [PortPolicy(port, P_DEV), PortPolicy(peer, Q_DEV)],
    )
    return Policy(inputs, port)


# -- random frames --------------------------------------------------------------------


def _l4(proto: int, pseudo: bytes, body: bytes) -> bytes:
    """``body`` with its checksum filled in (TCP, UDP, ICMP, ICMPv6)."""
    at = {6: 16, 17: 6, 1: 2, 58: 2}.get(proto)
    if at is None:
        return body
    summed = body if proto == 1 else pseudo + body
    value = checksum(summed) or (0xFFFF if proto == 17 else 0)
    return body[:at] + struct.pack("!H", value) + body[at + 2 :]


def ip_frame(src: str, dst: str, s: str, d: str, proto: int, body: bytes, ident: int) -> bytes:
    eth = bytes.fromhex(dst.replace(":", "")) + bytes.fromhex(src.replace(":", ""))
    saddr, daddr = ipaddress.ip_address(s).packed, ipaddress.ip_address(d).packed
    if len(saddr) == 4:
        pseudo = saddr + daddr + struct.pack("!BBH", 0, proto, len(body))
        head = struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(body), ident & 0xFFFF, 0, 64, proto, 0)
        head += saddr + daddr
        head = head[:10] + struct.pack("!H", checksum(head)) + head[12:]
        return eth + b"\x08\x00" + head + _l4(proto, pseudo, body)
    pseudo = saddr + daddr + struct.pack("!I3xB", len(body), proto)
    head = struct.pack("!IHBB", 0x60000000 | (ident & 0xFFFFF), len(body), proto, 64)
    return eth + b"\x86\xdd" + head + saddr + daddr + _l4(proto, pseudo, body)


@dataclass(frozen=True)
class Sent:
    frame: bytes
    by_port: bool  # P sends it (P's egress), else Q sends it to P (P's ingress)


@st.composite
def frames(draw: st.DrawFn) -> Sent:
    by_port = draw(st.booleans())
    src = draw(st.sampled_from([P_MAC, P_MAC, P_MAC, PAIR_MAC, ALIEN_MAC])) if by_port else Q_MAC
    dst = Q_MAC if by_port else P_MAC
    kind = draw(st.sampled_from(["v4", "v6", "v4", "v6", "arp", "other"]))
    eth = bytes.fromhex(dst.replace(":", "")) + bytes.fromhex(src.replace(":", ""))
    if kind == "other":
        return Sent(eth + b"\x88\xb6" + bytes(46), by_port)
    if kind == "arp":
        sha = draw(st.sampled_from([P_MAC, PAIR_MAC, ALIEN_MAC, Q_MAC]))
        spa = ipaddress.ip_address(draw(st.sampled_from(V4))).packed
        body = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + bytes.fromhex(sha.replace(":", ""))
        body += spa + bytes(6) + ipaddress.ip_address("10.9.0.2").packed
        return Sent(eth + b"\x08\x06" + body, by_port)
    pool = V4 if kind == "v4" else V6
    s, d = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
    if by_port and draw(st.integers(0, 3)):  # mostly a source the port may use: its rules decide
        s = P_IP4 if kind == "v4" else draw(st.sampled_from([P_IP6, link_local(P_MAC)]))
    icmp = 1 if kind == "v4" else 58
    proto = draw(st.sampled_from([6, 17, icmp, icmp, 253]))
    sport, dport = draw(st.sampled_from(PORTS)), draw(st.sampled_from(PORTS))
    if proto == 6:  # a bare SYN: the only first packet conntrack always takes
        body = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 0x50, 0x02, 8192, 0, 0)
    elif proto == 17:
        body = struct.pack("!HHHH", sport, dport, 12, 0) + b"abcd"
    elif proto == 1:
        kind_code = (draw(st.sampled_from([0, 3, 5, 8, 13, 42])), draw(st.sampled_from([0, 1])))
        body = struct.pack("!BBHHH", *kind_code, 0, 7, 1) + b"abcd"
    elif proto == 58:
        types = [1, 128, 129, 130, 131, 133, 134, 135, 136, 137, 139, 143, 200]
        kind_code = (draw(st.sampled_from(types)), draw(st.sampled_from([0, 1])))
        target = ipaddress.ip_address(draw(st.sampled_from(V6))).packed
        body = struct.pack("!BBHI", *kind_code, 0, 0) + target
    else:
        body = bytes(draw(st.sampled_from([0, 2, 8])))
    ident = draw(st.integers(1, 0xFFFF))
    return Sent(ip_frame(src, dst, s, d, proto, body, ident), by_port)


def sentinel_after(item: Sent, count: int) -> bytes:
    """A frame that always reaches the other port, sent after ``item`` to say when to stop
    looking: from P an ICMPv6 echo from its own address (admitted on egress always), from Q a
    frame of an ethertype no rule reads."""
    if item.by_port:
        body = struct.pack("!BBHHH", 128, 0, 0, 0xD1, count & 0xFFFF)
        return ip_frame(P_MAC, Q_MAC, P_IP6, "fd00:9::2", 58, body, count)
    eth = bytes.fromhex((P_MAC + Q_MAC).replace(":", ""))
    return eth + struct.pack("!HI", SENTINEL, count) + bytes(42)


# -- the kernel side --------------------------------------------------------------------


def _raw_socket(ns: str, dev: str) -> socket.socket:
    """An AF_PACKET socket on ``dev`` in namespace ``ns`` (made in a thread that enters it)."""
    made: list[socket.socket] = []

    def enter() -> None:
        fd = open_netns(netns_path(ns))
        try:
            setns(fd)
        finally:
            os.close(fd)
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        sock.bind((dev, 0))
        sock.settimeout(1.0)
        made.append(sock)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    return made[0]


@dataclass
class Bridge:
    host: str
    sockets: dict[str, socket.socket]  # "p", "q": the pods' eth0
    sent: int = 0

    def apply(self, inputs: PolicyInputs) -> None:
        text = ruleset.replace(compile_ruleset(inputs, naming.DEVICES).ruleset)
        subprocess.run(
            ["ip", "netns", "exec", self.host, "nft", "-f", "-"], input=text, text=True, check=True
        )

    def passes(self, item: Sent, flush: bool = True) -> bool:
        """Whether the kernel delivers the frame to the other port; ``flush``: conntrack
        forgets every flow first, so the frame is the first packet of its flow."""
        if flush:
            in_ns(self.host, "conntrack", "-F", check=False)
        self.sent += 1
        sender, receiver = ("p", "q") if item.by_port else ("q", "p")
        sentinel = sentinel_after(item, self.sent)
        self.sockets[sender].send(item.frame)
        self.sockets[sender].send(sentinel)
        seen = False
        while True:
            data, address = self.sockets[receiver].recvfrom(65536)
            if address[2] == socket.PACKET_OUTGOING:
                continue
            if data[: len(sentinel)] == sentinel:
                return seen
            seen = seen or data[: len(item.frame)] == item.frame


@pytest.fixture(scope="module")
def bridge() -> Iterator[Bridge]:
    env = NetEnv()
    affinity = os.sched_getaffinity(0)
    try:
        host = env.namespace("dh")
        in_ns(host, "ip", "link", "add", BRIDGE, "type", "bridge")
        in_ns(host, "ip", "link", "set", BRIDGE, "up")
        sockets = {}
        for name, dev, mac in (("p", P_DEV, P_MAC), ("q", Q_DEV, Q_MAC)):
            pod = env.namespace(f"d{name}")
            in_ns(host, "ip", "link", "add", dev, "type", "veth", "peer", "name", "eth0")
            in_ns(host, "ip", "link", "set", "eth0", "netns", pod)
            in_ns(host, "ip", "link", "set", dev, "master", BRIDGE, "up")
            in_ns(pod, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            in_ns(pod, "ip", "link", "set", "eth0", "address", mac, "up")
            sockets[name] = _raw_socket(pod, "eth0")
        # one CPU for the sender: a frame and its sentinel take one backlog, in order
        os.sched_setaffinity(0, {min(affinity)})
        yield Bridge(host, sockets)
        for sock in sockets.values():
            sock.close()
    finally:
        os.sched_setaffinity(0, affinity)
        env.cleanup()


def _egress_admitted() -> tuple[Policy, list[Sent]]:
    """A rule that admits what the port sends (random draws reach it about once in 60)."""
    rule = Rule("d1ff0000-0000-4000-a000-000000000001", "egress", "IPv4", 6, 80, 80, "10.9.0.0/24")
    port = _port(1, P_MAC, True, ())
    ports = [PortPolicy(port, P_DEV), PortPolicy(_port(2, Q_MAC, False, ()), Q_DEV)]
    inputs = PolicyInputs({SG: SecurityGroup(SG, (rule,))}, {}, {}, ports)
    syn = struct.pack("!HHIIBBHHH", 1000, 80, 1, 0, 0x50, 0x02, 8192, 0, 0)
    other = struct.pack("!HHIIBBHHH", 1000, 81, 1, 0, 0x50, 0x02, 8192, 0, 0)
    sent = [
        Sent(ip_frame(P_MAC, Q_MAC, P_IP4, "10.9.0.2", 6, syn, 1), True),
        Sent(ip_frame(P_MAC, Q_MAC, P_IP4, "10.9.0.2", 6, other, 2), True),
        Sent(ip_frame(P_MAC, Q_MAC, P_IP4, "10.9.1.2", 6, syn, 3), True),
    ]
    return Policy(inputs, port), sent


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(policy=policies(), sent=st.lists(frames(), min_size=1, max_size=8))
@example(*_egress_admitted())
def test_evaluator_agrees_with_nftables(bridge: Bridge, policy: Policy, sent: list[Sent]) -> None:
    found = compile_classifier(policy.inputs, policy.port)
    classifier = decode(encode(found))
    assert classifier == found
    bridge.apply(policy.inputs)
    for item in sent:
        expected, reason = verdict(classifier, parse(item.frame), item.by_port)
        kernel = bridge.passes(item)
        event(f"{'egress' if item.by_port else 'ingress'}: {reason}")
        assert kernel == expected, (
            f"kernel {'admits' if kernel else 'drops'}, evaluator says {reason}: "
            f"{'egress' if item.by_port else 'ingress'} {item.frame.hex()}"
        )
