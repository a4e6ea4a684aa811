"""The serving engine: one loop thread owns the device and runs schedule -> run -> update.

Each iteration: take new requests and cancellations, prefill this step's prompt chunks (new streams'
first chunks, then continuations of long prompts, within a budget that keeps decoding streams real time;
a stream's last chunk arms its first frame), one decode step for every decoding stream (a CUDA graph per
batch bucket on GPU), read the frames back with one copy, stop finished streams, decode new frames to audio
in batches, hand chunks to their streams. Long texts continue chunk by chunk with the previous chunk as
context. A prompt prefix shared with earlier requests (a voice's references) is read from the prefix cache's
pages instead of prefilled again (prefix_cache.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from ..config import EngineConfig
from ..errors import BusyError, EngineDown, ShuttingDown, TTSError, no_audio
from ..model.checkpoint import Checkpoint
from ..model.dual_ar import DualAR
from ..synthesis.output import SynthesisResult
from ..synthesis.plan import ChunkReport, Plan, Planner
from ..synthesis.request import SynthesisRequest
from ..synthesis.stream import Stream
from . import features
from .audio_feed import CodecRounds, Task, chunk_sizes, codec_calls, final_calls, pending_codes
from .control.faults import FaultCounter, simulated
from .control.prefill_budget import PrefillBudget
from .control.prefix_cache import PrefixCache, prefix_key
from .control.scheduler import Chunk, Job, Scheduler
from .device.compile.kernel_cache import KernelCache
from .device.cuda_graphs import GraphSet
from .device.in_flight import InFlight
from .device.runner import PrefillItem, Runner, RunnerConfig
from .device.vocoder import VOCODER_GRAPH_ROWS, Delivery, Vocoder
from .loader import load
from .metrics import EngineMetrics
from .settings import BatchSettings, snake_kernel_usable

IDLE_BEFORE_CAPTURE = 0.25  # s the loop waits idle before capturing a lazy graph (~0.25 s each on an H100)

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, checkpoint: Checkpoint, config: EngineConfig,
                 runner: Callable[[DualAR, RunnerConfig], Runner] = Runner, capture_lock: threading.RLock | None = None,
                 capture_gate: threading.Event | None = None, fail_at_step: int | None = None):
        """runner: makes the device side (tests pass a scripted stand-in with Runner's methods); capture_lock:
        shared by the engines of one process (fleet.py), since cuDNN's autotune flag is process-wide;
        capture_gate: graphs left for later are captured only once it is set (fleet.py: every engine warm);
        fail_at_step: the TTS_TEST_FAIL_ENGINE hook (this engine's decode step that fails as a lost GPU would)."""
        self.ckpt, self.config = checkpoint, config
        self.settings = s = BatchSettings.resolve(config, checkpoint)
        # one CUDA graph capture at a time: decode step or codec
        self._capture_lock = capture_lock if capture_lock is not None else threading.RLock()
        self._faults, self._fail_at, self._gate = FaultCounter(), fail_at_step, capture_gate
        self.down: str | None = None  # why the engine was taken out of service (faults.py)
        # voice encoding's convolutions wait for the codec's autotuned capture windows (cudnn_autotune_mode)
        self.planner = Planner(checkpoint, config, self.kv_positions,
                               encode_lock=self._capture_lock if s.cudnn_autotune == "graphs" else None)
        self.kernel_cache = KernelCache(config.cache_dir, {
            "model": repr(checkpoint.config), "codec": repr(checkpoint.codec_config),
            "dtype": str(checkpoint.model.norm.weight.dtype), "quant": checkpoint.quantization,
            "buckets": s.buckets, "chunks": (s.first_chunk_frames, s.stream_chunk_frames),
            **features.cache_key(s.features),  # the kernels on and the codec features that shape compiled code
            # which buckets run compiled units (those above layer_gemv's rows)
            "layer_gemv_rows": s.runner.gemv_rows if features.LAYER_GEMV in s.runner.fused else 0})
        if s.compile or s.cuda_graphs:
            self.kernel_cache.setup()
        self.runner = runner(checkpoint.model, s.runner)
        # the prefix cache: admission counts its pages (scheduler), the page pool evicts from it (runner)
        self.prefix_cache = PrefixCache() if s.prefix_cache else None
        self.runner.pages.cache = self.prefix_cache
        self.scheduler = Scheduler(s.runner.max_slots, s.max_queue, s.runner.num_pages - 1, s.runner.page_size,
                                   s.prefill_tokens, self.prefix_cache)
        self.budget = PrefillBudget(s.prefill_tokens, checkpoint.codec.frame_length / checkpoint.codec.sample_rate,
                                    s.runner.page_size)
        self._forget: deque[str] = deque()  # prefix keys to drop (a voice deleted or replaced), any thread
        self.metrics = EngineMetrics()
        self.vocoder = Vocoder(checkpoint.codec, s.runner.max_slots, checkpoint.config.max_seq_len,
                               chunk_sizes(s.first_chunk_frames, s.stream_chunk_frames), s.buckets, self._capture_lock,
                               self.metrics.vocoded, self.metrics.completed, s.codec_channels_last)
        if s.compile:
            precompile = features.PRECOMPILE in s.features
            self.runner.enable_compile(self.kernel_cache.precompiled_dir if precompile else None)
        self.vocoder.apply(s.codec)
        self.vocoder.set_merge(s.codec_merge_rows)
        self.vocoder.pinned_copy = s.codec_pinned_copy
        self.rounds = CodecRounds(s.first_chunk_frames, s.stream_chunk_frames,
                                  checkpoint.codec.frame_length / checkpoint.codec.sample_rate, s.codec_rounds,
                                  VOCODER_GRAPH_ROWS)
        if s.cudnn_autotune == "process":  # cuDNN picks each conv shape's fastest algorithm at its first call
            torch.backends.cudnn.benchmark = True
        self.graphs = self._step_graphs() if s.cuda_graphs else None
        self.eos = checkpoint.tokenizer.im_end_id
        self._free_voc = list(range(s.runner.max_slots - 1, -1, -1))
        self._inbox: deque[Task] = deque()
        self._cv = threading.Condition()
        self._streams: set[Stream] = set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        self.warmup_seconds: float | None = None
        self.compile_error: str | None = None
        self._failed: BaseException | None = None  # what warm-up raised, re-raised by start()
        # two pinned buffers: with overlapped steps one receives step k+1's frames while the host reads step k's
        self._host_out = torch.empty(2, s.runner.max_slots, checkpoint.config.num_codebooks + 1, dtype=torch.int64,
                                     pin_memory=self.runner.device.type == "cuda")
        self._flip = 0
        self._in_flight: InFlight | None = None  # the launched step not read yet (feature overlap_step)

    @classmethod
    def load(cls, config: EngineConfig, start: bool = True) -> Engine:
        engine = cls(load(config), config)
        if start:
            engine.start()
        return engine

    @property
    def max_streams(self) -> int:
        """Streams decoded together at most (the slots of the batch)."""
        return self.settings.max_slots

    @property
    def compiled(self) -> bool:
        """The decode step's units run through torch.compile (False after a compile failure fell back)."""
        return self.runner.compiled

    @property
    def kv_positions(self) -> int:
        """KV cache positions shared by all streams (the scratch page excluded)."""
        return self.settings.kv_positions

    @property
    def sample_rate(self) -> int:
        return self.ckpt.codec.sample_rate

    @property
    def voice_encoder(self):
        return self.planner.voice_encoder

    @property
    def frame_rate(self) -> float:
        """Code frames per second of audio (21.53 for S1)."""
        return self.sample_rate / self.ckpt.codec.frame_length

    @property
    def codec_tag(self) -> str:
        """Identifies the codec that stored voice codes were made with."""
        from ..model.weights import fingerprint

        return fingerprint(self.ckpt.codec)

    def voice_codes(self, audio: bytes) -> np.ndarray:
        """Reference audio (any soundfile-readable bytes) -> codes int64 [n, F]; InputError if unreadable."""
        return self.voice_encoder.codes_from_bytes(audio).numpy()

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self, wait: bool = True) -> None:
        """Starts the loop thread; it warms up (captures graphs) first, then `ready` is set."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tts-engine", daemon=True)
            self._thread.start()
        if wait:
            self.ready.wait()
            if self._failed is not None:
                raise self._failed

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.vocoder.close()

    # ---- requests -----------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest | Plan, *, ignore_stop: bool = False) -> Stream:
        """Validates and queues a request; raises InputError (bad request) or BusyError (full) at once."""
        plan = self.planner.plan(request)  # the capacity guard: every chunk fits this engine's cache
        plan.ignore_stop = plan.ignore_stop or ignore_stop
        stream = Stream(plan, self.sample_rate, str(self.runner.device))
        prompt, _ = self.planner.chunk_prompt(plan, 0, None)
        task = Task(stream, plan, 0, prompt, False, 0)
        with self._cv:
            if self.down is not None:
                raise EngineDown(f"the engine on {self.runner.device} is out of service: {self.down}")
            if self._stop:
                raise ShuttingDown("the server is shutting down; retry shortly")
            if len(self._inbox) + self.scheduler.queue_depth >= self.settings.max_queue:
                self.metrics.rejected += 1
                raise BusyError(f"the engine is busy ({len(self.scheduler.running)} streams running, "
                                f"{self.scheduler.queue_depth + len(self._inbox)} waiting); retry shortly")
            self._inbox.append(task)
            self._streams.add(stream)
            self._cv.notify_all()
        return stream

    def synthesize(self, request: SynthesisRequest | Plan) -> SynthesisResult:
        return self.submit(request).result()

    def occupancy(self) -> tuple[int, int]:
        """(slots not spoken for, requests waiting): the router's hint (fleet.py). Under the lock, so a request
        moving from the inbox to the scheduler (_intake) is counted once, never zero times."""
        with self._cv:
            waiting = self.scheduler.queue_depth + len(self._inbox)
            return self.settings.max_slots - len(self.scheduler.running) - waiting, waiting

    @property
    def open_streams(self) -> int:
        """Requests taken in and not yet ended (queued, generating, or their last audio being decoded)."""
        with self._cv:
            return len(self._streams)

    @property
    def state(self) -> str:
        """loading | ready | failed (warm-up raised) | down (taken out of service while serving)."""
        if self.down is not None:
            return "down"
        if not self.ready.is_set():
            return "loading"
        return "failed" if self._failed is not None else "ready"

    @property
    def error(self) -> str | None:
        """Why the engine is failed or down."""
        if self.down is not None:
            return self.down
        return f"{type(self._failed).__name__}: {self._failed}" if self._failed is not None else None

    def forget_voice(self, text: str, codes: np.ndarray) -> None:
        """A stored voice was deleted or replaced: its cached prefix is dropped at the next step (its pages
        free now, or when the streams reading them end). Its key would never match again anyway (a replaced
        voice's prompt differs); this frees the memory sooner than LRU eviction would."""
        if self.prefix_cache is None:
            return
        prefix = self.planner.prefix([(text, torch.as_tensor(np.asarray(codes), dtype=torch.int64))])
        key, _ = prefix_key(prefix, prefix.shape[1], self.settings.runner.page_size)
        if key is not None:
            with self._cv:
                self._forget.append(key)
                self._cv.notify_all()

    def stats(self) -> dict:
        cache = self.prefix_cache
        return {**self.metrics.snapshot(running=len(self.scheduler.running),
                                        waiting=self.scheduler.queue_depth + len(self._inbox),
                                        device=self.runner.device, prefix_cache=cache),
                "device": str(self.runner.device), "codec_device": str(self.vocoder.device), "state": self.state,
                "error": self.error,
                "quantization": self.ckpt.quantization, "kernel_cache": self.kernel_cache.status,
                "precompiled": self.precompiled, "compiled": self.compiled,
                "cuda_graphs": self.graphs is not None, "max_streams": self.max_streams,
                "kv_positions": self.kv_positions, "memory_preset": self.settings.preset.as_dict()}

    @property
    def precompiled(self) -> str:
        """The decode step's precompiled units (engine/device/compile/precompiled.py): "off", or variants loaded from
        the cache / traced by this process."""
        counts = self.runner.precompiled()
        return "off" if counts is None else f"{counts['loaded']} loaded, {counts['compiled']} traced"

    # ---- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:  # whatever fails before ready is start()'s error: never a start() that waits forever
            if self.runner.device.type == "cuda":
                torch.cuda.set_device(self.runner.device)  # Triton launches on the thread's current device
                if self.settings.step_priority:  # this thread's work (steps, prefill) ahead of the codec's for the SMs
                    stream = torch.cuda.Stream(self.runner.device, priority=-1)
                    stream.wait_stream(torch.cuda.current_stream(self.runner.device))  # buffers made on the old one
                    torch.cuda.set_stream(stream)
            with torch.inference_mode():
                start = time.perf_counter()
                self._warm_up()
                self.warmup_seconds = time.perf_counter() - start
                self.metrics.warmup_seconds = self.warmup_seconds
                if self.runner.compiled and self.kernel_cache.status in ("miss", "mismatch"):
                    self.kernel_cache.save_metadata()
            s = self.settings
            log.info("engine ready: %d slots, %d KV pages of %d, graphs %s, compile %s, fused %s, features %s, "
                     "quantization %s, kernel cache %s, precompiled %s, warm-up %.1f s", s.max_slots,
                     s.runner.num_pages, s.runner.page_size, "on" if self.graphs else "off",
                     "on" if self.runner.compiled else "off", ",".join(sorted(self.runner.fused_in_use)) or "off",
                     features.describe(s.features), self.ckpt.quantization,
                     self.kernel_cache.status, self.precompiled, self.warmup_seconds)
        except BaseException as e:  # noqa: BLE001 - reported to start()
            log.exception("engine warm-up failed")
            self._failed = e
            self.ready.set()
            return
        self.ready.set()
        with torch.inference_mode():
            while True:
                with self._cv:
                    if self._idle() and self._graphs_pending():
                        self._cv.wait(timeout=IDLE_BEFORE_CAPTURE)  # a request arriving now goes first
                    idle = self._idle()
                    if idle and not self._graphs_pending():
                        self._cv.wait(timeout=1.0)
                        continue
                    if self._stop:
                        break
                try:
                    if idle:  # every slot is free: capture one more bucket's graphs (lazy start-up)
                        self._capture_next()
                        continue
                    t0 = time.perf_counter()
                    try:
                        self._iteration()
                    finally:  # a failed iteration's time too (its step wait may be counted already)
                        self.metrics.iteration(time.perf_counter() - t0)
                    self._faults.succeeded()
                except Exception as e:  # noqa: BLE001 - keep serving; the affected streams get the error
                    why = self._faults.failed(e)
                    if why is not None:
                        self._go_down(why)
                        return
                    log.exception("engine step failed; failing the in-flight requests")
                    self.metrics.failed_streams += len(self._streams)
                    self._fail_all(TTSError(f"internal engine error: {type(e).__name__}: {e}"))
        self._fail_all(ShuttingDown("the server shut down before this request finished; retry it"))

    def _go_down(self, why: str) -> None:
        """Takes the engine out of service: every stream ends with the reason, nothing touches the device
        again (a lost GPU's calls would fail or hang), new requests are refused (EngineDown)."""
        log.error("the engine on %s is taken out of service: %s", self.runner.device, why, exc_info=True)
        error = EngineDown(f"the engine on {self.runner.device} failed and was taken out of service ({why})")
        with self._cv:
            self.down = why
            streams, self._streams = list(self._streams), set()
            self._inbox.clear()
            # host-side bookkeeping only (no page or slot resets on the device): a down engine reports no
            # running or waiting streams in /health and /metrics
            self.scheduler.release(list(self.scheduler.running))
            self.scheduler.waiting.clear()
        self._in_flight = None  # its frames belong to the streams just failed
        self.metrics.failed_streams += len(streams)
        for stream in streams:
            stream.finish(error)

    def _idle(self) -> bool:
        return not self._stop and not self._inbox and not self._forget and not self.scheduler.has_work()

    def _warm_up(self) -> None:
        """Compiles and captures the decode step for every bucket (all slots idle: no side effects)."""
        if self.graphs is None and not self.runner.compiled:
            return  # eager: nothing to prepare
        try:
            # the codec warms up on its thread while this one compiles the decode step (all slots idle:
            # the steps change nothing); the graphs are captured one thread at a time afterwards
            codec_done = self.vocoder.call_async(self.vocoder.warm_up)
            try:
                for bb in self.settings.warm_buckets if self.graphs is not None else self.settings.buckets:
                    self.runner.decode_step(bb)
            finally:
                self._codec_warmed(codec_done)
            self._capture()
        except Exception as e:  # noqa: BLE001 - compile problems must not take the service down
            if not self.runner.compiled:
                raise
            log.warning("torch.compile of the decode step failed (%s: %s); serving without compile",
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            self.runner.disable_compile()
            self.vocoder.disable_compile()
            self.compile_error = f"{type(e).__name__}: {e}"
            if self.graphs is not None:
                self.graphs = self._step_graphs()
                self._capture()

    def _codec_warmed(self, wait) -> None:
        """Waits for the codec's warm-up; a compiled codec that fails falls back to the eager one alone (the
        decode step keeps its compile)."""
        try:
            wait()
        except Exception as e:  # noqa: BLE001 - the codec's compile is optional
            if not self.vocoder.compiled:
                raise
            log.warning("torch.compile of the codec failed (%s: %s); the codec runs eager", type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")
            self.vocoder.disable_compile()
            self.compile_error = f"codec: {type(e).__name__}: {e}"
            if snake_kernel_usable(self.config, self.vocoder.device.type == "cuda"):
                self.vocoder.use_snake_kernel()
            self.vocoder.call(self.vocoder.warm_up)

    def _step_graphs(self) -> GraphSet:
        """The decode step's CUDA graphs, one per batch bucket (its state lives in the runner's buffers); and
        the prefill's, one per padded shape (runner.prefill_key), captured at first use or while idle."""
        graphs = GraphSet("decode-step", self._capture_lock, lambda bb: self.runner.decode_step(bb))
        graphs.plan(list(self.settings.buckets))
        graphs.gate = self.vocoder.graphs.gate = self._gate
        if self.settings.prefill_graphs:
            r = self.runner
            prefill = GraphSet("prefill", self._capture_lock, lambda key, *inputs: r.prefill_layers(*inputs),
                               r.prefill_scratch_inputs)
            prefill.plan(r.prefill_graph_keys())
            prefill.gate = self._gate
            r.prefill_graphs = prefill
        return graphs

    def _capture(self) -> None:
        """The codec's graphs (on its thread), then the decode step's (lazy: the smallest bucket of each
        before ready, the rest while idle)."""
        if self.graphs is not None:
            self.vocoder.plan_graphs(VOCODER_GRAPH_ROWS)
            rows = self.vocoder.pending_rows[:1] if self.settings.lazy_graphs else None
            self.vocoder.call(lambda: self.vocoder.capture(rows))
            self.graphs.capture(self._start_buckets)

    def _graphs_pending(self) -> bool:
        if self.graphs is None or (self._gate is not None and not self._gate.is_set()):
            return False
        prefill = self.runner.prefill_graphs
        return bool(self.graphs.pending or self.vocoder.pending_rows or (prefill is not None and prefill.pending))

    def _capture_next(self) -> None:
        """One more lazy capture, every slot idle: the smaller pending batch of the decode step and the codec
        (the codec's on its thread; this thread waits, so captures stay one at a time), then the prefill's."""
        step, codec = self.graphs.pending[:1], self.vocoder.pending_rows[:1]
        if step and (not codec or step[0] <= codec[0]):
            self.graphs.capture_next()
        elif codec:
            self.vocoder.call(self.vocoder.capture_next)
        else:
            self.runner.prefill_graphs.capture_next()

    def settle(self, timeout: float = 120.0) -> bool:
        """Waits until the graphs left for later (lazy start-up) are captured; -> whether they all are."""
        end = time.monotonic() + timeout
        while self._graphs_pending() and time.monotonic() < end:
            time.sleep(0.05)
        return not self._graphs_pending()

    @property
    def _start_buckets(self) -> tuple[int, ...] | None:
        """Decode graphs captured before ready: the smallest bucket when lazy, else all (None)."""
        return self.settings.buckets[:1] if self.settings.lazy_graphs else None

    def _iteration(self) -> None:
        self._intake()
        self._cancellations()
        running = self.scheduler.running
        # while streams decode and some running stream's audio has started (decoding, or prefilling its next text
        # chunk), the budget at the bucket of the step each admission brings it to (prefill_budget.py): a burst onto
        # running streams goes in at the pace the small steps leave room for, not the full batch's. Until one has
        # audio, nothing can stall: a burst onto an idle engine goes in as it arrives (TTS_PREFILL_TOKENS per step).
        # Budgeted, the prefill's ~5 ms per call (H100; one call of 8 prompts or fewer) read as a per-token cost
        # held 64 arrivals to 5-11 per step: the last began decoding 141 ms after the first (ramp_trace.py)
        playing = any(j.decoding for j in running) and any(j.owner.playing for j in running)
        t0 = time.perf_counter()
        bucket_of = self.settings.bucket
        chunks = self.scheduler.schedule(lambda rows: self.budget.tokens(bucket_of(rows) if playing else 0))
        begun = None
        if self.settings.overlap_step and self.runner.device.type == "cuda":
            # overlapped, the host's clock cannot time this iteration's GPU work (the step before may still run,
            # or the host may be the slower side): GPU events from here to the step's end do
            begun = torch.cuda.Event(enable_timing=True)
            begun.record()
        if chunks:
            self._prefill(chunks)
        tokens = sum(c.tokens for c in chunks)
        launched = self._launch(tokens, t0, begun) if any(j.decoding for j in running) else None
        if self._in_flight is not None:  # the step before, still running while this one was queued behind it
            self._read(self._in_flight)
        self._in_flight = launched
        # without overlap, or when no stream is left to decode (its rows were past their ends): read it now, so an
        # idle engine has no step in flight
        if launched is not None and (not self.settings.overlap_step or not self.scheduler.running):
            self._in_flight = None
            self._read(launched)
        self._vocode()

    def _intake(self) -> None:
        # under the lock: submit() and occupancy() never see a request in neither the inbox nor the scheduler
        # (max_queue would be overrun, the router would see a free engine); _enqueue is host-side and short
        with self._cv:
            tasks, self._inbox = list(self._inbox), deque()
            for task in tasks:
                self._enqueue(task, front=False)
            forget, self._forget = list(self._forget), deque()
        for key in forget:
            self._drop_prefix(key)

    def _drop_prefix(self, key: str) -> None:
        """The prefix cache forgets `key`; its pages go back to the pool now, or when the streams reading them end."""
        self.runner.pages.unref(self.prefix_cache.forget(key))

    def _enqueue(self, task: Task, front: bool) -> None:
        budget = self.planner.budget(task.prompt, task.plan)
        key, pages = None, 0
        if self.prefix_cache is not None:
            key, pages = prefix_key(task.prompt, min(task.plan.prefix_length, task.prompt.shape[1] - 1),
                                    self.settings.runner.page_size)
        job = Job(task.prompt.shape[1], budget, owner=task, stop_on_eos=not task.plan.ignore_stop,
                  prefix_key=key, prefix_pages=pages)
        task.job = job
        try:
            self.scheduler.submit(job, front=front)
        except BusyError as e:
            task.stream.finish(e)

    def _cancellations(self) -> None:
        for job in self.scheduler.waiting:
            if job.owner.stream.cancelled:
                job.cancelled = True
        for job in self.scheduler.cancel_waiting():
            self._close(job.owner, "cancelled")
        done = [j for j in self.scheduler.running if j.owner.stream.cancelled]
        for job in done:
            job.finish_reason = "cancelled"
        if done:
            self._release(done)

    def _prefill(self, chunks: list[Chunk]) -> None:
        t0 = time.perf_counter()
        items = []
        for chunk in chunks:
            job = chunk.job
            task: Task = job.owner
            req = task.plan.request
            if task.voc_slot < 0:  # the job's first chunk
                if job.prefix is not None:  # a prefix-cache hit: the slot starts with the cached pages
                    self.runner.share_prefix(job.slot, job.prefix.pages)
                task.voc_slot = self._free_voc.pop()
                task.stream.start()  # host clock only: the queue wait /metrics reports
            items.append(PrefillItem(job.slot, task.prompt, (req.temperature, req.top_p, req.repetition_penalty,
                                                             req.seed), task.frame_offset, chunk.start, chunk.end))
        self.runner.prefill(items)  # a last chunk arms its stream: the next decode step samples its first frame
        for chunk in chunks:  # a miss that wrote its prefix's pages offers them to later requests
            if self.scheduler.can_cache(chunk.job):
                job = chunk.job
                self.scheduler.cache_prefix(job, self.runner.keep_prefix(job.slot, job.prefix_pages))
        self.metrics.prefill(sum(c.tokens for c in chunks), time.perf_counter() - t0)

    def _launch(self, prefill_tokens: int, started: float, begun: torch.cuda.Event | None = None) -> InFlight:
        """Queues one decode step over the running jobs and the copy of its frames to the host; no sync."""
        if self._fail_at is not None and self.metrics.steps + 1 >= self._fail_at:
            raise simulated(str(self.runner.device))
        running = self.scheduler.running
        # a job whose prompt is still going in keeps an idle row: its frame is not read, its table row is scratch.
        # A job the step in flight makes a frame for writes one position further than its count says.
        ahead = self._in_flight.ahead() if self._in_flight is not None else set()
        self.runner.ensure_pages([(j.slot, j.prompt_len + j.generated - 1 + (id(j) in ahead)) for j in running
                                  if j.decoding])
        B = len(running)
        bb = self.settings.bucket(B)
        out = self.graphs.run(bb) if self.graphs is not None else self.runner.decode_step(bb)
        host = self._host_out[self._flip, :B]
        self._flip ^= 1
        host.copy_(out[:B], non_blocking=True)
        event = None
        if self.runner.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=begun is not None)
            event.record(torch.cuda.current_stream(self.runner.device))
        return InFlight([j if j.decoding else None for j in running], host, event, bb, prefill_tokens, started, begun)

    def _read(self, step: InFlight) -> None:
        """Takes a launched step's frames: records them on their jobs, finishes the jobs that ended."""
        frames = step.frames()
        # the iteration's prefill + step (prefill_budget.py times the steps it sizes): GPU events when overlapped,
        # else the host's clock from the iteration's start to this wait
        seconds = step.gpu_seconds()
        if seconds is None:
            seconds = time.perf_counter() - step.started
        makers = [j if j is not None and j.finish_reason is None else None for j in step.makers]
        finished = self.scheduler.record_frames(frames[:, 0].tolist(), self.eos, makers)
        for job, frame in zip(makers, frames):
            if job is not None:
                job.owner.frames.append(frame)
        self.metrics.step(sum(j is not None for j in makers), seconds, step.waited)
        self.budget.observe(step.bucket, step.prefill_tokens, seconds)
        if finished:
            self._release(finished)

    def _release(self, jobs: list[Job]) -> None:
        """Finishes jobs: decode their remaining audio, free their slots, continue or close streams."""
        # the jobs' last audio in shared codec calls: streams started together end at the same step, and a call per
        # stream (each followed by its reset and finish, which stop the codec thread's merge) left a queue of
        # one-row calls behind the last step (H100, 64 streams: ~120 ms of a 1.5 s run)
        self._vocode_tasks([j.owner for j in jobs if j.finish_reason != "cancelled"], final=True)
        for job in jobs:
            self.runner.release_pages(job.slot)
        old_count = len(self.scheduler.running)
        for src, dst in self.scheduler.release(jobs):
            self.runner.move_slot(src, dst)
        self.runner.reset_slots(range(len(self.scheduler.running), old_count))
        for job in jobs:
            self._close(job.owner, job.finish_reason)

    def _close(self, task: Task, reason: str) -> None:
        """Reports a finished text chunk; starts the next one or ends the stream."""
        stream, plan = task.stream, task.plan
        if task.voc_slot >= 0:
            self.vocoder.reset(task.voc_slot)  # queued after the slot's last decode
            self._free_voc.append(task.voc_slot)
            task.voc_slot = -1
        kept = task.kept if reason != "cancelled" else task.decoded
        plan.reports.append(ChunkReport(plan.texts[task.index], kept, reason, task.context_dropped,
                                        task.prompt.shape[1]))
        if plan.keep_codes:
            plan.codes.append(self._kept_codes(task, kept).numpy())
        if reason == "cancelled" or stream.cancelled:
            self.metrics.cancelled += 1
            self._end(stream)
            return
        if task.index + 1 < len(plan.texts):
            codes = self._kept_codes(task, kept)
            prompt, dropped = self.planner.chunk_prompt(plan, task.index + 1, (plan.texts[task.index], codes))
            nxt = Task(stream, plan, task.index + 1, prompt, dropped, task.frame_offset + len(task.frames),
                       audio_offset=task.audio_offset + kept)
            self._enqueue(nxt, front=True)
            return
        if not plan.frames:  # not one frame in any text chunk: say so, not 200 + 0 bytes
            self._end(stream, no_audio())  # a failed request: not counted as completed
            return
        self._end(stream, completed=True)

    def _kept_codes(self, task: Task, kept: int) -> torch.Tensor:
        """A finished text chunk's codebook codes of its first `kept` frames: int64 [num_codebooks, kept]."""
        if not kept:
            return torch.zeros(self.ckpt.config.num_codebooks, 0, dtype=torch.int64)
        return torch.from_numpy(np.stack(task.frames[:kept], axis=1)[1:])

    def _end(self, stream: Stream, error: BaseException | None = None, completed: bool = False) -> None:
        self.vocoder.finish(stream, error, completed)  # after its last audio chunk
        with self._cv:
            self._streams.discard(stream)

    def _fail_all(self, error: TTSError) -> None:
        self._in_flight = None  # its frames belong to the streams failed here
        self.rounds.reset()
        jobs = list(self.scheduler.running)
        for job in jobs:
            self.runner.release_pages(job.slot)
        old = len(self.scheduler.running)
        self.scheduler.release(jobs)
        if self.prefix_cache is not None:  # a failed step may have left any page half written: cache nothing
            for key in list(self.prefix_cache.entries):
                self._drop_prefix(key)
        self.runner.reset_slots(range(0, old))
        self.scheduler.waiting.clear()
        with self._cv:
            streams, self._streams = list(self._streams), set()
            self._inbox.clear()
        self._free_voc = list(range(self.settings.max_slots - 1, -1, -1))
        for slot in self._free_voc:
            self.vocoder.reset(slot)
        for stream in streams:
            self.vocoder.finish(stream, error)

    # ---- audio --------------------------------------------------------------------------------
    def _vocode(self) -> None:
        ready = self.rounds.due([job.owner for job in self.scheduler.running], time.perf_counter())
        if ready:
            self._vocode_tasks(ready, final=False)

    def _vocode_tasks(self, tasks: list[Task], final: bool) -> None:
        """Queues codec decodes of pending frames: whole chunks (audio_feed.codec_calls), or when `final` all that
        is left, every task in each call (audio_feed.final_calls)."""
        first, stream = self.settings.first_chunk_frames, self.settings.stream_chunk_frames
        calls = (final_calls(tasks, self.vocoder.chunk_sizes[-1]) if final else  # its largest: decode_padded's limit
                 ([(t, count) for t in group] for count, group in codec_calls(tasks, first, stream)))
        for call in calls:
            width = max(count for _, count in call)
            codes = np.stack([pending_codes(t, count, width) for t, count in call])  # [b, n, width]
            self.vocoder.decode([t.voc_slot for t, _ in call], codes,
                                [Delivery(t.stream, t.index, count) for t, count in call])
            for task, count in call:
                task.decoded += count
