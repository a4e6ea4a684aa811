"""The modded-DAC codec: waveform <-> codes (S1 spec §7.2-7.4). 44.1 kHz mono; one code frame per
`frame_length` samples (2048 for S1)."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from .config import ENCODER_WINDOW, CodecConfig, CodecTransformerConfig
from .conv import CausalConv, CausalTransConv, ResidualUnit, Snake
from .quantizer import DownsampleQuantizer
from .transformer import CodecTransformer

DILATIONS = (1, 3, 9)


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int, transformer: CodecTransformerConfig | None):
        super().__init__()
        half = dim // 2
        parts: list[nn.Module] = [ResidualUnit(half, d) for d in DILATIONS]
        parts += [Snake(half), CausalConv(half, dim, 2 * stride, stride=stride)]
        if transformer is not None:
            parts.append(CodecTransformer(transformer))
        self.block = nn.Sequential(*parts)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        d = cfg.encoder_dim
        blocks: list[nn.Module] = [CausalConv(1, d, 7)]
        for stride, n_layer in zip(cfg.encoder_rates, cfg.encoder_transformer_layers):
            d *= 2
            t = None
            if n_layer:
                t = CodecTransformerConfig(
                    n_layer=n_layer, n_head=d // 64, dim=d, intermediate_size=3 * d, head_dim=cfg.head_dim,
                    rope_base=cfg.rope_base, norm_eps=cfg.norm_eps, window=ENCODER_WINDOW,
                    block_size=cfg.encoder_block_size)
            blocks.append(EncoderBlock(d, stride, t))
        blocks += [Snake(d), CausalConv(d, cfg.latent_dim, 3)]
        self.block = nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, 1, L] -> [B, latent, L / hop]
        return self.block(x)


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake(c_in), CausalTransConv(c_in, c_out, 2 * stride, stride),
            *(ResidualUnit(c_out, d) for d in DILATIONS),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Decoder(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        c = cfg.decoder_dim
        layers: list[nn.Module] = [CausalConv(cfg.latent_dim, c, 7)]
        for i, stride in enumerate(cfg.decoder_rates):
            layers.append(DecoderBlock(c // 2**i, c // 2 ** (i + 1), stride))
        out = c // 2 ** len(cfg.decoder_rates)
        layers += [Snake(out), CausalConv(out, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        # z: [B, latent, T] -> [B, 1, T * hop] in [-1, 1]
        return self.model(z)


class Codec(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quantizer = DownsampleQuantizer(cfg)
        self.decoder = Decoder(cfg)

    @property
    def frame_length(self) -> int:
        return self.cfg.frame_length

    @property
    def sample_rate(self) -> int:
        return self.cfg.sample_rate

    def decode(self, codes: Tensor) -> Tensor:
        """codes: int [B, n, F] -> waveform [B, 1, F * frame_length]."""
        return self.decoder(self.quantizer.decode(codes))

    def pad_to_frames(self, audio: Tensor) -> Tensor:
        # audio: [B, 1, L] -> right-padded with zeros to a whole number of frames
        L = audio.shape[-1]
        return F.pad(audio, (0, math.ceil(L / self.frame_length) * self.frame_length - L))

    def encode(self, audio: Tensor) -> Tensor:
        """audio: float [B, 1, L] at sample_rate -> codes int64 [B, n, ceil(L / frame_length)]."""
        return self.quantizer.encode(self.encoder(self.pad_to_frames(audio)))


def codec_buffer_key(key: str) -> bool:
    """Persistent buffers the real codec.pth carries; they equal what the modules compute."""
    return key.endswith(".freqs_cis") or key.endswith(".causal_mask")
