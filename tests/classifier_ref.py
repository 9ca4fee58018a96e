"""The reference evaluator of the memif classifier (#38; docs/memif.md, "Security groups in
the master"): a decoded ``Classifier`` and one Ethernet frame in, admit or drop and why out.

Test-only: the C master implements the same steps; the differential test holds this one to the
kernel's nftables verdicts. It models the first packet of a flow (conntrack state new): no
flow is established, and conntrack's "invalid" is what the kernel says of a lone packet.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from podwire.sgpolicy.classifier import Classifier, ClassifierRule, RuleKind

ETH_IP, ETH_ARP, ETH_IP6 = 0x0800, 0x0806, 0x86DD
TCP, UDP, ICMP, ICMP6 = 6, 17, 1, 58
FIXED_IN_ICMP6 = (130, 135, 136, 134)  # MLD query, NS, NA, RA
ND_PROBES = (131, 135, 143)
# ICMP types conntrack lets open a flow; ICMPv6 ND/MLD it leaves untracked (never invalid).
ICMP_NEW = (8, 13, 15, 17)
ICMP6_NEW = (128, 139)
ICMP6_UNTRACKED = (130, 131, 132, 133, 134, 135, 136, 143)


@dataclass(frozen=True)
class Frame:
    src_mac: str
    ethertype: int
    version: int = 0  # 4, 6, or 0: not IP
    saddr: int = 0
    daddr: int = 0
    proto: int = -1
    l4: bytes = b""  # the transport header and what follows
    arp_sha: str = ""
    arp_spa: int = 0


def _mac(raw: bytes) -> str:
    return raw.hex(":")


def parse(frame: bytes) -> Frame:
    """Untagged Ethernet; IPv4 without options, IPv6 without extension headers."""
    src, ethertype = _mac(frame[6:12]), struct.unpack_from("!H", frame, 12)[0]
    body = frame[14:]
    if ethertype == ETH_IP:
        ihl = (body[0] & 0xF) * 4
        total = struct.unpack_from("!H", body, 2)[0]
        saddr, daddr = (int.from_bytes(body[i : i + 4], "big") for i in (12, 16))
        return Frame(src, ethertype, 4, saddr, daddr, body[9], body[ihl:total])
    if ethertype == ETH_IP6:
        length = struct.unpack_from("!H", body, 4)[0]
        saddr, daddr = (int.from_bytes(body[i : i + 16], "big") for i in (8, 24))
        return Frame(src, ethertype, 6, saddr, daddr, body[6], body[40 : 40 + length])
    if ethertype == ETH_ARP:
        return Frame(src, ethertype, arp_sha=_mac(body[8:14]), arp_spa=_u32(body, 14))
    return Frame(src, ethertype)


def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "big")


def _udp(frame: Frame) -> tuple[int, int] | None:
    if frame.proto != UDP or len(frame.l4) < 4:
        return None
    sport, dport = struct.unpack_from("!HH", frame.l4)
    return sport, dport


def _icmp6_type(frame: Frame) -> int | None:
    if frame.version != 6 or frame.proto != ICMP6 or not frame.l4:
        return None
    return frame.l4[0]


def _source_ok(found: Classifier, mac: str, version: int, address: int) -> bool:
    return any(
        s.mac == mac and s.version == version and s.span[0] <= address <= s.span[1]
        for s in found.sources
    )


def verdict(found: Classifier, frame: Frame, sent_by_port: bool) -> tuple[bool, str]:
    """``sent_by_port``: the port sends the frame (its egress), else it receives it."""
    if not found.filtered:
        return True, "unfiltered"
    if sent_by_port:
        spoofed = _port_security(found, frame)
        if spoofed:
            return False, spoofed
    if frame.version == 0:
        return True, "not ip"
    return _policy(found, frame, sent_by_port)


def _port_security(found: Classifier, frame: Frame) -> str:
    """Why the port may not send this frame; empty if it may."""
    if frame.src_mac not in found.macs:
        return "source mac"
    udp = _udp(frame)
    if udp in ((67, 68), (547, 546)):
        return "dhcp server"
    icmp6 = _icmp6_type(frame)
    if icmp6 in (134, 137):
        return "router advertisement or redirect"
    if icmp6 == 136 or (icmp6 == 135 and frame.saddr == 0):
        target = frame.l4[8:24]
        if len(target) < 16 or not _source_ok(
            found, frame.src_mac, 6, int.from_bytes(target, "big")
        ):
            return "nd target"
    if frame.version == 4:
        if _source_ok(found, frame.src_mac, 4, frame.saddr):
            return ""
        if frame.saddr == 0 and frame.daddr == 0xFFFFFFFF and udp == (68, 67):
            return ""
        return "source ip"
    if frame.version == 6:
        if _source_ok(found, frame.src_mac, 6, frame.saddr):
            return ""
        if frame.saddr == 0 and frame.daddr >> 112 == 0xFF02 and icmp6 in ND_PROBES:
            return ""
        return "source ip"
    if frame.ethertype == ETH_ARP:
        if _source_ok(found, frame.arp_sha, 4, frame.arp_spa) or frame.arp_spa == 0:
            return ""
        return "arp source"
    return "ethertype"


def _policy(found: Classifier, frame: Frame, egress: bool) -> tuple[bool, str]:
    udp = _udp(frame)
    icmp6 = _icmp6_type(frame)
    if egress and (frame.proto == ICMP6 or udp in ((68, 67), (546, 547))):
        return True, "fixed"
    if not egress and (icmp6 in FIXED_IN_ICMP6 or udp in ((67, 68), (547, 546))):
        return True, "fixed"
    if found.stateful and _invalid(frame):
        return False, "conntrack invalid"
    remote = frame.daddr if egress else frame.saddr
    for rule in found.egress if egress else found.ingress:
        if _matches(found, rule, frame, remote):
            return True, "rule"
    return False, "no rule"


def _invalid(frame: Frame) -> bool:
    """Conntrack's verdict on a lone packet (checksums right, TCP a bare SYN)."""
    if frame.version == 4 and frame.proto == ICMP:
        return frame.l4[0] not in ICMP_NEW
    if frame.version == 6 and frame.proto == ICMP6:
        return frame.l4[0] not in ICMP6_NEW + ICMP6_UNTRACKED
    return False


def _matches(found: Classifier, rule: ClassifierRule, frame: Frame, remote: int) -> bool:
    if rule.version != frame.version:
        return False
    if rule.kind == RuleKind.PORTS:
        if len(frame.l4) < 4:  # nft's th dport reads bytes 2-3 of the transport header
            return False
        first, second = frame.proto, struct.unpack_from("!H", frame.l4, 2)[0]
    else:
        if frame.proto != (ICMP if frame.version == 4 else ICMP6) or len(frame.l4) < 2:
            return False
        first, second = frame.l4[0], frame.l4[1]
    if not (rule.first[0] <= first <= rule.first[1] and rule.second[0] <= second <= rule.second[1]):
        return False
    return any(low <= remote <= high for low, high in found.lists[rule.prefixes].spans)
