"""What the engine loop keeps per text chunk in flight (Task), and which of its frames go to the codec when.

Frames become audio in chunks: a stream's first chunk is `first` frames (small: first audio sooner),
later ones grow (each at most the audio already made) up to `stream` frames; whatever is left when a chunk of
text ends goes in one last call (padded by the vocoder). Pure Python over host-side frame lists: no device, easy
to test.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from ..synthesis.plan import Plan
from ..synthesis.stream import Stream
from .scheduler import Job


@dataclass(eq=False)
class Task:
    """One text chunk of a stream, in flight."""

    stream: Stream
    plan: Plan  # the stream's request, its text chunks and their reports
    index: int  # text chunk
    prompt: torch.Tensor  # int64 [n+1, T]
    context_dropped: bool
    frame_offset: int
    frames: list[np.ndarray] = field(default_factory=list)  # every generated frame [n+1], on the host
    decoded: int = 0  # kept frames already turned into audio
    voc_slot: int = -1
    job: Job | None = None

    @property
    def kept(self) -> int:
        """Frames that are audio for sure: the last generated one may still be dropped."""
        return max(0, len(self.frames) - 1)


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


def codec_calls(tasks: list[Task], final: bool, first: int, stream: int) -> Iterator[tuple[int, list[Task]]]:
    """-> (frames, tasks) per codec call: whole chunks while running (each call a length of chunk_sizes: the
    vocoder pads only a final piece; frames that backed up go in the largest size that fits, so a call may then be
    longer than the audio made so: the engine takes audio every step, where none back up), everything left when
    final in pieces of at most the largest. Tasks with the
    same call length share a call; rounds keep each task's pieces in order. The caller advances each task's
    `decoded` by `frames` as it takes a call (the next round is computed from those counts)."""
    sizes = chunk_sizes(first, stream)
    largest = max(sizes)
    while True:
        groups: dict[int, list[Task]] = {}
        for task in tasks:
            pending = task.kept - task.decoded
            if final:
                pending = min(pending, largest)
            else:
                pending -= pending % _chunk(task, first, stream)
                pending = max((s for s in sizes if s <= pending), default=0)
            if pending > 0:
                groups.setdefault(pending, []).append(task)
        if not groups:
            return
        yield from groups.items()
