"""An echo peer run inside a pod namespace, over TCP or UDP, IPv4 or IPv6.

``serve tcp|udp PORT`` answers on every address (``serve tcp PORT peer``: answers each line
with the address the connection came from, for a test of source NAT); ``client tcp|udp HOST
PORT [SOURCE]`` prints ``connected`` (or ``failed ...``) and then echoes each stdin line through
one flow, so a test can keep a flow open across an agent restart.
"""

from __future__ import annotations

import socket
import sys
import threading


def serve(proto: str, port: int, tell_peer: bool = False) -> None:
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    sock = socket.socket(socket.AF_INET6, kind)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", port))
    if proto == "udp":
        print("listening", flush=True)
        while True:
            data, peer = sock.recvfrom(4096)
            sock.sendto(data, peer)
    sock.listen(16)
    print("listening", flush=True)
    while True:
        conn, peer = sock.accept()
        answer = peer[0].removeprefix("::ffff:").encode() + b"\n" if tell_peer else None
        threading.Thread(target=echo, args=(conn, answer), daemon=True).start()


def echo(conn: socket.socket, answer: bytes | None = None) -> None:
    with conn:
        while data := conn.recv(4096):
            conn.sendall(answer or data)


def client(proto: str, host: str, port: int, source: str = "") -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    conn = socket.socket(family, kind)
    conn.settimeout(1.5)
    try:
        if source:
            conn.bind((source, 0))
        conn.connect((host, port))
        if proto == "udp":  # a UDP "connection" is real once an answer came back
            conn.send(b"hello")
            conn.recv(4096)
    except OSError as exc:
        print(f"failed {exc}", flush=True)
        return
    print("connected", flush=True)
    conn.settimeout(3)
    for line in sys.stdin:
        try:
            conn.send(line.encode())
            print(conn.recv(4096).decode().strip(), flush=True)
        except OSError as exc:
            print(f"failed {exc}", flush=True)
            return


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4:5] == ["peer"])
    else:
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:6])
