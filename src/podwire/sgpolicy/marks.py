"""The packet-mark bits podwire owns, declared in one place.

A bridged frame carries the ids of its two ports' policies in the mark from the bridge's
forward hook to the inet forward hook (br_netfilter hands the same skb on). The mark is
shared with everything else on the node: kube-proxy marks Service traffic to masquerade
(0x4000) or drop (0x8000), other agents have bits of their own. So podwire sets, reads and
clears only its own bits and leaves every other bit as it found it: 12 bits for the sending
port's policy, the same 12 bits 16 higher for the receiving port's.
"""

from __future__ import annotations

from podwire.sgpolicy.rules import ChainRule, KeepMarkBits

RECEIVER_SHIFT = 16
SENDER_BITS = 0x0000_0FFF
RECEIVER_BITS = SENDER_BITS << RECEIVER_SHIFT
KEPT_BITS = 0xFFFF_FFFF & ~(SENDER_BITS | RECEIVER_BITS)  # 0xf000f000: not podwire's
MAX_POLICY_ID = SENDER_BITS  # distinct sets of security groups on one node

# The one statement that takes podwire's bits off a frame (before marking it, and once the
# verdict is given, so nothing later sees them).
CLEAR = ChainRule(statement=KeepMarkBits(KEPT_BITS))


def sender(policy_id: int) -> int:
    return policy_id


def receiver(policy_id: int) -> int:
    return policy_id << RECEIVER_SHIFT
