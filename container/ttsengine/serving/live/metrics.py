"""The live sockets' metrics (/v1/tts/live: protocol "fish"; ElevenLabs' stream-input and multi-stream-input:
"elevenlabs"), on the app's registry. A session is one LiveSession: a Fish `start` until its `finish`, an
ElevenLabs context until its isFinal. The adapters measure from the one stream they send (LiveSession.audio()
yields each Segment after its audio); nothing here sends anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ttsengine.serving.live.session import LiveSession

PROTOCOLS = ("fish", "elevenlabs")
FIRST_AUDIO_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
BARGE_IN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


def speaking(session: LiveSession) -> bool:
    """A segment is being made or its audio sent (from its submission to its last audio): a cancel now is a
    barge-in. Unlike session.working this holds while the next segment is being submitted too."""
    current = session.current
    return current is not None and current.end_sample is None and not session.cancelled


class LiveMetrics:
    def __init__(self, r: CollectorRegistry):
        p = ("protocol",)
        self.connections = Gauge("tts_live_connections_open", "Live WebSockets connected now.", p, registry=r)
        self.open = Gauge("tts_live_sessions_open", "Live sessions open now (a Fish start until its finish, an "
                          "ElevenLabs context until its isFinal).", p, registry=r)
        self.sessions = Counter("tts_live_sessions", "Live sessions started.", p, registry=r)
        self.segments = Counter("tts_live_segments", "Segments submitted to the engine by live sessions.", p,
                                registry=r)
        self.first_audio = Histogram("tts_live_segment_first_audio_seconds", "A segment's text complete and "
                                     "submitted (the segment before it done) to its first audio taken by the "
                                     "socket; segment=first: a session's first (what a listener waits for), next: "
                                     "the later ones (their listener is still playing the one before).",
                                     (*p, "segment"), buckets=FIRST_AUDIO_BUCKETS, registry=r)
        self.submit = Histogram("tts_live_segment_submit_seconds", "A segment's text complete and submitted (the "
                                "segment before it done) to: its submit beginning (stage thread: ~0 for a Service, "
                                "which the event loop awaits; a bare engine's wait for a thread), the engine taking "
                                "it, planned and queued, any wait for a planning thread included (stage taken).",
                                (*p, "stage"),
                                buckets=FIRST_AUDIO_BUCKETS, registry=r)
        self.barge_in = Histogram("tts_live_barge_in_seconds", "Barge-in (cancel, a barge-in close_context, the "
                                  "socket closed) while a segment was being made, to the session's producer "
                                  "stopped and the engine's slot freed.", p, buckets=BARGE_IN_BUCKETS, registry=r)
        for name in PROTOCOLS:  # every series from the first scrape, at 0
            for metric in (self.connections, self.open, self.sessions, self.segments, self.barge_in):
                metric.labels(name)
            for stage in ("thread", "taken"):
                self.submit.labels(name, stage)
            for which in ("first", "next"):
                self.first_audio.labels(name, which)

    def watch(self, protocol: str, admit: Callable) -> SessionWatch:
        return SessionWatch(self, protocol, admit)


class SessionWatch:
    """One session's account: counted open from its making until closed(); `admit` is the engine's (Service.admit,
    awaited), counting each segment; first_audio(session) -> the outbox's on_sent for an audio message (the first of
    each segment times it); barge_in() observes a barge-in once the producer and the engine let go."""

    def __init__(self, metrics: LiveMetrics, protocol: str, admit: Callable):
        self.m, self.protocol, self._admit = metrics, protocol, admit
        self._timed = None  # the latest segment whose first audio was timed
        self._timed_any = False  # a segment's first audio was timed: the next ones are "next"
        self._open = True
        metrics.sessions.labels(protocol).inc()
        metrics.open.labels(protocol).inc()

    async def admit(self, request, gone=None):
        stream = await self._admit(request, gone)
        self.m.segments.labels(self.protocol).inc()
        return stream

    def first_audio(self, session: LiveSession) -> Callable[[], None] | None:
        segment = session.current
        if segment is None or segment is self._timed:
            return None
        self._timed = segment
        histogram = self.m.first_audio.labels(self.protocol, "next" if self._timed_any else "first")
        self._timed_any = True

        def sent() -> None:
            histogram.observe(time.perf_counter() - segment.ready_at)
            for stage, at in (("thread", segment.submitting_at), ("taken", segment.taken_at)):
                if at is not None:
                    self.m.submit.labels(self.protocol, stage).observe(at - segment.ready_at)

        return sent

    def closed(self) -> None:
        if self._open:
            self._open = False
            self.m.open.labels(self.protocol).dec()

    async def barge_in(self, at: float, session: LiveSession, producer: asyncio.Task | None) -> None:
        """at: time.perf_counter() of the barge-in (session.cancel() is called by the adapter)."""
        if producer is not None:
            await asyncio.gather(producer, return_exceptions=True)
        await session.stopped()
        self.m.barge_in.labels(self.protocol).observe(time.perf_counter() - at)
