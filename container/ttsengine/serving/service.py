"""One boot for every adapter (HTTP, SageMaker, RunPod): load and warm the engine, in the background or in the
caller's thread, wire the stored voices to it, and say whether it is ready or why it failed.

The service owns the engines: a Fleet (engine/fleet.py), one engine per device behind one front. Adapters
submit through the service and read its stats, never an engine's insides: `submit` routes to an engine,
`stats` and `max_streams` add theirs up, `ready` holds while one engine serves. Errors go out through
failure.py's table; the body limit is network/body_limit.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..config import DownloadConfig, EngineConfig
from ..engine import features as feature_names
from ..engine.control import heap
from ..engine.fleet import Fleet
from ..engine.stats import FleetStats
from ..errors import Abandoned, EngineDown, ShuttingDown, engine_failed
from ..synthesis.request import SynthesisRequest
from ..synthesis.stream import Stream
from .delivery import unless_left, use_resample_thread
from .download import ensure_model
from .failure import ModelFailed, ModelLoading
from .voices import VoiceStore

log = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PLANNING_THREADS = 8  # requests planned at once; references are decoded and encoded two at a time (voice_encoder.py)


def setup_logging(level: str) -> None:
    """The adapters' log lines: time, level, logger, message (TTS_LOG_LEVEL)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def engine_loader(config: EngineConfig, download: DownloadConfig | None = None) -> Callable[[], Fleet]:
    """-> a function that loads the engines and returns once the first is warm. With a model source in `download`
    it first fetches the model into config.model_dir unless that is complete (RunPod's first start on a fresh
    network volume)."""

    def load() -> Fleet:
        if download is not None and download.model_source:
            ensure_model(config.model_dir, download.model_source, download.hf_token)
        if own_process(config):
            return spawn_engine_processes(config)
        return Fleet.load(config)

    return load


def own_process(config: EngineConfig) -> bool:
    """TTS_ENGINE_PROCESS: on, off, or auto = on when the engines would run on a GPU (one process keeps CPU-only
    runs and tests simple; on a GPU the decode loop must not share a GIL with the HTTP front: issue 43)."""
    if config.process != "auto":
        return config.process == "on"
    wanted = config.device if config.devices == "auto" else config.devices  # as engine/placement.py reads them
    if wanted != "auto":
        return "cuda" in wanted
    import torch

    return torch.cuda.is_available()


def spawn_engine_processes(config: EngineConfig):
    """The engines in processes of their own: one per GPU (engine/placement.py's process_configs), behind a
    ProcessFleet when there are several, else one RemoteFleet."""
    import torch

    from ..engine.placement import process_configs
    from .engine_process.process_fleet import ProcessFleet
    from .engine_process.remote_fleet import RemoteFleet

    configs = process_configs(config, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    return RemoteFleet.spawn(config) if len(configs) == 1 else ProcessFleet.spawn(configs)


class Service:
    def __init__(self, load: Callable[[], Fleet], voices_dir: Path | None, features: str = "auto"):
        """load() -> a fleet with a warm engine (engine_loader, or a test's factory); voices_dir: where stored
        voices live (None: this deployment has none); features: TTS_FEATURES (direct_admit: see admit;
        resample_thread: this process's deliveries, delivery.use_resample_thread)."""
        self._load, self.voices_dir = load, voices_dir
        self.direct_admit = not feature_names.switched_off(features, feature_names.DIRECT_ADMIT)
        self.gc_freeze = not feature_names.switched_off(features, feature_names.GC_FREEZE)
        self._froze = False  # this front froze the heap: close() hands the objects back
        use_resample_thread(not feature_names.switched_off(features, feature_names.RESAMPLE_THREAD))
        self.fleet: Fleet | None = None
        self.voices: VoiceStore | None = None
        self.voices_error: str | None = None  # why stored voices are off although a directory was configured
        self.load_error: str | None = None  # why loading failed
        self.draining = False  # SIGTERM: no new requests, the ones in flight finish (drain)
        self._closed = False
        self._close_lock = threading.Lock()  # a drain thread and the main thread may both close
        self._thread: threading.Thread | None = None
        self.planning = Planning()
        self.serving_since: float | None = None  # time.monotonic() when the first engine served

    # ---- boot -----------------------------------------------------------------------------------------------
    def start(self) -> Service:
        """Loads on a background thread, so the adapter answers health checks meanwhile."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._load_logged, name="engine-loader", daemon=True)
            self._thread.start()
        return self

    def load(self) -> Service:
        """Loads in this thread (RunPod's worker, SageMaker's model_fn): returns when warm, raises what failed."""
        fleet = None
        try:
            fleet = self._load()
            if self.voices_dir is not None:
                try:
                    self.voices = VoiceStore(self.voices_dir, fleet.voice_codes, fleet.codec_tag, fleet.frame_rate)
                    self.voices.forget = getattr(fleet, "forget_voice", None)  # drops a changed voice's prefix
                except OSError as e:  # degrade, don't die: synthesis without stored voices is still a service
                    why = e.strerror or str(e)
                    self.voices_error = f"stored voices are disabled: {self.voices_dir} is not usable ({why})"
                    log.warning("%s; set TTS_DATA_DIR to a writable directory", self.voices_error)
        except Exception as e:
            self.load_error = f"{type(e).__name__}: {e}"
            if fleet is not None:
                fleet.close()  # its loop threads would outlive the failure
            raise
        if self.gc_freeze and getattr(fleet, "engines_elsewhere", False):  # feature gc_freeze: an engine in this
            # process freezes the heap itself once its captures are in (engine.py); engines in processes of their own
            # leave this front's heap (the web framework's, torch's) to it, now that its start-up is over
            seconds, frozen = heap.freeze()
            self._froze = True
            log.info("froze the front's heap (gc_freeze): %d objects out of the collector's full passes, %.2f s",
                     frozen, seconds)
        processes = getattr(fleet, "processes", 1)  # ProcessFleet: engine processes behind this front
        if processes > 1:  # a planning thread here only waits for its process to plan: as many per process as one has
            self.planning.close()  # nothing is in it: requests are refused until self.fleet is set
            self.planning = Planning(PLANNING_THREADS * processes)
        self.serving_since = time.monotonic()
        self.fleet = fleet  # last: ready implies the voices are wired
        return self

    def _load_logged(self) -> None:
        try:
            self.load()
        except Exception:  # noqa: BLE001 - kept in self.error, reported by the adapter's health check
            log.exception("the engine failed to load")

    @property
    def error(self) -> str | None:
        """Why nothing can be served: loading failed, or every engine failed since (health checks say it)."""
        if self.load_error:
            return self.load_error
        return self.fleet.failure if self.fleet is not None else None

    @property
    def ready(self) -> bool:
        """At least one engine serves (the others may still warm up, or be out of service: see `health`), and
        the service is not draining."""
        return self.fleet is not None and self.fleet.ready and not self.draining

    def warming(self, when: str, max_wait: float, stats: FleetStats | None = None) -> int:
        """The readiness probes' rule (/ready, SageMaker's /ping; TTS_READY_WHEN): how many graphs the serving engines
        still have to capture before a burst meets them at full speed (0: none, or not waited for). "serving": 0 once
        an engine serves. "settled": their count until none is left, but never longer than max_wait seconds after
        the first engine served (a server under constant load captures the rest at first use: its probe must not
        fail forever). A failed capture is not left pending (it runs uncaptured), nor is a failed engine's.
        stats: a snapshot the caller already took (each fleet.stats() is a round trip to every engine process)."""
        if when == "serving" or not self.ready or self.serving_since is None:
            return 0
        if time.monotonic() - self.serving_since > max_wait:
            return 0
        try:
            engines = (stats or self.fleet.stats()).engines
        except EngineDown:
            return 0
        return sum(e.graphs_pending for e in engines if e.state == "ready")

    def settle(self, when: str, max_wait: float, poll: float = 0.5) -> float:
        """For adapters that start taking work themselves once loaded (RunPod's worker, SageMaker's model_fn): waits
        while warming() says graphs are pending, as /ready would answer 503 -> seconds waited."""
        start, said = time.monotonic(), None
        while pending := self.warming(when, max_wait):
            if pending != said:
                log.info("%d start-up step(s) left (CUDA graphs to capture, the heap's freeze) before taking work "
                         "(TTS_READY_WHEN=settled, at most "
                         "TTS_READY_MAX_WAIT=%gs)", pending, max_wait)
                said = pending
            time.sleep(poll)
        return time.monotonic() - start

    def health(self, stats: FleetStats | None = None) -> dict:
        """status ok | degraded (an engine is out of service or still warming up) | loading | failed, with each
        engine's device and state once loaded. An engine's error is one public line (errors.py: engine_failed);
        its own text is in the server log. stats: a snapshot the caller already took."""
        if self.error:
            return {"status": "failed", "error": self.error}
        if self.fleet is None:
            return {"status": "loading"}
        try:
            stats = stats or self.fleet.stats()
        except EngineDown as e:  # the engine process died while we asked (serving/engine_process)
            return {"status": "failed", "error": str(e)}
        state = "draining" if self.draining else stats.total.state
        engines = [{"index": i, "device": e.device, "codec_device": e.codec_device, "state": e.state,
                    "error": engine_failed(e.device) if e.error else None,
                    "running": e.running, "waiting": e.waiting, "max_streams": e.max_streams,
                    "graphs_pending": e.graphs_pending}
                   for i, e in enumerate(stats.engines)]
        status = {"ready": "ok"}.get(state, state)  # degraded, draining, loading
        return {"status": status, "engines": engines}

    def require(self) -> Fleet:
        """The fleet, or ModelFailed / ModelLoading (both 503) for a request that came too early or in vain."""
        if self.draining:
            raise ShuttingDown("the server is shutting down; retry shortly")
        if self.load_error:
            raise ModelFailed(f"the model failed to load: {self.load_error}")
        if self.error:
            raise ModelFailed(f"the model is out of service: {self.error}")
        if not self.ready:
            raise ModelLoading("the model is loading; retry shortly")
        return self.fleet

    # ---- what adapters ask of the engine(s) ---------------------------------------------------------------
    def submit(self, request: SynthesisRequest, abandoned: Callable[[], bool] | None = None) -> Stream:
        """In the caller's thread (blocks while the request is planned). abandoned: see admit()."""
        fleet = self.require()
        return fleet.submit(request) if abandoned is None else fleet.submit(request, abandoned=abandoned)

    async def admit(self, request: SynthesisRequest, gone: Callable[[], Awaitable[bool]] | None = None) -> Stream:
        """submit() in the service's own planning threads (Planning, below), never the event loop's shared pool:
        gone() (the client left?) is asked while it waits or is planned; then it is given up (Abandoned, 499).
        Engines in processes of their own plan it there: the event loop hands it over and awaits the answer
        (RemoteFleet.admit; feature direct_admit), unless it carries reference audio to send (megabytes: a
        planning thread sends those)."""
        fleet = self.require()  # a 503 without waiting for a planning thread
        direct = getattr(fleet, "admit", None)  # RemoteFleet, ProcessFleet
        if direct is not None and self.direct_admit and all(r.audio is None for r in request.references):
            return await direct(request, gone)
        return await self.planning.submit(self.submit, request, gone)

    @property
    def max_streams(self) -> int:
        return self.require().max_streams

    def stats(self) -> FleetStats | None:
        """The engines' stats (summed, and each engine's), or None before they are loaded."""
        return self.fleet.stats() if self.fleet is not None else None

    # ---- shutdown ------------------------------------------------------------------------------------------
    def drain(self, seconds: float, refuse_new: bool = True) -> bool:
        """Stops taking requests (ShuttingDown: 503, /ready 503) and waits up to `seconds` for the ones in flight
        to end; -> whether they all did. close() then cuts what is left (each such stream ends with an error).
        refuse_new=False waits without refusing (RunPod: the jobs its SDK already took still run in the window)."""
        if refuse_new:
            self.draining = True
        end = time.monotonic() + seconds
        while self.fleet is not None and self.fleet.open_streams and time.monotonic() < end:
            time.sleep(0.05)  # a shutdown-time poll, not the decode path
        left = self.fleet.open_streams if self.fleet is not None else 0
        if left:
            log.warning("drain: %d request(s) still running after %.0f s are cut", left, seconds)
        return left == 0

    def close(self) -> None:
        """Idempotent; a second caller waits until the first has closed the engines (so a process never exits
        while another thread is half-way through)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self.draining = True
            self.planning.close()
            if self.fleet is not None:
                self.fleet.close()
            if self._froze:
                heap.thaw()


class Planning:
    """Where the adapters' requests are submitted (Service.admit): a bounded pool of threads of its own, apart from
    the event loop's default thread pool, so planning (text tokenized, reference audio decoded and encoded; with
    the engine process, the wait for it to do that) never holds up the health checks, metrics and other small work
    that pool runs (issue 50: 45 abandoned one-reference requests made /health take 12 s). A request whose client
    leaves is given up: dropped if its planning has not started, stopped before its next reference if it has
    (Abandoned), and its stream cancelled if the engine took it meanwhile."""

    def __init__(self, threads: int = PLANNING_THREADS):
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="planning")
        self.dropped = 0  # requests given up before their planning started
        self.abandoned = 0  # requests whose client left while they were planned (stopped, or cancelled after)

    async def submit(self, submit: Callable[..., Stream], request: SynthesisRequest,
                     gone: Callable[[], Awaitable[bool]] | None = None) -> Stream:
        """submit(request, abandoned=...) in the pool -> its Stream. gone(): whether the client left (e.g. the
        HTTP request's is_disconnected), asked every delivery.POLL seconds while the request waits or is planned;
        once it says so the request is given up and Abandoned raised. A cancelled caller (the event loop cancelled the
        task) gives it up the same way."""
        left = threading.Event()

        def work() -> Stream:
            Abandoned.check(left.is_set)  # a client that left while this waited for a thread
            return submit(request, abandoned=left.is_set)

        future = self._pool.submit(work)
        waiting = asyncio.wrap_future(future)
        try:
            return await unless_left(waiting, gone, "the client left before the request was taken in")
        except BaseException:
            if not future.done():
                self._give_up(future, left)
                waiting.cancel()  # its result, when it comes, is nobody's (no "never retrieved" warning)
            raise

    def _give_up(self, future: Future, left: threading.Event) -> None:
        left.set()
        if future.cancel():  # not started: dropped
            self.dropped += 1
            return
        self.abandoned += 1
        future.add_done_callback(_cancel_stream)  # taken in before it saw `left`: nobody will read it

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _cancel_stream(future: Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().cancel()
