"""The one door between the API threads and the engine's loop thread: requests waiting to be taken in, the streams
taken in and not yet ended, prefix keys to forget, and whether the engine stops or is down.

Every method holds one condition. A request moves from here into the scheduler inside take(), under it, so
occupancy() (the router's hint) and the busy check count it once, never zero times. The loop sleeps on the same
condition while idle (wait), so a request, a forget or a stop wakes it at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from ..errors import SEE_LOGS, AtCapacity, BusyError, EngineDown, ShuttingDown
from ..synthesis.stream import Stream
from .audio_feed import Task
from .control.goodput import AT_CAPACITY, Goodput
from .control.scheduler import Scheduler
from .metrics import EngineMetrics


class Intake:
    def __init__(self, scheduler: Scheduler, max_queue: int, slots: int, where: str, metrics: EngineMetrics,
                 goodput: Goodput | None = None):
        """where: the engine's device, for the messages; metrics: counts the requests refused as busy; goodput:
        refuses a stream that would slow the streams below real time (None: slots and queue alone decide)."""
        self.scheduler, self.max_queue, self.slots, self.where = scheduler, max_queue, slots, where
        self.metrics, self.goodput = metrics, goodput
        self.cv = threading.Condition()
        self._tasks: deque[Task] = deque()
        self._forget: deque[str] = deque()  # prefix keys to drop (a voice deleted or replaced)
        self._streams: set[Stream] = set()
        self.stopping = False
        self.down: str | None = None  # why the engine was taken out of service (control/faults.py)

    # ---- the API threads ----------------------------------------------------------------------
    def put(self, task: Task) -> None:
        """Queues a request's first text chunk; EngineDown, ShuttingDown or BusyError at once. BusyError when the
        engine is full: every slot running or spoken for by a waiting request, and max_queue more waiting."""
        with self.cv:
            if self.down is not None:
                raise EngineDown(f"the engine on {self.where} is out of service; {SEE_LOGS}")  # why: logged
            if self.stopping:
                raise ShuttingDown("the server is shutting down; retry shortly")
            waiting = self._waiting()
            # room: the free slots (a burst lands here before the loop moves it into them) plus the queue places
            running = len(self.scheduler.running)
            if waiting >= self.scheduler.free_slots + self.max_queue:
                self.metrics.rejected += 1
                raise BusyError(f"the engine is busy ({running} streams running, {waiting} waiting); retry shortly")
            self._goodput(task.plan.admitted)
            self._tasks.append(task)
            self._streams.add(task.stream)
            self.cv.notify_all()

    def precheck(self, admitted: bool) -> None:
        """AtCapacity now when goodput admission would refuse a new stream: before it is planned (its references
        encoded on the device), which is work the refusal would waste exactly when the engine is busiest. put()
        checks again (the load may change while it is planned)."""
        with self.cv:
            self._goodput(admitted)

    def _goodput(self, admitted: bool) -> None:
        """AtCapacity when goodput admission refuses one more stream (call under cv). The streams that would
        decode together once it runs: the running ones, the waiting ones and it, at most the slots; beyond them it
        waits for a slot, and only as long as goodput's wait allows."""
        if self.goodput is None or admitted:
            return
        running, waiting = len(self.scheduler.running), self._waiting()
        why = self.goodput.refuses(min(running + waiting + 1, self.slots), running)
        ahead = running + waiting + 1 - self.slots  # streams to start before it gets a slot, itself included
        if why is None and ahead > 0:  # only then the open streams are scanned for the queue's head
            why = self.goodput.refuses_wait(ahead, self._head_wait())
        if why is not None:
            self.metrics.rejected += 1
            self.metrics.refused_capacity += 1
            raise AtCapacity(f"{AT_CAPACITY}{why}; retry shortly")

    def forget(self, key: str) -> None:
        with self.cv:
            self._forget.append(key)
            self.cv.notify_all()

    def occupancy(self) -> tuple[int, int]:
        """(slots not spoken for, requests waiting); with goodput admission, the slots it would still fill."""
        with self.cv:
            waiting, running = self._waiting(), len(self.scheduler.running)
            free = self.slots - running - waiting
            if self.goodput is not None and free > 0:
                free = self.goodput.room(running + waiting, running, self.slots)
            return free, waiting

    @property
    def waiting(self) -> int:
        with self.cv:
            return self._waiting()

    def _head_wait(self) -> float:
        """Seconds the stream waiting longest for its first prefill has waited (call under cv); 0 with none."""
        now = time.perf_counter()
        return max((now - s.submitted_at for s in self._streams if s.started_at is None), default=0.0)

    def _waiting(self) -> int:
        """Requests not yet running: here, or in the scheduler's queue (call under cv)."""
        return len(self._tasks) + self.scheduler.queue_depth

    @property
    def open_streams(self) -> int:
        """Requests taken in and not yet ended (queued, generating, or their last audio being decoded)."""
        with self.cv:
            return len(self._streams)

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify_all()

    # ---- the loop thread ----------------------------------------------------------------------
    def take(self, enqueue: Callable[[Task], None]) -> list[str]:
        """Moves the waiting requests into the scheduler (enqueue, under the condition) -> prefix keys to forget."""
        with self.cv:
            tasks, self._tasks = list(self._tasks), deque()
            for task in tasks:
                enqueue(task)
            forget, self._forget = list(self._forget), deque()
        return forget

    def idle(self) -> bool:
        """Nothing to do (call under cv): no request, no forget, no work in the scheduler, not stopping."""
        return not self.stopping and not self._tasks and not self._forget and not self.scheduler.has_work()

    def ended(self, stream: Stream) -> None:
        with self.cv:
            if stream in self._streams and self.goodput is not None:
                self.goodput.ended()  # its slot is free: the rate a waiting stream gets one at
            self._streams.discard(stream)

    def end_all(self, down: str | None = None) -> list[Stream]:
        """Every open stream and waiting request leaves (the loop fails them) -> the streams; down: the engine is
        taken out of service for that reason, and the scheduler forgets its jobs (host side only)."""
        with self.cv:
            streams, self._streams = list(self._streams), set()
            self._tasks.clear()
            if down is not None:
                self.down = down
                self.scheduler.release(list(self.scheduler.running))
                self.scheduler.waiting.clear()
        return streams
