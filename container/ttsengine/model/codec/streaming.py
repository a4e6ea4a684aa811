"""The codec's decoder run incrementally: new frames in, their audio out, with exactly the state the
causal codec needs, for many streams at once (one row each). Never re-decodes a prefix.

State per row (rows of preallocated buffers, gathered and scattered by row index):
- every stride-1 causal conv: its last (span - 1) input samples (zeros at the start = the causal
  zero padding of a whole decode);
- every transposed conv: the last (kernel - stride) output samples not yet complete (overlap-add;
  the bias is added once, to completed samples only; a whole decode drops the final tail too);
- the window-limited transformer (post_module): its last (window - 1) keys and values per layer,
  plus the row's absolute frame position (RoPE and the window mask use absolute positions).
Snake, LayerNorm, pointwise layers and codebook lookups are per-sample and need nothing.
Streaming equals the whole decode (Codec.decode) to float rounding, at any chunk size: tests/model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
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
from .transformer import CodecTransformer


def _state_shapes(module: nn.Module, prefix: str, out: dict[str, tuple[int, ...]], time_major: bool = False) -> None:
    # a conv's kept samples: [C, n] channel-major, [n, C] time-major
    if isinstance(module, CausalConv):
        if module.stride != 1:
            raise ValueError(f"{prefix}: streaming needs stride-1 causal convs in the decoder")
        if module.left:
            c, n = module.conv.in_channels, module.left
            out[prefix] = (n, c) if time_major else (c, n)
    elif isinstance(module, CausalTransConv):
        if module.trim:
            c, n = module.conv.out_channels, module.trim
            out[prefix] = (n, c) if time_major else (c, n)
    elif isinstance(module, CodecTransformer):
        c = module.cfg
        for i in range(c.n_layer):
            out[f"{prefix}.{i}.k"] = out[f"{prefix}.{i}.v"] = (c.n_head, c.window - 1, c.head_dim)
    elif isinstance(module, ConvNeXtBlock):
        _state_shapes(module.dwconv, prefix + ".dwconv", out, time_major)
    elif isinstance(module, (ResidualUnit,)):
        _state_shapes(module.block, prefix + ".block", out, time_major)
    else:
        for name, child in module.named_children():
            _state_shapes(child, f"{prefix}.{name}", out, time_major)



def _walk_sequential(module: nn.Sequential, x: Tensor, state: dict[str, Tensor], prefix: str, walk: Callable,
                     snake_into_conv: Callable) -> Tensor:
    # the children in turn; a Snake followed by a causal conv with history goes as one step (snake_into_conv)
    children = list(module.named_children())
    i = 0
    while i < len(children):
        name, child = children[i]
        nxt = children[i + 1] if i + 1 < len(children) else None
        if isinstance(child, Snake) and nxt is not None and isinstance(nxt[1], CausalConv) and nxt[1].left:
            x = snake_into_conv(child, nxt[1], x, state, f"{prefix}.{nxt[0]}")
            i += 2
            continue
        x = walk(child, x, state, f"{prefix}.{name}")
        i += 1
    return x


class StreamingCodec:
    """Chunk-by-chunk decode for `rows` streams; each row keeps its own state between calls."""

    def __init__(self, codec: Codec, rows: int, max_frames: int, time_major: bool = False):
        """max_frames: the longest stream (frames) a row will decode; sizes the RoPE table. time_major: the
        activations run as [b, T, C] and every conv as a channels-last (NHWC) cuDNN convolution on them
        (TTS_CODEC_CHANNELS_LAST; see _walk_time_major), else [b, C, T] as the modules run them."""
        self.codec = codec
        self.time_major = time_major
        # snake(x, alpha, out=None): the eager one, or the fused Triton kernel (Vocoder.use_snake_kernel); the
        # time-major path calls snake_time_major on [b, T, C]
        self.snake: Callable[..., Tensor] = snake
        self.snake_time_major: Callable[..., Tensor] = snake_time_major  # (x, alpha, out=None, bias=None)
        self.residual_bias: Callable[[Tensor, Tensor, Tensor], Tensor] = residual_bias
        self._nhwc: dict[int, Tensor] = {}  # id(conv) -> its weight as [Co, Ci/g, 1, k] channels-last
        # around the time-major dilated convs: cuDNN's untuned pick for two of them is ~35x slower than its best and
        # is kept for the shape (Vocoder.warm_up tunes just these, under its capture lock); default: nothing
        self.tune_dilated: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        p = next(codec.parameters())
        self.device, self.dtype = p.device, p.dtype
        shapes: dict[str, tuple[int, ...]] = {}
        _state_shapes(codec.quantizer.post_module, "post", shapes)
        _state_shapes(codec.quantizer.upsample, "up", shapes, time_major)
        _state_shapes(codec.decoder.model, "dec", shapes, time_major)
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
        state = {k: v.index_select(0, rows) for k, v in self.state.items()}
        pos = self.position.index_select(0, rows)
        q = self.codec.quantizer
        z = q.codes_to_latent(codes).to(self.dtype)  # [b, C, K]
        if self.time_major:
            h = self._transformer(q.post_module, z.transpose(1, 2), state, "post", pos, True)  # [b, K, C]
            h = self._walk_time_major(q.upsample, h, state, "up")
            audio = self._walk_time_major(self.codec.decoder.model, h, state, "dec")[:, :, 0]
        else:
            z = self._transformer(q.post_module, z, state, "post", pos)
            z = self._walk(q.upsample, z, state, "up")
            audio = self._walk(self.codec.decoder.model, z, state, "dec")[:, 0]
        for k, v in state.items():
            self.state[k].index_copy_(0, rows, v)
        self.position.index_add_(0, rows, torch.full_like(pos, codes.shape[-1]))
        return audio

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
            return self.snake(x, module.alpha)
        if isinstance(module, ResidualUnit):
            return x + self._walk(module.block, x, state, prefix + ".block")
        if isinstance(module, ConvNeXtBlock):
            return x + module.pointwise(self._walk(module.dwconv, x, state, prefix + ".dwconv"))
        if isinstance(module, nn.Tanh):
            return torch.tanh(x)
        if isinstance(module, DecoderBlock):
            return self._walk(module.block, x, state, prefix + ".block")
        if isinstance(module, nn.Sequential):
            return _walk_sequential(module, x, state, prefix, self._walk, self._snake_into_conv)
        raise TypeError(f"no streaming rule for {type(module).__name__} at {prefix}")

    def _snake_into_conv(self, act: Snake, conv: CausalConv, x: Tensor, state: dict[str, Tensor], key: str) -> Tensor:
        """Snake then a causal conv with history, without concatenating: Snake writes its output right behind
        the conv's kept input samples in one buffer [b, C, left + L] (the cat was ~13% of the codec's time)."""
        left = conv.left
        full = torch.empty(x.shape[0], x.shape[1], left + x.shape[2], dtype=x.dtype, device=x.device)
        full[..., :left] = state[key]
        self.snake(x, act.alpha, out=full[..., left:])
        state[key] = full[..., -left:]
        return conv.conv(full)

    def _transformer(self, t: CodecTransformer, x: Tensor, state: dict[str, Tensor], prefix: str,
                     pos: Tensor, time_major: bool = False) -> Tensor:
        # x: [b, C, K] ([b, K, C] time-major, returned so too); pos: [b] absolute frame position of x's first frame
        W = t.cfg.window
        h = x if time_major else x.transpose(1, 2)
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
        h = t.norm(h)
        return h if time_major else h.transpose(1, 2)

    # ---- time-major: [b, T, C] activations, channels-last convolutions ---------------------------------------
    # A [b, T, C] tensor seen as [b, C, 1, T] is channels-last (NHWC) without a copy, so each conv runs as a
    # channels-last cuDNN conv2d with a (1, k) kernel and returns channels-last, which is again [b, T', C'].
    # The channel-major path hands cuDNN NCHW tensors, which it transposes to NHWC and back around every
    # conv (~15% of the codec's GPU time at 64 streams on an H100); Snake, adds and the ConvNeXt pointwise
    # layers do not care (the latter even lose two transposes). Same math; convolution algorithms may differ.
    def _walk_time_major(self, module: nn.Module, x: Tensor, state: dict[str, Tensor], prefix: str) -> Tensor:
        if isinstance(module, CausalConv):
            if not module.left:
                return self._conv_nhwc(module.conv, x)
            full = torch.cat([state[prefix], x], dim=1)
            state[prefix] = full[:, -module.left:]
            return self._conv_nhwc(module.conv, full)
        if isinstance(module, CausalTransConv):
            conv = module.conv
            y = self._conv_nhwc(conv, x, transposed=True)  # [b, (L-1)s + k, C], no bias; ours to change
            n = x.shape[1] * conv.stride[0]
            if module.trim:
                y[:, :module.trim] += state[prefix]  # the overlap in place: no copy of the whole output
                state[prefix] = y[:, n:]
            return y[:, :n] + conv.bias
        if isinstance(module, Snake):
            return self.snake_time_major(x, module.alpha)
        if isinstance(module, ResidualUnit):
            return self._residual_unit_time_major(module, x, state, prefix + ".block")
        if isinstance(module, ConvNeXtBlock):
            y = self._walk_time_major(module.dwconv, x, state, prefix + ".dwconv")
            return x + module.pointwise_time_major(y)
        if isinstance(module, nn.Tanh):
            return torch.tanh(x)
        if isinstance(module, DecoderBlock):
            return self._walk_time_major(module.block, x, state, prefix + ".block")
        if isinstance(module, nn.Sequential):
            return _walk_sequential(module, x, state, prefix, self._walk_time_major, self._snake_into_conv_time_major)
        raise TypeError(f"no streaming rule for {type(module).__name__} at {prefix}")

    def _residual_unit_time_major(self, unit: ResidualUnit, x: Tensor, state: dict[str, Tensor], prefix: str) -> Tensor:
        # x + conv1(snake(conv7(snake(x)))), each conv's bias added by what reads its output (cuDNN adds a bias
        # in a pass of its own over the output: ~19% of the codec's GPU time at 64 streams on an H100)
        act1, conv7, act2, conv1 = unit.block
        if conv1.left or conv7.conv.bias is None or conv1.conv.bias is None:  # not the codec's unit: plain walk
            return x + self._walk_time_major(unit.block, x, state, prefix)
        h = self._snake_into_conv_time_major(act1, conv7, x, state, f"{prefix}.1", bias=False)
        h = self._conv_nhwc(conv1.conv, self.snake_time_major(h, act2.alpha, bias=conv7.conv.bias), bias=False)
        return self.residual_bias(x, h, conv1.conv.bias)

    def _snake_into_conv_time_major(self, act: Snake, conv: CausalConv, x: Tensor, state: dict[str, Tensor],
                                    key: str, bias: bool = True) -> Tensor:
        # _snake_into_conv on [b, T, C]: Snake writes behind the kept samples of one [b, left + L, C] buffer
        left = conv.left
        full = torch.empty(x.shape[0], left + x.shape[1], x.shape[2], dtype=x.dtype, device=x.device)
        full[:, :left] = state[key]
        self.snake_time_major(x, act.alpha, out=full[:, left:])
        state[key] = full[:, -left:]
        return self._conv_nhwc(conv.conv, full, bias=bias)

    def _conv_nhwc(self, conv: nn.Module, x: Tensor, transposed: bool = False, bias: bool = True) -> Tensor:
        # x [b, T, Ci] -> conv(x) [b, T', Co] (a ConvTranspose1d, or bias=False: without the bias)
        w = self._nhwc.get(id(conv))
        if w is None:
            w = self._nhwc[id(conv)] = conv.weight.detach()[:, :, None].contiguous(memory_format=torch.channels_last)
        x4 = x.transpose(1, 2)[:, :, None]  # [b, Ci, 1, T], channels-last strides
        if transposed:
            y = F.conv_transpose2d(x4, w, None, stride=(1, conv.stride[0]), groups=conv.groups)
        else:
            with self.tune_dilated() if conv.dilation[0] > 1 else contextlib.nullcontext():
                y = F.conv2d(x4, w, conv.bias if bias else None, stride=(1, conv.stride[0]),
                             dilation=(1, conv.dilation[0]), groups=conv.groups)
        return y[:, :, 0].transpose(1, 2)
