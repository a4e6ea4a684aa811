"""How many prompt positions one engine step may prefill, so that decoding streams stay at least real time.

Each loop iteration makes one frame for every decoding stream; a frame is 1/21.5 s of audio, so an iteration
must take less than that for the streams to stay real time. An iteration costs roughly
`step(batch) + tokens * per_token`: the decode step at the current batch bucket plus the prefill. Both are
measured from the iterations themselves (the step's one host sync per step ends each timing, so the GPU work
of the prefill queued before it is inside; no extra sync): iterations without prefill give step(batch) per
bucket, the others give per_token. The budget is what fits in HEADROOM of the frame period beside the step:

    tokens = (HEADROOM * frame_seconds - step(batch)) / per_token,   clamped to [floor, limit]

`limit` is TTS_PREFILL_TOKENS; `floor` (a page) keeps prefill moving even when the step alone is already
slower than real time (then nothing keeps those streams real time; new requests must still get in). With no
stream decoding nothing is at stake: the whole limit.

With feature prefill_fit the prefill's cost is `fixed + tokens * per_token`, fitted over the recent iterations'
prefills (a prefill call costs about the same for one short prompt as for several: padded rows, every layer's
weights read once), so a step with room for many prompts is not sized by what one prompt cost per position:

    tokens = (HEADROOM * frame_seconds - step(batch) - fixed) / per_token,   at most FIT_REACH x the largest seen

Without it one moving average per position (fixed cost included) sizes every step: a wave of arrivals beside a full
batch goes in a few prompts a step.

With feature slack_prefill the iteration may take longer than HEADROOM of a frame while every playing stream's
listener has audio in hand: streams that run faster than real time build up audio ahead of playback, and a step
that takes `s` seconds costs each of them at most `s` of it. So up to (that audio - SLACK_MARGIN_S), at most
SLACK_STEP_MAX_S: waiting requests get in sooner, and no listener runs dry. Pure Python.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

HEADROOM = 0.8  # of the frame period: the codec shares the GPU with the step, and timings jitter
SMOOTHING = 0.2  # weight of the newest timing in the moving averages
SLACK_MARGIN_S = 1.0  # audio ahead of a listener that a longer step never spends (jitter, the codec's own lag)
SLACK_STEP_MAX_S = 0.1  # one iteration at most, however much audio is ahead (a stream's chunks stay near even; a
# stream whose first audio is still to come waits at most this much longer per step)


FIT_SAMPLES = 64  # prefills the fit looks back over (a few seconds of iterations under load)
FIT_MIN = 8  # fewer: no fit yet (the average per position sizes the steps)
FIT_SPREAD = 2.0  # the largest prefill seen at least this many times the smallest: else fixed and per-position costs
# cannot be told apart
FIT_REACH = 4.0  # a step's prefill at most this many times the largest seen: the fit extrapolates one step at a time


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


@dataclass
class PrefillBudget:
    limit: int  # prompt positions per step at most (TTS_PREFILL_TOKENS)
    frame_seconds: float  # one frame of audio
    floor: int  # positions per step at least
    step_seconds: dict[int, float] = field(default_factory=dict)  # per batch bucket: an iteration without prefill
    timed_at: dict[int, float] = field(default_factory=dict)  # per batch bucket: time.monotonic() of its last timing
    token_seconds: float | None = None  # one prefilled position
    fit: bool = False  # prefill_fit: size steps by the fitted fixed + per-position cost
    cost: tuple[float, float, int] | None = None  # the fit: (fixed s, s per position, largest prefill seen); None: none
    samples: deque = field(default_factory=lambda: deque(maxlen=FIT_SAMPLES))  # (positions, seconds) of prefills

    def tokens(self, bucket: int, slack: float = 0.0) -> int:
        """The budget of the next step while `bucket` rows decode (0: none). A bucket not timed yet (an
        iteration without prefill gives its time: under a steady stream of prefills that may never come) takes
        the time of the nearest timed bucket above it, else the largest below (a step is never faster with more
        rows), so one long prompt cannot go in whole because its admission moved the batch into a new bucket.
        slack: seconds of audio the playing stream with the least has ahead of its listener (slack_prefill; 0:
        the real-time budget only)."""
        if bucket == 0 or not self.token_seconds or not self.step_seconds:
            return self.limit
        step = self.step_seconds.get(bucket)
        if step is None:
            above = [b for b in self.step_seconds if b > bucket]
            step = self.step_seconds[min(above)] if above else self.step_seconds[max(self.step_seconds)]
        room = iteration_seconds(self.frame_seconds, slack) - step
        if self.cost is not None:
            fixed, per_token, seen = self.cost
            tokens = min(int((room - fixed) / per_token), int(FIT_REACH * seen))
        else:
            tokens = int(room / self.token_seconds)
        return max(min(self.floor, self.limit), min(self.limit, tokens))

    def observe(self, bucket: int, prefilled: int, seconds: float) -> None:
        """One iteration: `bucket` decode rows (0: no decode step), `prefilled` positions, `seconds` from the
        prefill's start to the step's host sync."""
        if bucket == 0:
            return  # a prefill without a step never synced: its time is launch time, not work
        if prefilled == 0:
            self.step_seconds[bucket] = _average(self.step_seconds.get(bucket), seconds)
            self.timed_at[bucket] = time.monotonic()  # goodput admission trusts recent timings only
        elif bucket in self.step_seconds:
            extra = max(seconds - self.step_seconds[bucket], 0.0)
            self.token_seconds = _average(self.token_seconds, extra / prefilled)
            if self.fit:
                self.samples.append((prefilled, extra))
                self.cost = fit_cost(self.samples)


def fit_cost(samples) -> tuple[float, float, int] | None:
    """(fixed seconds, seconds per position, largest positions) of a prefill, by least squares over `samples`
    ((positions, seconds) each); None while they are too few or too alike to tell the two costs apart, or the fit
    says a position costs nothing (noise)."""
    n = len(samples)
    if n < FIT_MIN:
        return None
    xs = [x for x, _ in samples]
    lo, hi = min(xs), max(xs)
    if hi < FIT_SPREAD * lo:
        return None
    mx, my = sum(xs) / n, sum(y for _, y in samples) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    per_token = sum((x - mx) * (y - my) for x, y in samples) / sxx
    if per_token <= 0:
        return None
    return max(my - per_token * mx, 0.0), per_token, hi


def iteration_seconds(frame_seconds: float, slack: float) -> float:
    """How long one iteration (prefill + step) may take: HEADROOM of a frame, or, with `slack` seconds of audio
    ahead of every listener, up to that less SLACK_MARGIN_S (at most SLACK_STEP_MAX_S)."""
    return max(HEADROOM * frame_seconds, min(slack - SLACK_MARGIN_S, SLACK_STEP_MAX_S))


def listener_slack(streams, now: float, frame_seconds: float) -> float:
    """streams: (frames made into audio, time.perf_counter() of its first audio) of each playing stream -> the
    least audio, in seconds, any of their listeners has ahead of playback (playing from the first audio on at 1x);
    0 when none plays. A stream whose audio has not started has nothing to lose but time to its first audio, as
    the requests still queued do: a longer step trades its wait against theirs (at most SLACK_STEP_MAX_S)."""
    return max(0.0, min((frames * frame_seconds - (now - first_audio_at) for frames, first_audio_at in streams),
                        default=0.0))
