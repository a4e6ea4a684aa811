"""The device plane's one entry point: execute(plan) carries out a control-plane StepPlan on the runner's fixed buffers
and launches its decode step; and what the device needs before and between steps: warm-up with the compile
fallback, the CUDA graphs of the decode step and the prefill, and their lazy capture while the engine is idle.

execute() copies the plan into buffers that live as long as the runner (page table, per-slot state, the pinned host
frames): a captured graph keeps reading the same memory, so nothing is ever replaced. It decides nothing: which rows,
pages, moves and buckets come from the plan (control/scheduler.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from ...config import EngineConfig
from .. import features
from ..control.step_plan import Move, StepPlan
from .compile.early_jit import wait_for_keys
from .compile.kernel_cache import KernelCache
from .cuda_graphs import GraphSet
from .in_flight import InFlight
from .runner import PrefillItem, Runner
from .vocoder import VOCODER_GRAPH_ROWS, Vocoder

log = logging.getLogger(__name__)


def units_text(counts: dict[str, int] | None) -> str:
    """Precompiled-unit counts (device/compile/precompiled.py) for a log or a status: "off" or "N loaded, M traced"."""
    return "off" if counts is None else f"{counts['loaded']} loaded, {counts['compiled']} traced"


def kernel_cache(config: EngineConfig, checkpoint, settings) -> KernelCache:
    """The compile cache of this engine's model and settings (set up where anything compiles or captures): its key
    holds whatever decides the traced code."""
    s = settings
    cache = KernelCache(config.cache_dir, {
        "model": repr(checkpoint.config), "codec": repr(checkpoint.codec_config),
        "dtype": str(checkpoint.model.norm.weight.dtype), "quant": checkpoint.quantization,
        "buckets": s.buckets, "chunks": (s.first_chunk_frames, s.stream_chunk_frames),
        **features.cache_key(s.features),  # the kernels on and the codec features that shape compiled code
        # which buckets run compiled units (those above layer_gemv's rows)
        "layer_gemv_rows": s.runner.gemv_rows if features.LAYER_GEMV in s.runner.fused else 0})
    if s.compile or s.cuda_graphs:
        cache.setup()
    return cache


class Device:
    def __init__(self, runner: Runner, vocoder: Vocoder, settings, config: EngineConfig, kernel_cache: KernelCache,
                 capture_lock: threading.RLock, gate: threading.Event | None, num_codebooks: int,
                 on_prefill: Callable[[int, float], None], snake_fallback: Callable[[], bool]):
        """settings: the engine's BatchSettings; gate: graphs left for later are captured only once it is set
        (fleet.py: every engine warm); on_prefill(tokens, host seconds): the metrics' prefill record;
        snake_fallback(): whether an eager codec may use the Snake kernel after its compile failed."""
        self.runner, self.vocoder, self.settings, self.kernel_cache = runner, vocoder, settings, kernel_cache
        self._lock, self._gate, self._on_prefill, self._snake_fallback = capture_lock, gate, on_prefill, snake_fallback
        s = settings
        if s.compile:
            precompile = features.PRECOMPILE in s.features
            runner.enable_compile(kernel_cache.precompiled_dir if precompile else None)
        vocoder.apply(s.codec)
        if s.cudnn_autotune == "process":  # cuDNN picks each conv shape's fastest algorithm at its first call
            torch.backends.cudnn.benchmark = True
        self.graphs = self._step_graphs() if s.cuda_graphs else None
        self.compile_error: str | None = None
        # two pinned buffers: with overlapped steps one receives step k+1's frames while the host reads step k's
        self._host_out = torch.empty(2, s.runner.max_slots, num_codebooks + 1, dtype=torch.int64,
                                     pin_memory=runner.device.type == "cuda")
        self._flip = 0

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def compiled(self) -> bool:
        """The decode step's units run through torch.compile (False after a compile failure fell back)."""
        return self.runner.compiled

    @property
    def fused_in_use(self) -> frozenset[str]:
        return self.runner.fused_in_use

    def precompiled(self) -> dict[str, int] | None:
        """Precompiled-unit counts ({'loaded', 'compiled'}), or None when the units are not precompiled."""
        return self.runner.precompiled()

    # ---- the step ---------------------------------------------------------------------------------
    def execute(self, plan: StepPlan, started: float) -> InFlight | None:
        """Carries out `plan` in order (slot operations, prefill, page-table entries, the decode step) and queues the
        copy of the step's frames to the host -> the step in flight, or None when the plan decodes nothing. No sync.
        started: perf_counter at the iteration's start (the step's host-clock time when not overlapped)."""
        r = self.runner
        for op in plan.slot_ops:
            if isinstance(op, Move):
                r.move_slot(op.src, op.dst)
            else:
                r.reset_slots(op.slots)
        begun = None
        if self.settings.overlap_step and r.device.type == "cuda":
            # overlapped, the host's clock cannot time this iteration's GPU work (the step before may still run,
            # or the host may be the slower side): GPU events from here to the step's end do
            begun = torch.cuda.Event(enable_timing=True)
            begun.record()
        if plan.chunks:
            t0 = time.perf_counter()
            # a last chunk arms its slot: the next decode step samples its first frame
            r.prefill([PrefillItem(c.job.slot, c.job.prompt, c.job.sampling, c.job.frame_offset, c.start, c.end,
                                   plan.pages[c.job.slot]) for c in plan.chunks])
            self._on_prefill(plan.tokens, time.perf_counter() - t0)
        if not plan.decodes:
            return None
        r.write_table(plan.table)
        B, bb = len(plan.rows), plan.bucket
        out = self.graphs.run(bb) if self.graphs is not None else r.decode_step(bb)
        host = self._host_out[self._flip, :B]
        self._flip ^= 1
        host.copy_(out[:B], non_blocking=True)
        event = None
        if r.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=begun is not None)
            event.record(torch.cuda.current_stream(r.device))
        return InFlight(list(plan.rows), host, event, bb, plan.tokens, started, begun)

    # ---- before ready -----------------------------------------------------------------------------
    def bind_thread(self) -> None:
        """The loop thread's CUDA device, and with the step_priority feature its high-priority stream."""
        if self.device.type != "cuda":
            return
        torch.cuda.set_device(self.device)  # Triton launches on the thread's current device
        if self.settings.step_priority:  # this thread's work (steps, prefill) ahead of the codec's for the SMs
            stream = torch.cuda.Stream(self.device, priority=-1)
            stream.wait_stream(torch.cuda.current_stream(self.device))  # buffers made on the old one
            torch.cuda.set_stream(stream)

    def warm_up(self) -> float:
        """Compiles and captures the decode step for every bucket (all slots idle: no side effects); a compile that
        fails falls back to eager (compile_error says why). Saves the kernel cache's description after a compile.
        -> seconds it took."""
        start = time.perf_counter()
        self._warm_up()
        if self.runner.compiled and self.kernel_cache.status in ("miss", "mismatch"):
            self.kernel_cache.save_metadata()
        return time.perf_counter() - start

    def describe(self) -> str:
        """One line for the ready log: slots, pages, graphs, compile, fused kernels, kernel cache, precompiled."""
        s = self.settings
        return (f"{s.max_slots} slots, {s.runner.num_pages} KV pages of {s.runner.page_size}, "
                f"graphs {'on' if self.graphs else 'off'}, compile {'on' if self.compiled else 'off'}, "
                f"fused {','.join(sorted(self.fused_in_use)) or 'off'}, features {features.describe(s.features)}, "
                f"kernel cache {self.kernel_cache.status}, "
                f"precompiled {units_text(self.precompiled())}")

    def _warm_up(self) -> None:
        wait_for_keys()  # feature early_jit: the first launches below then find Triton's keys made
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
            if self._snake_fallback():
                self.vocoder.use_snake_kernel()
            self.vocoder.call(self.vocoder.warm_up)

    def _step_graphs(self) -> GraphSet:
        """The decode step's CUDA graphs, one per batch bucket (its state lives in the runner's buffers); and
        the prefill's, one per padded shape (runner.prefill_key), captured at first use or while idle."""
        graphs = GraphSet("decode-step", self._lock, lambda bb: self.runner.decode_step(bb), gate=self._gate)
        graphs.plan(list(self.settings.buckets))
        if self.settings.prefill_graphs:
            r = self.runner
            prefill = GraphSet("prefill", self._lock, lambda key, *inputs: r.prefill_layers(*inputs),
                               r.prefill_scratch_inputs, gate=self._gate)
            prefill.plan(r.prefill_graph_keys())
            r.prefill_graphs = prefill
        return graphs

    def _capture(self) -> None:
        """The codec's graphs (on its thread), then the decode step's (lazy: the smallest bucket of each
        before ready, the rest while idle)."""
        if self.graphs is not None:
            self.vocoder.plan_graphs(VOCODER_GRAPH_ROWS)
            rows = self.vocoder.pending_rows[:1] if self.settings.lazy_graphs else None
            self.vocoder.call(lambda: self.vocoder.capture(rows))
            self.graphs.capture(self.settings.buckets[:1] if self.settings.lazy_graphs else None)

    # ---- while idle -------------------------------------------------------------------------------
    def graphs_pending(self) -> bool:
        """Graphs left for later (lazy start-up) that may be captured now."""
        if self._gate is not None and not self._gate.is_set():
            return False
        return self.graphs_left() > 0

    def graphs_left(self) -> int:
        """How many graphs (decode step, codec, prefill) are still to be captured, the gate aside: what /ready waits
        for with TTS_READY_WHEN=settled (a burst before they are in pays their capture and cuDNN tuning)."""
        if self.graphs is None:
            return 0
        prefill = self.runner.prefill_graphs
        return (len(self.graphs.pending) + len(self.vocoder.graphs.pending)
                + (len(prefill.pending) if prefill is not None else 0))

    def settle(self, timeout: float) -> bool:
        """Waits (another thread: the loop captures while idle) until no graph is left for later -> whether none is."""
        end = time.monotonic() + timeout
        while self.graphs_pending() and time.monotonic() < end:
            time.sleep(0.05)
        return not self.graphs_pending()

    def capture_next(self) -> None:
        """One more lazy capture, every slot idle: the smaller pending batch of the decode step and the codec
        (the codec's on its thread; this thread waits, so captures stay one at a time), then the prefill's."""
        step, codec = self.graphs.pending[:1], self.vocoder.pending_rows[:1]
        if step and (not codec or step[0] <= codec[0]):
            self.graphs.capture_next()
        elif codec:
            self.vocoder.call(self.vocoder.capture_next)
        else:
            self.runner.prefill_graphs.capture_next()
