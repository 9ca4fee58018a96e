"""The Services table (agent/services/table.py) in a real network namespace: a client
namespace holds the table, a server namespace answers on three addresses with the address
it was reached at, so each connection shows which backend the translation chose."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from podwire.agent.services import table
from podwire.agent.services.table import PodPort, PodService
from podwire.netfilter import Nftables
from podwire.schema.services import Backend, ServiceEntry, ServicePort
from tests.agent.netenv import in_ns, sh

CLUSTER_IP = "10.96.77.7"
BACKENDS = ("10.201.0.2", "10.201.0.3", "10.201.0.4")
NETWORK = "9b2a3c5e-1111-4222-8333-444455556666"
SERVER = """
import selectors, socket, sys
sel = selectors.DefaultSelector()
for address in sys.argv[1:]:
    tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((address, 8080)); tcp.listen(64); sel.register(tcp, selectors.EVENT_READ, "tcp")
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind((address, 5353))
    sel.register(udp, selectors.EVENT_READ, "udp")
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        sock = key.fileobj
        if key.data == "tcp":
            conn, _ = sock.accept(); conn.sendall(sock.getsockname()[0].encode()); conn.close()
        else:
            _, peer = sock.recvfrom(64); sock.sendto(sock.getsockname()[0].encode(), peer)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces")


@dataclass
class Pair:
    client: str
    server: str


@pytest.fixture
def pair() -> Iterator[Pair]:
    tag = uuid.uuid4().hex[:6]
    found = Pair(f"pwst-c-{tag}", f"pwst-s-{tag}")
    sh("ip", "netns", "add", found.client)
    sh("ip", "netns", "add", found.server)
    server = None
    try:
        sh("ip", "link", "add", f"pwst{tag}", "netns", found.client, "type", "veth", "peer",
           "name", f"pwsp{tag}", "netns", found.server)  # fmt: skip
        in_ns(found.client, "ip", "addr", "add", "10.201.0.1/24", "dev", f"pwst{tag}")
        in_ns(found.client, "ip", "link", "set", f"pwst{tag}", "up")
        in_ns(found.client, "ip", "link", "set", "lo", "up")
        in_ns(found.client, "ip", "route", "add", "default", "via", BACKENDS[0])
        for address in BACKENDS:
            in_ns(found.server, "ip", "addr", "add", f"{address}/24", "dev", f"pwsp{tag}")
        in_ns(found.server, "ip", "link", "set", f"pwsp{tag}", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", found.server, sys.executable, "-c", SERVER, *BACKENDS],
            stdout=subprocess.PIPE,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        yield found
    finally:
        if server is not None:
            server.kill()
            server.wait()
        sh("ip", "netns", "del", found.client, check=False)
        sh("ip", "netns", "del", found.server, check=False)


def _service(backends: tuple[str, ...], affinity: bool = False) -> PodService:
    ports = [
        ServicePort("tcp", 80, tuple(Backend(a, 8080, NETWORK) for a in backends)),
        ServicePort("udp", 53, tuple(Backend(a, 5353, NETWORK) for a in backends)),
    ]
    entry = ServiceEntry("demo/web", (CLUSTER_IP,), affinity, tuple(ports))
    return table.for_network(entry, NETWORK)


async def _apply(netns: str, text: str) -> None:
    nft = Nftables(f"/run/netns/{netns}")
    try:
        await nft.apply(text)
    finally:
        nft.close()


def _text(change: str | None) -> str:
    assert change is not None, "the change needs the table written whole"
    return change


def test_a_change_needing_a_new_picking_chain_asks_for_the_whole_table() -> None:
    backends = tuple(("10.0.0.1", port) for port in range(1, 20))
    wide = PodService((PodPort("10.96.77.9", "tcp", 80, backends),), False)
    assert table.changed(None, wide, table.MADE_AHEAD) is None
    assert table.changed(None, wide, table.MADE_AHEAD | {"pick_19"}) is not None


def _ask(netns: str, kind: int, port: int, times: int) -> list[str]:
    """Answers of ``times`` connections (or datagrams) to the ClusterIP; "refused" and
    "silent" for the two ways of not being answered."""
    script = f"""
import socket, sys
out = []
for _ in range({times}):
    s = socket.socket(socket.AF_INET, {kind}); s.settimeout(1.0)
    try:
        s.connect(("{CLUSTER_IP}", {port}))  # a connected UDP socket hears ICMP errors
        if {kind} == socket.SOCK_DGRAM:
            s.send(b"?")
        out.append(s.recv(64).decode())
    except ConnectionRefusedError:
        out.append("refused")
    except TimeoutError:
        out.append("silent")
    except OSError as exc:
        out.append(type(exc).__name__)
    finally:
        s.close()
print(" ".join(out))
"""
    done = in_ns(netns, sys.executable, "-c", script)
    return done.stdout.split()


def test_connections_spread_over_every_backend(pair: Pair) -> None:
    asyncio.run(_apply(pair.client, table.whole({"demo/web": _service(BACKENDS)})))
    assert set(_ask(pair.client, socket.SOCK_STREAM, 80, 60)) == set(BACKENDS)
    assert set(_ask(pair.client, socket.SOCK_DGRAM, 53, 60)) == set(BACKENDS)


def test_client_affinity_keeps_one_backend(pair: Pair) -> None:
    services = {"demo/web": _service(BACKENDS, affinity=True)}
    asyncio.run(_apply(pair.client, table.whole(services)))
    answers = set(_ask(pair.client, socket.SOCK_STREAM, 80, 30))
    assert len(answers) == 1 and answers <= set(BACKENDS)


def test_a_change_replaces_one_service_and_a_removal_stops_it(pair: Pair) -> None:
    other = PodService((PodPort("10.96.77.8", "tcp", 80, ((BACKENDS[2], 8080),)),), False)
    before = {"demo/web": _service(BACKENDS), "demo/other": other}
    asyncio.run(_apply(pair.client, table.whole(before)))
    after = _service(BACKENDS[1:2])
    chains = table.chains(before) | table.MADE_AHEAD
    asyncio.run(_apply(pair.client, _text(table.changed(before["demo/web"], after, chains))))
    assert set(_ask(pair.client, socket.SOCK_STREAM, 80, 20)) == {BACKENDS[1]}
    started = time.monotonic()
    asyncio.run(_apply(pair.client, _text(table.changed(after, None, chains))))
    assert _ask(pair.client, socket.SOCK_STREAM, 80, 2) == ["silent", "silent"]
    assert time.monotonic() - started >= 2.0  # nothing translated: nobody answered
    listed = in_ns(pair.client, "nft", "list", "table", "ip", table.TABLE).stdout
    assert "10.96.77.8" in listed  # the other Service was not touched


def test_a_service_without_backends_is_refused(pair: Pair) -> None:
    services = {"demo/web": _service(())}
    asyncio.run(_apply(pair.client, table.whole(services)))
    # Rejected where the packet is made: the connect is refused, the send fails at once.
    assert _ask(pair.client, socket.SOCK_STREAM, 80, 3) == ["refused"] * 3
    assert _ask(pair.client, socket.SOCK_DGRAM, 53, 3) == ["PermissionError"] * 3
    ready = _service(BACKENDS[:1])
    change = table.changed(services["demo/web"], ready, table.MADE_AHEAD)
    asyncio.run(_apply(pair.client, _text(change)))
    assert _ask(pair.client, socket.SOCK_STREAM, 80, 3) == [BACKENDS[0]] * 3


def test_backends_of_other_networks_are_left_out() -> None:
    ports = (
        ServicePort(
            "tcp",
            80,
            (
                Backend("10.0.0.5", 8080, NETWORK),
                Backend("10.0.0.5", 8080, "0d0a3c5e-1111-4222-8333-444455556666"),
                Backend("192.0.2.2", 6443, "host"),
            ),
        ),
    )
    seen = table.for_network(ServiceEntry("a/b", ("10.96.0.1",), False, ports), NETWORK)
    assert seen.ports[0].backends == (("10.0.0.5", 8080), ("192.0.2.2", 6443))
