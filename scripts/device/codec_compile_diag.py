"""Compiled vs eager streaming codec on the GPU, per chunk and row, with and without CUDA graphs and with
and without duplicate padding rows: where a codec_compile mismatch comes from."""
import sys
import threading

import torch

sys.path.insert(0, "tests")
from conftest import MODEL_DIR  # noqa: E402

from ttsengine import EngineConfig  # noqa: E402
from ttsengine.engine.device.vocoder import Vocoder  # noqa: E402
from ttsengine.engine.loader import load  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
codec = load(EngineConfig(model_dir=MODEL_DIR, device="cuda", dtype="float32", codec_dtype="float32")).codec
g = torch.Generator(device="cpu").manual_seed(3)
codes = torch.cat([torch.randint(0, 32, (4, 1, 24), generator=g), torch.randint(0, 16, (4, 3, 24), generator=g)],
                  dim=1).cuda()
schedule = [([0, 1, 2], 0), ([0, 2, 3], 8), ([1, 3], 16)]


def run(compiled, graphs, buckets):
    voc = Vocoder(codec, 4, 4096, (8,), buckets, threading.Lock(), lambda f, s: None, lambda s: None)
    if compiled:
        voc.enable_compile()
    if graphs:
        voc.plan_graphs(4)
    out = []

    def body():
        for slots, f in schedule:
            out.append(voc.decode_padded(slots, codes[slots, :, f:f + 8]).clone())
        torch.cuda.current_stream().synchronize()  # the worker's stream: done before another stream reads
    with torch.inference_mode():
        voc.call(body)
    voc.close()
    return out


ref = run(False, False, (1, 4))
VARIANTS = [("eager graphs dup", (False, True, (1, 4))), ("compiled no-graphs dup", (True, False, (1, 4))),
            ("compiled graphs nodup", (True, True, (1, 2, 3, 4))), ("compiled graphs dup", (True, True, (1, 4)))]
for name, args in VARIANTS:
    got = run(*args)
    print(name, [[round((a[i] - b[i]).abs().max().item(), 6) for i in range(a.shape[0])] for a, b in zip(got, ref)],
          flush=True)
