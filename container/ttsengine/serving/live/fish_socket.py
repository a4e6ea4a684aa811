"""Fish Audio's live protocol over any WebSocket: the machine behind `/v1/tts/live` (the HTTP server) and SageMaker's
bidirectional stream (`serve`'s `/invocations-bidirectional-stream`). Binary msgpack maps, each with an `event`:

client: `start` {request: a /v1/tts body; its text may be empty}, `text` {text}, `flush` (speak what is
pending now), `stop` (no more text: the rest is spoken, then `finish`); and `cancel` (ours: barge-in without
closing the socket). server: `audio` {audio: bytes of the requested format}, `finish` {reason: stop | cancelled |
error, message when error}. After `finish` the connection takes a new `start`. Fish's protocol has no timing
message; a `start` whose request says `segment_events: true` (ours) also gets `segment` {text, start_sample,
end_sample} after each segment's audio: the samples of the session's audio it made, at the output rate (clients that
do not ask never see it; fish-audio-sdk ignores events it does not know).

Closing the socket is barge-in: the queued and running segments are cancelled. Every error is a `finish` with
reason "error" and a one-line message, then a close with a code: 1007 a message that is not a msgpack map of a
known event, 1008 a limit (text, idle time, a client that leaves more than TTS_LIVE_SEND_BUFFER bytes unread: the
session is cancelled) or a bad request, 1013 the model is loading or full, 1011 a failure.

The socket is the adapter's, accepted: anything with ASGI's `receive()` (message dicts), `send_bytes(data)` and
`close(code, reason)`, plus `disconnected()` saying whether it is gone (starlette's WebSocket, wrapped by the
adapter). No web framework is imported here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import msgpack

from ...config import ServerConfig
from ...errors import InputError
from ..failure import failure
from ..service import Service
from .metrics import LiveMetrics, speaking
from .outbox import Outbox, Overflow
from .session import LiveSession, Segment, live_job

log = logging.getLogger("ttsengine.serving.live")
EVENTS = ("start", "text", "flush", "stop", "cancel")
CLOSE_WAIT = 10.0  # seconds a closing socket waits for the client to take what is left


class Socket(Protocol):
    async def receive(self) -> dict: ...  # an ASGI message: websocket.receive (bytes or text) or websocket.disconnect

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class Gone(Exception):
    """The client closed the socket: nobody to tell anything."""


class ProtocolError(Exception):
    def __init__(self, message: str, code: int = 1007):
        super().__init__(message)
        self.message, self.code = message, code


class FishConnection:
    def __init__(self, ws: Socket, disconnected: Callable[[], bool], service: Service, server: ServerConfig,
                 metrics: LiveMetrics):
        """ws: accepted; disconnected(): the socket is gone (nothing can be closed any more); server: the live
        settings (TTS_LIVE_*, TTS_STRICT_FIELDS); metrics: the live series (a private registry where none is
        scraped)."""
        self.ws, self.disconnected = ws, disconnected
        self.service, self.server = service, server
        self.session: LiveSession | None = None
        self.live = metrics
        self.watch = None  # the session's metrics (metrics.SessionWatch)
        self.segment_events = False  # the session's start asked for `segment` events
        self.producer: asyncio.Task | None = None
        self.last_active = time.monotonic()  # a message in or audio out
        self.send_lock = asyncio.Lock()
        self.outbox = Outbox(self.ws.send_bytes, self.server.live_send_buffer)  # bounded: a client may stop reading
        self.writer: asyncio.Task | None = None
        self.closed = False
        self.tasks: set[asyncio.Task] = set()
        self.failing = False  # an error is being reported: the session sends nothing more

    async def run(self) -> None:
        receiving: asyncio.Task | None = None
        self.writer = asyncio.ensure_future(self.outbox.run())
        self.live.connections.labels("fish").inc()
        try:
            while not self.closed:
                receiving = receiving or asyncio.ensure_future(self.ws.receive())
                idle = self.server.live_idle_timeout
                if self.writer.done():  # a send failed: the client is gone
                    self.closed = True
                    return
                waits = {receiving, self.writer}
                if self.producer is not None and not self.producer.done():
                    waits.add(self.producer)
                left = max(0.0, self.last_active + idle - time.monotonic())
                done, _ = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if receiving not in done:
                    if done or self.closed:  # the session ended (or failed and closed the socket)
                        continue
                    if self.busy:
                        self.last_active = max(self.last_active, time.monotonic() - idle / 2)
                        continue
                    raise ProtocolError(f"idle for {idle:g} s (TTS_LIVE_IDLE_TIMEOUT)", 1008)
                message, receiving = receiving.result(), None
                if message["type"] == "websocket.disconnect":
                    self.closed = True
                    return
                self.last_active = time.monotonic()
                await self.handle(decode(message))
        except ProtocolError as e:
            await self.fail(e.message, e.code)
        except Exception as e:  # noqa: BLE001 - a client sees a protocol error, never a traceback
            await self.fail_with(e)
        finally:
            if receiving is not None:
                receiving.cancel()
            if self.session is not None:
                barge_in = speaking(self.session) and time.perf_counter()
                self.session.cancel()  # the socket is gone or closing: barge-in
                if barge_in:
                    await self.watch.barge_in(barge_in, self.session, self.producer)
            if self.producer is not None:
                await asyncio.gather(self.producer, return_exceptions=True)
            self.writer.cancel()
            self.live.connections.labels("fish").dec()

    @property
    def busy(self) -> bool:
        """Audio is being made (not idle, whatever the client does meanwhile)."""
        return self.producer is not None and not self.producer.done() and self.session is not None and \
            self.session.working

    async def handle(self, event: dict) -> None:
        name = event["event"]
        if name == "start":
            return await self.start(event)
        session = self.session
        if session is None or self.producer is None or self.producer.done():
            if name == "stop":  # nothing to speak
                return await self.send({"event": "finish", "reason": "stop"})
            if name == "cancel":  # the session ended meanwhile: nothing to stop
                return None
            raise ProtocolError(f"{name!r} before `start`", 1008)
        try:
            if name == "text":
                text = event.get("text")
                if not isinstance(text, str):
                    raise ProtocolError("text: `text` must be a string")
                session.text(text)
            elif name == "flush":
                session.flush()
            elif name == "stop":
                session.end()
            else:
                at = speaking(session) and time.perf_counter()
                session.cancel()
                if at:
                    self.background(self.watch.barge_in(at, session, self.producer))
        except InputError as e:
            raise ProtocolError(str(e), 1008) from None

    async def start(self, event: dict) -> None:
        if self.producer is not None and not self.producer.done():
            raise ProtocolError("a session is running: send `stop` (or `cancel`) and wait for `finish` first", 1008)
        try:
            self.service.require()  # loading: 1013 (stored voices are known once loaded)
            job, req = live_job(event.get("request"), self.service.voices, strict=self.server.strict_fields)
            watch = self.live.watch("fish", self.service.admit)
            self.session = LiveSession(watch.admit, job, max_chars=self.server.live_max_chars,
                                       chain=req.condition_on_previous_chunks, first_text=req.text)
        except InputError as e:
            raise ProtocolError(f"start: {e}", 1008) from None
        self.watch, self.segment_events = watch, req.segment_events
        self.producer = asyncio.create_task(self.produce(self.session, watch))

    def background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)  # held until done (the loop keeps only weak references)
        task.add_done_callback(self.tasks.discard)

    async def produce(self, session: LiveSession, watch) -> None:
        try:
            async for item in session.audio():
                if isinstance(item, Segment):
                    if self.segment_events:
                        await self.send({"event": "segment", "text": item.text, "start_sample": item.start_sample,
                                         "end_sample": item.end_sample})
                    continue
                await self.send({"event": "audio", "audio": item}, on_sent=watch.first_audio(session))
                self.last_active = time.monotonic()
            await self.send({"event": "finish", "reason": "cancelled" if session.cancelled else "stop"})
            self.last_active = time.monotonic()
        except Gone:
            return
        except Overflow as e:
            await self.fail(f"{e} (TTS_LIVE_SEND_BUFFER)", 1008)
        except Exception as e:  # noqa: BLE001 - the engine's error as a protocol message
            if not self.closed:
                await self.fail_with(e)
        finally:
            watch.closed()

    async def send(self, message: dict, final: bool = False, on_sent=None) -> None:
        async with self.send_lock:
            if self.closed or (self.failing and not final) or self.writer.done():
                raise Gone  # the client left (a send failed): barge-in
            data = msgpack.packb(message, use_bin_type=True)
            self.outbox.put(data, 0 if final else len(data), on_sent)  # Overflow: the client does not read

    async def fail_with(self, error: BaseException) -> None:
        f = failure(error)
        if not f.expected:
            log.error("live session failed", exc_info=error)
        code = 1013 if f.kind == "busy" else 1008 if f.kind == "input" else 1011
        await self.fail(f.message, code)

    async def fail(self, message: str, code: int) -> None:
        """finish (reason error, the message), then a close with `code` and the message as its reason."""
        if self.closed:
            return
        self.failing = True
        if self.session is not None:
            self.session.cancel()
        self.outbox.drop()  # audio not yet sent: the error goes out next
        try:
            await self.send({"event": "finish", "reason": "error", "message": message}, final=True)
        except Gone:
            return
        await asyncio.wait({self.writer, asyncio.ensure_future(self.outbox.drained())}, timeout=CLOSE_WAIT,
                           return_when=asyncio.FIRST_COMPLETED)  # the finish goes out before the close
        try:
            async with self.send_lock:
                self.closed = True
                if not self.disconnected():
                    await asyncio.wait_for(self.ws.close(code, message.encode()[:120].decode(errors="ignore")),
                                           CLOSE_WAIT)
        except Exception:  # noqa: BLE001 - the client is gone already: nothing to tell it
            self.closed = True


def decode(message: dict) -> dict:
    """One received WebSocket message -> an event map, or ProtocolError (1007) saying what is wrong."""
    data = message.get("bytes")
    if data is None:
        raise ProtocolError("send msgpack maps in binary messages (a text message came)")
    try:
        event = msgpack.unpackb(data, raw=False)
    except Exception as e:  # noqa: BLE001 - msgpack raises several types for bad input
        raise ProtocolError(f"a message is not valid msgpack: {type(e).__name__}") from None
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        raise ProtocolError("each message is a msgpack map with an `event`: " + ", ".join(EVENTS))
    if event["event"] not in EVENTS:
        raise ProtocolError(f"unknown event {event['event'][:40]!r}; expected one of: {', '.join(EVENTS)}")
    return event
