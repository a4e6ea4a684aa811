"""Several engine processes behind one front (issue 49): one per GPU (engine/placement.py's process_configs: the
engines sharing a GPU, or a split pair, stay together). One Python process no longer keeps two fast GPUs fed (one GIL
for every engine loop: docs/configuration.md, TTS_ENGINE_PROCESS); a process each does.

The front routes like Fleet.route: most free slots first (free = a process's stream slots less the streams the
front has open there: exact, not a stale report), a voice's home process first while it has room, ties in turn;
a process that is busy or down passes the request to the next. Backpressure is the sum: a request is refused only
when every process refused it. A process that dies is out of rotation (its streams end with EngineDown); the others
serve on, and /health says degraded, then failed when none is left.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from ...config import EngineConfig
from ...engine.fleet import best_first, busy, voice_affinity
from ...engine.stats import EngineStats, FleetStats
from ...errors import SEE_LOGS, BusyError, EngineDown
from ...synthesis.request import SynthesisRequest
from ...synthesis.stream import Stream
from .remote_fleet import RemoteFleet

log = logging.getLogger(__name__)


class ProcessFleet:
    engines_elsewhere = True  # the engines live in processes of their own (Service: this front freezes its heap)

    def __init__(self, configs: list[EngineConfig], random_weights: str | None = None):
        self.configs, self.random_weights = configs, random_weights
        self.members: list[RemoteFleet | None] = [None] * len(configs)  # None: loading, or failed to load
        self.load_errors: list[str | None] = [None] * len(configs)
        self.rejected = 0
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._loading = len(configs)
        self._closed = False

    @classmethod
    def spawn(cls, configs: list[EngineConfig], random_weights: str | None = None) -> ProcessFleet:
        """Starts every engine process at once and returns when each is warm or failed (they load side by side,
        so waiting for all costs about one load, and a burst right after ready meets every engine); raises the
        first load failure if every one failed. random_weights: RemoteFleet.spawn's (bench)."""
        fleet = cls(configs, random_weights)
        errors: list[BaseException] = []
        for i in range(len(configs)):
            threading.Thread(target=fleet._load, args=(i, errors), name=f"engine-process-{i}-load",
                             daemon=True).start()
        with fleet._changed:
            fleet._changed.wait_for(lambda: fleet._loading == 0)
        if not fleet.ready:
            fleet.close()
            raise errors[0]
        return fleet

    def _load(self, i: int, errors: list[BaseException]) -> None:
        try:
            member = RemoteFleet.spawn(self.configs[i], self.random_weights)
        except Exception as e:  # noqa: BLE001 - kept: reported per engine, raised if none loads
            log.error("the engine process for %s failed to load: %s: %s", self.configs[i].devices, type(e).__name__, e)
            with self._changed:
                errors.append(e)
                self.load_errors[i] = f"{type(e).__name__}: {e}"
                self._loading -= 1
                self._changed.notify_all()
            return
        with self._changed:
            if self._closed:  # closed while this one loaded: nobody will close it later
                member.close()
            self.members[i] = member
            self._loading -= 1
            self._changed.notify_all()

    # ---- requests ------------------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest, *, ignore_stop: bool = False,
               abandoned: Callable[[], bool] | None = None) -> Stream:
        """Like Fleet.submit; abandoned(): RemoteFleet.submit's (the client left: given up, Abandoned)."""
        order = self._order(request)
        refusals: list[BusyError] = []
        for member in order:
            try:
                return member.submit(request, ignore_stop=ignore_stop, abandoned=abandoned)
            except BusyError as e:  # full: the next one
                refusals.append(e)
            except EngineDown:  # went down since route(): the next one
                continue
        raise self._refused(order, refusals)

    async def admit(self, request: SynthesisRequest, gone: Callable[[], Awaitable[bool]] | None = None, *,
                    ignore_stop: bool = False) -> Stream:
        """submit() on the event loop (RemoteFleet.admit), the same routing and backpressure."""
        order = self._order(request)
        refusals: list[BusyError] = []
        for member in order:
            try:
                return await member.admit(request, gone, ignore_stop=ignore_stop)
            except BusyError as e:
                refusals.append(e)
            except EngineDown:
                continue
        raise await asyncio.to_thread(self._refused, order, refusals)  # a stats round trip per process: not here

    def _order(self, request: SynthesisRequest) -> list[RemoteFleet]:
        """The processes to try, best first; EngineDown or BusyError when none is ready."""
        order = self.route(voice_affinity(request))
        if not order:
            if self.failure:
                raise EngineDown(self.failure)
            raise BusyError("no engine is ready yet; retry shortly")
        return order

    def _refused(self, order: list[RemoteFleet], refusals: list[BusyError]) -> BusyError:
        """Every process refused: the BusyError to raise, counted, with the streams running and waiting in all."""
        with self._lock:
            self.rejected += 1
        running = waiting = 0
        for m in order:  # the refusal's path only: one stats call per process, for the same message as one process
            try:
                total = m.stats().total
            except EngineDown:
                continue
            running, waiting = running + total.running, waiting + total.waiting
        return busy(len(order), running, waiting, refusals)

    def synthesize(self, request: SynthesisRequest):
        return self.submit(request).result()

    def route(self, affinity: int | None = None) -> list[RemoteFleet]:
        """Ready processes, best first (engine/fleet.py's best_first; free slots: the front's own count)."""
        room = {i: (m.max_streams - m.open_streams, 0) for i, m in enumerate(self.members)
                if m is not None and m.ready}
        return [self.members[i] for i in best_first(room, len(self.members), next(self._turn), affinity)]

    # ---- what the front reports ----------------------------------------------------------------------
    @property
    def processes(self) -> int:
        """Engine processes behind this front: the front plans this many requests at a time per PLANNING_THREADS
        (service.py: with one pool of 8 for all, 2-4 GPUs' submits queued behind each other's round trips)."""
        return len(self.configs)

    def _ready_members(self) -> list[RemoteFleet]:
        return [m for m in self.members if m is not None and m.ready]

    @property
    def ready(self) -> bool:
        return bool(self._ready_members())

    @property
    def failure(self) -> str | None:
        """Why no engine can serve, once none is loading or ready (None: one is, or will be)."""
        if self._loading or self.ready:
            return None
        # each one's reason was logged when it failed; clients see where, not what (errors.py: SEE_LOGS)
        return f"every engine process failed ({'; '.join(c.devices for c in self.configs)}); {SEE_LOGS}"

    @property
    def max_streams(self) -> int:
        return sum(m.max_streams for m in self._ready_members())

    @property
    def open_streams(self) -> int:
        return sum(m.open_streams for m in self.members if m is not None)

    def _any(self) -> RemoteFleet:
        ready = self._ready_members()
        if not ready:
            raise EngineDown(self.failure or "no engine process is ready")
        return ready[0]

    @property
    def sample_rate(self) -> int:
        return self._any().sample_rate

    @property
    def frame_rate(self) -> float:
        return self._any().frame_rate

    @property
    def codec_tag(self) -> str:
        return self._any().codec_tag

    def voice_codes(self, audio: bytes):
        return self._any().voice_codes(audio)

    def forget_voice(self, text: str, codes) -> None:
        for m in self._ready_members():
            m.forget_voice(text, codes)

    def stats(self) -> FleetStats:
        """Every engine of every process (in TTS_DEVICES order) summed; a process that is loading or gone counts
        as its engines in that state."""
        engines: list[EngineStats] = []
        for config, member, error in zip(self.configs, self.members, self.load_errors):
            try:
                if member is not None and member.dead is None:
                    engines.extend(member.stats().engines)
                    continue
            except EngineDown:
                pass
            state = "failed" if error or member is not None else "loading"
            why = error or (member.failure if member is not None else None)
            engines.extend(EngineStats(device=d, codec_device=d, state=state, error=why)
                           for d in config.devices.split(","))
        return EngineStats.sum(engines, rejected=self.rejected)

    def settle(self, timeout: float = 120.0) -> bool:
        return all([m.settle(timeout) for m in self._ready_members()])

    def wait_all(self, timeout: float | None = None) -> bool:
        with self._changed:
            if not self._changed.wait_for(lambda: self._loading == 0, timeout):
                return False
        return all([m.wait_all(timeout) for m in self._ready_members()])

    def close(self) -> None:
        """Closes every engine process at once (each may take its drain of the engines)."""
        with self._lock:
            self._closed = True
            members = [m for m in self.members if m is not None]
        with ThreadPoolExecutor(max(1, len(members))) as pool:
            list(pool.map(RemoteFleet.close, members))
