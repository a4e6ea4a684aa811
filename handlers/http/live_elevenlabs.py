"""ElevenLabs' WebSocket text to speech: `/v1/text-to-speech/{voice_id}/multi-stream-input` (contexts, as LiveKit's
and Pipecat's ElevenLabs plugins use it) and `/v1/text-to-speech/{voice_id}/stream-input` (one stream, as the
elevenlabs SDK's convert_realtime uses it). JSON text messages; the mapping lives in serving/live/elevenlabs.py, and
each context is a LiveSession, as a /v1/tts/live session is.

A context opens with its first message. Text is cut at sentence ends (and the cap) and spoken in order; `flush` speaks
what is pending now. `close_context` ends a context: when everything it was sent was flushed, the flushed audio is
still sent and then `isFinal` (ElevenLabs' rule, on which LiveKit's and Pipecat's plugins rely at the end of each
turn); otherwise it is barge-in: the context stops at once, `isFinal` comes right away and no audio follows it.
`close_socket` closes every context so, then the socket (1000). stream-input: `{"text": ""}` ends the stream (the rest
is spoken, `isFinal`, close 1000). Errors: `{"message", "error", "code"}`, then a close with that code: 1007 a
message that is not a JSON object of the known fields, 1008 a bad setting or request, an unknown voice, too many
contexts, inactivity, a client that does not read its audio; 1013 loading or full; 1011 a failure.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import dataclass

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketState

from ttsengine import InputError
from ttsengine.serving.failure import failure
from ttsengine.serving.live.elevenlabs import (
    DEFAULT_CONTEXT,
    MAX_CONTEXTS,
    ClientMessage,
    ProtocolError,
    audio_message,
    context_job,
    error_message,
    final_message,
    parse_message,
    parse_settings,
    ulaw,
)
from ttsengine.serving.live.metrics import speaking
from ttsengine.serving.live.outbox import Outbox, Overflow
from ttsengine.serving.live.session import LiveSession, Segment

from .live import origin_allowed

log = logging.getLogger("handlers.http")
router = APIRouter()
CLOSE_WAIT = 10.0  # seconds a closing socket waits for the client to take what is left


@router.websocket("/v1/text-to-speech/{voice_id}/multi-stream-input")
async def multi_stream_input(ws: WebSocket, voice_id: str):
    await serve(ws, voice_id, multi=True)


@router.websocket("/v1/text-to-speech/{voice_id}/stream-input")
async def stream_input(ws: WebSocket, voice_id: str):
    await serve(ws, voice_id, multi=False)


async def serve(ws: WebSocket, voice_id: str, multi: bool) -> None:
    if not origin_allowed(ws.headers, ws.app.state.server.cors_origins):
        await ws.close(1008, "origin not allowed (TTS_CORS_ORIGINS)")  # before accept: the handshake gets a 403
        return
    await ws.accept()
    await Connection(ws, voice_id, multi).run()


@dataclass
class Context:
    id: str | None  # None on stream-input: its messages carry no contextId
    session: LiveSession
    watch: object = None  # its metrics (live_metrics.SessionWatch)
    producer: asyncio.Task | None = None
    flushed: bool = False  # all its text so far was flushed: close_context lets the flushed audio finish
    done: bool = False  # isFinal is out (or the socket is failing): nothing more is sent for it


class Connection:
    def __init__(self, ws: WebSocket, voice_id: str, multi: bool):
        self.ws, self.voice_id, self.multi = ws, voice_id, multi
        self.service, self.server = ws.app.state.service, ws.app.state.server
        self.aliases = dict(self.server.voice_aliases)
        self.contexts: dict[str | None, Context] = {}
        self.outbox = Outbox(self.ws.send_text, self.server.live_send_buffer)
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()  # result: close 1000; else the error
        self.closing = False  # close_socket (or stream-input's end) came: further messages are ignored
        self.closed = False
        self.last_active = time.monotonic()
        self.live = ws.app.state.metrics.live
        self.tasks: set[asyncio.Task] = set()  # barge-ins being measured

    async def run(self) -> None:
        self.writer = writer = asyncio.ensure_future(self.outbox.run())
        receiving = None
        self.live.connections.labels("elevenlabs").inc()
        try:
            self.settings = parse_settings(self.ws.query_params, self.server.live_idle_timeout)
            self.service.require()  # loading: 1013 (stored voices are known once loaded)
            try:
                context_job(self.voice_id, self.service.voices, self.aliases, self.settings, None)
            except InputError as e:
                raise ProtocolError(str(e), "voice_not_found") from None
            while True:
                receiving = receiving or asyncio.ensure_future(self.ws.receive())
                idle = self.settings.inactivity_timeout
                left = max(0.0, self.last_active + idle - time.monotonic())
                done, _ = await asyncio.wait({receiving, writer, self.ended}, timeout=left,
                                             return_when=asyncio.FIRST_COMPLETED)
                if self.ended in done:
                    self.ended.result()  # an error raises
                    await self.close(1000, "")
                    return
                if writer in done:  # a send failed: the client is gone
                    return
                if receiving not in done:
                    if self.busy:
                        self.last_active = max(self.last_active, time.monotonic() - idle / 2)
                        continue
                    raise ProtocolError(f"no text for {idle:g} s (inactivity_timeout)", "input_timeout_exceeded")
                message, receiving = receiving.result(), None
                if message["type"] == "websocket.disconnect":
                    self.closed = True
                    return
                self.last_active = time.monotonic()
                self.handle(parse_message(message.get("text")))
        except ProtocolError as e:
            await self.fail(e.message, e.error, e.code)
        except Overflow as e:
            await self.fail(f"{e} (TTS_LIVE_SEND_BUFFER)", "client_not_reading", 1008)
        except Exception as e:  # noqa: BLE001 - a client sees a protocol error, never a traceback
            f = failure(e)
            if not f.expected:
                log.error("elevenlabs socket failed", exc_info=e)
            code, kind = (1013, "server_busy") if f.kind == "busy" else (1008, "invalid_request") \
                if f.kind == "input" else (1011, "internal_error")
            await self.fail(f.message, kind, code)
        finally:
            if receiving is not None:
                receiving.cancel()
            barge_ins = []
            for ctx in list(self.contexts.values()):
                ctx.done = True
                if speaking(ctx.session):
                    barge_ins.append(ctx.watch.barge_in(time.perf_counter(), ctx.session, ctx.producer))
                ctx.session.cancel()  # the socket is gone or closing: barge-in
            await asyncio.gather(*(c.producer for c in self.contexts.values() if c.producer), return_exceptions=True)
            await asyncio.gather(*barge_ins)
            writer.cancel()
            self.live.connections.labels("elevenlabs").dec()

    @property
    def busy(self) -> bool:
        return any(c.session.working for c in self.contexts.values())

    # ---- the client's messages -----------------------------------------------------------------------------
    def handle(self, msg: ClientMessage) -> None:
        if self.closing:
            return
        if msg.close_socket:
            self.closing = True
            for ctx in list(self.contexts.values()):
                self.close_context(ctx)
            self.check_closed()
            return
        cid = (msg.context_id or DEFAULT_CONTEXT) if self.multi else None
        ctx = self.contexts.get(cid)
        if msg.close_context:
            if ctx is not None:
                self.close_context(ctx)
            return
        if ctx is None:
            if msg.text is None and not msg.flush:
                return
            if msg.text == "" and not self.multi:  # the end before any text
                self.closing = True
                self.ended.set_result(None)
                return
            ctx = self.open(cid, msg)
        try:
            if msg.text:
                ctx.session.text(msg.text)
                ctx.flushed = ctx.flushed and not msg.text.strip()
            elif msg.text == "" and not self.multi:  # stream-input's end: the rest is spoken, then isFinal
                self.closing = True
                ctx.session.end()
                return
            if msg.flush:
                ctx.session.flush()
                ctx.flushed = True
        except InputError as e:
            raise ProtocolError(str(e), "invalid_request") from None

    def open(self, cid: str | None, msg: ClientMessage) -> Context:
        if len(self.contexts) >= MAX_CONTEXTS:
            raise ProtocolError(f"at most {MAX_CONTEXTS} contexts may be open on one socket: close one first",
                                "max_active_conversations")
        try:
            job = context_job(self.voice_id, self.service.voices, self.aliases, self.settings, msg.voice_settings)
        except InputError as e:
            raise ProtocolError(str(e), "invalid_request") from None
        watch = self.live.watch("elevenlabs", self.service.admit)
        ctx = Context(cid, LiveSession(watch.admit, job, max_chars=self.server.live_max_chars), watch)
        ctx.producer = asyncio.create_task(self.produce(ctx))
        self.contexts[cid] = ctx
        return ctx

    def close_context(self, ctx: Context) -> None:
        if ctx.flushed and not ctx.session.cancelled:
            ctx.session.end()  # the flushed audio is finished; produce() sends isFinal after it
        else:
            at = speaking(ctx.session) and time.perf_counter()
            ctx.session.cancel()  # barge-in
            if at:
                task = asyncio.ensure_future(ctx.watch.barge_in(at, ctx.session, ctx.producer))
                self.tasks.add(task)  # held until done (the loop keeps only weak references)
                task.add_done_callback(self.tasks.discard)
            self.finish(ctx)

    def finish(self, ctx: Context) -> None:
        """isFinal for the context; nothing is sent for it after this."""
        if ctx.done:
            return
        ctx.done = True
        if self.contexts.get(ctx.id) is ctx:
            del self.contexts[ctx.id]  # its id may open a new context now
        self.put(final_message(ctx.id))
        self.check_closed()

    def check_closed(self) -> None:
        if self.closing and not self.contexts and not self.ended.done():
            self.ended.set_result(None)

    # ---- the audio -------------------------------------------------------------------------------------------
    async def produce(self, ctx: Context) -> None:
        try:
            async for data in ctx.session.audio():
                if ctx.done:
                    break
                if isinstance(data, Segment):  # ElevenLabs' protocol has no such message (alignment aside)
                    continue
                if self.settings.output.ulaw:
                    data = ulaw(data)
                self.put(audio_message(base64.b64encode(data).decode(), ctx.id), ctx.watch.first_audio(ctx.session))
                self.last_active = time.monotonic()
            self.finish(ctx)
        except Exception as e:  # noqa: BLE001 - the run loop reports it (Overflow, an engine error)
            ctx.session.cancel()
            if not self.ended.done():
                self.ended.set_exception(e)
        finally:
            ctx.watch.closed()

    def put(self, message: dict, on_sent=None) -> None:
        data = json.dumps(message)
        self.outbox.put(data, len(data), on_sent)

    async def close(self, code: int, reason: str) -> None:
        """What was put goes out first (for as long as the client takes it), then the close frame."""
        if self.closed:
            return
        if not self.writer.done():
            await asyncio.wait({self.writer, asyncio.ensure_future(self.outbox.drained())}, timeout=CLOSE_WAIT,
                               return_when=asyncio.FIRST_COMPLETED)
        self.closed = True
        try:
            if self.ws.application_state != WebSocketState.DISCONNECTED:
                await asyncio.wait_for(self.ws.close(code, reason.encode()[:120].decode(errors="ignore")), CLOSE_WAIT)
        except Exception:  # noqa: BLE001 - the client is gone (or never reads again): nothing to tell it
            pass

    async def fail(self, message: str, error: str, code: int) -> None:
        """The error message, then a close with `code`; audio not yet sent is dropped."""
        for ctx in list(self.contexts.values()):
            ctx.done = True
            ctx.session.cancel()
        self.outbox.drop()
        self.outbox.put(json.dumps(error_message(message, error, code)), 0)
        await self.close(code, message)
