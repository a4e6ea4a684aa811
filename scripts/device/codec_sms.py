"""Does confining the codec to part of the GPU's SMs let the decode step run beside it unslowed? The engine's
codec stream becomes a CUDA green-context stream of CODEC_SMS SMs (0: the plain stream, as the engine runs), then
`bench` runs with the given args. The step's stream keeps every SM (and its high priority), so its small kernels
always find free SMs instead of queueing behind the codec's convolutions. Nothing in the package changes.
Usage: CODEC_SMS=112 python scripts/device/codec_sms.py --random-weights s1-mini --frames 192 --concurrency 64,64
"""
import os
import sys

import torch

from ttsengine.engine.device import vocoder
from ttsengine.tools import bench

SMS = int(os.environ.get("CODEC_SMS", "0"))
_KEEP: list = []  # the green contexts outlive their streams' use


def green_stream(device: torch.device, sms: int) -> torch.cuda.Stream:
    from torch.cuda import green_contexts

    cls = green_contexts.GreenContext
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        ctx = cls.create(num_sms=sms, device_id=index)
    except TypeError:
        ctx = cls.create(sms, index)
    _KEEP.append(ctx)
    if hasattr(ctx, "Stream"):
        return ctx.Stream()
    ctx.set_context()  # makes a stream of the green context current
    try:
        return torch.cuda.current_stream()
    finally:
        ctx.pop_context()


_init = vocoder.Vocoder.__init__


def init(self, *a, **kw):
    real = torch.cuda.Stream

    def make(device=None, priority=0, **kw):  # torch.cuda.stream(s) builds Streams with keywords: those stay real
        return real(device, priority, **kw) if kw else green_stream(torch.device(device or "cuda"), SMS)

    if SMS:
        torch.cuda.Stream = make
    try:
        _init(self, *a, **kw)
    finally:
        torch.cuda.Stream = real
    print(f"codec stream: {self._stream} ({SMS or 'all'} SMs)", flush=True)


vocoder.Vocoder.__init__ = init

if __name__ == "__main__":
    from torch.cuda import green_contexts

    print("GreenContext API:", [m for m in dir(green_contexts.GreenContext) if not m.startswith("__")],
          "SMs:", torch.cuda.get_device_properties(0).multi_processor_count, flush=True)
    sys.exit(bench.main(sys.argv[1:]))
