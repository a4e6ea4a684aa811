"""A live session as one RunPod job: the event sequence of /v1/tts/live in one input,

    {"live": [{"event": "start", "request": {...a /v1/tts body, text may be empty...}},
              {"event": "text", "text": "Hello there. How"}, {"event": "text", "text": " are you"},
              {"event": "flush"}, {"event": "text", "text": "today?"}, {"event": "stop"}]}

RunPod's job model is one JSON in and a stream of items out (the async generator handler, /stream), so every text
piece is there at once; they are fed to the same LiveSession as the WebSocket's (the segmenter, each segment with the
one before as context, one encoder), so the same events and seed give the same audio. `stop` may be left out (the
input's end is the end). `cancel` is not an event here: RunPod's /cancel stops the job, which is barge-in (the
running segment stops within an engine step, the rest never start).

Items, in order: audio pieces as a streaming job's ({"index", "audio" (base64, at most 1 MiB), "format",
"content_type", "sample_rate"}); with `"segment_events": true` in the start's request, {"segment": {"text",
"start_sample", "end_sample"}} after each segment's audio; then {"done": true, "seed", "segments", "bytes",
"pieces"}.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ttsengine import InputError, VoiceStore, audio_record, output_rate
from ttsengine.serving.live.session import LiveRequest, LiveSession, Segment, live_job
from ttsengine.serving.protocol import SpeechJob

EVENTS = ("start", "text", "flush", "stop")
MAX_CHARS = 100_000  # TTS_LIVE_MAX_CHARS's default: the text one live session may send


@dataclass(frozen=True)
class LiveInput:
    job: SpeechJob
    request: LiveRequest
    events: tuple[dict, ...]  # after start: text, flush, stop


def parse_live(raw: object, voices: VoiceStore | None, strict: bool) -> LiveInput:
    """`input.live` -> the session's job and its events (InputError naming the first wrong one)."""
    if not isinstance(raw, list) or not raw:
        raise InputError("live: a list of events: start, then text / flush, then stop")
    for i, event in enumerate(raw):
        name = event.get("event") if isinstance(event, dict) else None
        if name not in EVENTS:
            raise InputError(f"live[{i}]: an object with `event`: one of {', '.join(EVENTS)}"
                             + (" (RunPod's /cancel stops a job)" if name == "cancel" else ""))
        if (name == "start") != (i == 0):
            raise InputError(f"live[{i}]: the first event, and only it, is `start` (one session per job)")
        if name == "text" and not isinstance(event.get("text"), str):
            raise InputError(f"live[{i}]: `text` must be a string")
        if name == "stop" and i != len(raw) - 1:
            raise InputError(f"live[{i}]: `stop` is the last event")
    chars = sum(len(e["text"]) for e in raw if e["event"] == "text")
    if chars > MAX_CHARS:
        raise InputError(f"live: the session's text is {chars} characters, over {MAX_CHARS}")
    try:
        job, req = live_job(raw[0].get("request", {}), voices, strict=strict)
    except InputError as e:
        raise InputError(f"live[0]: {e}") from None
    return LiveInput(job, req, tuple(raw[1:]))


async def live_items(live: LiveInput, submit: Callable, piece_bytes: int) -> AsyncIterator[dict]:
    """The job's items; an engine error is raised (the handler makes it an error item). Closed early (RunPod
    cancelled the job): the session is cancelled and the engine slot freed."""
    req, job = live.request, live.job
    session = LiveSession(submit, job, max_chars=MAX_CHARS, chain=req.condition_on_previous_chunks,
                          first_text=req.text)
    for event in live.events:
        if event["event"] == "text":
            session.text(event["text"])
        elif event["event"] == "flush":
            session.flush()
    session.end()
    index = total = segments = 0
    try:
        async with contextlib.aclosing(session.audio()) as audio:
            async for item in audio:
                if isinstance(item, Segment):
                    segments += 1
                    if req.segment_events:
                        yield {"segment": {"text": item.text, "start_sample": item.start_sample,
                                           "end_sample": item.end_sample}}
                    continue
                rate = output_rate(job.format, session.native_rate, job.sample_rate)
                for at in range(0, len(item), piece_bytes):
                    piece = item[at:at + piece_bytes]
                    total += len(piece)
                    yield audio_record(index, piece, job.format, rate)
                    index += 1
    finally:
        session.cancel()  # a no-op once spoken; else barge-in: nothing more starts, the running segment stops
    yield {"done": True, "seed": job.request.seed, "segments": segments, "bytes": total, "pieces": index}
