"""What the engine loop keeps per text chunk in flight (Task), and which of its frames go to the codec when.

Frames become audio in chunks: a stream's first chunk is `first` frames (small: first audio sooner),
later ones grow (each at most the audio already made) up to `stream` frames; whatever is left when a chunk of
text ends goes in one last call (padded by the vocoder). Later chunks go in codec rounds (CodecRounds): streams
start at different steps, so without them each step would send the few streams at a chunk boundary to the codec
alone, and a codec call of a few rows costs nearly what one of 64 does. Pure Python over host-side frame lists: no
device, easy to test.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from ..synthesis.plan import ChunkReport, Plan, Planner
from ..synthesis.stream import Stream
from .control.scheduler import Job
from .device.vocoder import Delivery, Vocoder


@dataclass(eq=False)
class Task:
    """One text chunk of a stream, in flight."""

    stream: Stream
    plan: Plan  # the stream's request, its text chunks and their reports
    index: int  # text chunk
    prompt: torch.Tensor  # int64 [n+1, T]
    context_dropped: bool
    frame_offset: int  # the stream's frames generated before this text chunk (its random stream goes on from there)
    frames: list[np.ndarray] = field(default_factory=list)  # every generated frame [n+1], on the host
    decoded: int = 0  # kept frames already turned into audio
    voc_slot: int = -1
    job: Job | None = None
    audio_offset: int = 0  # the stream's frames made into audio before this text chunk (kept ones only)

    @property
    def playing(self) -> bool:
        """The stream's audio has started: frames of it went to the codec (this text chunk's or an earlier one's)."""
        return self.decoded > 0 or self.audio_offset > 0

    @property
    def kept(self) -> int:
        """Frames that are audio for sure: the last generated one may still be dropped."""
        return max(0, len(self.frames) - 1)

    def report(self, reason: str, num_codebooks: int) -> torch.Tensor:
        """The text chunk ended (`reason`): its report goes on the plan (and its codes, when kept) -> its kept
        codes int64 [num_codebooks, kept] (the next chunk's context)."""
        plan = self.plan
        kept = self.kept if reason != "cancelled" else self.decoded
        plan.reports.append(ChunkReport(plan.texts[self.index], kept, reason, self.context_dropped,
                                        self.prompt.shape[1]))
        codes = (torch.from_numpy(np.stack(self.frames[:kept], axis=1)[1:]) if kept else
                 torch.zeros(num_codebooks, 0, dtype=torch.int64))
        if plan.keep_codes:
            plan.codes.append(codes.numpy())
        return codes

    def successor(self, planner: Planner, codes: torch.Tensor) -> Task | None:
        """The stream's next text chunk, with this one's text and kept `codes` as its context; None after the last."""
        plan, nxt = self.plan, self.index + 1
        if nxt >= len(plan.texts):
            return None
        prompt, dropped = planner.chunk_prompt(plan, nxt, (plan.texts[self.index], codes))
        return Task(self.stream, plan, nxt, prompt, dropped, self.frame_offset + len(self.frames),
                    audio_offset=self.audio_offset + codes.shape[1])


def chunk_sizes(first: int, stream: int) -> tuple[int, ...]:
    """The audio chunk lengths a stream goes through: `first`, then doubling while below `stream`, then `stream`
    (4, 8 -> (4, 8); 4, 32 -> (4, 8, 16, 32)); `stream` <= `first`: (first, stream) as given, no growth."""
    if stream <= first:
        return (first, stream)
    sizes = [first]
    while sizes[-1] * 2 < stream:
        sizes.append(sizes[-1] * 2)
    return (*sizes, stream)


def _chunk(task: Task, first: int, stream: int) -> int:
    """The next chunk: the first, then the largest size no longer than the audio already made (a listener holds at
    least as much audio as the next chunk takes to make at any speed above real time, so growing never stalls
    playback, and a long stream reaches `stream`: fewer, larger codec calls)."""
    if task.decoded == 0:
        return first
    if stream <= first:
        return stream
    return max(s for s in chunk_sizes(first, stream) if s <= task.decoded)


def ready_for_audio(tasks: list[Task], first: int, stream: int) -> list[Task]:
    """The tasks with at least one whole audio chunk of kept frames not decoded yet."""
    return [t for t in tasks if t.kept - t.decoded >= _chunk(t, first, stream)]


def codec_calls(tasks: list[Task], first: int, stream: int) -> Iterator[tuple[int, list[Task]]]:
    """-> (frames, tasks) per codec call of running tasks: whole chunks (each call a length of chunk_sizes: the
    vocoder pads only a final piece, final_calls; frames that backed up go in the largest size that fits, so a call
    may then be longer than the audio made so: the engine takes audio every step, where none back up). Tasks with
    the same call length share a call; rounds keep each task's pieces in order. The caller advances each task's
    `decoded` by `frames` as it takes a call (the next round is computed from those counts)."""
    sizes = chunk_sizes(first, stream)
    while True:
        groups: dict[int, list[Task]] = {}
        for task in tasks:
            pending = task.kept - task.decoded
            pending -= pending % _chunk(task, first, stream)
            pending = max((s for s in sizes if s <= pending), default=0)
            if pending > 0:
                groups.setdefault(pending, []).append(task)
        if not groups:
            return
        yield from groups.items()


def final_calls(tasks: list[Task], largest: int) -> Iterator[list[tuple[Task, int]]]:
    """The last audio of tasks whose text chunk ended -> per codec call, (task, frames) for every task with kept
    frames left, each taking up to `largest`: one call for all of them, not one per length (streams started together
    end at the same step). The vocoder pads the call to a chunk size and the shorter rows up to the call's longest:
    the codec is causal, so frames after a row's real ones change none of its audio, and each slot is reset after
    its last call. The caller advances each task's `decoded` by its frames before taking the next call."""
    while True:
        call = [(t, min(t.kept - t.decoded, largest)) for t in tasks if t.kept > t.decoded]
        if not call:
            return
        yield call


def pending_codes(task: Task, frames: int, width: int) -> np.ndarray:
    """The codebook codes of the task's next `frames` frames not decoded yet, zero-padded to `width` columns
    -> int64 [n, width] (a frame's first entry, its text-token slot, is not audio)."""
    codes = np.stack(task.frames[task.decoded:task.decoded + frames], axis=1)[1:]
    return np.pad(codes, ((0, 0), (0, width - frames))) if width > frames else codes


def buffered_seconds(task: Task, now: float, frame_seconds: float) -> float | None:
    """Audio the stream's listener holds at `now` (time.perf_counter()) if it plays from its first chunk on at normal
    speed: made (earlier text chunks and this one's chunks sent to the codec) less played; None before its first
    chunk arrived."""
    start = task.stream.first_audio_at
    if start is None:
        return None
    return (task.audio_offset + task.decoded) * frame_seconds - (now - start)


HOLD_MARGIN_S = 0.1  # a held stream's listener keeps at least this much audio beyond the wait's estimate


class CodecRounds:
    """Which ready tasks go to the codec at this iteration (one call of `due` per engine iteration).

    A stream's later chunks go at its rounds: every max(first, stream) iterations (its largest chunk's frames), at a
    phase set by its codec slot, so the
    streams of `rows` consecutive slots share a phase (one graphed codec call of up to `rows` rows: the vocoder's
    largest graph) and more streams than that spread over the other phases (a codec load as even as the steps').
    Between its rounds only a stream's first chunk goes (first audio never waits), or a stream whose listener might
    run dry before its round after next: its buffered audio is below twice a round's length at the recent iteration
    pace, plus HOLD_MARGIN_S. All of a round's calls are whole chunks: at most `stream` frames per stream pile up
    between rounds, and codec_calls sends them in the largest sizes that fit. With more than `phases * rows`
    streams running nothing waits: the codec thread is then behind and its merge (vocoder.py) already joins what
    queues up into large calls, and rounds measured slower there (docs/performance.md, "Codec").
    enabled False: every ready task goes (TTS_FEATURES=-codec_rounds)."""

    def __init__(self, first: int, stream: int, frame_seconds: float, enabled: bool = True, rows: int = 64,
                 phases: int = 2):
        self.first, self.stream, self.frame_seconds, self.enabled = first, stream, frame_seconds, enabled
        self.rows, self.phases = rows, phases
        self.period = max(first, stream)  # a round's frames per stream: the largest chunk
        self.iterations = 0
        self.pace = 0.0  # seconds per iteration, moving average
        self._last: float | None = None

    def due(self, tasks: list[Task], now: float) -> list[Task]:
        """tasks: the running ones; now: time.perf_counter() -> those to send to the codec now."""
        ready = ready_for_audio(tasks, self.first, self.stream)
        if not tasks:  # idle: the pace restarts with the next stream
            self._last = None
            return ready
        if self._last is not None:
            step = now - self._last
            self.pace = step if self.pace == 0.0 else 0.9 * self.pace + 0.1 * step
        self._last = now
        self.iterations += 1
        if not self.enabled or len(tasks) > self.phases * self.rows:
            return ready
        hold = 2 * self.period * self.pace + HOLD_MARGIN_S
        return [t for t in ready if self._on_round(t) or not self._may_wait(t, now, hold)]

    def reset(self) -> None:
        """Forgets the pace (the engine failed its streams: the next iteration comes after a gap, not a step)."""
        self._last, self.pace = None, 0.0

    def _on_round(self, task: Task) -> bool:
        return (self.iterations + max(task.voc_slot, 0) // self.rows) % self.period == 0

    def _may_wait(self, task: Task, now: float, hold: float) -> bool:
        buffered = buffered_seconds(task, now, self.frame_seconds)
        return task.decoded > 0 and buffered is not None and buffered >= hold


class AudioFeed:
    """The loop's side of the codec: a codec slot for each text chunk in flight, its frames sent in rounds or all at
    its end, its slot reset and its stream finished after its last audio (the vocoder's queue keeps that order)."""

    def __init__(self, vocoder: Vocoder, rounds: CodecRounds, slots: int, first: int, stream: int):
        self.vocoder, self.rounds, self.first, self.stream = vocoder, rounds, first, stream
        self._slots = slots
        self._free = list(range(slots - 1, -1, -1))

    def start(self, task: Task) -> None:
        """The text chunk's first prompt chunk is prefilled: it takes a codec slot."""
        task.voc_slot = self._free.pop()

    def due(self, tasks: list[Task], now: float) -> None:
        """The running chunks' audio whose round has come (CodecRounds) goes to the codec."""
        ready = self.rounds.due(tasks, now)
        if ready:
            self.send(ready, final=False)

    def send(self, tasks: list[Task], final: bool) -> None:
        """Queues codec decodes of pending frames: whole chunks (codec_calls), or when `final` all that is left, every
        task in each call (final_calls)."""
        voc = self.vocoder
        calls = (final_calls(tasks, voc.chunk_sizes[-1]) if final else  # its largest: decode_padded's limit
                 ([(t, count) for t in group] for count, group in codec_calls(tasks, self.first, self.stream)))
        for call in calls:
            width = max(count for _, count in call)
            codes = np.stack([pending_codes(t, count, width) for t, count in call])  # [b, n, width]
            voc.decode([t.voc_slot for t, _ in call], codes, [Delivery(t.stream, t.index, count) for t, count in call])
            for task, count in call:
                task.decoded += count

    def release(self, task: Task) -> None:
        """The text chunk ended: its slot is reset after its last decode and free again."""
        if task.voc_slot >= 0:
            self.vocoder.reset(task.voc_slot)
            self._free.append(task.voc_slot)
            task.voc_slot = -1

    def end(self, stream: Stream, error: BaseException | None = None, completed: bool = False) -> None:
        """The stream ends after its last audio chunk; completed: it counts as a finished request."""
        self.vocoder.finish(stream, error, completed)

    def fail(self, streams: list[Stream], error: BaseException) -> None:
        """Every slot reset and free, every stream ended with `error` (the loop failed them all)."""
        self.rounds.reset()
        self._free = list(range(self._slots - 1, -1, -1))
        for slot in self._free:
            self.vocoder.reset(slot)
        for stream in streams:
            self.vocoder.finish(stream, error)
