"""Deadlines a connection meets before the ASGI app sees it. A socket that never sends a byte, and a request
whose headers arrive a byte at a time (a header slowloris), each hold a connection and a file descriptor without
ever reaching the app, so only the protocol under it can bound them. uvicorn times a connection only between a
response and the next request's first byte (its keep-alive): a new connection has no timer, and once a byte of
a request has arrived nothing is timed until its headers are complete.

ConnectionGuard wraps uvicorn's HTTP protocol (httptools or h11; it knows nothing of uvicorn but the `cycle`
attribute both keep, the request in progress) and forwards every call to it. It closes a new connection that
sends nothing for `idle` seconds, and one whose request headers are not complete `header` seconds after their
first byte, with a 408 first (no response is under way then, so one can still be written). Between requests,
uvicorn's own keep-alive timer does the idle part (shutdown.serve sets it to the same seconds). Bodies are timed
above, in body_limit.py, where the app's reads are.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import InputError, TTSError

log = logging.getLogger(__name__)


class HeaderTimeout(InputError):
    """The request headers did not arrive in time (HTTP 408)."""

    status = 408


class TooManyConnections(TTSError):
    """TTS_MAX_CONNECTIONS connections are open: a new one is answered 503 and closed."""

    status = 503


LINGER_S = 2.0  # a refused connection reads and drops the client's request this long at most before it closes
MAX_LINGERING = 64
FD_RESERVE = 256  # file descriptors kept for what is not a connection: model and voice files, engine processes'
# pipes, audio encoders, downloads


def max_connections(configured: int = 0) -> int:
    """TTS_MAX_CONNECTIONS at a server's start: `configured`, or (0) the process's file-descriptor limit less
    FD_RESERVE (at least 64), so a flood of connections gets 503s before the server runs out of descriptors for its
    own files. Either way the soft limit is raised to the hard one first (many hosts start processes at 1024 soft,
    which would cap a GPU serving 1,000 streams below its slots, or fail an explicit cap above it with EMFILE)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as e:  # a sandbox may forbid it: the limit stays, and so does the cap's share
            log.info("could not raise the open-file limit from %d to %d: %s", soft, want, e)
    if configured:
        return configured
    return max(64, soft - FD_RESERVE) if soft != resource.RLIM_INFINITY else 1 << 20


@dataclass
class OpenConnections:
    """The server's open connections, as their transports (the event loop's thread alone touches them: no lock). A
    connection leaves when its protocol hears it is lost; one whose protocol this guard no longer sees (upgraded to a
    WebSocket where the guard did not notice) leaves once its transport is closing, checked before any refusal."""

    transports: set = field(default_factory=set)
    refused: int = 0
    lingering: int = 0  # refused connections still reading the client's request before they close

    @property
    def count(self) -> int:
        return len(self.transports)

    def full(self, cap: int) -> bool:
        if len(self.transports) >= cap:
            self.transports = {t for t in self.transports if not t.is_closing()}
        return len(self.transports) >= cap


@dataclass(frozen=True)
class Deadlines:
    idle: float = 0.0  # seconds a new connection may wait before its first byte; 0: no limit
    header: float = 0.0  # seconds from a request's first byte to the end of its headers; 0: no limit
    reply: Callable[[TTSError], dict] = lambda e: {"error": {"message": str(e), "code": e.status}}
    max_connections: int = 0  # open at once, WebSockets included; past it a new one gets a 503; 0: no limit
    open: OpenConnections = field(default_factory=OpenConnections)

    def too_many(self) -> bytes:
        """The whole 503 for a connection past max_connections, written before any request is read."""
        busy = TooManyConnections(f"the server has {self.open.count} connections open (TTS_MAX_CONNECTIONS="
                                  f"{self.max_connections}); retry shortly")
        data = json.dumps(self.reply(busy), separators=(",", ":")).encode()
        return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(data)) + data

    def late_headers(self) -> bytes:
        """The whole 408 response, written straight to the transport (there is no request for the app to answer)."""
        late = HeaderTimeout(f"the request headers took longer than {self.header:g} s")
        data = json.dumps(self.reply(late), separators=(",", ":")).encode()  # as compact as the app's answers
        return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(data)) + data


class ConnectionGuard(asyncio.Protocol):
    """inner(**uvicorn_args): the protocol guarded (uvicorn's AutoHTTPProtocol); uvicorn builds this one as it
    would build that, with `functools.partial(ConnectionGuard, inner, deadlines)` as uvicorn.Config's `http`."""

    def __init__(self, inner: Callable[..., asyncio.Protocol], deadlines: Deadlines, **uvicorn_args):
        self.inner = inner(**uvicorn_args)
        self.deadlines = deadlines
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.head_of: object | None = None  # while headers are timed: the request in progress when they began
        self.timing_head = False
        self.refused = False  # over max_connections: answered 503 and closed, nothing forwarded

    # ---- asyncio.Protocol, forwarded ----
    def connection_made(self, transport) -> None:
        self.transport = transport
        limits = self.deadlines
        if limits.max_connections and limits.open.full(limits.max_connections):
            self.refused = True
            limits.open.refused += 1
            if limits.open.refused in (1, 10, 100) or limits.open.refused % 1000 == 0:  # a flood: a few lines
                log.warning("refused a connection from %s: %d open (TTS_MAX_CONNECTIONS=%d); %d refused so far",
                            transport.get_extra_info("peername"), limits.open.count, limits.max_connections,
                            limits.open.refused)
            transport.write(limits.too_many())
            self._linger(transport)
            return
        limits.open.transports.add(transport)
        self.inner.connection_made(transport)
        if self.deadlines.idle:
            self._arm(self.deadlines.idle, self._idle)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if not self.timing_head and self._between_requests():  # a request's first byte: its headers' clock starts
            self._disarm()  # the idle clock of a new connection, if it still runs
            if self.deadlines.header:
                self._arm(self.deadlines.header, self._late)
                self.timing_head, self.head_of = True, self._request()
        self.inner.data_received(data)
        upgraded = self.transport.get_protocol() is not self  # to a WebSocket, which keeps its own timeouts
        if upgraded:
            self._count_until_lost(self.transport.get_protocol())
        if upgraded or (self.timing_head and self._request() is not self.head_of):  # or the headers are complete
            self._disarm()

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()  # None: a refused one closes on the client's EOF

    def _linger(self, transport) -> None:
        """Closing a refused connection at once resets it when the client's request is still unread here, and a
        reset may throw away the 503 before the client reads it: send a FIN after it, read and drop what comes, and
        close on the client's EOF or after LINGER_S. Few at a time (a flood must not hold descriptors): past
        MAX_LINGERING, closed at once."""
        opened = self.deadlines.open
        if opened.lingering >= MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        opened.lingering += 1
        transport.write_eof()

        def done() -> None:
            opened.lingering -= 1
            if not transport.is_closing():
                transport.close()

        asyncio.get_running_loop().call_later(LINGER_S, done)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self._disarm()
        self.deadlines.open.transports.discard(self.transport)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    def _count_until_lost(self, protocol: asyncio.BaseProtocol) -> None:
        """The connection became a WebSocket: its protocol, not this one, hears of its end. It stays counted until
        then (the count moves with the connection: this protocol's own connection_lost will not come)."""
        lost, opened, transport = protocol.connection_lost, self.deadlines.open, self.transport

        def connection_lost(exc: Exception | None) -> None:
            opened.transports.discard(transport)
            lost(exc)

        protocol.connection_lost = connection_lost  # an instance attribute: this connection's protocol only

    # ---- the deadlines ----
    def _request(self) -> object | None:
        return getattr(self.inner, "cycle", None)

    def _between_requests(self) -> bool:
        cycle = self._request()
        return cycle is None or getattr(cycle, "response_complete", False)

    def _arm(self, seconds: float, then: Callable[[], None]) -> None:
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(seconds, then)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self.timing_head = None, False

    def _idle(self) -> None:
        self.timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _late(self) -> None:
        self.timer, self.timing_head = None, False
        if self.transport.is_closing() or self._request() is not self.head_of:
            return
        peer = self.transport.get_extra_info("peername")
        log.info("closed a connection from %s: its request headers took longer than %g s", peer,
                 self.deadlines.header)
        self.transport.write(self.deadlines.late_headers())
        self.transport.close()
