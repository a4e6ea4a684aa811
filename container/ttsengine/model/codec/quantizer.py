"""Residual vector quantizer with a semantic codebook and a x4 time downsample (S1 spec §7.3-7.4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import CodecConfig
from .conv import CausalConv, CausalTransConv, ConvNeXtBlock
from .transformer import CodecTransformer


class VectorQuantizer(nn.Module):
    """Project down to codebook_dim, nearest codebook row by cosine, project back up."""

    def __init__(self, dim: int, codebook_size: int, codebook_dim: int):
        super().__init__()
        self.in_proj = nn.Conv1d(dim, codebook_dim, 1)
        self.out_proj = nn.Conv1d(codebook_dim, dim, 1)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)

    def decode(self, codes: Tensor) -> Tensor:
        # codes: [B, F] -> [B, dim, F]; raw (un-normalised) codebook rows
        return self.out_proj(self.codebook(codes).transpose(1, 2))

    def encode(self, z: Tensor) -> tuple[Tensor, Tensor]:
        # z: [B, dim, F] -> (codes [B, F], z_q [B, dim, F])
        z_e = self.in_proj(z)
        B, d, Fr = z_e.shape
        e = F.normalize(z_e.transpose(1, 2).reshape(B * Fr, d))
        c = F.normalize(self.codebook.weight)
        # squared distance between normalised vectors, ties to the first index (as upstream)
        dist = e.pow(2).sum(1, keepdim=True) - 2 * e @ c.T + c.pow(2).sum(1, keepdim=True).T
        codes = (-dist).max(dim=1).indices.view(B, Fr)
        z_q = self.codebook(codes).transpose(1, 2)
        z_q = z_e + (z_q - z_e)  # upstream's straight-through form; kept for bit-level agreement
        return codes, self.out_proj(z_q)


class ResidualQuantizer(nn.Module):
    def __init__(self, dim: int, n: int, codebook_size: int, codebook_dim: int):
        super().__init__()
        self.quantizers = nn.ModuleList(VectorQuantizer(dim, codebook_size, codebook_dim) for _ in range(n))


def _stage(conv: nn.Module, dim: int) -> nn.Sequential:
    return nn.Sequential(conv, ConvNeXtBlock(dim))


class DownsampleQuantizer(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        dim = cfg.latent_dim
        self.semantic_quantizer = ResidualQuantizer(dim, 1, cfg.semantic_codebook_size, cfg.codebook_dim)
        self.quantizer = ResidualQuantizer(dim, cfg.n_codebooks, cfg.codebook_size, cfg.codebook_dim)
        self.downsample = nn.Sequential(
            *(_stage(CausalConv(dim, dim, f, stride=f), dim) for f in cfg.downsample_factor))
        self.upsample = nn.Sequential(
            *(_stage(CausalTransConv(dim, dim, f, f), dim) for f in reversed(cfg.downsample_factor)))
        self.pre_module = CodecTransformer(cfg.pre_module)
        self.post_module = CodecTransformer(cfg.post_module)
        self.semantic_size, self.residual_size = cfg.semantic_codebook_size, cfg.codebook_size

    def codes_to_latent(self, codes: Tensor) -> Tensor:
        """codes: [B, n, F] -> summed codebook projections [B, dim, F]; out-of-range codes are clamped
        to the codebook maxima (upstream does the same, silently)."""
        sem = codes[:, 0].clamp(0, self.semantic_size - 1)
        res = codes[:, 1:].clamp(0, self.residual_size - 1)
        residual = self.quantizer.quantizers[0].decode(res[:, 0])
        for i, q in enumerate(self.quantizer.quantizers[1:], 1):
            residual = residual + q.decode(res[:, i])
        return self.semantic_quantizer.quantizers[0].decode(sem) + residual

    def decode(self, codes: Tensor) -> Tensor:
        # codes: [B, n, F] -> latent [B, dim, F * prod(downsample)]
        return self.upsample(self.post_module(self.codes_to_latent(codes)))

    def encode(self, latent: Tensor) -> Tensor:
        # latent: [B, dim, T] (T divisible by prod(downsample)) -> codes [B, n, T / prod(downsample)]
        z = self.pre_module(self.downsample(latent))
        sem_codes, z_sem = self.semantic_quantizer.quantizers[0].encode(z)
        residual = z - z_sem
        codes = [sem_codes]
        for q in self.quantizer.quantizers:
            c, z_q = q.encode(residual)
            residual = residual - z_q
            codes.append(c)
        return torch.stack(codes, dim=1)
