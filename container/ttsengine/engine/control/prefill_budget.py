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

With feature slack_prefill the iteration may take longer than HEADROOM of a frame while every playing stream's
listener has audio in hand: streams that run faster than real time build up audio ahead of playback, and a step
that takes `s` seconds costs each of them at most `s` of it. So up to (that audio - SLACK_MARGIN_S), at most
SLACK_STEP_MAX_S: waiting requests get in sooner, and no listener runs dry. Pure Python.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

HEADROOM = 0.8  # of the frame period: the codec shares the GPU with the step, and timings jitter
SMOOTHING = 0.2  # weight of the newest timing in the moving averages
SLACK_MARGIN_S = 1.0  # audio ahead of a listener that a longer step never spends (jitter, the codec's own lag)
SLACK_STEP_MAX_S = 0.1  # one iteration at most, however much audio is ahead (a stream's chunks stay near even; a
# stream whose first audio is still to come waits at most this much longer per step)


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
        return max(min(self.floor, self.limit), min(self.limit, int(room / self.token_seconds)))

    def observe(self, bucket: int, prefilled: int, seconds: float) -> None:
        """One iteration: `bucket` decode rows (0: no decode step), `prefilled` positions, `seconds` from the
        prefill's start to the step's host sync."""
        if bucket == 0:
            return  # a prefill without a step never synced: its time is launch time, not work
        if prefilled == 0:
            self.step_seconds[bucket] = _average(self.step_seconds.get(bucket), seconds)
            self.timed_at[bucket] = time.monotonic()  # goodput admission trusts recent timings only
        elif bucket in self.step_seconds:
            extra = max(seconds - self.step_seconds[bucket], 0.0) / prefilled
            self.token_seconds = _average(self.token_seconds, extra)


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
