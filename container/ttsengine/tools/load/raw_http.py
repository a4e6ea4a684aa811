"""A minimal HTTP/1.1 client on asyncio streams for the load generator (`loadtest --client raw`, the default): only
what a POST with a streamed answer needs (Content-Length or chunked bodies, keep-alive, http and https), with the
slice of httpx's interface that load/client.py uses (`stream(...)` -> status_code, headers, aiter_raw(), aread()).

Why not httpx alone: its per-chunk and connection-pool work costs far more CPU than the bytes themselves, so with
64+ streams per client process the generator's own event loop adds latency to what it measures (issue 43 asks
whether the load generator is a bottleneck). Each read here hands on whatever the socket had, timed as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

READ = 1 << 16


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.1 as this client reads it."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class RawResponse:
    def __init__(self, conn: _Connection, status: int, headers: dict[str, str], timeout: float, head: bool):
        self._conn, self.status_code, self.headers, self._timeout = conn, status, headers, timeout
        self.complete = head or status in (204, 304)  # True once the whole body was read: the connection is reusable
        self.keep_alive = headers.get("connection", "").lower() != "close"

    async def _read(self, n: int) -> bytes:
        data = await asyncio.wait_for(self._conn.reader.read(n), self._timeout)
        if not data:
            raise ProtocolError("the server closed the connection inside a response body")
        return data

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's bytes (transfer encoding removed) as they arrive."""
        if self.complete:
            return
        reader = self._conn.reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                line = await asyncio.wait_for(reader.readline(), self._timeout)
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    while (await asyncio.wait_for(reader.readline(), self._timeout)) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                while size:
                    data = await self._read(min(size, READ))
                    size -= len(data)
                    yield data
                if await asyncio.wait_for(reader.readexactly(2), self._timeout) != b"\r\n":
                    raise ProtocolError("a chunk does not end with CRLF")
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left:
                data = await self._read(min(left, READ))
                left -= len(data)
                yield data
        else:  # the body runs to the connection's end
            self.keep_alive = False
            while data := await asyncio.wait_for(reader.read(READ), self._timeout):
                yield data
        self.complete = True

    async def aread(self) -> bytes:
        return b"".join([part async for part in self.aiter_raw()])


class RawClient:
    """Connections to one origin, kept alive between requests (one per concurrent request at most)."""

    def __init__(self, base_url: str, timeout: float):
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host, self.port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.host_header = u.netloc
        self.timeout = timeout
        self._idle: list[_Connection] = []

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *exc) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def _open(self) -> _Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=READ), self.timeout)
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection, request: bytes, head: bool) -> RawResponse:
        conn.writer.write(request)
        await conn.writer.drain()
        try:
            raw = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), self.timeout)
        except asyncio.IncompleteReadError as e:
            raise ConnectionResetError("the server closed the connection before answering") from e
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return RawResponse(conn, int(parts[1]), headers, self.timeout, head)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, json: object = None, headers: dict | None = None):  # noqa: A002
        """One request; url is the full URL (its path and query are sent). Yields the response with its headers
        read; the body is read by the caller. An idle connection the server has closed is replaced once."""
        u = urlsplit(url)
        body = b"" if json is None else _dumps(json)
        lines = [f"{method} {u.path or '/'}{'?' + u.query if u.query else ''} HTTP/1.1", f"Host: {self.host_header}",
                 f"Content-Length: {len(body)}"] + ["Content-Type: application/json"] * (json is not None)
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        reused = bool(self._idle)
        conn = self._idle.pop() if reused else await self._open()
        try:
            response = await self._exchange(conn, request, method == "HEAD")
        except (ConnectionError, asyncio.IncompleteReadError):
            conn.close()
            if not reused:
                raise
            conn = await self._open()  # a kept connection the server had closed: once more on a new one
            response = await self._exchange(conn, request, method == "HEAD")
        except BaseException:
            conn.close()
            raise
        try:
            yield response
        finally:
            if response.complete and response.keep_alive:
                self._idle.append(conn)
            else:
                conn.close()


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
