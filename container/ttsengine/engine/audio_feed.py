"""What the engine loop keeps per text chunk in flight (Task), and which of its frames go to the codec when.

Frames become audio in chunks: a stream's first chunk is `first` frames (small: first audio sooner),
later ones `stream` frames; whatever is left when a chunk of text ends goes in one last call (padded by
the vocoder). Pure Python over host-side frame lists: no device, easy to test.
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


def _chunk(task: Task, first: int, stream: int) -> int:
    return first if task.decoded == 0 else stream


def ready_for_audio(tasks: list[Task], first: int, stream: int) -> list[Task]:
    """The tasks with at least one whole audio chunk of kept frames not decoded yet."""
    return [t for t in tasks if t.kept - t.decoded >= _chunk(t, first, stream)]


def codec_calls(tasks: list[Task], final: bool, first: int, stream: int) -> Iterator[tuple[int, list[Task]]]:
    """-> (frames, tasks) per codec call: whole chunks while running, everything left when final. Tasks with
    the same chunk length share a call; rounds keep each task's pieces in order. The caller advances each
    task's `decoded` by `frames` as it takes a call (the next round is computed from those counts)."""
    largest = max(first, stream)
    while True:
        groups: dict[int, list[Task]] = {}
        for task in tasks:
            pending = task.kept - task.decoded
            if not final:
                pending -= pending % _chunk(task, first, stream)
            if pending > 0:
                groups.setdefault(min(pending, largest), []).append(task)
        if not groups:
            return
        yield from groups.items()
