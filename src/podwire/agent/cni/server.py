"""The agent's CNI endpoint: a root-only unix socket, one request per connection.

Whatever arrives (garbage, a half request, a client that hangs) ends as a CNI error reply or
a closed connection; it never reaches the handler unvalidated and never stops the server.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

from podwire.agent.cni import socket_proto
from podwire.cni.spec import IO_FAILURE, CniError
from podwire.errors import ConfigError
from podwire.log import get_logger

log = get_logger(__name__)

Handler = Callable[[dict[str, str], str], Awaitable[tuple[int, str]]]
READ_TIMEOUT = 30.0


class CniServer:
    def __init__(self, path: str, handler: Handler) -> None:
        self.path = Path(path)
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._prepare_path()
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others connect
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(self.path), limit=socket_proto.MAX_REQUEST
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        log.info("agent.cni.listening", socket=str(self.path))

    def _prepare_path(self) -> None:
        if len(str(self.path).encode()) > 107:
            raise ConfigError(f"agent.cni_socket: {self.path} is longer than 107 bytes")
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise ConfigError(f"agent.cni_socket: {self.path} exists and is not a socket")
        self.path.unlink()  # left by a previous agent

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self.path.is_socket():
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                data = await self._read(reader)
            try:
                code, out = await self._dispatch(data)
            except Exception as exc:
                # A bug, not an input problem: the runtime still gets a CNI error, then the
                # exception propagates to asyncio's handler (logged); the server keeps serving.
                failure = CniError(IO_FAILURE, f"podwire agent failed unexpectedly: {exc}")
                writer.write(socket_proto.encode_reply(IO_FAILURE, failure.to_json()))
                raise
            writer.write(socket_proto.encode_reply(code, out))
            await writer.drain()
        except (TimeoutError, ConnectionError) as exc:
            log.warning("agent.cni.connection_dropped", error=str(exc) or type(exc).__name__)
        finally:
            writer.close()

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> bytes:
        data = await reader.read(socket_proto.MAX_REQUEST + 1)
        chunks = [data]
        total = len(data)
        while data and total <= socket_proto.MAX_REQUEST:
            data = await reader.read(socket_proto.MAX_REQUEST + 1 - total)
            chunks.append(data)
            total += len(data)
        return b"".join(chunks)

    async def _dispatch(self, data: bytes) -> tuple[int, str]:
        try:
            env, stdin = socket_proto.decode_request(data)
            return await self._handler(env, stdin)
        except CniError as exc:
            return exc.code, exc.to_json()
