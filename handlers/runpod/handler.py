"""The RunPod job handler: one async generator for every job, so RunPod's /stream delivers audio while it
is made and /runsync (return_aggregate_stream, unless RUNPOD_AGGREGATE_STREAM=off) gets the same items as one list.

A job's input holds the fields of /v1/tts (`text`, `references`, `reference_id`, `format`, `seed`, ...)
or of OpenAI's speech API (`input`, `voice`, `response_format`, `speed`, ...), plus two worker options:
  stream  true: items {"index", "audio" (base64, at most 1 MiB), "format", "content_type",
          "sample_rate"} as audio is produced, then {"done": true, "seed", "frames", "bytes"}.
          Default: the fish `streaming` field, else false.
  upload  true: the whole file goes to RUNPOD_S3_BUCKET and the item carries its presigned `url`.
Without `stream` the job yields one item: {"audio" | "url", "format", "content_type", "sample_rate",
"seconds", "seed", "frames", "bytes"}. A file over RUNPOD_MAX_INLINE_BYTES is uploaded when a bucket
is configured, and is an error saying what to do otherwise (never a silently dropped result).
A live session (`{"live": [events of /v1/tts/live]}`, live.py) streams its audio and segments the same way.
Errors are items {"error": "<json>"} with error_type, error_message and an HTTP-like status; the worker
turns them into a FAILED job.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from dataclasses import dataclass

from ttsengine import (
    AtCapacity,
    Fleet,
    InputError,
    RunPodConfig,
    TTSError,
    VoiceStore,
    audio_bytes,
    audio_record,
    output_rate,
    whole,
)
from ttsengine.serving import chunk_trace
from ttsengine.serving.coalesce import coalesced
from ttsengine.serving.delivery import Tally
from ttsengine.serving.failure import failure
from ttsengine.serving.protocol import SpeechJob, job_from_body
from ttsengine.serving.service import Service

from .live import live_items, parse_live
from .upload import upload

log = logging.getLogger("handlers.runpod")
PIECE_BYTES = 3 * (1 << 18)  # 768 KiB of audio -> exactly 1 MiB of base64
OPTIONS = ("stream", "upload")
PROGRESS_EVERY_S = 0.5
CAPACITY_WAIT_S = 60.0  # a job refused for capacity waits this long for room before it fails (503, retry)
CAPACITY_RETRY_S = 0.5


class OutputTooLarge(InputError):
    """The result is over the inline limit and there is nowhere to upload it."""


@dataclass
class Options:
    stream: bool
    upload: bool


class Item(dict):
    """A job's output item as RunPod's SDK gets it: a dict whose repr gives its audio's length, not the base64.
    The SDK formats every item into two debug f-strings, logged or not; an audio item's repr copied its whole base64
    each time (scripts/runpod_item_cost.py, 64 jobs on a CPU: 8% more audio per second in 18 kB items, 21-33% in
    71 kB ones, 43-46% in 285 kB ones)."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {_brief(k, v)}" for k, v in self.items()) + "}"


def _brief(key: str, value: object) -> str:
    return f"<{len(value)} characters>" if key == "audio" and isinstance(value, str) else repr(value)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def b64_size(n: int) -> int:
    return 4 * ((n + 2) // 3)


ERROR_TYPES = {"input": "invalid_input", "busy": "busy", "server": "server_error"}


def error_item(error: BaseException) -> dict:
    """RunPod's own handler-exception layout (error_type, error_message), plus a status code."""
    f = failure(error)
    return {"error": json.dumps({"error_type": ERROR_TYPES[f.kind], "error_message": f.message, "status": f.status})}


def ignored(speech: SpeechJob) -> dict:
    """The fields a tolerant reading dropped (TTS_STRICT_FIELDS off), so a typo is not silent."""
    return {"ignored_fields": list(speech.ignored)} if speech.ignored else {}


def parse_input(raw: object, voices: VoiceStore | None, cfg: RunPodConfig) -> tuple[SpeechJob, Options]:
    """A job's `input` -> the speech job and the worker's own options (InputError for anything wrong)."""
    if not isinstance(raw, dict):
        raise InputError("input must be an object with `text` (fish-speech fields) or `input` (OpenAI fields)")
    body = dict(raw)
    opts = {k: body.pop(k) for k in OPTIONS if k in body}
    for k, v in opts.items():
        if not isinstance(v, bool):
            raise InputError(f"{k}: must be true or false")
    job = job_from_body(body, voices, aliases=dict(cfg.voice_aliases), strict=cfg.strict_fields)
    fish_streaming = "text" in body and bool(body.get("streaming"))
    options = Options(stream=opts.get("stream", fish_streaming), upload=opts.get("upload", False))
    if options.upload and not cfg.s3_bucket:
        raise InputError("upload: this worker has no bucket; set RUNPOD_S3_BUCKET on the endpoint")
    return job, options


class JobHandler:
    def __init__(self, engine: Service | Fleet, voices: VoiceStore | None, cfg: RunPodConfig, progress=None,
                 drain=None, coalesce: bool = True):
        """engine: the worker's Service (what it takes of the engines: submit, max_streams), or a Fleet.
        drain: a Drain to chain onto the SDK's signal handlers once its loop runs (the worker's), or None.
        coalesce: feature runpod_coalesce (a streamed job's item holds all the audio made since the last one)."""
        self.engine, self.voices, self.cfg, self.coalesce = engine, voices, cfg, coalesce
        self.progress = progress  # progress(job, dict) or None (RunPod's local test API has nowhere to send it)
        self.drain = drain

    def concurrency(self, current: int) -> int:
        """RunPod's concurrency_modifier: take as many jobs as the engine has stream slots, so concurrent
        jobs decode in one batch on the GPU (RUNPOD_CONCURRENCY overrides). The SDK calls it from its loop on
        the main thread, after installing its signal handlers: the moment to chain the drain onto them."""
        if self.drain is not None:
            self.drain.install()
        return self.cfg.concurrency or self.engine.max_streams

    async def run(self, job: dict):
        # closed with this generator: a job cancelled while it waits for audio gets the cancel inside it, and the
        # cleanup (the stream's slot freed) runs on the way out; one the SDK drops at a yield (a cancel that landed in
        # its own post) is closed by asyncio's finaliser once unreferenced, and this close reaches the stream too
        async with contextlib.aclosing(self._items(job)) as items:
            async for item in items:
                yield Item(item)

    async def _items(self, job: dict):
        raw = job.get("input")
        if isinstance(raw, dict) and "live" in raw:
            async for item in self._live(raw):
                yield item
            return
        try:
            speech, opts = parse_input(job.get("input"), self.voices, self.cfg)
            stream = await self._submit(speech.request)
        except TTSError as e:
            yield error_item(e)
            return
        watcher = asyncio.create_task(self._report_progress(job, stream)) if self.progress else None
        try:
            items = (self._streamed(stream, speech, job.get("id")) if opts.stream
                     else self._whole(job, stream, speech, opts))
            async for item in items:
                yield item
        except TTSError as e:
            log.warning("job %s failed: %s", job.get("id"), e)
            yield error_item(e)
        finally:
            if not stream.done:
                stream.cancel()  # stopped by RunPod (task cancelled) or failed: free the slot now
            if watcher:
                watcher.cancel()

    async def _live(self, raw: dict):
        try:
            if set(raw) != {"live"}:
                raise InputError("a live job's input holds only `live` (the start event's request has the rest)")
            live = parse_live(raw["live"], self.voices, self.cfg.strict_fields)
            # a Service admits each segment (with engine processes on the event loop); a bare fleet (tests) in a thread
            admit = self.engine.admit if isinstance(self.engine, Service) else self.engine.submit
            async for item in live_items(live, admit, PIECE_BYTES):
                yield item
        except TTSError as e:
            yield error_item(e)

    async def _submit(self, request):
        """A Service plans in its own threads and gives the request up when RunPod stops the job meanwhile (this
        task cancelled: no reference encoded further, no stream generated for nobody); a bare fleet (tests) in a
        worker thread. A job refused for capacity (goodput admission: the streams would fall below real time) waits
        here for room, up to CAPACITY_WAIT_S, as it would in RunPod's queue, instead of failing: RunPod counts it as
        running, so its scaler starts workers meanwhile."""
        deadline = time.monotonic() + CAPACITY_WAIT_S
        while True:
            try:
                if isinstance(self.engine, Service):
                    return await self.engine.admit(request)
                return await asyncio.to_thread(self.engine.submit, request)
            except AtCapacity:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(CAPACITY_RETRY_S)

    async def _streamed(self, stream, speech: SpeechJob, job_id=None):
        fmt, index, total = speech.format, 0, 0
        rate = output_rate(fmt, stream.sample_rate, speech.sample_rate)
        tally = Tally()  # its marks: each chunk's times when TTS_TRACE_CHUNKS is on (None when off)
        posts: list[tuple[float, float]] = []  # tracing: (handed to the SDK, the SDK asked for the next) per item
        chunks = audio_bytes(stream, speech, tally)
        # closed with this generator: coalesced's reading task stops with the job, not when it is collected
        async with contextlib.aclosing(coalesced(chunks, PIECE_BYTES) if self.coalesce else chunks) as pieces:
            async for data in pieces:
                for at in range(0, len(data), PIECE_BYTES):
                    piece = data[at:at + PIECE_BYTES]
                    total += len(piece)
                    handed = time.perf_counter()
                    yield audio_record(index, piece, fmt, rate)
                    if tally.marks is not None:
                        posts.append((handed, time.perf_counter()))
                    index += 1
        if tally.marks is not None:
            log.info("trace job %s: %s", job_id, chunk_trace.job_summary(list(tally.marks), posts))
        if b64_size(total) > self.cfg.max_inline_bytes:
            # every piece went out on /stream; /runsync's aggregate of them may exceed RunPod's limit
            log.warning("streamed %d bytes: over the inline limit for clients that read the aggregate", total)
        yield {"done": True, "seed": stream.seed, "frames": stream.frames, "bytes": total,
               "pieces": index, **ignored(speech)}

    async def _whole(self, job: dict, stream, speech: SpeechJob, opts: Options):
        audio = await whole(stream, speech)
        item = {"format": speech.format, "content_type": audio.content_type, "sample_rate": audio.sample_rate,
                "seconds": round(audio.seconds, 3), "seed": stream.seed,
                "frames": stream.frames, "bytes": len(audio.data), **ignored(speech)}
        too_big = b64_size(len(audio.data)) > self.cfg.max_inline_bytes
        if opts.upload or too_big:
            if not self.cfg.s3_bucket:
                raise OutputTooLarge(
                    f"the audio is {len(audio.data)} bytes, over this worker's inline limit of "
                    f"{self.cfg.max_inline_bytes} (base64): ask for \"stream\": true, a compressed format (mp3, "
                    "opus), or configure RUNPOD_S3_BUCKET and send \"upload\": true")
            key = f"tts/{job.get('id', 'job')}.{speech.format}"
            item["url"] = await asyncio.to_thread(upload, audio.data, self.cfg.s3_bucket, key, audio.content_type,
                                                  self.cfg.url_expires)
            item["uploaded"] = "requested" if opts.upload else "over the inline limit"
        else:
            item["audio"] = b64(audio.data)
        yield item

    async def _report_progress(self, job: dict, stream) -> None:
        """One update per finished text chunk of a long text."""
        total, sent = stream.text_chunks, 0
        if total < 2:
            return
        while not stream.done:
            await asyncio.sleep(PROGRESS_EVERY_S)
            done = len(stream.reports)
            if done > sent:
                sent = done
                self.progress(job, {"text_chunks_done": done, "text_chunks": total,
                                    "frames": stream.frames})
