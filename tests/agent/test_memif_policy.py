"""The node master with security groups in force on the shared path (#38): a port's classifier
handed over a sealed memfd (``MasterControl.set_policy``), frames ring to ring judged by the
sender's port security and rules and the receiver's rules, connection tracking for stateful
groups, counters by reason; refused policies change nothing. Python memif clients are the
CNFs (``memif_client.RingClient``); each frame is followed by one that always passes, so what
arrived before it is what the master let through.

The last test is differential: for random rule sets and random frames, and replies to what
was admitted, the master's verdict equals the kernel's nftables verdict on the same port
(tests/agent/test_classifier_differential.py's bridge, strategies and frames).
"""

from __future__ import annotations

import array
import fcntl
import ipaddress
import mmap
import os
import re
import signal
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from podwire.config import MemifSettings
from podwire.memif import build as memif_build
from podwire.memif import master as memif_master
from podwire.memif.master import MasterControl, MasterRefused, PortSpec, PortStats
from podwire.schema.ports import DesiredPort
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy.classifier import (
    UNFILTERED,
    MalformedClassifier,
    compile_classifier,
    decode,
    encode,
)
from podwire.sgpolicy.compile import PolicyInputs, PortPolicy
from tests.agent import memif_client as mc
from tests.agent.netenv import NetEnv, in_ns
from tests.agent.test_classifier_differential import (
    P_IP4,
    P_IP6,
    P_MAC,
    Q_MAC,
    SG,
    Bridge,
    Policy,
    Sent,
    _egress_admitted,
    _port,
    bridge,  # noqa: F401 (a fixture)
    checksum,
    frames,
    ip_frame,
    policies,
    sentinel_after,
)
from tests.agent.test_memif_master import add_port
from tests.classifier_ref import parse

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(memif_build.find() is None, reason="podwire-memif not built"),
]

SECRET = "policy-test-secret"
P_NAME, Q_NAME = "pwtpolp", "pwtpolq"
Q_IP4 = "10.9.0.2"
ALIEN_MAC = "fa:16:3e:d1:00:63"
P_PORT = _port(1, P_MAC, True, ())
Q_PORT = _port(2, Q_MAC, True, ())


class Node:
    """A master in a namespace of its own with two shared ports of one domain, P and Q, each
    with a client connected."""

    def __init__(self, env: NetEnv, work: Path, max_flows: int | None = None) -> None:
        self.ns = env.namespace("mp")
        for conf in ("all", "default"):  # nothing of the kernel's own into the rings
            in_ns(self.ns, "sysctl", "-qw", f"net.ipv6.conf.{conf}.disable_ipv6=1")
        in_ns(self.ns, "ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        in_ns(self.ns, "ip", "link", "set", "br0", "up")
        self.work = work
        self.log = work / "master.log"
        self.control_path = str(work / "control.sock")
        binary = memif_build.find()
        assert binary is not None
        extra = (f"--max-flows={max_flows}",) if max_flows else ()
        with open(self.log, "wb") as out:
            self.pid, self.started = memif_master.spawn(
                binary, self.control_path, MemifSettings(), stderr=out.fileno(), extra=extra
            )
        self.control = MasterControl(self.control_path)
        self.clients: dict[str, mc.RingClient] = {}
        self.add_both()

    def add_both(self) -> None:
        for name, mac in ((P_NAME, P_MAC), (Q_NAME, Q_MAC)):
            path = str(self.work / f"{name}.sock")
            add_port(self.control, self.ns, PortSpec(name, path, SECRET, "br0", True, mac))
            self.clients[name] = mc.RingClient(path, SECRET)

    def renew(self) -> None:
        """Both ports removed and added again: the domain's flows go with its last port."""
        for name, client in self.clients.items():
            client.close()
            assert self.control.remove(name)
        self.add_both()

    @property
    def p(self) -> mc.RingClient:
        return self.clients[P_NAME]

    @property
    def q(self) -> mc.RingClient:
        return self.clients[Q_NAME]

    def port(self, name: str) -> PortStats:
        return next(s for s in self.control.ports() if s.name == name)

    def running(self) -> bool:
        return memif_master.is_running(self.pid, self.started)

    def stop(self) -> None:
        for client in self.clients.values():
            client.close()
        self.control.close()
        memif_master.stop(self.pid, self.started)


@pytest.fixture
def node(netenv: NetEnv, tmp_path: Path) -> Iterator[Node]:
    node = Node(netenv, tmp_path)
    try:
        yield node
    finally:
        node.stop()
    assert not node.running()


# -- frames and policies --------------------------------------------------------------------

TCP_SYN, TCP_ACK = 0x02, 0x10


def udp(sport: int, dport: int, payload: bytes = b"data") -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def tcp(sport: int, dport: int, flags: int) -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 0x50, flags, 8192, 0, 0)


def echo(kind: int, ident: int) -> bytes:
    return struct.pack("!BBHHH", kind, 0, 0, ident, 1) + b"ping"


def from_p(proto: int, body: bytes, src: str = P_IP4, mac: str = P_MAC) -> bytes:
    return ip_frame(mac, Q_MAC, src, Q_IP4, proto, body, 1)


def from_q(proto: int, body: bytes) -> bytes:
    return ip_frame(Q_MAC, P_MAC, Q_IP4, P_IP4, proto, body, 1)


_count = iter(range(1, 1 << 30))


def arp_marker(src_mac: str, src_ip: str, dst_mac: str) -> bytes:
    """An ARP request from a port's own MAC and address: its port security admits it and no
    rule reads it, so it always arrives; a fresh target address tells it apart."""
    sha = bytes.fromhex(src_mac.replace(":", ""))
    body = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + sha + ipaddress.IPv4Address(src_ip).packed
    body += bytes(6) + next(_count).to_bytes(4, "big")
    return bytes.fromhex(dst_mac.replace(":", "")) + sha + b"\x08\x06" + body


def through(node: Node, by_p: bool, *sent: bytes) -> list[bool]:
    """Send ``sent`` from P (else Q) to the other port; which of them arrived."""
    sender, receiver = (node.p, node.q) if by_p else (node.q, node.p)
    marker = arp_marker(P_MAC, P_IP4, Q_MAC) if by_p else arp_marker(Q_MAC, Q_IP4, P_MAC)
    for frame in sent:
        sender.send(frame)
    sender.send(marker)
    got = receiver.until(marker)
    return [frame in got for frame in sent]


def rule(direction: str, protocol: int | None, low: int | None = None, high: int | None = None,
         version: int = 4) -> Rule:  # fmt: skip
    rule_id = f"d1ff0000-0000-4000-b000-{next(_count):012d}"
    return Rule(rule_id, direction, f"IPv{version}", protocol, low, high, None, None, None)


def blob(rules: tuple[Rule, ...], stateful: bool = True, port: DesiredPort = P_PORT) -> bytes:
    group = SecurityGroup(SG, rules, stateful=stateful)
    inputs = PolicyInputs({SG: group}, {}, {}, [PortPolicy(port, "pwtx")])
    return encode(compile_classifier(inputs, port))


# -- what the rules say ---------------------------------------------------------------------


def test_a_port_starts_unfiltered_and_an_unfiltered_blob_clears_its_policy(node: Node) -> None:
    assert not node.port(P_NAME).filtered
    anything = from_q(17, udp(1, 9))
    assert through(node, False, anything) == [True]
    node.control.set_policy(P_NAME, blob(()))  # port security on, no rule
    assert node.port(P_NAME).filtered
    assert through(node, False, anything) == [False]
    node.control.set_policy(P_NAME, encode(UNFILTERED))
    p = node.port(P_NAME)
    assert not p.filtered and p.denied == 1
    assert through(node, False, anything) == [True]


def test_what_a_rule_admits_passes_ring_to_ring_the_rest_is_denied(node: Node) -> None:
    node.control.set_policy(P_NAME, blob((rule("ingress", 6, 80, 80), rule("egress", 17))))
    web, other = from_q(6, tcp(1000, 80, TCP_SYN)), from_q(6, tcp(1000, 81, TCP_SYN))
    assert through(node, False, web, other) == [True, False]
    assert through(node, True, from_p(17, udp(5000, 53)), from_p(6, tcp(1, 80, TCP_SYN))) == [
        True,
        False,
    ]
    p, q = node.port(P_NAME), node.port(Q_NAME)
    assert (p.denied, p.spoofed, p.invalid, p.flows_full) == (2, 0, 0, 0)
    assert p.admitted == 4  # web, the query, and the two markers
    assert p.drops == 2 and not q.filtered and q.denied == 0
    assert p.to_shared == 2  # the query and P's marker


def test_an_end_talking_to_itself_gets_its_answer(node: Node) -> None:
    """A TCP tuple that is its own reverse (P's address and port at both ends): its SYN-ACK is
    the flow's reply, as the kernel's conntrack sees it (found by the differential test)."""
    node.control.set_policy(P_NAME, blob((rule("egress", 6),)))
    syn = ip_frame(P_MAC, Q_MAC, P_IP4, P_IP4, 6, tcp(1, 1, TCP_SYN), 1)
    assert through(node, True, syn) == [True]
    answer = ip_frame(Q_MAC, P_MAC, P_IP4, P_IP4, 6, tcp(1, 1, TCP_SYN | TCP_ACK), 1)
    assert through(node, False, answer) == [True]
    assert node.port(P_NAME).invalid == 0


@pytest.mark.parametrize("stateful", [True, False], ids=["stateful", "stateless"])
def test_replies_pass_when_the_groups_are_stateful(node: Node, stateful: bool) -> None:
    """P may send UDP and TCP to port 53 and pings; nothing is admitted in. Stateful, the
    replies pass; stateless they need a rule (as nftables: no conntrack accept)."""
    rules = (rule("egress", 17, 53, 53), rule("egress", 6, 53, 53), rule("egress", 1))
    node.control.set_policy(P_NAME, blob(rules, stateful))
    asked = [from_p(17, udp(4000, 53)), from_p(6, tcp(4001, 53, TCP_SYN)), from_p(1, echo(8, 7))]
    assert through(node, True, *asked) == [True, True, True]
    replies = [from_q(17, udp(53, 4000)), from_q(6, tcp(53, 4001, TCP_SYN | TCP_ACK))]
    replies.append(from_q(1, echo(0, 7)))
    unasked = [from_q(17, udp(53, 4999)), from_q(1, echo(0, 8))]  # no flow: a lone echo reply
    assert through(node, False, *replies, *unasked) == [stateful] * 3 + [False, False]
    p = node.port(P_NAME)
    if stateful:
        assert (p.denied, p.invalid) == (1, 1)  # conntrack: an echo reply opens no flow
    else:
        assert (p.denied, p.invalid) == (5, 0)
    # ...and with a rule the stateless port takes the replies.
    if not stateful:
        back = (*rules, rule("ingress", 17), rule("ingress", 6), rule("ingress", 1))
        node.control.set_policy(P_NAME, blob(back, stateful=False))
        assert through(node, False, *replies) == [True] * 3


def test_one_flow_serves_two_filtered_stateful_ports(node: Node) -> None:
    """P may open TCP 80 out, Q may take it in; neither admits anything the other way, yet
    Q's answer passes Q's egress and P's ingress: both see the flow established."""
    node.control.set_policy(P_NAME, blob((rule("egress", 6, 80, 80),)))
    node.control.set_policy(Q_NAME, blob((rule("ingress", 6, 80, 80),), port=Q_PORT))
    assert through(node, True, from_p(6, tcp(3333, 80, TCP_SYN))) == [True]
    answer = from_q(6, tcp(80, 3333, TCP_SYN | TCP_ACK))
    unasked = from_q(6, tcp(80, 4444, TCP_SYN))
    assert through(node, False, answer, unasked) == [True, False]
    assert through(node, True, from_p(6, tcp(3333, 80, TCP_ACK))) == [True]
    assert node.port(Q_NAME).denied == 1  # Q's egress refused the unasked SYN
    assert node.port(P_NAME).denied == 0


def test_spoofed_sources_are_dropped_and_never_learned(node: Node) -> None:
    node.control.set_policy(P_NAME, blob((rule("egress", None),)))
    alien_mac = from_p(17, udp(1, 2), mac=ALIEN_MAC)
    alien_ip = from_p(17, udp(1, 2), src="10.9.0.77")
    assert through(node, True, alien_mac, alien_ip, from_p(17, udp(1, 2))) == [False, False, True]
    assert node.port(P_NAME).spoofed == 2
    # The spoofed MAC was not learned: a frame to it is an unknown destination, for the tap
    # (the bridge floods it, so P may get it that way), not for P's ring.
    before = node.port(Q_NAME)
    through(node, False, ip_frame(Q_MAC, ALIEN_MAC, Q_IP4, P_IP4, 17, udp(2, 1), 1))
    after = node.port(Q_NAME)
    assert after.to_kernel == before.to_kernel + 1
    assert after.to_shared == before.to_shared + 1  # the marker only


def _rewriter(region: mmap.mmap, at: int, values: tuple[int, int]) -> int:
    """A child process, as a hostile CNF's second thread, that flips byte ``at`` of every C2S
    buffer between ``values`` until it is killed; its pid."""
    spots = [mc.RingClient.C2S_BUFFERS + i * mc.RingClient.BUFFER + at
             for i in range(mc.RingClient.SLOTS)]  # fmt: skip
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            while True:
                for value in values:
                    for spot in spots:
                        region[spot] = value
        finally:
            os._exit(0)
    return pid


def test_a_frame_rewritten_while_it_is_judged_moves_as_judged(node: Node) -> None:
    """The client rewrites the UDP destination port (53, admitted; 54, denied) of its buffers
    while the master reads them: the master judges and moves its own copy, so no frame to 54
    ever reaches Q."""
    node.control.set_policy(P_NAME, blob((rule("egress", 17, 53, 53),), stateful=False))
    frame = from_p(17, udp(4000, 53))
    at = 14 + 20 + 3  # the low byte of the destination port
    assert frame[at] == 53
    arrived: list[bytes] = []
    child = _rewriter(node.p.region, at, (54, 53))
    try:
        for n in range(8000):
            node.p.send(frame)
            if n % 16 == 0:
                arrived += node.q.received()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert through(node, True, from_p(17, udp(4000, 53))) == [True]
    arrived += node.q.received()
    ports = {f[at] for f in arrived if len(f) == len(frame) and f[12:14] == b"\x08\x00"}
    assert ports <= {53}, f"frames to {ports} passed a rule for 53 only"
    p = node.port(P_NAME)
    assert p.denied > 0 and p.admitted > 0  # the rewriting raced the master both ways


def fragmented(frame: bytes, field: int) -> bytes:
    """An IPv4 frame made a fragment: ``field`` is its flags and offset (MF 0x2000, the
    offset in 8-byte units), the header's sum redone."""
    head = bytearray(frame[14:34])
    head[6:8] = field.to_bytes(2, "big")
    head[10:12] = bytes(2)
    head[10:12] = checksum(bytes(head)).to_bytes(2, "big")
    return frame[:14] + bytes(head) + frame[34:]


def test_fragments_to_or_from_a_filtered_port_go_to_the_kernel_unjudged(node: Node) -> None:
    """A fragmented UDP datagram (nftables sees it reassembled): the master reads no ports
    from fragments, whose later bytes are payload; it sends them to the sender's tap, counted
    as to_kernel, neither admitted nor denied nor invalid. IPv6 fragments and fragments to the
    filtered port likewise."""
    node.control.set_policy(P_NAME, blob((rule("egress", 17, 53, 53),)))
    first = fragmented(from_p(17, udp(4000, 53, bytes(16))), 0x2000)
    lookalike = fragmented(from_p(17, struct.pack("!HHHH", 4000, 53, 12, 0) + b"tail"), 0x2003)
    last = fragmented(from_p(17, bytes(12)), 6)  # payload read as ports and length: junk
    v6 = ip_frame(P_MAC, Q_MAC, P_IP6, "fd00:9::2", 44, struct.pack("!BBHI", 17, 0, 1, 7), 1)
    before_p, before_q = node.port(P_NAME), node.port(Q_NAME)
    through(node, True, first, lookalike, last, v6)  # the bridge may bring them to Q later
    through(node, False, fragmented(from_q(17, udp(53, 4000)), 0x2000))
    p, q = node.port(P_NAME), node.port(Q_NAME)
    assert p.to_kernel == before_p.to_kernel + 4 and q.to_kernel == before_q.to_kernel + 1
    assert p.to_shared == before_p.to_shared + 1  # the marker only
    assert q.to_shared == before_q.to_shared + 1
    assert (p.denied, p.invalid, p.spoofed) == (0, 0, 0)
    assert p.admitted == before_p.admitted + 2  # the two markers


def test_a_policy_swap_is_in_force_for_the_next_frame(node: Node) -> None:
    closed, dns = blob(()), blob((rule("ingress", 17, 53, 53),))
    query = from_q(17, udp(4000, 53))
    for policy, passes in ((closed, False), (dns, True), (closed, False), (dns, True)):
        node.control.set_policy(P_NAME, policy)
        assert through(node, False, query) == [passes]
        query = from_q(17, udp(4000 + next(_count) % 1000, 53))  # a new flow each time


def test_a_full_flow_table_drops_new_flows_established_ones_pass(
    netenv: NetEnv, tmp_path: Path
) -> None:
    """Both entries hold flows that saw a reply, so neither may be evicted: a third flow is
    dropped as flows_full and the two keep passing."""
    node = Node(netenv, tmp_path, max_flows=2)
    try:
        node.control.set_policy(P_NAME, blob((rule("egress", 17),)))
        opened = [from_p(17, udp(5000 + i, 53)) for i in range(3)]
        replies = [from_q(17, udp(53, 5000 + i)) for i in range(3)]
        assert through(node, True, *opened[:2]) == [True, True]
        assert through(node, False, *replies[:2]) == [True, True]
        assert through(node, True, opened[2]) == [False]
        p = node.port(P_NAME)
        assert p.flows_full == 1 and p.denied == 0
        assert through(node, False, *replies) == [True, True, False]
        assert node.port(P_NAME).denied == 1  # the third never opened: its reply has no flow
        assert "max_flows=2 flow_table_bytes=136" in node.log.read_text()
    finally:
        node.stop()


def test_a_flood_of_unreplied_flows_evicts_its_own_kind_never_a_replied_flow(
    netenv: NetEnv, tmp_path: Path
) -> None:
    """Four entries: P opens a flow Q answers, then floods bare ACKs (TCP picked up midstream,
    never answered). Each new flow evicts the least recently seen flow that saw no reply, so
    no flow is refused: a legitimate SYN after the flood opens and its answer passes, the
    answered flow is still there, and of the flood only the last two are left."""
    node = Node(netenv, tmp_path, max_flows=4)
    try:
        node.control.set_policy(P_NAME, blob((rule("egress", 6), rule("egress", 17))))
        assert through(node, True, from_p(17, udp(6000, 53))) == [True]
        assert through(node, False, from_q(17, udp(53, 6000))) == [True]
        flood = [from_p(6, tcp(7000 + i, 80, TCP_ACK)) for i in range(50)]
        assert through(node, True, *flood) == [True] * 50
        assert through(node, True, from_p(6, tcp(8000, 443, TCP_SYN))) == [True]
        answers = [from_q(6, tcp(443, 8000, TCP_SYN | TCP_ACK)), from_q(17, udp(53, 6000))]
        late = [from_q(6, tcp(80, 7000 + i, TCP_ACK)) for i in (0, 47, 48, 49)]
        assert through(node, False, *answers, *late) == [True, True, False, False, True, True]
        p = node.port(P_NAME)
        assert p.flows_full == 0 and p.denied == 2  # the answers to evicted flows
    finally:
        node.stop()


# -- refusals -------------------------------------------------------------------------------


def _memfd(data: bytes, seals: int) -> int:
    fd = os.memfd_create("pw-test-policy", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def _policy_request(node: Node, name: str, fds: tuple[int, ...], tail: bytes = b"") -> str:
    """One POLICY request on a connection of its own; the master's reason, "" when OK."""
    request = memif_master.REQUEST.pack(memif_master.OP_POLICY, name.encode(), b"", b"", 0, b"")
    request = request[: len(request) - len(tail)] + tail
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(2)
    sock.connect(node.control_path)
    try:
        ancillary = []
        if fds:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sock.sendmsg([request], ancillary)
        reply = sock.recv(memif_master.REPLY_SIZE + 1)
    finally:
        sock.close()
        for fd in fds:
            os.close(fd)
    assert len(reply) == memif_master.REPLY_SIZE
    status = struct.unpack_from("<I", reply)[0]
    return "" if status == memif_master.ST_OK else reply[4:].split(b"\0", 1)[0].decode()


ALL_SEALS = memif_master.POLICY_SEALS
GOOD = blob((rule("ingress", 17, 53, 53),))
COUNTS_AT = 10  # the header's six record counts


def _over_limit() -> bytes:
    macs = bytearray(GOOD)
    struct.pack_into("<H", macs, COUNTS_AT, 33)
    return bytes(macs)


REFUSED: list[tuple[Callable[[], tuple[int, ...]], str]] = [
    (lambda: (_memfd(GOOD, 0),), "classifier memfd is not sealed against change"),
    (
        lambda: (_memfd(GOOD, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW),),
        "classifier memfd is not sealed against change (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE)",
    ),
    (lambda: (_memfd(b"PWCX" + GOOD[4:], ALL_SEALS),), "magic b'PWCX' is not b'PWCL'"),
    (lambda: (_memfd(GOOD[:-1], ALL_SEALS),), f"{len(GOOD) - 1} bytes, header says {len(GOOD)}"),
    (lambda: (_memfd(GOOD[:20], ALL_SEALS),), "20 bytes: not within the header's 32"),
    (lambda: (_memfd(_over_limit(), ALL_SEALS),), "33 records: over MAX_MACS = 32"),
    (lambda: (), "policy needs one descriptor"),
    (lambda: (_memfd(GOOD, ALL_SEALS), _memfd(GOOD, ALL_SEALS)), "policy needs one descriptor"),
    (lambda: (os.open("/dev/null", os.O_RDONLY),), "the descriptor is not a memfd"),
]


@pytest.mark.parametrize(("make", "reason"), REFUSED)
def test_a_refused_policy_names_the_problem_and_changes_nothing(
    node: Node, make: Callable[[], tuple[int, ...]], reason: str
) -> None:
    node.control.set_policy(P_NAME, GOOD)
    before = node.port(P_NAME)
    assert _policy_request(node, P_NAME, make()).startswith(reason)
    assert node.running()
    assert node.port(P_NAME) == before
    dns, other = from_q(17, udp(4000, 53)), from_q(17, udp(4000, 54))
    assert through(node, False, dns, other) == [True, False]  # the old classifier, in force


def test_policy_for_no_port_or_with_reserved_bytes_is_refused(node: Node) -> None:
    assert _policy_request(node, "pwtnone", (_memfd(GOOD, ALL_SEALS),)) == "no port of this name"
    bad_tail = _policy_request(node, P_NAME, (_memfd(GOOD, ALL_SEALS),), tail=b"\x01")
    assert bad_tail == "reserved bytes must be zero"
    with pytest.raises(MasterRefused, match="no port of this name"):
        node.control.set_policy("pwtnone", GOOD)
    assert not node.port(P_NAME).filtered


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    """A classifier blob with a few bytes changed, cut short or lengthened."""
    found = draw(policies())
    data = bytearray(encode(compile_classifier(found.inputs, found.port)))
    how = draw(st.sampled_from(["bytes", "bytes", "header", "cut", "grow"]))
    if how == "cut":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "grow":
        return bytes(data + draw(st.binary(min_size=1, max_size=40)))
    top = 32 if how == "header" else len(data)
    for _ in range(draw(st.integers(1, 3))):
        data[draw(st.integers(0, top - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=mangled())
def test_the_masters_reader_refuses_what_decode_refuses_in_its_words(
    node: Node, data: bytes
) -> None:
    try:
        decode(data)
        expected = ""
    except MalformedClassifier as exc:
        expected = str(exc)
    event(re.sub(r"\d+", "N", expected.split(":")[0]) if expected else "accepted")
    assert _policy_request(node, P_NAME, (_memfd(data, ALL_SEALS),)) == expected


# -- the master against the kernel ----------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    env = NetEnv()
    try:
        node = Node(env, tmp_path_factory.mktemp("memif-policy"))
        try:
            yield node
        finally:
            node.stop()
    finally:
        env.cleanup()


def reply_to(item: Sent) -> Sent | None:
    """The other port's answer to an IP frame: addresses and ports swapped, a SYN answered
    with SYN-ACK, an ICMP request with its reply; None for what is not IP."""
    frame = parse(item.frame)
    if not frame.version:
        return None
    address = ipaddress.IPv4Address if frame.version == 4 else ipaddress.IPv6Address
    body = bytearray(frame.l4)
    if frame.proto in (6, 17):
        body[0:4] = body[2:4] + body[0:2]
        if frame.proto == 6:
            body[13] = TCP_SYN | TCP_ACK
            body[8:12] = (struct.unpack_from("!I", body, 4)[0] + 1).to_bytes(4, "big")
    elif frame.proto in (1, 58) and body:
        body[0] = {8: 0, 13: 14, 128: 129}.get(body[0], body[0])
    at = {6: 16, 17: 6, 1: 2, 58: 2}.get(frame.proto)
    if at is not None and len(body) >= at + 2:
        body[at : at + 2] = bytes(2)  # ip_frame sums the body with a zero checksum
    src, dst = (Q_MAC, P_MAC) if item.by_port else (P_MAC, Q_MAC)
    answer = ip_frame(src, dst, str(address(frame.daddr)), str(address(frame.saddr)),
                      frame.proto, bytes(body), 2)  # fmt: skip
    return Sent(answer, not item.by_port)


def master_passes(node: Node, item: Sent, count: int) -> bool:
    sender, receiver = (node.p, node.q) if item.by_port else (node.q, node.p)
    sentinel = sentinel_after(item, count)
    sender.send(item.frame)
    sender.send(sentinel)
    return item.frame in [f[: len(item.frame)] for f in receiver.until(sentinel)]


@dataclass
class Verdicts:
    kernel: bool
    master: bool


def both(kernel_side: Bridge, node: Node, item: Sent) -> Verdicts:
    kernel = kernel_side.passes(item, flush=False)
    return Verdicts(kernel, master_passes(node, item, kernel_side.sent))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(policy=policies(), sent=st.lists(st.tuples(frames(), st.booleans()), min_size=1, max_size=8))
@example(_egress_admitted()[0], [(item, True) for item in _egress_admitted()[1]])
def test_the_master_agrees_with_nftables(
    bridge: Bridge,  # noqa: F811
    pair: Node,
    policy: Policy,
    sent: list[tuple[Sent, bool]],
) -> None:
    """Each example starts with no flow on either side; its frames, and the replies drawn to
    those the kernel admitted, build the same flows in both."""
    bridge.apply(policy.inputs)
    in_ns(bridge.host, "conntrack", "-F", check=False)
    pair.renew()
    pair.control.set_policy(P_NAME, encode(compile_classifier(policy.inputs, policy.port)))
    for item, answer in sent:
        seen = both(bridge, pair, item)
        direction = "egress" if item.by_port else "ingress"
        event(f"{direction}: {'admitted' if seen.kernel else 'dropped'}")
        assert seen.master == seen.kernel, f"{seen}: {direction} {item.frame.hex()}"
        reply = reply_to(item) if answer and seen.kernel else None
        if reply is not None:
            again = both(bridge, pair, reply)
            event(f"reply: {'admitted' if again.kernel else 'dropped'}")
            assert again.master == again.kernel, f"reply {again}: {reply.frame.hex()}"
