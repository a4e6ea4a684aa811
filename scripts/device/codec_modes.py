"""The streaming codec three ways, each captured in CUDA graphs as the engine does: torch.compile'd
(Inductor cache in --cache-dir), eager, eager with the Triton Snake kernel. Prints per mode the
warm-up + capture seconds, the replay time per chunk batch and the SNR of its audio against eager.

    python3 scripts/device/codec_modes.py --cache-dir .kc [--modes compiled,eager,snake]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import torch


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    ref, x = ref.float(), x.float()
    noise = (ref - x).pow(2).mean().item()
    return float("inf") if noise == 0 else 10 * torch.log10(ref.pow(2).mean() / noise).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=".kc")
    ap.add_argument("--modes", default="compiled,eager,snake")
    args = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(os.path.join(args.cache_dir, "inductor")))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.abspath(os.path.join(args.cache_dir, "triton")))
    from ttsengine.engine.device.vocoder import Vocoder
    from ttsengine.model.loading.synthetic import random_checkpoint

    dev = torch.device("cuda")
    ckpt = random_checkpoint("s1-mini", dev, torch.bfloat16, torch.bfloat16)
    buckets = (2, 4, 8, 16, 32, 64, 128, 256)
    n = ckpt.codec.cfg.num_codebooks
    g = torch.Generator(device="cpu").manual_seed(0)
    codes = torch.randint(0, ckpt.codec.cfg.codebook_size, (64, n, 8), generator=g).to(dev)
    side = torch.cuda.Stream()
    ref = None
    for mode in args.modes.split(","):
        voc = Vocoder(ckpt.codec, 256, ckpt.config.max_seq_len, (4, 8), buckets, threading.Lock(),
                      lambda frames, seconds: None, lambda stream: None)
        if mode == "compiled":
            voc.enable_compile()
        elif mode == "snake":
            voc.use_snake_kernel()
        with torch.inference_mode(), torch.cuda.stream(side):
            t0 = time.perf_counter()
            voc.warm_up()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            voc.plan_graphs(64)
            voc.capture()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            row = {"mode": mode, "warm_up_s": round(t1 - t0, 2), "capture_s": round(t2 - t1, 2)}
            for rows, size in ((1, 4), (2, 8), (8, 8), (64, 8)):
                slots = list(range(rows))
                voc.decode_padded(slots, codes[:rows, :, :size])
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(20):
                    voc.decode_padded(slots, codes[:rows, :, :size])
                torch.cuda.synchronize()
                row[f"ms_b{rows}_k{size}"] = round((time.perf_counter() - t) / 20 * 1e3, 3)
            voc.codec.reset(torch.arange(257, device=dev))
            audio = torch.cat([voc.decode_padded(list(range(64)), codes[:, :, :8]) for _ in range(3)], dim=1)
            torch.cuda.synchronize()
        if ref is None:
            ref = audio.clone()
        row["snr_db_vs_first"] = round(snr_db(ref, audio), 1)
        print(json.dumps(row), flush=True)
        voc.close()


if __name__ == "__main__":
    main()
