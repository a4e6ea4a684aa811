"""Streaming codec decode: new frames in, their audio out, keeping exactly the state the causal
codec needs, batched across streams. Never re-decodes a prefix.

State per stream slot (rows of batched buffers, gathered and scattered by slot index):
- every stride-1 causal conv: its last (span - 1) input samples (zeros at the start = the causal
  zero padding of a full decode);
- every transposed conv: the last (kernel - stride) output samples not yet complete (overlap-add;
  the bias is added once, to completed samples only; a full decode drops the final tail too);
- the window-limited transformer (post_module): its last (window - 1) keys and values per layer,
  plus the stream's absolute frame position (RoPE and the window mask use absolute positions).
Snake, LayerNorm, pointwise layers and codebook lookups are per-sample and need nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.codec import Codec
from ..model.codec.conv import CausalConv, CausalTransConv, ConvNeXtBlock, ResidualUnit, Snake, snake
from ..model.codec.transformer import CodecTransformer
from ..model.layers import attend

log = logging.getLogger(__name__)


def _state_shapes(module: nn.Module, prefix: str, out: dict[str, tuple[int, ...]]) -> None:
    if isinstance(module, CausalConv):
        if module.stride != 1:
            raise ValueError(f"{prefix}: streaming needs stride-1 causal convs in the decoder")
        if module.left:
            out[prefix] = (module.conv.in_channels, module.left)
    elif isinstance(module, CausalTransConv):
        if module.trim:
            out[prefix] = (module.conv.out_channels, module.trim)
    elif isinstance(module, CodecTransformer):
        c = module.cfg
        for i in range(c.n_layer):
            out[f"{prefix}.{i}.k"] = out[f"{prefix}.{i}.v"] = (c.n_head, c.window - 1, c.head_dim)
    elif isinstance(module, ConvNeXtBlock):
        _state_shapes(module.dwconv, prefix + ".dwconv", out)
    elif isinstance(module, (ResidualUnit,)):
        _state_shapes(module.block, prefix + ".block", out)
    else:
        for name, child in module.named_children():
            _state_shapes(child, f"{prefix}.{name}", out)


class StreamingDecoder:
    """Decodes codes to audio chunk by chunk for up to `slots` concurrent streams.

    `decode` takes any batch and chunk length. `decode_padded` is the serving path: chunk lengths
    are padded up to one of `chunk_sizes` (the codec is causal, so frames appended after the real
    ones change nothing before them; only a stream's final chunk is ever padded, and its state is
    reset afterwards) and the batch is padded to a bucket with a scratch row, so the compiled code
    sees few shapes.
    """

    def __init__(self, codec: Codec, slots: int, max_frames: int, chunk_sizes: tuple[int, ...] = (),
                 buckets: tuple[int, ...] = ()):
        """max_frames: the longest stream (frames) a slot will decode; sizes the RoPE table."""
        self.codec = codec
        self.chunk_sizes = tuple(sorted(chunk_sizes))
        self.buckets = tuple(sorted(buckets))
        self.scratch = slots  # one extra state row that padding rows read and write
        self._impl = self.decode
        self._snake = snake
        p = next(codec.parameters())
        self.device, self.dtype = p.device, p.dtype
        shapes: dict[str, tuple[int, ...]] = {}
        _state_shapes(codec.quantizer.post_module, "post", shapes)
        _state_shapes(codec.quantizer.upsample, "up", shapes)
        _state_shapes(codec.decoder.model, "dec", shapes)
        rows = slots + 1
        self.state = {k: torch.zeros(rows, *s, dtype=self.dtype, device=self.device) for k, s in shapes.items()}
        self.position = torch.zeros(rows, dtype=torch.int64, device=self.device)  # frames decoded per slot
        self.frame_length = codec.frame_length
        post = codec.quantizer.post_module
        self.rope = post.rope(0, max_frames + 1024, self.device)[0]  # [positions, d/2, 2], indexed on device

    def reset(self, slots: Tensor) -> None:
        """Forget the streams in `slots` (int64 [b]) so the rows can start new ones."""
        for buf in self.state.values():
            buf.index_fill_(0, slots, 0)
        self.position.index_fill_(0, slots, 0)

    def enable_compile(self) -> None:
        """torch.compile the chunk decode (batch dynamic; one compile per chunk size): fuses Snake and
        the other elementwise chains between convolutions."""
        self._impl = torch.compile(self.decode, dynamic=None)
        self._compiled = True

    _compiled = False

    def use_snake_kernel(self) -> None:
        """Snake as one Triton kernel (model/kernels/snake.py): the eager codec's fused pass."""
        from ..model.kernels.snake import snake_triton

        self._snake = snake_triton

    def decode_padded(self, slots: list[int], codes: Tensor) -> Tensor:
        """slots: distinct stream slots; codes: int64 [b, n, K] with K <= max(chunk_sizes)
        -> audio [b, K * frame_length]."""
        b, _, K = codes.shape
        cap = self._graph_cap  # the planned graphs' largest batch, captured yet or not (lazy start-up)
        if cap and b > cap:  # larger than the largest captured batch: graphed pieces
            return torch.cat([self.decode_padded(slots[i:i + cap], codes[i:i + cap]) for i in range(0, b, cap)])
        size = next(s for s in self.chunk_sizes if s >= K)
        rows = next((x for x in self.buckets if x >= b), b)
        if size > K or rows > b:
            codes = torch.nn.functional.pad(codes, (0, size - K, 0, 0, 0, rows - b))
        index = torch.tensor(slots + [self.scratch] * (rows - b), device=self.device)
        self.position[self.scratch] = 0  # the scratch row never runs out of RoPE table
        self._mark_batch_dynamic(index, codes)
        graph = self._graphs.get((rows, size))
        if graph is not None:
            graph.index.copy_(index)
            graph.codes.copy_(codes)
            graph.graph.replay()
            audio = graph.audio
        else:
            audio = self._impl(index, codes)
            if (rows, size) in self._graph_keys and not self._graphs_failed:
                self._record_at_first_use(rows, size)
        return audio[:b, : K * self.frame_length]

    def _mark_batch_dynamic(self, index: Tensor, codes: Tensor) -> None:
        if self._compiled:
            from torch import _dynamo

            top = max(self.buckets[-1] if self.buckets else 2, 2) + 1
            _dynamo.mark_dynamic(index, 0, min=2, max=top)
            _dynamo.mark_dynamic(codes, 0, min=2, max=top)

    def _record_at_first_use(self, rows: int, size: int) -> None:
        # the real decode that just ran was this shape's warm-up; recording executes nothing, so no
        # stream's state moves twice
        t0 = time.perf_counter()
        try:
            with self.capture_lock:
                self._graphs[(rows, size)] = self._record(rows, size)
        except Exception as e:  # noqa: BLE001 - the decode itself ran; only its replay is lost
            log.warning("capturing the codec graph of %d rows x %d frames failed (%s: %s); codec graphs still "
                        "pending run uncaptured", rows, size, type(e).__name__, e)
            self._graphs_failed = True
            return
        log.info("captured the codec graph of %d rows x %d frames at first use in %.2f s", rows, size,
                 time.perf_counter() - t0)

    def _record(self, rows: int, size: int) -> _Captured:
        """Records (executes nothing) the chunk decode of `rows` x `size` into a graph whose static
        inputs start as scratch rows."""
        index = torch.full((rows,), self.scratch, dtype=torch.int64, device=self.device)
        codes = torch.zeros(rows, self.codec.cfg.num_codebooks, size, dtype=torch.int64, device=self.device)
        self._mark_batch_dynamic(index, codes)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=torch.cuda.current_stream(),
                              capture_error_mode="thread_local"):
            audio = self._impl(index, codes)
        return _Captured(graph, index, codes, audio)

    _graphs: dict = {}

    def plan_graphs(self, max_rows: int) -> None:
        """Plans CUDA graphs of the chunk decode for every (bucket <= max_rows, chunk size); they are
        captured by capture_graphs / capture_next. Larger batches run as graphed pieces of max_rows."""
        self._graph_keys = [(r, s) for r in self.buckets if r <= max_rows for s in self.chunk_sizes]
        self._graph_cap = max((r for r, _ in self._graph_keys), default=0)
        self._graphs, self._graphs_failed = {}, False

    _graph_keys: list = []
    _graph_cap = 0
    _graphs_failed = False
    capture_lock = threading.Lock()  # the engine hands in the lock its decode-step captures hold

    @property
    def pending_graphs(self) -> list[int]:
        """Row counts with a planned graph not captured yet, smallest first."""
        if self._graphs_failed:
            return []
        return sorted({r for r, s in self._graph_keys if (r, s) not in self._graphs})

    def capture_graphs(self, rows: list[int] | None = None) -> None:
        """Captures the planned graphs of `rows` (default: all pending) on the calling thread (the
        vocoder worker), where they are replayed. Nothing may be decoding meanwhile."""
        todo = sorted(self.pending_graphs if rows is None else rows, reverse=True)  # largest first: the pool
        t0 = time.perf_counter()  # is reused by the smaller ones
        n, count = self.codec.cfg.num_codebooks, 0
        with self.capture_lock:
            for r in todo:
                for size in self.chunk_sizes:
                    if (r, size) in self._graphs or (r, size) not in self._graph_keys:
                        continue
                    for _ in range(2):  # warm-up: lazy init, kernel selection (scratch rows only)
                        self._impl(torch.full((r,), self.scratch, dtype=torch.int64, device=self.device),
                                   torch.zeros(r, n, size, dtype=torch.int64, device=self.device))
                    self._graphs[(r, size)] = self._record(r, size)
                    count += 1
            self.reset(torch.tensor([self.scratch], device=self.device))
        log.info("captured %d codec graph(s) (rows %s) in %.2f s", count, ",".join(map(str, todo[::-1])),
                 time.perf_counter() - t0)

    _pool = None

    def capture_next(self) -> None:
        """Captures the smallest pending row count's graphs (lazy start-up); a failure leaves the
        pending ones uncaptured (logged once): they run as plain decodes."""
        try:
            self.capture_graphs(self.pending_graphs[:1])
        except Exception as e:  # noqa: BLE001 - a missing graph costs speed, not service
            log.warning("capturing codec graphs failed (%s: %s); rows %s run uncaptured", type(e).__name__, e,
                        self.pending_graphs)
            self._graphs_failed = True

    def warm_up(self) -> None:
        """Compiles (when enabled) every chunk size with a padding-only batch."""
        t0 = time.perf_counter()
        for size in self.chunk_sizes:
            n = self.codec.cfg.num_codebooks
            self.decode_padded([self.scratch], torch.zeros(1, n, size, dtype=torch.int64, device=self.device))
        self.reset(torch.tensor([self.scratch], device=self.device))
        log.info("codec warm-up (%s) in %.2f s", "compiled" if self._compiled else "eager", time.perf_counter() - t0)

    def decode(self, slots: Tensor, codes: Tensor) -> Tensor:
        """slots: int64 [b] (distinct); codes: int64 [b, n, K] -> audio [b, K * frame_length]."""
        state = {k: v.index_select(0, slots) for k, v in self.state.items()}
        pos = self.position.index_select(0, slots)
        q = self.codec.quantizer
        z = q.codes_to_latent(codes).to(self.dtype)  # [b, C, K]
        z = self._transformer(q.post_module, z, state, "post", pos)
        z = self._walk(q.upsample, z, state, "up")
        y = self._walk(self.codec.decoder.model, z, state, "dec")
        for k, v in state.items():
            self.state[k].index_copy_(0, slots, v)
        self.position.index_add_(0, slots, torch.full_like(pos, codes.shape[-1]))
        return y[:, 0]

    # ---- one module, streaming ----------------------------------------------------------------
    def _walk(self, module: nn.Module, x: Tensor, state: dict[str, Tensor], prefix: str) -> Tensor:
        if isinstance(module, CausalConv):
            if not module.left:
                return module.conv(x)
            full = torch.cat([state[prefix], x], dim=-1)
            state[prefix] = full[..., -module.left:]
            return module.conv(full)
        if isinstance(module, CausalTransConv):
            conv = module.conv
            y = F.conv_transpose1d(x, conv.weight, None, stride=conv.stride)  # [b, C, (L-1)s + k]
            n = x.shape[-1] * conv.stride[0]
            if module.trim:
                y = torch.cat([y[..., :module.trim] + state[prefix], y[..., module.trim:]], dim=-1)
                state[prefix] = y[..., n:]
            return y[..., :n] + conv.bias[None, :, None]
        if isinstance(module, Snake):
            return self._snake(x, module.alpha)
        if isinstance(module, ResidualUnit):
            return x + self._walk(module.block, x, state, prefix + ".block")
        if isinstance(module, ConvNeXtBlock):
            return x + module.pointwise(self._walk(module.dwconv, x, state, prefix + ".dwconv"))
        if isinstance(module, nn.Tanh):
            return torch.tanh(x)
        if isinstance(module, nn.Sequential) or type(module).__name__ in ("DecoderBlock",):
            for name, child in module.named_children():
                x = self._walk(child, x, state, f"{prefix}.{name}")
            return x
        raise TypeError(f"no streaming rule for {type(module).__name__} at {prefix}")

    def _transformer(self, t: CodecTransformer, x: Tensor, state: dict[str, Tensor], prefix: str,
                     pos: Tensor) -> Tensor:
        # x: [b, C, K]; pos: [b] absolute frame position of x's first frame
        W = t.cfg.window
        h = x.transpose(1, 2)
        b, K, _ = h.shape
        steps = torch.arange(K, device=h.device)
        q_pos = pos[:, None] + steps  # [b, K]
        cache_pos = pos[:, None] - (W - 1) + torch.arange(W - 1, device=h.device)  # [b, W-1]
        k_pos = torch.cat([cache_pos, q_pos], dim=1)  # [b, W-1+K]
        d = q_pos[:, :, None] - k_pos[:, None, :]
        mask = ((d >= 0) & (d < W) & (k_pos[:, None, :] >= 0))[:, None]  # [b, 1, K, W-1+K]
        rope = self.rope[q_pos]  # [b, K, d/2, 2]
        for i, layer in enumerate(t.layers):
            att = layer.attention
            q, k, v = att.project(layer.attention_norm(h), rope)
            keys = torch.cat([state[f"{prefix}.{i}.k"], k.transpose(1, 2)], dim=2)
            values = torch.cat([state[f"{prefix}.{i}.v"], v.transpose(1, 2)], dim=2)
            state[f"{prefix}.{i}.k"], state[f"{prefix}.{i}.v"] = keys[:, :, -(W - 1):], values[:, :, -(W - 1):]
            y = attend(q.transpose(1, 2), keys, values, mask)
            y = att.wo(y.transpose(1, 2).reshape(b, K, att.n_head * att.head_dim))
            h = h + layer.attention_layer_scale(y)
            h = h + layer.ffn_layer_scale(layer.feed_forward(layer.ffn_norm(h)))
        return t.norm(h).transpose(1, 2)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    index: Tensor  # static input: slot rows
    codes: Tensor  # static input: codes [rows, n, size]
    audio: Tensor  # static output
