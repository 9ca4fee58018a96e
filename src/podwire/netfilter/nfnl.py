"""Set element changes sent to nf_tables as one netlink batch (one transaction).

The batch is what libnftables would send for ``add element``/``delete element`` commands: a
batch begin, one NEWSETELEM or DELSETELEM message per set (split where a message's element
list would outgrow a netlink attribute), a batch end. The kernel applies all of it or, on any
error, none; every message asks for an acknowledgement, and the first error is raised with the
kernel's own explanation.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable, Sequence

from podwire.netfilter.elements import ElementChange, Packed, Unencodable, layout, pack_all
from podwire.netlink.rtnl import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    RtnlError,
    attr,
    error_of,
    message,
    messages,
    open_socket,
)

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 16, 17
NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM = 12, 14
NLA_F_NESTED = 0x8000
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_FLAGS, NFTA_SET_ELEM_KEY_END = 1, 2, 3, 10
NFT_SET_ELEM_INTERVAL_END = 1
NFTA_DATA_VALUE, NFTA_DATA_VERDICT = 1, 2
NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN = 1, 2
FAMILIES = {"inet": 1, "ip": 2, "arp": 3, "netdev": 5, "bridge": 7, "ip6": 10}
MAX_NEST = 60000  # an attribute's length is 16 bits
MAX_BATCH = 1 << 20  # larger changes go through libnftables
SEND_BUFFER = 4 << 20
TIMEOUT = 5.0


def _nested(kind: int, data: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, data)


def _strz(text: str) -> bytes:
    return text.encode() + b"\0"


def _element(item: Packed) -> bytes:
    body = _nested(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, item.key))
    if item.interval_end:
        body += attr(NFTA_SET_ELEM_FLAGS, struct.pack(">I", NFT_SET_ELEM_INTERVAL_END))
    if item.key_end is not None:
        body += _nested(NFTA_SET_ELEM_KEY_END, attr(NFTA_DATA_VALUE, item.key_end))
    if item.value is not None:
        body += _nested(NFTA_SET_ELEM_DATA, attr(NFTA_DATA_VALUE, item.value))
    if item.verdict is not None:
        code, chain = item.verdict
        verdict = attr(NFTA_VERDICT_CODE, struct.pack(">i", code))
        verdict += attr(NFTA_VERDICT_CHAIN, _strz(chain))
        body += _nested(NFTA_SET_ELEM_DATA, _nested(NFTA_DATA_VERDICT, verdict))
    return _nested(NFTA_LIST_ELEM, body)


def _nfgen(family: int, res_id: int = 0) -> bytes:
    return struct.pack("=BB", family, 0) + res_id.to_bytes(2, "big")


def _chunks(encoded: Iterable[bytes]) -> Iterable[bytes]:
    chunk = b""
    for item in encoded:
        if chunk and len(chunk) + len(item) > MAX_NEST:
            yield chunk
            chunk = b""
        chunk += item
    if chunk:
        yield chunk


def bodies(change: ElementChange) -> list[tuple[int, int, bytes]]:
    """(message type, flags, body) of the messages that make ``change``."""
    if change.family not in FAMILIES or change.verb not in ("add", "delete"):
        raise Unencodable(f"{change.verb} element in family {change.family}")
    shape = layout(change.spec)
    encoded = [
        _element(packed)
        for element in sorted(change.elements)
        for packed in pack_all(shape, element)
    ]
    head = _nfgen(FAMILIES[change.family]) + attr(NFTA_SET_ELEM_LIST_TABLE, _strz(change.table))
    head += attr(NFTA_SET_ELEM_LIST_SET, _strz(change.set_name))
    adding = change.verb == "add"
    kind = (NFNL_SUBSYS_NFTABLES << 8) | (NFT_MSG_NEWSETELEM if adding else NFT_MSG_DELSETELEM)
    flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE if adding else 0)
    return [
        (kind, flags, head + _nested(NFTA_SET_ELEM_LIST_ELEMENTS, chunk))
        for chunk in _chunks(encoded)
    ]


class NfnlSocket:
    """A NETLINK_NETFILTER socket, in the namespace of the thread that opened it (any thread
    may use it after; one at a time)."""

    def __init__(self) -> None:
        self._sock = open_socket(NETLINK_NETFILTER)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            self._sock.settimeout(TIMEOUT)
        except OSError:
            self._sock.close()
            raise
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def apply(self, changes: Sequence[ElementChange]) -> None:
        """One transaction of every change; ``Unencodable`` before anything is sent."""
        parts = [(change, body) for change in changes for body in bodies(change)]
        if not parts:
            return
        begin = self._next()
        batch = [
            message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, begin, _nfgen(0, NFNL_SUBSYS_NFTABLES))
        ]
        waiting: dict[int, str] = {}
        for change, (kind, flags, body) in parts:
            seq = self._next()
            waiting[seq] = f"{change.verb} element {change.family} {change.table} {change.set_name}"
            batch.append(message(kind, flags, seq, body))
        batch.append(
            message(
                NFNL_MSG_BATCH_END, NLM_F_REQUEST, self._next(), _nfgen(0, NFNL_SUBSYS_NFTABLES)
            )
        )
        data = b"".join(batch)
        if len(data) > MAX_BATCH:
            raise Unencodable(f"a batch of {len(data)} bytes")
        self._sock.send(data)
        self._acks(begin, waiting)

    def _acks(self, begin: int, waiting: dict[int, str]) -> None:
        """Every message's answer; the first error is raised once the others have come (the
        kernel answers the whole batch at once, so after an error, waiting for an answer
        that is not already there would only hide it)."""
        failure: RtnlError | None = None
        try:
            while waiting:
                try:
                    data = self._sock.recv(1 << 16)
                except BlockingIOError:
                    break  # after an error: nothing more is there
                for kind, flags, seq, payload in messages(data):
                    if kind != NLMSG_ERROR:
                        continue
                    if seq == begin:  # the whole batch was refused before any message
                        raise error_of(payload, flags, "nftables batch") or RtnlError(0, "batch")
                    what = waiting.pop(seq, None)
                    if what is not None and failure is None:
                        failure = error_of(payload, flags, what)
                        if failure is not None:
                            self._sock.settimeout(0.0)
        finally:
            self._sock.settimeout(TIMEOUT)
        if failure is not None:
            raise failure

    def _next(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq
