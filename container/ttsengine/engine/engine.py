"""The serving engine: the loop and the request lifecycle. One loop thread runs, per iteration:
intake (intake.py: new requests, cancellations) -> schedule (control/, torch-free: this step's prompt chunks within
a budget that keeps decoding streams real time, their pages, one decode step over the decoding streams: a StepPlan)
-> execute (device/device.py: the plan on the GPU; the step stays in flight) -> update (its frames read back with one
copy; finished text chunks released, continued with the previous chunk as context, or ended) -> audio (audio_feed.py:
new frames to the codec in batches, the audio to its streams).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from ..config import EngineConfig
from ..errors import SEE_LOGS, BusyError, EngineDown, ShuttingDown, TTSError, no_audio
from ..model.loading.checkpoint import Checkpoint
from ..synthesis.output import SynthesisResult
from ..synthesis.plan import Plan, Planner
from ..synthesis.request import SynthesisRequest
from ..synthesis.stream import Stream
from . import features as feature_names
from .audio_feed import AudioFeed, CodecRounds, Task, chunk_sizes
from .control import heap
from .control.faults import FaultCounter, simulated
from .control.goodput import Goodput
from .control.prefill_budget import PrefillBudget, listener_slack
from .control.prefix_cache import PrefixCache, prefix_key
from .control.scheduler import Job, Scheduler
from .control.step_plan import Reset, StepPlan, StepResult
from .device.cuda_graphs import PROCESS_CAPTURE_LOCK
from .device.device import Device, kernel_cache, units_text
from .device.in_flight import InFlight
from .device.runner import Runner
from .device.vocoder import VOCODER_GRAPH_ROWS, Vocoder
from .intake import Intake
from .loader import load
from .metrics import EngineMetrics
from .settings import BatchSettings, codec_buckets, snake_kernel_usable
from .stats import EngineStats

IDLE_BEFORE_CAPTURE = 0.25  # s the loop stays idle after work before capturing a lazy graph (about one capture)

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, checkpoint: Checkpoint, config: EngineConfig,
                 device: Callable[[Engine], Device] | None = None, capture_lock: threading.RLock | None = None,
                 capture_gate: threading.Event | None = None, fail_at_step: int | None = None):
        """device: makes the device plane from this engine's parts (default: device.Device over a Runner; tests pass a
        scripted one); capture_lock: default the process's one (cuda_graphs.PROCESS_CAPTURE_LOCK: cuDNN's autotune
        flag is process-wide, so every engine of a process, in a fleet or not, captures in turn);
        capture_gate: lazy graphs wait for it (fleet.py: every engine warm); fail_at_step: TTS_TEST_FAIL_ENGINE."""
        self.ckpt, self.config = checkpoint, config
        self.settings = s = BatchSettings.resolve(config, checkpoint)
        self.capture_lock = capture_lock if capture_lock is not None else PROCESS_CAPTURE_LOCK
        self._faults, self._fail_at = FaultCounter(), fail_at_step
        # voice encoding's convolutions wait for the codec's autotuned capture windows (cudnn_autotune_mode)
        self.planner = Planner(checkpoint, config, self.kv_positions,
                               encode_lock=self.capture_lock if s.cudnn_autotune == "graphs" else None)
        self.kernel_cache = kernel_cache(config, checkpoint, s)
        self.prefix_cache = PrefixCache() if s.prefix_cache else None
        self.scheduler = Scheduler(s.runner.max_slots, s.max_queue, s.runner.num_pages - 1, s.runner.page_size,
                                   s.prefill_tokens, self.prefix_cache, bucket=s.bucket)
        frame_seconds = checkpoint.codec.frame_length / checkpoint.codec.sample_rate
        self.budget = PrefillBudget(s.prefill_tokens, frame_seconds, s.runner.page_size,
                                    fit=feature_names.PREFILL_FIT in s.features)
        self.metrics = EngineMetrics()
        self.vocoder = Vocoder(checkpoint.codec, s.runner.max_slots, checkpoint.config.max_seq_len,
                               chunk_sizes(s.first_chunk_frames, s.stream_chunk_frames),
                               codec_buckets(s.buckets, s.codec.sparse_rows), self.capture_lock,
                               self.metrics.vocoded, self.metrics.completed, s.codec_channels_last,
                               merge_rows=s.codec_merge_rows, pinned_copy=s.codec_pinned_copy, gate=capture_gate,
                               kv_ring=s.codec.kv_ring)
        self.capture_gate = capture_gate
        self.device = (device or _real_device)(self)
        rounds = CodecRounds(s.first_chunk_frames, s.stream_chunk_frames, frame_seconds, s.codec_rounds,
                             VOCODER_GRAPH_ROWS)
        self.audio = AudioFeed(self.vocoder, rounds, s.max_slots, s.first_chunk_frames, s.stream_chunk_frames)
        self.eos = checkpoint.tokenizer.im_end_id
        goodput = Goodput(s.admit_rtf, frame_seconds, s.bucket, self.budget.step_seconds,
                          lambda: self.vocoder.lag, s.stream_chunk_frames, self.budget.timed_at,
                          wait_s=s.admit_wait)
        self.intake = Intake(self.scheduler, s.max_queue, s.max_slots, str(self.device.device), self.metrics,
                             goodput)
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        self.warmup_seconds: float | None = None
        self._failed: BaseException | None = None  # what warm-up raised, re-raised by start()
        self._in_flight: InFlight | None = None  # the launched step not read yet (feature overlap_step)
        # feature gc_freeze: the heap's freeze (control/heap.py) is the last start-up work, in the loop's first idle
        # turn once the lazy captures are in (like them: a request in flight then would be frozen with its cycles and
        # never collected); counted as a graph pending, so a settled /ready waits for it too
        self._heap_left = feature_names.GC_FREEZE in s.features

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
        self.intake.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.vocoder.close()
        if feature_names.GC_FREEZE in self.settings.features and not self._heap_left:  # this engine froze the heap,
            heap.thaw()  # its own cycles with the rest: the collector may take them again

    # ---- requests -----------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest | Plan, *, ignore_stop: bool = False,
               abandoned: Callable[[], bool] | None = None) -> Stream:
        """Validates and queues a request; InputError (bad request), BusyError (full) or Abandoned at once."""
        self.intake.precheck(request.admitted)  # goodput: refused before its references are encoded
        plan = self.planner.plan(request, abandoned)  # the capacity guard: every chunk fits this engine's cache
        plan.ignore_stop = plan.ignore_stop or ignore_stop
        stream = Stream(plan, self.sample_rate, str(self.device.device))
        prompt, _ = self.planner.chunk_prompt(plan, 0, None)
        self.intake.put(Task(stream, plan, 0, prompt, False, 0))
        return stream

    def synthesize(self, request: SynthesisRequest | Plan) -> SynthesisResult:
        return self.submit(request).result()

    def occupancy(self) -> tuple[int, int]:
        """(slots not spoken for, requests waiting): the router's hint (fleet.py)."""
        return self.intake.occupancy()

    @property
    def open_streams(self) -> int:
        return self.intake.open_streams

    @property
    def down(self) -> str | None:
        """Why the engine was taken out of service, or None."""
        return self.intake.down

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
            self.intake.forget(key)

    def stats(self) -> EngineStats:
        return self.metrics.snapshot(
            running=len(self.scheduler.running), waiting=self.intake.waiting,
            device=self.device.device, prefix_cache=self.prefix_cache, codec_device=str(self.vocoder.device),
            state=self.state, error=self.error, quantization=self.ckpt.quantization,
            kernel_cache=self.kernel_cache.status, precompiled=self.precompiled, compiled=self.compiled,
            cuda_graphs=self.device.graphs is not None, max_streams=self.max_streams, kv_positions=self.kv_positions,
            graphs_pending=self._graphs_left() + self._heap_left,
            memory_preset=self.settings.preset, references_encoded=self.planner.voice_encoder.encoded)

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
        busy_at = 0.0  # the end of the last iteration with work
        with torch.inference_mode():
            while True:
                with self.intake.cv:
                    if self.intake.idle() and (self.device.graphs_pending() or self._heap_due()):
                        # a request arriving now goes first; but only just after work: back to back, the lazy
                        # captures' waits added 0.25 s to each of ~70 graphs before a settled /ready (stop 55); the
                        # freeze too (a server under traffic before it settled: not in a gap between two requests)
                        quiet = time.perf_counter() - busy_at
                        if quiet < IDLE_BEFORE_CAPTURE:
                            self.intake.cv.wait(timeout=IDLE_BEFORE_CAPTURE - quiet)
                    idle = self.intake.idle()
                    heap = idle and self._heap_due()
                    if idle and not self.device.graphs_pending() and not heap:
                        self.intake.cv.wait(timeout=1.0)
                        continue
                    if self.intake.stopping:
                        break
                try:
                    if heap:
                        self._freeze_heap()
                        continue
                    if idle:  # every slot is free: capture one more bucket's graphs (lazy start-up)
                        self.device.capture_next()
                        continue
                    t0 = time.perf_counter()
                    try:
                        self._iteration()
                    finally:  # a failed iteration's time too (its step wait may be counted already)
                        busy_at = time.perf_counter()
                        self.metrics.iteration(busy_at - t0)
                    self._faults.succeeded()
                except Exception as e:  # noqa: BLE001 - keep serving; the affected streams get the error
                    why = self._faults.failed(e)
                    if why is not None:
                        self._go_down(why)
                        return
                    log.exception("engine step failed; failing the in-flight requests")
                    self.metrics.failed_streams += self.intake.open_streams
                    self._fail_all(TTSError(f"internal engine error on {self.device.device}; {SEE_LOGS}"))
        self._fail_all(ShuttingDown("the server shut down before this request finished; retry it"))

    def _go_down(self, why: str) -> None:
        """Takes the engine out of service: every stream ends with the reason, nothing touches the device
        again (a lost GPU's calls would fail or hang), new requests are refused (EngineDown)."""
        log.error("the engine on %s is taken out of service: %s", self.device.device, why, exc_info=True)
        # the clients' words; `why` stays in this log line and in the stats (errors.py: SEE_LOGS)
        error = EngineDown(f"the engine on {self.device.device} failed and was taken out of service; {SEE_LOGS}")
        # host-side bookkeeping only (no page or slot resets on the device): a down engine reports no running or
        # waiting streams in /health and /metrics
        streams = self.intake.end_all(down=why)
        self._in_flight = None  # its frames belong to the streams just failed
        self.metrics.failed_streams += len(streams)
        for stream in streams:
            stream.finish(error)

    def settle(self, timeout: float = 120.0) -> bool:
        """Waits until the graphs left for later (lazy start-up) are captured and the heap is frozen (feature
        gc_freeze); -> whether they all are."""
        end = time.monotonic() + timeout
        if not self.device.settle(timeout):
            return False
        # the freeze waits for every graph; with the capture gate closed (graphs left, none pending) settled is what
        # the device says, as without the feature
        while self._heap_due() and self.state == "ready" and time.monotonic() < end:
            time.sleep(0.02)
        return not self._heap_due() or self.state != "ready"

    def _heap_due(self) -> bool:
        """Feature gc_freeze: the freeze is still to do, and every graph left for later is captured."""
        return self._heap_left and not self._graphs_left()

    def _graphs_left(self) -> int:
        """Graphs still to capture, the capture gate aside (none without CUDA graphs, or on a scripted device)."""
        return self.device.graphs_left() if self.device.graphs is not None else 0

    def _freeze_heap(self) -> None:
        seconds, frozen = heap.freeze()
        log.info("froze the heap (gc_freeze) on %s: %d objects out of the collector's full passes, %.2f s",
                 self.device.device, frozen, seconds)
        self._heap_left = False  # last: settle() and a settled /ready see it done once it is

    def _iteration(self) -> None:
        self._intake()
        self._cancellations()
        running = self.scheduler.running
        # while streams decode and one's audio has started, each admission is budgeted at the bucket it brings the
        # step to (control/prefill_budget.py): a burst cannot stall running streams. Before any audio nothing can
        # stall, and a burst goes in as it arrives (a prefill call costs about the same whatever its size)
        playing = any(j.decoding for j in running) and any(j.owner.playing for j in running)
        t0 = time.perf_counter()
        bucket_of = self.settings.bucket
        # slack_prefill: longer steps while every listener has audio in hand, only when requests are waiting
        slack = self._listener_slack(running) if self.settings.slack_prefill and playing and self.scheduler.waiting \
            else 0.0
        plan = self.scheduler.schedule(lambda rows: self.budget.tokens(bucket_of(rows) if playing else 0, slack))
        for chunk in plan.chunks:
            task: Task = chunk.job.owner
            if task.voc_slot < 0:  # the job's first chunk
                self.audio.start(task)
                task.stream.start()  # host clock only: the queue wait /metrics reports
        if plan.decodes and self._fail_at is not None and self.metrics.steps + 1 >= self._fail_at:
            raise simulated(str(self.device.device))
        launched = self.device.execute(plan, t0)
        if self._in_flight is not None:  # the step before, still running while this one was queued behind it
            self._read(self._in_flight)
        self._in_flight = launched
        # without overlap, or with no stream left to decode: read it now (an idle engine has no step in flight)
        if launched is not None and (not self.settings.overlap_step or not self.scheduler.running):
            self._in_flight = None
            self._read(launched)
        self.audio.due([job.owner for job in self.scheduler.running], time.perf_counter())

    def _listener_slack(self, running: list[Job]) -> float:
        """The least audio a playing stream's listener has ahead (control/prefill_budget.py), less the codec's lag:
        frames sent to the codec are not audio yet. Host numbers only. (A stream with first audio is playing: its
        frames went to the codec.)"""
        streams = [(t.audio_offset + t.decoded, t.stream.first_audio_at) for t in (j.owner for j in running)
                   if t.stream.first_audio_at is not None]
        return max(0.0, listener_slack(streams, time.perf_counter(), self.budget.frame_seconds) - self.vocoder.lag)

    def _intake(self) -> None:
        for key in self.intake.take(lambda task: self._enqueue(task, front=False)):
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
        slack = task.plan.slack_s if self.settings.segment_slack else 0.0
        job = Job(task.prompt.shape[1], budget, owner=task, stop_on_eos=not task.plan.ignore_stop,
                  prefix_key=key, prefix_pages=pages, prompt=task.prompt, frame_offset=task.frame_offset,
                  sampling=(req.temperature, req.top_p, req.repetition_penalty, req.seed),
                  deadline=time.perf_counter() + slack)
        task.job = job
        try:
            self.scheduler.submit(job, front=front)
        except BusyError as e:  # continuations went ahead of it since it was let in: refused after all
            self.metrics.rejected += 1
            task.stream.finish(e)
            self.intake.ended(task.stream)

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
        """Jobs the scheduler released: their rows move and reset on the device at once (before any stream hears of
        its end), their last audio goes to the codec in shared calls (streams started together end together), then
        their streams continue or close."""
        self.device.execute(self.scheduler.flush(), time.perf_counter())
        self.audio.send([j.owner for j in jobs if j.finish_reason != "cancelled"], final=True)
        for job in jobs:
            self._close(job.owner, job.finish_reason)

    def _close(self, task: Task, reason: str) -> None:
        """Reports a finished text chunk; starts the next one or ends the stream."""
        self.audio.release(task)
        codes = task.report(reason, self.ckpt.config.num_codebooks)
        if reason == "cancelled" or task.stream.cancelled:
            self.metrics.cancelled += 1
            self._end(task.stream)
        elif (nxt := task.successor(self.planner, codes)) is not None:
            self._enqueue(nxt, front=True)
        elif not task.plan.frames:  # not one frame in any text chunk: say so, not 200 + 0 bytes
            self._end(task.stream, no_audio())  # a failed request: not counted as completed
        else:
            self._end(task.stream, completed=True)

    def _end(self, stream: Stream, error: BaseException | None = None, completed: bool = False) -> None:
        self.audio.end(stream, error, completed)
        self.intake.ended(stream)

    def _fail_all(self, error: TTSError) -> None:
        self._in_flight = None  # its frames belong to the streams failed here
        self.scheduler.release(list(self.scheduler.running))
        if self.prefix_cache is not None:  # a failed step may have left any page half written: cache nothing
            for key in list(self.prefix_cache.entries):
                self._drop_prefix(key)
        # every row reset, not only those the releases name: a plan that failed before its moves and resets ran
        # would leave a row armed over pages the pool gave away
        self.scheduler.flush()
        self.device.execute(StepPlan(slot_ops=[Reset(tuple(range(self.settings.max_slots)))]), time.perf_counter())
        self.scheduler.waiting.clear()
        self.audio.fail(self.intake.end_all(), error)


def _real_device(engine: Engine) -> Device:
    """The device plane of a real engine: a Runner over the checkpoint's model behind Device."""
    s, config = engine.settings, engine.config
    return Device(Runner(engine.ckpt.model, s.runner), engine.vocoder, s, config, engine.kernel_cache,
                  engine.capture_lock, engine.capture_gate, engine.ckpt.config.num_codebooks, engine.metrics.prefill,
                  lambda: snake_kernel_usable(config, engine.vocoder.device.type == "cuda"))
