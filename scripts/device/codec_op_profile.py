"""The streaming codec's GPU time by op and input shape (torch profiler), one layout per run: which eager ops
(not kernels) the time goes to. Random S1-mini codec, bf16, cuDNN autotuned, no CUDA graphs.
Usage: python3 scripts/device/codec_op_profile.py [streams] [chunk_frames] [tuned]   (default 64 8 1; tuned 0: cuDNN's
heuristics, as an eager call outside the codec's capture windows runs)"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from ttsengine.model.codec.streaming import StreamingCodec
from ttsengine.model.kernels.codec.snake import residual_bias_triton, snake_triton, snake_triton_time_major
from ttsengine.model.loading.synthetic import random_checkpoint
from ttsengine.tools.codec_bench import random_codes


def main():
    streams = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    torch.backends.cudnn.benchmark = (sys.argv[3] if len(sys.argv) > 3 else "1") == "1"
    codec = random_checkpoint("s1-mini", "cuda", torch.bfloat16, torch.bfloat16).codec
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"streams {streams} chunk {chunk}")
    codes = random_codes(codec, streams, chunk * 4, torch.device("cuda"))
    slots = torch.arange(streams, device="cuda")
    for time_major in (False, True):
        dec = StreamingCodec(codec, streams, 4096, time_major)
        dec.snake, dec.snake_time_major = snake_triton, snake_triton_time_major
        dec.residual_bias = residual_bias_triton
        with torch.inference_mode():
            for i in range(3):
                dec.codes_to_audio(slots, codes[:, :, i * chunk:(i + 1) * chunk])
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU], record_shapes=True) as prof:
                dec.codes_to_audio(slots, codes[:, :, 3 * chunk:4 * chunk])
                torch.cuda.synchronize()
        print(f"## time_major={time_major}: self CUDA ms by op and input shapes (ops only)")
        rows = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")
                and e.self_device_time_total > 0]
        rows.sort(key=lambda e: -e.self_device_time_total)
        total = sum(e.self_device_time_total for e in rows)
        print(f"ops' self CUDA total {total / 1e3:.2f} ms")
        for e in rows[:25]:
            print(f"{e.self_device_time_total / 1e3:8.3f} ms x{e.count:<3d} {e.key:24s} {str(e.input_shapes)[:110]}")

if __name__ == "__main__":
    main()
