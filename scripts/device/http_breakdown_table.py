"""The short table http_breakdown.sh prints last: bench in-process beside each loadtest run, per level, then the
server's breakdown and per-thread CPU. Usage: http_breakdown_table.py WORKDIR RUN... (RUN: a loadtest --out
folder name under WORKDIR; bench's report is WORKDIR/bench/bench.json)."""

import json
import sys
from pathlib import Path

FRAME_RATE = 44100 / 2048
work = Path(sys.argv[1])
print("| run | c | first audio p50 / p95 ms | audio-s/s | rtf p95 | stalls (streams, s) | engine host s / wall s "
      "| loadgen CPU % |")
print("|---|---|---|---|---|---|---|---|")
bench_file = work / "bench" / "bench.json"
if bench_file.exists():
    for lv in json.loads(bench_file.read_text())["levels"]:
        print(f"| bench in-process | {lv['concurrency']} | {lv['ttfa_p50_ms']:.0f} / {lv['ttfa_p95_ms']:.0f} | "
              f"{lv['aggregate_fps'] / FRAME_RATE:.0f} | {lv['rtf_max']:.2f} (max) | p95 {lv['stall_p95_ms']:.0f} ms, "
              f"max {lv['stall_max_ms']:.0f} ms | {lv['time_host_s']:.2f} / {lv['wall_s']:.2f} | - |")
runs = [(name, json.loads((work / name / "loadtest.json").read_text())) for name in sys.argv[2:]
        if (work / name / "loadtest.json").exists()]
for name, report in runs:
    for lv in report["levels"]:
        sv = lv["server"]
        print(f"| HTTP {name} {lv['format']} | {lv['concurrency']} | {lv['first_audio_p50_ms']:.0f} / "
              f"{lv['first_audio_p95_ms']:.0f} | {lv['audio_s_per_s']:.0f} | {lv['rtf_p95']:.2f} | {lv['stalls']} "
              f"({lv['stalled_streams']}, {lv['stall_s']:.1f} s) | {sv.get('engine_host_s', float('nan')):.2f} / "
              f"{lv['wall_s']:.2f} | {'/'.join(map(str, lv['client_cpu_pct']))} |")
print()
keys = ("queue_wait", "engine_first_audio", "first_byte_sent", "chunk_wake", "chunk_encode", "chunk_send",
        "chunk_total")
print("| run | c | " + " | ".join(f"{k} mean/p50/p95 ms" for k in keys) + " |")
print("|---|---|" + "---|" * len(keys))
for name, report in runs:
    for lv in report["levels"]:
        sv = lv["server"]
        cells = [f"{sv[k]['mean_ms']:.0f}/{sv[k]['p50_ms']:.0f}/{sv[k]['p95_ms']:.0f}" if k in sv else "-"
                 for k in keys]
        print(f"| {name} {lv['format']} | {lv['concurrency']} | " + " | ".join(cells) + " |")
print()
print("server CPU seconds per thread during the level (wall s):")
for name, report in runs:
    for lv in report["levels"]:
        cpu = lv["server"].get("thread_cpu_s", {})
        print(f"  {name} {lv['format']} {lv['concurrency']} ({lv['wall_s']:.1f} s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
