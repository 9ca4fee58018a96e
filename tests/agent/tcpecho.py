"""A TCP echo peer run inside a pod namespace: ``serve PORT`` or ``client HOST PORT``.

The client prints ``connected`` (or ``refused``/``timeout``) and then echoes each stdin line
through the connection, so a test can keep one flow open across an agent restart.
"""

from __future__ import annotations

import socket
import sys
import threading


def serve(port: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(16)
    print("listening", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


def echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)


def client(host: str, port: int) -> None:
    try:
        conn = socket.create_connection((host, port), timeout=1.5)
    except OSError as exc:
        print(f"failed {exc}", flush=True)
        return
    print("connected", flush=True)
    conn.settimeout(3)
    for line in sys.stdin:
        try:
            conn.sendall(line.encode())
            print(conn.recv(4096).decode().strip(), flush=True)
        except OSError as exc:
            print(f"failed {exc}", flush=True)
            return


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        client(sys.argv[2], int(sys.argv[3]))
