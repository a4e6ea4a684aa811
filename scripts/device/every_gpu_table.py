"""The table every_gpu.sh prints last: each bench run (decoded frames/s and its multiple of the one-GPU run, the
slowest stream's x real time, first audio, GPU utilisation, host time) and each loadtest run (first audio, delivered
audio, the slowest stream's x real time, errors). Usage: every_gpu_table.py WORKDIR KIND:NAME ... (KIND: bench or
http; NAME: the run's --out folder under WORKDIR)."""

import json
import sys
from pathlib import Path

FRAME_RATE = 44100 / 2048
work = Path(sys.argv[1])
runs = [r.split(":", 1) for r in sys.argv[2:]]
print("| bench run | engines | streams | decoded frames/s | x one GPU | slowest stream x real time "
      "| first audio p50 / p95 ms | GPU util % | host s / wall s |")
print("|---|---|---|---|---|---|---|---|---|")
one = None
for kind, name in runs:
    f = work / name / "bench.json"
    if kind != "bench" or not f.exists():
        continue
    report = json.loads(f.read_text())
    for lv in report["levels"]:
        one = one or (lv["aggregate_fps"] if name.startswith("g1-") else None)
        x = f"{lv['aggregate_fps'] / one:.2f}" if one else "-"
        print(f"| {name} | {' '.join(report['engines'])} | {lv['concurrency']} | {lv['aggregate_fps']:,.0f} | {x} | "
              f"{lv['realtime_x_min']:.2f} | {lv['ttfa_p50_ms']:.0f} / {lv['ttfa_p95_ms']:.0f} | "
              f"{lv['gpu_util_pct'] if lv['gpu_util_pct'] is not None else '-'} | "
              f"{lv['time_host_s']:.2f} / {lv['wall_s']:.2f} |")
print()
print("| HTTP run | streams | requests | errors | first audio p50 / p95 / p99 ms | audio-s/s "
      "| slowest stream x real time | rtf p95 | stalled streams | loadgen CPU % max |")
print("|---|---|---|---|---|---|---|---|---|---|")
for kind, name in runs:
    f = work / name / "loadtest.json"
    if kind != "http" or not f.exists():
        continue
    for lv in json.loads(f.read_text())["levels"]:
        slowest = 1 / lv["rtf_max"] if lv.get("rtf_max") else float("nan")
        print(f"| {name} | {lv['concurrency']} | {lv['requests']} | {lv['errors']} | {lv['first_audio_p50_ms']:.0f} / "
              f"{lv['first_audio_p95_ms']:.0f} / {lv['first_audio_p99_ms']:.0f} | {lv['audio_s_per_s']:.0f} | "
              f"{slowest:.2f} | {lv['rtf_p95']:.2f} | {lv['stalled_streams']} | {max(lv['client_cpu_pct'])} |")
        if lv.get("error_sample"):
            print(f"|  e.g. | {lv['error_sample'][:150]} |")
