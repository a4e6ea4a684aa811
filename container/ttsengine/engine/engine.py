"""The serving engine: the loop and the request lifecycle. One loop thread runs intake -> schedule -> execute ->
update -> audio.

Each iteration: take new requests and cancellations; the scheduler (control/, torch-free) plans the step: this
step's prompt chunks (new streams' first chunks, then continuations of long prompts, within a budget that keeps
decoding streams real time; a stream's last chunk arms its first frame), the pages they and the decode step need,
and one decode step for every decoding stream; the device plane (device/device.py) executes the plan (a CUDA graph
per batch bucket on GPU) and hands back the step in flight; its frames come back with one copy and update the
scheduler (finished streams released); new frames are decoded to audio in batches and handed to their streams.
Long texts continue chunk by chunk with the previous chunk as context. A prompt prefix shared with earlier requests
(a voice's references) is read from the prefix cache's pages instead of prefilled again (control/prefix_cache.py).
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
from ..model.loading.checkpoint import Checkpoint
from ..synthesis.output import SynthesisResult
from ..synthesis.plan import ChunkReport, Plan, Planner
from ..synthesis.request import SynthesisRequest
from ..synthesis.stream import Stream
from .audio_feed import CodecRounds, Task, chunk_sizes, send_to_codec
from .control.faults import FaultCounter, simulated
from .control.prefill_budget import PrefillBudget
from .control.prefix_cache import PrefixCache, prefix_key
from .control.scheduler import Job, Scheduler
from .control.step_plan import StepResult
from .device.device import Device, kernel_cache, units_text
from .device.in_flight import InFlight
from .device.runner import Runner
from .device.vocoder import VOCODER_GRAPH_ROWS, Vocoder
from .loader import load
from .metrics import EngineMetrics
from .settings import BatchSettings, snake_kernel_usable
from .stats import EngineStats

IDLE_BEFORE_CAPTURE = 0.25  # s the loop waits idle before capturing a lazy graph (~0.25 s each on an H100)

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, checkpoint: Checkpoint, config: EngineConfig,
                 device: Callable[[Engine], Device] | None = None, capture_lock: threading.RLock | None = None,
                 capture_gate: threading.Event | None = None, fail_at_step: int | None = None):
        """device: makes the device plane from this engine's parts (default: a Runner on the checkpoint's device
        behind device.Device; the state-machine tests pass a scripted one); capture_lock: shared by the engines of
        one process (fleet.py), since cuDNN's autotune flag is process-wide; capture_gate: graphs left for later are
        captured only once it is set (fleet.py: every engine warm); fail_at_step: the TTS_TEST_FAIL_ENGINE hook
        (this engine's decode step that fails as a lost GPU would)."""
        self.ckpt, self.config = checkpoint, config
        self.settings = s = BatchSettings.resolve(config, checkpoint)
        # one CUDA graph capture at a time: decode step or codec
        self.capture_lock = capture_lock if capture_lock is not None else threading.RLock()
        self._faults, self._fail_at = FaultCounter(), fail_at_step
        self.down: str | None = None  # why the engine was taken out of service (faults.py)
        # voice encoding's convolutions wait for the codec's autotuned capture windows (cudnn_autotune_mode)
        self.planner = Planner(checkpoint, config, self.kv_positions,
                               encode_lock=self.capture_lock if s.cudnn_autotune == "graphs" else None)
        self.kernel_cache = kernel_cache(config, checkpoint, s)
        # the prefix cache: admission counts its pages, the page pool evicts from it (both the scheduler's)
        self.prefix_cache = PrefixCache() if s.prefix_cache else None
        self.scheduler = Scheduler(s.runner.max_slots, s.max_queue, s.runner.num_pages - 1, s.runner.page_size,
                                   s.prefill_tokens, self.prefix_cache, bucket=s.bucket)
        self.budget = PrefillBudget(s.prefill_tokens, checkpoint.codec.frame_length / checkpoint.codec.sample_rate,
                                    s.runner.page_size)
        self._forget: deque[str] = deque()  # prefix keys to drop (a voice deleted or replaced), any thread
        self.metrics = EngineMetrics()
        self.vocoder = Vocoder(checkpoint.codec, s.runner.max_slots, checkpoint.config.max_seq_len,
                               chunk_sizes(s.first_chunk_frames, s.stream_chunk_frames), s.buckets, self.capture_lock,
                               self.metrics.vocoded, self.metrics.completed, s.codec_channels_last)
        self.capture_gate = capture_gate
        self.device = (device or _real_device)(self)
        self.rounds = CodecRounds(s.first_chunk_frames, s.stream_chunk_frames,
                                  checkpoint.codec.frame_length / checkpoint.codec.sample_rate, s.codec_rounds,
                                  VOCODER_GRAPH_ROWS)
        self.eos = checkpoint.tokenizer.im_end_id
        self._free_voc = list(range(s.runner.max_slots - 1, -1, -1))
        self._inbox: deque[Task] = deque()
        self._cv = threading.Condition()
        self._streams: set[Stream] = set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        self.warmup_seconds: float | None = None
        self._failed: BaseException | None = None  # what warm-up raised, re-raised by start()
        self._in_flight: InFlight | None = None  # the launched step not read yet (feature overlap_step)

    @property
    def runner(self) -> Runner | None:
        """The device plane's runner (None for a scripted device)."""
        return getattr(self.device, "runner", None)

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
        return self.device.compiled

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
        from ..model.loading.weights import fingerprint

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
        stream = Stream(plan, self.sample_rate, str(self.device.device))
        prompt, _ = self.planner.chunk_prompt(plan, 0, None)
        task = Task(stream, plan, 0, prompt, False, 0)
        with self._cv:
            if self.down is not None:
                raise EngineDown(f"the engine on {self.device.device} is out of service: {self.down}")
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

    def stats(self) -> EngineStats:
        return self.metrics.snapshot(
            running=len(self.scheduler.running), waiting=self.scheduler.queue_depth + len(self._inbox),
            device=self.device.device, prefix_cache=self.prefix_cache, codec_device=str(self.vocoder.device),
            state=self.state, error=self.error, quantization=self.ckpt.quantization,
            kernel_cache=self.kernel_cache.status, precompiled=self.precompiled, compiled=self.compiled,
            cuda_graphs=self.device.graphs is not None, max_streams=self.max_streams, kv_positions=self.kv_positions,
            memory_preset=self.settings.preset)

    @property
    def precompiled(self) -> str:
        """The decode step's precompiled units (device/compile/precompiled.py): "off", or "N loaded, M traced"."""
        return units_text(self.device.precompiled())

    @property
    def failure(self) -> BaseException | None:
        """What warm-up raised (start() re-raises it), or None."""
        return self._failed

    # ---- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:  # whatever fails before ready is start()'s error: never a start() that waits forever
            self.device.bind_thread()
            with torch.inference_mode():
                self.warmup_seconds = self.metrics.warmup_seconds = self.device.warm_up()
            log.info("engine ready: %s, quantization %s, warm-up %.1f s", self.device.describe(),
                     self.ckpt.quantization, self.warmup_seconds)
        except BaseException as e:  # noqa: BLE001 - reported to start()
            log.exception("engine warm-up failed")
            self._failed = e
            self.ready.set()
            return
        self.ready.set()
        with torch.inference_mode():
            while True:
                with self._cv:
                    if self._idle() and self.device.graphs_pending():
                        self._cv.wait(timeout=IDLE_BEFORE_CAPTURE)  # a request arriving now goes first
                    idle = self._idle()
                    if idle and not self.device.graphs_pending():
                        self._cv.wait(timeout=1.0)
                        continue
                    if self._stop:
                        break
                try:
                    if idle:  # every slot is free: capture one more bucket's graphs (lazy start-up)
                        self.device.capture_next()
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
        log.error("the engine on %s is taken out of service: %s", self.device.device, why, exc_info=True)
        error = EngineDown(f"the engine on {self.device.device} failed and was taken out of service ({why})")
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

    def settle(self, timeout: float = 120.0) -> bool:
        """Waits until the graphs left for later (lazy start-up) are captured; -> whether they all are."""
        end = time.monotonic() + timeout
        while self.device.graphs_pending() and time.monotonic() < end:
            time.sleep(0.05)
        return not self.device.graphs_pending()

    def _iteration(self) -> None:
        self._intake()
        self._cancellations()
        running = self.scheduler.running
        # while streams decode and some running stream's audio has started (decoding, or prefilling its next text
        # chunk), the budget at the bucket of the step each admission brings it to (control/prefill_budget.py): a
        # burst onto running streams goes in at the pace the small steps leave room for, not the full batch's. Until
        # one has audio, nothing can stall: a burst onto an idle engine goes in as it arrives (TTS_PREFILL_TOKENS
        # per step); budgeted, a prefill call's fixed cost read as a per-token cost held a burst back (ramp_trace.py)
        playing = any(j.decoding for j in running) and any(j.owner.playing for j in running)
        t0 = time.perf_counter()
        bucket_of = self.settings.bucket
        plan = self.scheduler.schedule(lambda rows: self.budget.tokens(bucket_of(rows) if playing else 0))
        for chunk in plan.chunks:
            task: Task = chunk.job.owner
            if task.voc_slot < 0:  # the job's first chunk
                task.voc_slot = self._free_voc.pop()
                task.stream.start()  # host clock only: the queue wait /metrics reports
        if plan.decodes and self._fail_at is not None and self.metrics.steps + 1 >= self._fail_at:
            raise simulated(str(self.device.device))
        launched = self.device.execute(plan, t0)
        if self._in_flight is not None:  # the step before, still running while this one was queued behind it
            self._read(self._in_flight)
        self._in_flight = launched
        # without overlap, or when no stream is left to decode (its rows were past their ends): read it now, so an
        # idle engine has no step in flight
        if launched is not None and (not self.settings.overlap_step or not self.scheduler.running):
            self._in_flight = None
            self._read(launched)
        if not self.scheduler.has_work() and self.scheduler.has_slot_ops:  # going idle: the freed rows reset now
            self.device.execute(self.scheduler.flush(), t0)
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
        self.scheduler.pool.unref(self.prefix_cache.forget(key))

    def _enqueue(self, task: Task, front: bool) -> None:
        budget = self.planner.budget(task.prompt, task.plan)
        key, pages = None, 0
        if self.prefix_cache is not None:
            key, pages = prefix_key(task.prompt, min(task.plan.prefix_length, task.prompt.shape[1] - 1),
                                    self.settings.runner.page_size)
        req = task.plan.request
        job = Job(task.prompt.shape[1], budget, owner=task, stop_on_eos=not task.plan.ignore_stop,
                  prefix_key=key, prefix_pages=pages, prompt=task.prompt, frame_offset=task.frame_offset,
                  sampling=(req.temperature, req.top_p, req.repetition_penalty, req.seed))
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
            self.scheduler.release(done)
            self._finished(done)

    def _read(self, step: InFlight) -> None:
        """Takes a launched step's frames: records them on their jobs, finishes the jobs that ended."""
        frames = step.frames()
        # the iteration's prefill + step (control/prefill_budget.py times the steps it sizes): GPU events when
        # overlapped, else the host's clock from the iteration's start to this wait
        seconds = step.gpu_seconds()
        if seconds is None:
            seconds = time.perf_counter() - step.started
        # a maker that finished since (an overlapped step ran one frame past its end) did not make this frame
        makers = [j if j is not None and j.finish_reason is None else None for j in step.makers]
        finished = self.scheduler.update(StepResult(makers, frames[:, 0].tolist()), self.eos)
        for job, frame in zip(makers, frames):
            if job is not None:
                job.owner.frames.append(frame)
        self.metrics.step(sum(j is not None for j in makers), seconds, step.waited)
        self.budget.observe(step.bucket, step.prefill_tokens, seconds)
        if finished:
            self._finished(finished)

    def _finished(self, jobs: list[Job]) -> None:
        """Jobs the scheduler released: their remaining audio, then their streams continue or close."""
        # the jobs' last audio in shared codec calls: streams started together end at the same step, and a call per
        # stream (each followed by its reset and finish, which stop the codec thread's merge) left a queue of
        # one-row calls behind the last step
        self._send([j.owner for j in jobs if j.finish_reason != "cancelled"], final=True)
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
        self.scheduler.release(list(self.scheduler.running))
        if self.prefix_cache is not None:  # a failed step may have left any page half written: cache nothing
            for key in list(self.prefix_cache.entries):
                self._drop_prefix(key)
        self.device.execute(self.scheduler.flush(), time.perf_counter())  # every row reset
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
    def _send(self, tasks: list[Task], final: bool) -> None:
        send_to_codec(self.vocoder, tasks, final, self.settings.first_chunk_frames, self.settings.stream_chunk_frames)

    def _vocode(self) -> None:
        ready = self.rounds.due([job.owner for job in self.scheduler.running], time.perf_counter())
        if ready:
            self._send(ready, final=False)


def _real_device(engine: Engine) -> Device:
    """The device plane of a real engine: a Runner over the checkpoint's model behind Device."""
    s, config = engine.settings, engine.config
    return Device(Runner(engine.ckpt.model, s.runner), engine.vocoder, s, config, engine.kernel_cache,
                  engine.capture_lock, engine.capture_gate, engine.ckpt.config.num_codebooks, engine.metrics.prefill,
                  lambda: snake_kernel_usable(config, engine.vocoder.device.type == "cuda"))
