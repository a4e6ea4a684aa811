"""Every engine of the process behind one front: one engine per device entry (placement.py), each with its
own slots, KV pool, graphs and codec, and the requests routed to the one with the most room.

Routing: the ready engine with the most free slots (slots less running and waiting requests), then the
shortest queue, ties taken in turn; a busy engine passes the request on to the next, so backpressure
(BusyError: 503 + Retry-After, RunPod's concurrency) counts the room of all of them. An engine that fails
for good (faults.py) leaves the rotation; its requests end with EngineDown and the others keep serving.
The fleet is ready while at least one engine is.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..compat import want_recompile_limit
from ..config import EngineConfig
from ..errors import SEE_LOGS, AtCapacity, BusyError, EngineDown
from ..synthesis.plan import Plan
from ..synthesis.request import SynthesisRequest
from ..synthesis.stream import Stream
from .control.goodput import AT_CAPACITY
from .engine import Engine
from .loader import load_all
from .placement import engine_configs
from .stats import EngineStats, FleetStats

log = logging.getLogger(__name__)


class Fleet:
    def __init__(self, engines: list[Engine], warm: threading.Event | None = None):
        """warm: the engines' capture gate, set once every engine has warmed up (start())."""
        self.engines = engines
        self.warm = warm if warm is not None else threading.Event()
        self.rejected = 0  # requests no engine had room for
        self._turn = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def load(cls, config: EngineConfig, random_weights: str | None = None, start: bool = True) -> Fleet:
        """Reads the weights once, copies them to every engine's devices, builds the engines and (start) waits
        until the first is ready; the others join the rotation when they are."""
        configs = engine_configs(config, torch.cuda.device_count() if torch.cuda.is_available() else 0)
        gpus = len({c.device for c in configs if c.device.startswith("cuda")})
        if gpus > 1:  # each unit compiles once per device index (its guards check it): room for all of them
            want_recompile_limit(8 * gpus)
        ckpts = load_all(configs, random_weights)
        warm = threading.Event()  # lazy captures wait for every engine's warm-up (cuda_graphs.GraphSet.gate)
        failing, _, at = config.fail_engine.partition("@")
        engines = [Engine(ckpt, c, capture_gate=warm,  # the process's capture lock (Engine's default)
                          fail_at_step=int(at) if failing == str(i) else None)
                   for i, (ckpt, c) in enumerate(zip(ckpts, configs))]
        fleet = cls(engines, warm)
        if start:
            fleet.start()
        return fleet

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self, wait: bool = True) -> None:
        """Warms the engines up one after the other (a CUDA graph captured on one GPU while another thread
        compiles for another failed), serving from the first ready one on; wait: until that one is ready."""
        threading.Thread(target=self._start_in_turn, name="fleet-start", daemon=True).start()
        if wait:
            self.wait_ready()

    def _start_in_turn(self) -> None:
        for engine in self.engines:
            engine.start(wait=False)
            engine.ready.wait()
        self.warm.set()

    def wait_all(self, timeout: float | None = None) -> bool:
        """Blocks until every engine has warmed up (or failed doing so)."""
        return self.warm.wait(timeout)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Blocks until an engine is ready (-> True), or every one failed (raises the first failure), or the
        timeout passed (-> False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.ready:
            if all(e.ready.is_set() for e in self.engines):  # all warmed up, none ready: all failed
                raise next(e.failure for e in self.engines if e.failure is not None)
            if end is not None and time.monotonic() > end:
                return False
            time.sleep(0.02)
        return True

    def settle(self, timeout: float = 120.0) -> bool:
        """Every engine warm and its lazily captured graphs in (engine.settle)."""
        end = time.monotonic() + timeout
        if not self.warm.wait(timeout):
            return False
        return all([e.settle(max(0.0, end - time.monotonic())) for e in self.engines if e.state == "ready"])

    def close(self) -> None:
        for engine in self.engines:
            engine.close()

    @property
    def ready(self) -> bool:
        return any(e.state == "ready" for e in self.engines)

    @property
    def failure(self) -> str | None:
        """Why no engine can serve, once none is loading or ready (None: one is, or will be)."""
        if any(e.state in ("loading", "ready") for e in self.engines):
            return None
        # each engine's own error was logged when it failed; clients see where, not what (errors.py: SEE_LOGS)
        return f"every engine failed ({', '.join(str(e.runner.device) for e in self.engines)}); {SEE_LOGS}"

    # ---- requests -----------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest | Plan, *, ignore_stop: bool = False,
               abandoned: Callable[[], bool] | None = None) -> Stream:
        """Queues the request on the engine with the most room; InputError at once; BusyError when none has
        room; EngineDown when none is in service; Abandoned once abandoned() says the client left (checked
        between the units of planning: Planner.plan)."""
        order = self.route(voice_affinity(request))
        if not order:
            if self.failure:
                raise EngineDown(self.failure)
            raise BusyError("no engine is ready yet; retry shortly")
        refusals: list[BusyError] = []
        for engine in order:
            try:
                return engine.submit(request, ignore_stop=ignore_stop, abandoned=abandoned)
            except BusyError as e:  # full: the next one
                refusals.append(e)
            except EngineDown:  # went down since route(): the next one
                continue
        with self._lock:
            self.rejected += 1
        raise busy(len(order), sum(len(e.scheduler.running) for e in order), sum(e.occupancy()[1] for e in order),
                   refusals)

    def synthesize(self, request: SynthesisRequest | Plan):
        return self.submit(request).result()

    def route(self, affinity: int | None = None) -> list[Engine]:
        """Ready engines, best first (best_first, with each engine's free slots and waiting requests)."""
        room = {i: e.occupancy() for i, e in enumerate(self.engines) if e.state == "ready"}  # read once each
        return [self.engines[i] for i in best_first(room, len(self.engines), next(self._turn), affinity)]

    # ---- what the front reports ---------------------------------------------------------------
    @property
    def max_streams(self) -> int:
        """Streams the ready engines decode together at most (RunPod's concurrency)."""
        return sum(e.max_streams for e in self.engines if e.state == "ready")

    @property
    def open_streams(self) -> int:
        """Requests taken in and not yet ended, over every engine (a drain waits for 0)."""
        return sum(e.open_streams for e in self.engines)

    def _any(self) -> Engine:
        return next((e for e in self.engines if e.state == "ready"), self.engines[0])

    @property
    def sample_rate(self) -> int:
        return self._any().sample_rate

    @property
    def frame_rate(self) -> float:
        return self._any().planner.frame_rate

    @property
    def codec_tag(self) -> str:
        return self._any().planner.codec_tag

    def voice_codes(self, audio: bytes) -> np.ndarray:
        """Stored voices are codes on the host: any engine's codec makes the same (the weights are copies)."""
        return self._any().planner.voice_codes(audio)

    def forget_voice(self, text: str, codes: np.ndarray) -> None:
        """A stored voice was deleted or replaced: every engine drops its cached prompt prefix."""
        for engine in self.engines:
            if engine.state == "ready":
                engine.forget_voice(text, codes)

    def stats(self) -> FleetStats:
        """The engines' stats summed (EngineStats.sum: the first ready engine's settings), with the requests no
        engine had room for, and every engine's own."""
        return EngineStats.sum([e.stats() for e in self.engines], rejected=self.rejected)


def best_first(room: dict[int, tuple[int, int]], n: int, turn: int, affinity: int | None) -> list[int]:
    """The indices of `room` ({member index: (free slots, waiting)} over the n members that can serve), best first:
    most free slots, then fewest waiting, ties in turn (`turn` counts the calls). affinity (a voice's,
    voice_affinity): its home member (affinity mod n) goes first while it has a free slot and at least half the free
    slots of the best, so a voice's requests meet its cached prompt prefix there instead of prefilling it once per
    member; past that, load wins. Fleet routes engines by it, the engine processes' front (ProcessFleet) processes."""
    order = sorted(room, key=lambda i: (-room[i][0], room[i][1], (i - turn) % n))
    home = affinity % n if affinity is not None else None
    if order and home in room and home != order[0] and room[home][0] > 0 and 2 * room[home][0] >= room[order[0]][0]:
        order.sort(key=lambda i: i != home)  # stable: the rest keep their order
    return order


def busy(members: int, running: int, waiting: int, refusals: Sequence[BaseException] = ()) -> BusyError:
    """The refusal when every engine refused a request (the same words for one process or several). When each
    refused for capacity (goodput admission: more streams would fall below real time), the first one's reason."""
    if refusals and all(isinstance(e, AtCapacity) for e in refusals):
        return AtCapacity(str(refusals[0]) if members == 1 else
                         f"every engine is at capacity ({running} streams running, {waiting} waiting; the first: "
                         f"{str(refusals[0])[len(AT_CAPACITY):].removesuffix('; retry shortly')}); retry shortly")
    return BusyError(f"the engine{'s are' if members > 1 else ' is'} busy ({running} streams running, {waiting} "
                     "waiting); retry shortly")


def voice_affinity(request: SynthesisRequest | Plan) -> int | None:
    """A stable number for the request's voice (its references' transcripts and audio or codes; None without
    references): requests of one voice share a home engine in Fleet.route."""
    refs = request.request.references if isinstance(request, Plan) else request.references
    if not refs:
        return None
    h = hashlib.blake2b(digest_size=8)
    for ref in refs:
        h.update(ref.text.encode())
        h.update(b"\0")
        h.update(ref.audio if ref.audio is not None else np.ascontiguousarray(ref.codes).tobytes())
        h.update(b"\1")
    return int.from_bytes(h.digest(), "little")
