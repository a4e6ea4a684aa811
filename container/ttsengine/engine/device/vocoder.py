"""The engine's codec: streaming decode of every active stream, on its own thread and CUDA stream, so
decode steps never wait for audio.

Commands run in submission order, which is what keeps it simple: a slot's reset is queued after its
last decode, and a stream is finished only after its last chunk was emitted. The loop thread may hand
a slot to a new stream right after queueing the reset. Two exceptions keep that order where it
matters: queued decodes merge into one call (their resets and finishes run right after it), and a run
of resets and finishes runs as the finishes, then one reset of all their slots.

Chunk lengths are padded up to one of `chunk_sizes` (the codec is causal, so frames appended after
the real ones change nothing before them; only a stream's final chunk is ever padded, and its state
is reset afterwards) and the batch is padded to a bucket with a scratch row, so compiled code and
CUDA graphs see few shapes. The math of one chunk is model/codec/streaming.py.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from ...compat import compiler
from ...model.codec import Codec
from ...model.codec.streaming import StreamingCodec
from .cuda_graphs import GraphSet

log = logging.getLogger(__name__)
VOCODER_GRAPH_ROWS = 64  # the engine's largest codec batch captured as a CUDA graph (bounds the graph pool)


@dataclass(frozen=True)
class CodecSwitches:
    """How the engine runs its streaming codec, resolved from EngineConfig (settings.codec_switches; BatchSettings
    holds them, Vocoder.apply sets them; bench --codec-only's default `engine` mode builds its codec the same way)."""

    compile: bool  # torch.compile the streaming codec
    snake_kernel: bool  # Snake as one Triton kernel
    cudnn_autotune: str  # cudnn_autotune_mode
    channels_last: bool  # time-major, channels-last convolutions
    kv_ring: bool = False  # the transformer's keys and values in a ring per row (feature codec_kv_ring)
    sparse_rows: bool = False  # calls padded to powers of 4 rows: half the graphs (feature codec_sparse_rows)
    own_convs: bool = False  # time-major convs as GEMMs of our own, no cuDNN (feature codec_own_convs)
    fused_convs: bool = False  # their residual-unit epilogues: Snake, the residual sum (feature codec_fused_convs)

    def describe(self) -> str:
        """-> e.g. "time-major, Snake kernel, cuDNN tuned in graph captures" (bench --codec-only's engine mode)."""
        parts = ["time-major" if self.channels_last else "channel-major"] + ["KV ring"] * self.kv_ring
        parts += ["rows 1/4/16/64"] * self.sparse_rows
        parts += ["compiled"] * self.compile + ["Snake kernel"] * self.snake_kernel + ["own convs"] * self.own_convs
        parts += ["fused epilogues"] * self.fused_convs
        parts.append({"off": "cuDNN untuned", "graphs": "cuDNN tuned in graph captures",
                      "process": "cuDNN tuned everywhere"}[self.cudnn_autotune])
        return ", ".join(parts)


@contextlib.contextmanager
def cudnn_autotuned():
    """cuDNN autotuning on inside the block. The flag is process-wide: the caller holds the capture lock, which
    keeps other captures out and which voice encoding waits for (engine/settings.py cudnn_autotune_mode)."""
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = old


class AudioSink(Protocol):
    """Where a row's audio goes (a request's stream, synthesis/stream.py): its chunks in order, then its end. The
    device plane calls back through this and never imports the synthesis layer."""

    def emit(self, audio: np.ndarray, text_index: int) -> None: ...

    def finish(self, error: BaseException | None = None) -> None: ...


@dataclass
class Delivery:
    stream: AudioSink
    text_index: int
    frames: int  # real frames in this row (the rest of the chunk is padding)


class Vocoder:
    def __init__(self, codec: Codec, slots: int, max_frames: int, chunk_sizes: tuple[int, ...],
                 buckets: tuple[int, ...], capture_lock: threading.RLock,
                 on_decoded: Callable[[int, float], None], on_finished: Callable[[AudioSink], None],
                 time_major: bool = False, *, merge_rows: int = 0, pinned_copy: bool = True,
                 gate: threading.Event | None = None, kv_ring: bool = False):
        """max_frames: the longest stream a slot decodes; capture_lock: held by every CUDA graph capture (reentrant:
        the codec holds it around first uses that may capture);
        on_decoded(frames, seconds) after each decode; on_finished(stream) when a stream completed; time_major:
        the streaming codec's layout (StreamingCodec, feature codec_channels_last); merge_rows: queued decodes join
        into calls of up to this many rows (0: off; feature codec_merge); pinned_copy: audio reaches the host through
        a pinned buffer (feature codec_pinned_copy); gate: graphs left for later wait for it (fleet.py); kv_ring: the
        transformer's keys and values in a ring sized for the largest chunk (feature codec_kv_ring)."""
        self.codec = StreamingCodec(codec, slots + 1, max_frames, time_major,
                                    ring_chunk=max(chunk_sizes) if kv_ring else 0)
        self.device, self.frame_length = self.codec.device, self.codec.frame_length
        self.chunk_sizes, self.buckets = tuple(sorted(chunk_sizes)), tuple(sorted(buckets))
        self.scratch = slots  # one extra state row that padding rows read and write
        self._decode: Callable[[Tensor, Tensor], Tensor] = self.codec.codes_to_audio
        self.compiled = False
        self.graphs = GraphSet("codec", capture_lock, self._graph_body, self._scratch_inputs,
                               capture_on_current_stream=True, gate=gate)
        self._capture_lock = capture_lock
        self._graph_rows = 0  # the planned graphs' largest batch
        self.merge_rows = merge_rows
        self.on_decoded, self.on_finished = on_decoded, on_finished
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.frames_queued = 0  # real frames put in decode commands (loop thread)
        self.frames_done = 0  # of those, decoded or failed (worker thread)
        # (frames_queued after a decode command, when it was queued) per command not done yet: the loop thread
        # appends, the worker drops what it finished, `lag` peeks (deque's append and popleft are atomic)
        self._waiting: deque = deque()
        self._cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self.pinned_copy = pinned_copy
        self._staging: Tensor | None = None  # float32, pinned: the last decode's audio (_to_host)
        self._copied = torch.cuda.Event() if self._cuda else None
        self._thread = threading.Thread(target=self._run, name="tts-vocoder", daemon=True)
        self._thread.start()

    # ---- settings (before start, or on the worker thread) ------------------------------------------
    def apply(self, switches: CodecSwitches) -> None:
        """The engine's codec switches, but the layout (a constructor argument: time_major) and process-wide cuDNN
        tuning ("process": the caller's torch.backends.cudnn.benchmark): compile or the Snake kernel, and cuDNN
        tuned in the graphs' captures ("graphs")."""
        if switches.compile:
            self.enable_compile()
        if switches.snake_kernel:
            self.use_snake_kernel()
        if switches.cudnn_autotune == "graphs":
            self.autotune_captures()
        if switches.own_convs:
            self.use_own_convs(switches.fused_convs)

    def enable_compile(self) -> None:
        """torch.compile the chunk decode, one static-shape compile per (rows, chunk) key (a dynamic batch
        fails in Inductor on torch 2.11): fuses Snake and the other elementwise chains between convolutions."""
        compiler(len(self.buckets) * len(self.chunk_sizes) + 4)  # room for every key's static compile
        self._decode, self.compiled = torch.compile(self.codec.codes_to_audio, dynamic=False), True

    def disable_compile(self) -> None:
        self._decode, self.compiled = self.codec.codes_to_audio, False
        self.plan_graphs(0)

    def autotune_captures(self) -> None:
        """cuDNN times its algorithms while each codec graph is first run and recorded; the graph keeps them."""
        self.graphs.tune = cudnn_autotuned

    def use_own_convs(self, fused: bool = False) -> None:
        """The time-major codec's convolutions as GEMMs of our own (model/codec/own_convs.py): no cuDNN plan to build
        or tune per shape when a graph is captured. fused: with the residual units' epilogues (codec_fused_convs)."""
        from ...model.codec.own_convs import OwnConvs

        self.codec.own_convs = OwnConvs(kernel=True, fused=fused)

    def use_snake_kernel(self) -> None:
        """Snake as one Triton kernel (model/kernels/codec/snake.py): the eager codec's fused pass."""
        from ...model.kernels.codec.snake import residual_bias_triton, snake_triton, snake_triton_time_major

        self.codec.snake, self.codec.snake_time_major = snake_triton, snake_triton_time_major
        self.codec.residual_bias = residual_bias_triton

    def plan_graphs(self, max_rows: int) -> None:
        """Plans CUDA graphs for every (bucket <= max_rows, chunk size); larger batches run as graphed
        pieces of max_rows."""
        self.graphs.plan([(r, s) for r in self.buckets if r <= max_rows for s in self.chunk_sizes])
        self._graph_rows = max((r for r, _ in self.graphs.planned), default=0)

    def set_merge(self, rows: int) -> None:
        """Queued decodes join into one call of up to `rows` rows while the worker is behind (0: off)."""
        self.merge_rows = rows

    def whole(self, codes: list[np.ndarray]) -> np.ndarray:
        """The codec's plain decode of each text chunk's codes (int [n, F] each) in one call, joined: no streaming
        state, CUDA graph or batch with other streams, so what a stream of those codes should have delivered (to
        the dtype's rounding). On the caller's thread, under the capture lock (no capture sees its kernels)."""
        parts = []
        on_device = torch.cuda.device(self.device) if self._cuda else contextlib.nullcontext()
        with self._capture_lock, torch.inference_mode(), on_device:  # the codec's Triton kernels (int8) launch there
            for c in codes:
                if c.shape[1]:
                    rows = torch.from_numpy(np.asarray(c, dtype=np.int64))[None].to(self.device)  # [1, n, F]
                    parts.append(self.codec.codec.decode(rows)[0, 0].float().cpu().numpy())
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    @property
    def pending_rows(self) -> list[int]:
        """Row counts with a planned graph not captured yet, smallest first."""
        return sorted({r for r, _ in self.graphs.pending})

    # ---- loop thread ------------------------------------------------------------------------------
    def decode(self, slots: list[int], codes: np.ndarray, deliveries: list[Delivery]) -> None:
        """codes: int64 [b, n, K] for the streams in `slots` (one row each)."""
        self.frames_queued += sum(d.frames for d in deliveries)
        self._waiting.append((self.frames_queued, time.monotonic()))
        self._q.put(("decode", slots, codes, deliveries))

    @property
    def lag(self) -> float:
        """Seconds the oldest decode not done yet has waited since it was queued, 0 with none (goodput admission's
        reading of whether the codec has fallen behind: control/goodput.py LAG_CHUNKS)."""
        try:
            upto, queued_at = self._waiting[0]
        except IndexError:
            return 0.0
        return time.monotonic() - queued_at if upto > self.frames_done else 0.0

    def reset(self, slot: int) -> None:
        self._q.put(("reset", slot))

    def finish(self, stream: AudioSink, error: BaseException | None = None, completed: bool = False) -> None:
        """Ends the stream after everything queued before; completed: count it as a finished request."""
        self._q.put(("finish", stream, error, completed))

    def call(self, fn: Callable[[], None]) -> None:
        """Runs fn on the worker thread and waits (warm-up: compile and capture where it runs)."""
        self.call_async(fn)()

    def call_async(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Queues fn for the worker thread -> wait(), which blocks until fn is done and re-raises its error."""
        done = threading.Event()
        box: list = []

        def job():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                box.append(e)
            finally:
                done.set()

        self._q.put(("call", job))

        def wait() -> None:
            done.wait()
            if box:
                raise box[0]

        return wait

    def close(self) -> None:
        self._q.put(("stop",))
        self._thread.join(timeout=30)

    # ---- worker thread ----------------------------------------------------------------------------
    def capture(self, rows: list[int] | None = None) -> None:
        """Captures the planned graphs of `rows` (default: all pending). Nothing may be decoding."""
        self.graphs.capture([k for k in self.graphs.pending if rows is None or k[0] in rows])
        self._reset_scratch()

    def capture_next(self) -> None:
        """Captures the smallest pending row count's graphs (lazy start-up)."""
        self.graphs.capture_next([k for k in self.graphs.pending if k[0] == self.pending_rows[0]])
        self._reset_scratch()

    def warm_up(self) -> None:
        """Compiles (when enabled) every chunk size with a padding-only batch."""
        t0 = time.perf_counter()
        with self._dilated_tuned():
            for size in self.chunk_sizes:
                zeros = torch.zeros(1, self.codec.num_codebooks, size, dtype=torch.int64, device=self.device)
                self.decode_padded([self.scratch], zeros)
        self._reset_scratch()
        log.info("codec warm-up (%s) in %.2f s", "compiled" if self.compiled else "eager", time.perf_counter() - t0)

    @contextlib.contextmanager
    def _dilated_tuned(self, key: tuple[int, int] | None = None):
        """The time-major codec's dilated convs tuned as a capture tunes, for runs that are not replays (warm-up,
        first uses, keys never captured; `key`: the run's graph key, nothing to do when captured): cuDNN keeps the
        algorithm it first picks for a shape, tuned or not, and its heuristics pick one ~35x slower for two of them
        at a few rows (tuning every conv of the warm-up cost seconds of start; docs/performance.md, "Codec"). Under the
        capture lock
        (reentrant: a first use inside may capture), since the tuning's timing would break another thread's capture.
        The channel-major codec: nothing (its untuned picks were fine)."""
        if not self.codec.time_major or key in self.graphs.graphs:
            yield
            return
        with self.graphs.lock:
            self.codec.tune_dilated = self.graphs.tune
            try:
                yield
            finally:
                self.codec.tune_dilated = contextlib.nullcontext

    def _reset_scratch(self) -> None:
        """Warm-ups and captures ran on the scratch row: it starts the next padding clean."""
        self.codec.reset(torch.tensor([self.scratch], device=self.device))

    def decode_padded(self, slots: list[int], codes: Tensor) -> Tensor:
        """slots: distinct stream slots; codes: int64 [b, n, K] with K <= max(chunk_sizes)
        -> audio [b, K * frame_length]."""
        b, _, K = codes.shape
        cap = self._graph_rows
        if cap and b > cap:  # larger than the largest planned graph: graphed pieces
            # each piece is a view of its graph's static output, which the next replay of the same key overwrites:
            # copied out before that replay (a cat of the views after them gave every piece the last one's audio)
            out = None
            for i in range(0, b, cap):
                piece = self.decode_padded(slots[i:i + cap], codes[i:i + cap])  # [<= cap, K * frame_length]
                out = piece.new_empty((b, piece.shape[1])) if out is None else out
                out[i:i + piece.shape[0]].copy_(piece)
            return out
        if K > self.chunk_sizes[-1]:  # the engine never sends more (audio_feed): not a shape to run unplanned
            raise ValueError(f"a codec call of {K} frames: longer than the largest chunk, {self.chunk_sizes[-1]}")
        size = self._chunk_size(K)
        rows = next((x for x in self.buckets if x >= b), b)
        if size > K or rows > b:
            codes = torch.nn.functional.pad(codes, (0, size - K, 0, 0, 0, rows - b))
        index = torch.tensor(slots + [self.scratch] * (rows - b), device=self.device)
        self.codec.position[self.scratch] = 0  # the scratch row never runs out of RoPE table
        with self._dilated_tuned((rows, size)):
            audio = self.graphs.run((rows, size), index, codes)
        return audio[:b, : K * self.frame_length]

    def _graph_body(self, key: tuple[int, int], index: Tensor, codes: Tensor) -> Tensor:
        return self._decode(index, codes)

    def _scratch_inputs(self, key: tuple[int, int]) -> tuple[Tensor, Tensor]:
        rows, size = key
        return (torch.full((rows,), self.scratch, dtype=torch.int64, device=self.device),
                torch.zeros(rows, self.codec.num_codebooks, size, dtype=torch.int64, device=self.device))

    def _run(self) -> None:
        if self._cuda:
            torch.cuda.set_device(self.device)  # Triton launches on the thread's current device
        ctx = torch.cuda.stream(self._stream) if self._cuda else contextlib.nullcontext()
        held: deque = deque()  # commands taken off the queue while merging decodes, run next in their order
        with torch.inference_mode(), ctx:
            while True:
                cmd = held.popleft() if held else self._q.get()
                kind = cmd[0]
                if kind == "stop":
                    return
                if kind == "decode" and self.merge_rows and not held:  # (held ones came off the queue first)
                    cmd = self._merge(cmd, held)
                try:
                    if kind == "decode":
                        self._decode_deliver(*cmd[1:])
                    elif kind == "reset":
                        self._resets(cmd[1], held)
                    elif kind == "finish":
                        self._finish(cmd)
                    elif kind == "call":
                        cmd[1]()
                except Exception as e:  # noqa: BLE001 - fail the affected streams, keep serving
                    log.exception("vocoder command %s failed", kind)
                    if kind == "decode":
                        for d in cmd[3]:
                            d.stream.finish(RuntimeError(f"audio decoding failed: {type(e).__name__}: {e}"))
                finally:
                    if kind == "decode":  # a merged command carries the deliveries of every decode it took
                        self.frames_done += sum(d.frames for d in cmd[3])
                        while self._waiting and self._waiting[0][0] <= self.frames_done:
                            self._waiting.popleft()

    def _finish(self, cmd: tuple) -> None:
        # counted before the stream ends: whoever waits on the stream then sees the count that includes it (the
        # RunPod engines test read the counters between the two and timed out in CI)
        if cmd[3]:
            self.on_finished(cmd[1])
        cmd[1].finish(cmd[2])

    def _resets(self, slot: int, held: deque) -> None:
        """A slot's reset and the resets and finishes queued right behind it: the finishes first, then every slot in
        one reset. A reset is ~60 small kernels (one per state buffer) whatever its rows, and streams started together
        end together: one reset per slot left the GPU mostly idle on them before the last streams finished
        (scripts/device/gpu_timeline.py; docs/performance.md, "Codec"). Any order among these commands is safe: a
        finish needs
        only its stream's earlier decodes done, a reset its slot's; the command that ends the run (a decode, maybe
        of one of these slots' next streams) runs after the reset."""
        slots = [slot]
        try:
            while True:
                if held:
                    nxt = held.popleft()
                else:
                    try:
                        nxt = self._q.get_nowait()
                    except queue.Empty:
                        break
                if nxt[0] == "reset":
                    slots.append(nxt[1])
                elif nxt[0] == "finish":
                    try:
                        self._finish(nxt)
                    except Exception:  # noqa: BLE001 - one stream's failure must not hold back the others
                        log.exception("finishing a stream failed")
                else:
                    held.appendleft(nxt)
                    break
        finally:  # whatever happened, the slots must not keep their old streams' state
            self.codec.reset(torch.tensor(slots, device=self.device))

    def _merge(self, cmd: tuple, held: deque) -> tuple:
        """Joins the decodes queued right behind `cmd` into one batched call while this thread is behind
        (under load small decodes pile up: streams reach chunk boundaries at different steps, and streams end at
        different steps, each end a final decode followed by its slot's reset and its stream's finish). Decodes
        of the same padded chunk size and of other slots join, up to merge_rows rows; resets and finishes between
        them run right after the joined call, in their order (a reset's slot joins no later decode: that decode
        belongs to the slot's next stream; a finished stream has no later decode). Anything else stops the merge
        and runs after those, so every slot's and every stream's commands keep their order. Rows narrower than
        the call are padded: only final chunks are ever narrower than their chunk size (audio_feed), and the
        codec is causal."""
        parts, deferred = [cmd], []
        rows, size = len(cmd[1]), self._chunk_size(cmd[2].shape[-1])
        taken = set(cmd[1])  # slots whose decodes joined, or whose reset was passed over
        while rows < self.merge_rows:
            try:
                nxt = self._q.get_nowait()
            except queue.Empty:
                break
            if nxt[0] in ("reset", "finish"):
                deferred.append(nxt)
                if nxt[0] == "reset":
                    taken.add(nxt[1])
                continue
            if (nxt[0] != "decode" or self._chunk_size(nxt[2].shape[-1]) != size
                    or rows + len(nxt[1]) > self.merge_rows or not taken.isdisjoint(nxt[1])):
                deferred.append(nxt)
                break
            parts.append(nxt)
            rows += len(nxt[1])
            taken.update(nxt[1])
        held.extend(deferred)
        if len(parts) == 1:
            return cmd
        width = max(p[2].shape[-1] for p in parts)
        codes = [np.pad(p[2], ((0, 0), (0, 0), (0, width - p[2].shape[-1]))) for p in parts]
        return ("decode", [s for p in parts for s in p[1]], np.concatenate(codes), [d for p in parts for d in p[3]])

    def _chunk_size(self, frames: int) -> int:
        """The chunk size a call of `frames` frames is padded to (decode_padded)."""
        return next((s for s in self.chunk_sizes if s >= frames), frames)

    def _decode_deliver(self, slots: list[int], codes: np.ndarray, deliveries: list[Delivery]) -> None:
        t0 = time.perf_counter()
        audio = self.decode_padded(slots, torch.from_numpy(codes).to(self.device))
        if self._cuda and self.pinned_copy:
            host = self._to_host(audio)  # the staging buffer: valid until the next call, so each wave is copied out
            # relayed streams (the engine process's writer pickles their chunks within moments) share one copy of
            # the block: 256 row copies took ~5x one block copy's time, with the GIL handed away at each (stop 61);
            # queued streams keep a copy each, so a slow reader never pins a whole call's block
            relayed = [d.stream.relayed for d in deliveries]
            block = host[:len(deliveries)].copy() if any(relayed) else None
            waves = [block[i, : d.frames * self.frame_length] if r else host[i, : d.frames * self.frame_length].copy()
                     for i, (d, r) in enumerate(zip(deliveries, relayed))]
        else:
            host = audio.float().cpu().numpy()  # waits for this stream only
            waves = [host[i, : d.frames * self.frame_length] for i, d in enumerate(deliveries)]
        for wave, d in zip(waves, deliveries):
            d.stream.emit(wave, d.text_index)
        self.on_decoded(sum(d.frames for d in deliveries), time.perf_counter() - t0)

    def _to_host(self, audio: Tensor) -> np.ndarray:
        """audio [b, L] on the device -> float32 [b, L] in the pinned staging buffer, valid until the next call.
        A copy into pageable memory is synchronous: it waits for the codec's kernels inside the driver, and the
        engine thread's CUDA calls (launches, event records) were seen to block meanwhile, off the CPU, for a
        third of a level (scripts/device/loop_trace.py; docs/performance.md, "Codec"), as if behind a driver lock. Into
        pinned
        memory it is an asynchronous DMA; the wait is an event's, which blocks only this thread."""
        need = audio.numel()
        if self._staging is None or self._staging.numel() < need:
            self._staging = torch.empty(need, dtype=torch.float32, pin_memory=True)
        host = self._staging[:need].view(audio.shape)
        host.copy_(audio, non_blocking=True)  # bf16 -> float32 on the device, then the DMA
        self._copied.record(self._stream)
        self._copied.synchronize()
        return host.numpy()
