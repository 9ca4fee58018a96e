"""Real connections between pods, made from this test process: every socket is opened inside
a pod's network namespace (by a thread that enters it and comes home) and then driven by the
event loop, so one process serves TCP and a UDP echo in every pod and probes every cell of
the table at once, with no process per pod or per probe.

A cell counts as reached when the target answered at all: a connection accepted, a UDP
echo, or a refusal (a TCP reset or an ICMP port unreachable also crossed both pods' rules).
Only silence until the timeout counts as blocked, so a pod with no server yet still shows
whether its packets get through.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from podwire.netlink.netns import go_home, open_netns, own_netns, setns
from tests.kube.netpol_spec import Cell

TIMEOUT = 1.0
KINDS = {"TCP": socket.SOCK_STREAM, "UDP": socket.SOCK_DGRAM}
PAYLOAD = b"netpol-probe"

# One thread enters pods' namespaces: setns moves only the calling thread, and no other
# work of this process ever runs on it.
_entering = ThreadPoolExecutor(1, thread_name_prefix="netpol-netns")


def _open_in(netns: str, kinds: list[str]) -> list[socket.socket]:
    home = own_netns()
    target = open_netns(netns)
    try:
        setns(target)
    finally:
        os.close(target)
    try:
        made = [socket.socket(socket.AF_INET, KINDS[kind]) for kind in kinds]
    finally:
        go_home(home)
        os.close(home)
    for sock in made:
        sock.setblocking(False)
    return made


async def sockets_in(netns: str, kinds: list[str]) -> list[socket.socket]:
    """Unconnected non-blocking sockets of the pod whose namespace file is ``netns``."""
    return await asyncio.get_running_loop().run_in_executor(_entering, _open_in, netns, kinds)


class _Accept(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.transport.sendto(data, addr)  # type: ignore[attr-defined]


@dataclass
class Servers:
    """A TCP listener and a UDP echo on each (protocol, port) in each pod, until closed."""

    closers: list[asyncio.AbstractServer | asyncio.BaseTransport] = field(default_factory=list)

    async def serve(self, netns: str, services: Iterable[tuple[str, int]]) -> None:
        services = list(services)
        loop = asyncio.get_running_loop()
        made = await sockets_in(netns, [protocol for protocol, _ in services])
        for sock, (protocol, port) in zip(made, services, strict=True):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("0.0.0.0", port))
            if protocol == "TCP":
                sock.listen(128)
                self.closers.append(await loop.create_server(_Accept, sock=sock))
            else:
                transport, _ = await loop.create_datagram_endpoint(_Echo, sock=sock)
                self.closers.append(transport)

    def close(self) -> None:
        for closer in self.closers:
            closer.close()
        self.closers.clear()


async def _tcp(sock: socket.socket, address: tuple[str, int]) -> bool:
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, address), TIMEOUT)
    except ConnectionRefusedError:
        return True
    except (TimeoutError, OSError):
        return False
    return True


async def _udp(sock: socket.socket, address: tuple[str, int]) -> bool:
    """Two datagrams, half the timeout apart, and any answer to either."""
    loop = asyncio.get_running_loop()
    try:
        sock.connect(address)
        for _ in range(2):
            sock.send(PAYLOAD)
            try:
                data = await asyncio.wait_for(loop.sock_recv(sock, 64), TIMEOUT / 2)
            except TimeoutError:
                continue
            return data == PAYLOAD
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


async def probe(netns: str, cell: Cell, address: str, sock: socket.socket | None = None) -> bool:
    """One connection attempt of ``cell`` from the pod of ``netns`` to ``address``."""
    if sock is None:
        (sock,) = await sockets_in(netns, [cell.protocol])
    with contextlib.closing(sock):
        check = _tcp if cell.protocol == "TCP" else _udp
        return await check(sock, (address, cell.port))


async def measure(
    netns: dict[str, str], addresses: dict[str, str], cells: list[Cell]
) -> dict[Cell, bool]:
    """Every cell at once: the sockets of each source pod opened in one visit to its
    namespace, then all attempts concurrently (a round lasts about one timeout)."""
    by_source: dict[str, list[Cell]] = {}
    for cell in cells:
        by_source.setdefault(cell.source, []).append(cell)
    attempts = []
    for source, own in by_source.items():
        made = await sockets_in(netns[source], [cell.protocol for cell in own])
        attempts += [
            (cell, probe(netns[source], cell, addresses[cell.target], sock))
            for cell, sock in zip(own, made, strict=True)
        ]
    results = await asyncio.gather(*(attempt for _, attempt in attempts))
    return {cell: result for (cell, _), result in zip(attempts, results, strict=True)}
