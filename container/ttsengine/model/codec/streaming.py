"""The codec's decoder run incrementally: new frames in, their audio out, with exactly the state the
causal codec needs, for many streams at once (one row each). Never re-decodes a prefix.

State per row (rows of preallocated buffers, gathered and scattered by row index):
- every stride-1 causal conv: its last (span - 1) input samples (zeros at the start = the causal
  zero padding of a whole decode);
- every transposed conv: the last (kernel - stride) output samples not yet complete (overlap-add;
  the bias is added once, to completed samples only; a whole decode drops the final tail too);
- the window-limited transformer (post_module): its last (window - 1) keys and values per layer,
  plus the row's absolute frame position (RoPE and the window mask use absolute positions). With a ring
  (ring_chunk; feature codec_kv_ring) the keys and values stay in place instead, in a ring of
  window - 1 + ring_chunk positions per row: a call writes its new ones only and attends over the row's ring
  (position p in slot p % size), where the plain state is gathered, concatenated and written back whole on every
  call (94% of a row's state at S1's sizes: issue 46).
Snake, LayerNorm, pointwise layers and codebook lookups are per-sample and need nothing.
One walker for both memory layouts (channel-major [b, C, n] or time-major [b, n, C] activations): the layout
(layout.py) is the axis of time and the few ops whose form depends on it.
Streaming equals the whole decode (Codec.decode) to float rounding, at any chunk size: tests/model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..layers import attend
from .conv import (
    CausalConv,
    CausalTransConv,
    ConvNeXtBlock,
    ResidualUnit,
    Snake,
    residual_bias,
    snake,
    snake_time_major,
)
from .dac import Codec, DecoderBlock
from .layout import ChannelMajor, TimeMajor
from .own_convs import OwnConvs
from .transformer import CodecTransformer


def _state_shapes(module: nn.Module, prefix: str, out: dict[str, tuple[int, ...]],
                  layout: ChannelMajor | TimeMajor, ring: int = 0) -> None:
    if isinstance(module, CausalConv):
        if module.stride != 1:
            raise ValueError(f"{prefix}: streaming needs stride-1 causal convs in the decoder")
        if module.left:
            out[prefix] = layout.state_shape(module.conv.in_channels, module.left)
    elif isinstance(module, CausalTransConv):
        if module.trim:
            out[prefix] = layout.state_shape(module.conv.out_channels, module.trim)
    elif isinstance(module, CodecTransformer):
        c = module.cfg
        for i in range(c.n_layer):  # ring: [positions, heads, d] per row, a (row, slot) one contiguous block
            shape = (c.window - 1 + ring, c.n_head, c.head_dim) if ring else (c.n_head, c.window - 1, c.head_dim)
            out[f"{prefix}.{i}.k"] = out[f"{prefix}.{i}.v"] = shape
    elif isinstance(module, ConvNeXtBlock):
        _state_shapes(module.dwconv, prefix + ".dwconv", out, layout)
    elif isinstance(module, ResidualUnit):
        _state_shapes(module.block, prefix + ".block", out, layout)
    else:
        for name, child in module.named_children():
            _state_shapes(child, f"{prefix}.{name}", out, layout)


class StreamingCodec:
    """Chunk-by-chunk decode for `rows` streams; each row keeps its own state between calls."""

    def __init__(self, codec: Codec, rows: int, max_frames: int, time_major: bool = False, ring_chunk: int = 0):
        """max_frames: the longest stream (frames) a row will decode; sizes the RoPE table. time_major: the
        activations run as [b, T, C] and every conv as a channels-last (NHWC) cuDNN convolution on them
        (TTS_CODEC_CHANNELS_LAST; layout.TimeMajor), else [b, C, T] as the modules run them. ring_chunk: keep the
        transformer's keys and values in a ring sized for calls of up to this many frames (longer ones go through
        it in pieces); 0: the plain state (feature codec_kv_ring)."""
        self.codec = codec
        self.time_major = time_major
        # the swappable ops (layout.Kernels), read by the layout at every call. snake(x, alpha, out=None): the
        # eager one, or the fused Triton kernel (Vocoder.use_snake_kernel); the time-major layout calls
        # snake_time_major on [b, T, C] and residual_bias
        self.snake: Callable[..., Tensor] = snake
        self.snake_time_major: Callable[..., Tensor] = snake_time_major  # (x, alpha, out=None, bias=None)
        self.residual_bias: Callable[[Tensor, Tensor, Tensor], Tensor] = residual_bias
        # around the time-major dilated convs (Vocoder._dilated_tuned sets it); default: nothing
        self.tune_dilated: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        # the time-major layout's convs as GEMMs of our own (Vocoder.use_own_convs; feature codec_own_convs); None:
        # cuDNN's
        self.own_convs: OwnConvs | None = None
        self.layout = (TimeMajor if time_major else ChannelMajor)(self)
        p = next(codec.parameters())
        self.device, self.dtype = p.device, p.dtype
        shapes: dict[str, tuple[int, ...]] = {}
        self.ring_chunk = ring_chunk
        _state_shapes(codec.quantizer.post_module, "post", shapes, self.layout, ring_chunk)
        # the ring's buffers are read and written in place (_transformer_ring), never gathered whole
        self.in_place = {k for k in shapes if k.startswith("post.")} if ring_chunk else set()
        _state_shapes(codec.quantizer.upsample, "up", shapes, self.layout)
        _state_shapes(codec.decoder.model, "dec", shapes, self.layout)
        self.state = {k: torch.zeros(rows, *s, dtype=self.dtype, device=self.device) for k, s in shapes.items()}
        self.position = torch.zeros(rows, dtype=torch.int64, device=self.device)  # frames decoded per row
        self.frame_length = codec.frame_length
        self.num_codebooks = codec.cfg.num_codebooks
        post = codec.quantizer.post_module
        self.rope = post.rope(0, max_frames + 1024, self.device)[0]  # [positions, d/2, 2], indexed on device

    def reset(self, rows: Tensor) -> None:
        """Forget the streams in `rows` (int64 [b]) so the rows can start new ones."""
        for buf in self.state.values():
            buf.index_fill_(0, rows, 0)
        self.position.index_fill_(0, rows, 0)

    def codes_to_audio(self, rows: Tensor, codes: Tensor) -> Tensor:
        """rows: int64 [b] (distinct); codes: int64 [b, n, K] -> audio [b, K * frame_length]."""
        state = {k: v.index_select(0, rows) for k, v in self.state.items() if k not in self.in_place}
        pos = self.position.index_select(0, rows)
        q, lay = self.codec.quantizer, self.layout
        z = q.codes_to_latent(codes).to(self.dtype)  # [b, C, K]
        if self.ring_chunk:
            h = self._transformer_ring(q.post_module, z.transpose(1, 2), rows, pos)
        else:
            h = self._transformer(q.post_module, z.transpose(1, 2), state, "post", pos)
        h = lay.from_time_major(h)
        h = self._walk(q.upsample, h, state, "up")
        audio = lay.to_time_major(self._walk(self.codec.decoder.model, h, state, "dec"))[:, :, 0]  # [b, T]
        for k, v in state.items():
            self.state[k].index_copy_(0, rows, v)
        self.position.index_add_(0, rows, torch.full_like(pos, codes.shape[-1]))
        return audio

    # ---- one module, streaming: x and the result are the layout's activations, time on axis t ----------------
    def _walk(self, module: nn.Module, x: Tensor, state: dict[str, Tensor], prefix: str) -> Tensor:
        lay, t = self.layout, self.layout.time
        if isinstance(module, CausalConv):
            if not module.left:
                return lay.conv(module.conv, x)
            full = torch.cat([state[prefix], x], dim=t)
            state[prefix] = full.narrow(t, -module.left, module.left)
            return lay.conv(module.conv, full)
        if isinstance(module, CausalTransConv):
            conv = module.conv
            y = lay.conv_transposed(conv, x)  # (L-1)s + k samples, no bias; ours to change
            n = x.shape[t] * conv.stride[0]
            if module.trim:
                y.narrow(t, 0, module.trim).add_(state[prefix])  # the overlap in place: no copy of the whole output
                state[prefix] = y.narrow(t, n, module.trim)
            return y.narrow(t, 0, n) + lay.per_channel(conv.bias)
        if isinstance(module, Snake):
            return lay.snake(x, module.alpha)
        if isinstance(module, ResidualUnit):
            return self._residual_unit(module, x, state, prefix + ".block")
        if isinstance(module, ConvNeXtBlock):
            y = self._walk(module.dwconv, x, state, prefix + ".dwconv")
            return x + lay.from_time_major(module.pointwise_time_major(lay.to_time_major(y)))
        if isinstance(module, nn.Tanh):
            return torch.tanh(x)
        if isinstance(module, DecoderBlock):
            return self._walk(module.block, x, state, prefix + ".block")
        if isinstance(module, nn.Sequential):
            return self._sequential(module, x, state, prefix)
        raise TypeError(f"no streaming rule for {type(module).__name__} at {prefix}")

    def _sequential(self, module: nn.Sequential, x: Tensor, state: dict[str, Tensor], prefix: str) -> Tensor:
        # the children in turn; a Snake followed by a causal conv with history goes as one step (_snake_behind)
        children = list(module.named_children())
        i = 0
        while i < len(children):
            name, child = children[i]
            nxt = children[i + 1] if i + 1 < len(children) else None
            if isinstance(child, Snake) and nxt is not None and isinstance(nxt[1], CausalConv) and nxt[1].left:
                x = self.layout.conv(nxt[1].conv, self._snake_behind(child, nxt[1], x, state, f"{prefix}.{nxt[0]}"))
                i += 2
                continue
            x = self._walk(child, x, state, f"{prefix}.{name}")
            i += 1
        return x

    def _snake_behind(self, act: Snake, conv: CausalConv, x: Tensor, state: dict[str, Tensor], key: str) -> Tensor:
        """The input of a causal conv with history that follows a Snake, without concatenating: Snake writes its
        output right behind the conv's kept input samples in one buffer of left + L samples (the cat was ~13% of
        the codec's time). Keeps the buffer's last `left` samples as the conv's state."""
        t, left = self.layout.time, conv.left
        shape = list(x.shape)
        shape[t] += left
        full = torch.empty(shape, dtype=x.dtype, device=x.device)  # [b, C, left + L] / [b, left + L, C]
        full.narrow(t, 0, left).copy_(state[key])
        self.layout.snake(x, act.alpha, out=full.narrow(t, left, x.shape[t]))
        state[key] = full.narrow(t, -left, left)
        return full

    def _residual_unit(self, unit: ResidualUnit, x: Tensor, state: dict[str, Tensor], prefix: str) -> Tensor:
        # x + conv1(snake(conv7(snake(x)))); where the layout folds biases (layout.TimeMajor.fold_biases), each
        # conv's bias is added by what reads its output: the second Snake, the residual sum
        lay = self.layout
        if not lay.fold_biases:
            return x + self._walk(unit.block, x, state, prefix)
        act1, conv7, act2, conv1 = unit.block
        if conv1.left or conv7.conv.bias is None or conv1.conv.bias is None:  # not the codec's unit: plain walk
            return x + self._walk(unit.block, x, state, prefix)
        h = lay.conv_snake(conv7.conv, self._snake_behind(act1, conv7, x, state, f"{prefix}.1"), act2.alpha)
        return lay.conv_residual(conv1.conv, h, x)

    def _transformer(self, t: CodecTransformer, h: Tensor, state: dict[str, Tensor], prefix: str,
                     pos: Tensor) -> Tensor:
        # h: [b, K, C] -> [b, K, C], time-major whatever the codec's layout (the transformer's own); pos: [b] the
        # absolute frame position of h's first frame
        W = t.cfg.window
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
        return t.norm(h)

    def _transformer_ring(self, t: CodecTransformer, h: Tensor, rows: Tensor, pos: Tensor) -> Tensor:
        # as _transformer, with each layer's keys and values in the rows' rings of self.state ([rows, S, H, d]):
        # the call's new ones written into slots (position % S), then the whole ring of each row attended, a slot's
        # absolute position told by the mask (a slot not written yet is masked; reset left it zero, so finite)
        W, S, cap = t.cfg.window, t.cfg.window - 1 + self.ring_chunk, self.ring_chunk
        b, K, _ = h.shape
        if K > cap:  # longer than the ring takes at once: in pieces, each seeing the ones before (causal)
            return torch.cat([self._transformer_ring(t, h[:, s:s + cap], rows, pos + s) for s in range(0, K, cap)], 1)
        q_pos = pos[:, None] + torch.arange(K, device=h.device)  # [b, K]
        where = (rows[:, None] * S + q_pos % S).reshape(-1)  # [b*K] (row, slot) in a ring buffer's [rows * S, ...]
        newest = q_pos[:, -1:]  # [b, 1] the last position written
        k_pos = newest - (newest - torch.arange(S, device=h.device)) % S  # [b, S] the position each slot holds
        d = q_pos[:, :, None] - k_pos[:, None, :]
        mask = ((d >= 0) & (d < W) & (k_pos[:, None, :] >= 0))[:, None]  # [b, 1, K, S]
        rope = self.rope[q_pos]  # [b, K, d/2, 2]
        for i, layer in enumerate(t.layers):
            att = layer.attention
            q, k, v = att.project(layer.attention_norm(h), rope)  # [b, K, H, d]
            ring_k, ring_v = self.state[f"post.{i}.k"], self.state[f"post.{i}.v"]  # [rows, S, H, d]
            ring_k.view(-1, *ring_k.shape[2:]).index_copy_(0, where, k.reshape(b * K, *k.shape[2:]))
            ring_v.view(-1, *ring_v.shape[2:]).index_copy_(0, where, v.reshape(b * K, *v.shape[2:]))
            keys = ring_k.index_select(0, rows).transpose(1, 2)  # [b, H, S, d], d contiguous
            values = ring_v.index_select(0, rows).transpose(1, 2)
            y = attend(q.transpose(1, 2), keys, values, mask)
            y = att.wo(y.transpose(1, 2).reshape(b, K, att.n_head * att.head_dim))
            h = h + layer.attention_layer_scale(y)
            h = h + layer.ffn_layer_scale(layer.feed_forward(layer.ffn_norm(h)))
        return t.norm(h)
