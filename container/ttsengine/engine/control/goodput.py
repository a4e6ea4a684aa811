"""Goodput admission: a new stream is taken only while the engine expects every admitted stream to stay at least
`rtf` x real time (TTS_ADMIT_RTF; issue 50). Past that, a listener is better served by a 503 and Retry-After than
by a stream that stutters, and so are the streams already playing.

Two tests, from what the engine measured itself (no constants of a GPU):
- the step: each loop iteration makes one frame for every decoding stream, so with N streams the decode step at
  N's batch bucket must take at most frame_seconds / rtf. Its time comes from PrefillBudget's table (iterations
  without prefill, per bucket). A bucket not timed yet takes the nearest timed one above it, else the largest
  timed one B scaled by bucket / B: a step costs a fixed part plus a part per row, so the scaled time bounds it
  from above. Scaling by more than TRUSTED_SCALE is not trusted (a 1-row step says little about 256 rows): past
  it the estimate stays at the scaled time there, so mostly the slots decide, as without this gate. A step is
  never faster with more rows: the slowest timed bucket at or below is a floor (timings are noisy).
- the codec: it turns frames into audio on its own thread. When the oldest chunk sent to it and not yet decoded has
  waited longer than LAG_CHUNKS chunks of audio last at rtf x real time, it is behind already: nothing more goes in
  until it catches up. By age, not by frames behind per running stream: at the end of a burst the ended streams'
  last chunks (drained at once) read as many frames behind the few still running; and by several chunks, not one:
  a stream plays the audio it already has while its next chunk waits (docs/http-breakdown.md, "Stop 56").
- the wait for a slot (TTS_ADMIT_WAIT): with every slot taken a new stream queues, and at twice the capacity the
  queue held a whole stream's length (docs/http-breakdown.md, "Stop 55"): shed, don't stretch. A stream that must
  wait is taken only while the streams ahead of it, at the rate streams have been ending (the last RATE_WINDOW_S),
  would free its slot within wait_s, and the queue's head has not waited longer than that already; no stream ended
  lately: no wait is promised.
Pure Python; the tables are written by the loop thread and read here on the API threads (a dict copy is atomic
under the GIL).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

ADMIT_RTF = 1.2  # TTS_ADMIT_RTF=auto on a GPU: the floor for every stream; a CPU is never real time: off
TRUSTED_SCALE = 2  # a timed bucket predicts buckets up to this many times its size
LAG_CHUNKS = 3  # the codec is behind once its oldest chunk waited as long as this many chunks of audio last
RATE_WINDOW_S = 10.0  # the streams that ended this recently give the rate slots free at
ENDS_KEPT = 512  # the most recent ends remembered (more than any engine's slots end within the window)
FRESH_S = 30.0  # a bucket's timing counts this long after it was taken: then a refused size is tried again
AT_CAPACITY = "the engine is at capacity: "  # how such a refusal begins (a BusyError: 503, Retry-After)


@dataclass
class Goodput:
    rtf: float  # every stream at least this x real time; 0: off (slots alone decide)
    frame_seconds: float  # one frame of audio
    bucket: Callable[[int], int]  # streams -> the decode step's batch bucket
    step_seconds: Mapping[int, float]  # PrefillBudget.step_seconds: a decode step per bucket (the loop writes it)
    codec_lag: Callable[[], float]  # seconds the oldest chunk sent to the codec and not decoded yet has waited
    chunk_frames: int  # the largest audio chunk
    timed_at: Mapping[int, float] = field(default_factory=dict)  # PrefillBudget.timed_at: when each was last timed
    clock: Callable[[], float] = time.monotonic
    wait_s: float = 1.0  # a stream that must wait for a slot: at most this long, expected (TTS_ADMIT_WAIT)
    ends: deque = field(default_factory=lambda: deque(maxlen=ENDS_KEPT))  # clock() of recent stream ends

    def ended(self) -> None:
        """A stream ended and left its slot (the loop thread)."""
        self.ends.append(self.clock())

    def end_rate(self) -> float | None:
        """Streams ending per second over the last RATE_WINDOW_S; None when fewer than two ended in it."""
        now = self.clock()
        recent = [t for t in list(self.ends) if now - t <= RATE_WINDOW_S]  # a copy: the loop thread appends
        if len(recent) < 2:
            return None
        return len(recent) / max(now - recent[0], 1e-3)

    def refuses_wait(self, ahead: int, head_wait: float = 0.0) -> str | None:
        """Why a new stream with `ahead` streams to start before it gets a slot (itself included; <= 0: a slot is
        free) should not wait; None when it should (or admission is off). head_wait: how long the stream waiting
        longest has waited so far. The rate alone misjudges streams that end in waves (a burst started together
        ends together: the rate is high just after, then nothing frees for a whole stream's length); a queue whose
        head has waited past wait_s already is not moving fast enough, whatever the rate says."""
        if self.rtf <= 0 or ahead <= 0:
            return None
        if self.wait_s <= 0:
            return "every slot is taken and TTS_ADMIT_WAIT=0 queues none"
        if head_wait > self.wait_s:
            return (f"every slot is taken and the stream waiting longest has waited {head_wait:.2f} s, over the "
                    f"{self.wait_s:g} s allowed")
        rate = self.end_rate()
        if rate is None:
            return f"every slot is taken and no stream ended in the last {RATE_WINDOW_S:g} s"
        wait = ahead / rate
        if wait > self.wait_s:
            return (f"every slot is taken: {ahead} stream{'s' if ahead != 1 else ''} would wait about {wait:.2f} s "
                    f"for a slot, over the {self.wait_s:g} s allowed")
        return None

    def refuses(self, streams: int, running: int) -> str | None:
        """Why `streams` decoding together (the running ones, the admitted waiting ones and the new one, at most
        the slots) would fall below rtf x real time; None when they would not (or nothing says so yet). Nothing
        running: nothing to protect (and no timing of the current load), so the slots decide."""
        if self.rtf <= 0 or running == 0:
            return None
        step = self.predicted_step(streams)
        budget = self.frame_seconds / self.rtf
        if step is not None and step > budget:
            count = f"{streams} stream{'s' if streams != 1 else ''}"
            return (f"a step for {count} would take {step * 1e3:.3g} ms, over the {budget * 1e3:.3g} ms that keep "
                    f"each at {self.rtf:g}x real time")
        lag, lasts = self.codec_lag(), LAG_CHUNKS * self.chunk_frames * self.frame_seconds / self.rtf
        if lag > lasts:
            return (f"the codec is {lag:.2f} s behind: a chunk of audio has waited longer than {LAG_CHUNKS} chunks "
                    f"last at {self.rtf:g}x real time ({lasts * 1e3:.0f} ms)")
        return None

    def predicted_step(self, streams: int) -> float | None:
        """Seconds of a decode step for `streams` rows, from the timed buckets; None when none predicts it."""
        now = self.clock()
        timed_at = dict(self.timed_at)
        # one consistent copy while the loop thread writes; only recent timings: a bucket timed slow once (run before
        # its graph was captured, or beside a busy codec) and refused since would never run again to be re-timed
        timed = {b: t for b, t in dict(self.step_seconds).items() if now - timed_at.get(b, now) <= FRESH_S}
        if not timed or streams <= 0:
            return None
        bucket = self.bucket(streams)
        # a step is never faster with more rows: the slowest timed bucket at or below this one is a floor, in every
        # case (timings are noisy: without it a smaller count could be refused where a larger one is let in, and the
        # router's search relies on refusals being monotone in streams)
        floor = max((t for b, t in timed.items() if b <= bucket), default=0.0)
        if bucket in timed:
            return max(floor, timed[bucket])
        above = [b for b in timed if b > bucket]
        if above:
            return max(floor, timed[min(above)])
        largest = max(timed)
        # scaled from the largest timed bucket, but not past TRUSTED_SCALE times it: beyond, the estimate stays what
        # it is there
        return max(floor, timed[largest] * min(bucket / largest, TRUSTED_SCALE))

    def room(self, streams: int, running: int, slots: int) -> int:
        """How many more streams may join the `streams` admitted (at most the free slots): the router's hint."""
        free = max(0, slots - streams)
        if self.rtf <= 0 or free == 0 or self.refuses(slots, running) is None:
            return free
        lo, hi = 0, free  # refuses() is monotone in streams: the largest n with streams + n admitted
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.refuses(streams + mid, running) is None:
                lo = mid
            else:
                hi = mid - 1
        return lo
