"""The short table http_breakdown.sh and front_door.sh print last: bench in-process beside each loadtest run, per
level (refusals and the slowest stream too), then the server's breakdown and per-thread CPU. Usage:
http_breakdown_table.py WORKDIR RUN... (RUN: a loadtest --out folder name under WORKDIR; bench's reports are
WORKDIR/bench*/bench.json: WORKDIR/bench the defaults, WORKDIR/bench-NAME a variant, shown as NAME)."""

import json
import re
import sys
from pathlib import Path

FRAME_RATE = 44100 / 2048
work = Path(sys.argv[1])
print("| run | c | first audio p50 / p95 ms | audio-s/s | rtf p95 | slowest stream x real time | errors / requests "
      "| stalls (streams, s) | engine host s / wall s | loadgen CPU % |")
print("|---|---|---|---|---|---|---|---|---|---|")
for bench_file in sorted(work.glob("bench*/bench.json")):
    variant = bench_file.parent.name.removeprefix("bench").lstrip("-")
    for lv in json.loads(bench_file.read_text())["levels"]:
        print(f"| bench in-process{f' {variant}' if variant else ''} | {lv['concurrency']} | {lv['ttfa_p50_ms']:.0f} / "
              f"{lv['ttfa_p95_ms']:.0f} | {lv['aggregate_fps'] / FRAME_RATE:.0f} | {lv['rtf_max']:.2f} (max) | "
              f"{1 / lv['rtf_max']:.2f} | - | p95 {lv['stall_p95_ms']:.0f} ms, max {lv['stall_max_ms']:.0f} ms | "
              f"{lv['time_host_s']:.2f} / {lv['wall_s']:.2f} | - |")
def label(door: str, name: str) -> str:
    """front_door's runs are HTTP ones named after their server; doors.sh's are named after the door."""
    return name if name.startswith(door) else f"{'HTTP' if door == 'http' else door} {name}"


runs = [(name, json.loads((work / name / "loadtest.json").read_text())) for name in sys.argv[2:]
        if (work / name / "loadtest.json").exists()]
for name, report in runs:
    for lv in report["levels"]:
        sv = lv["server"]
        print(f"| {label(report.get('door', 'http'), name)} {lv['format']} | {lv['concurrency']} | "
              f"{lv['first_audio_p50_ms']:.0f} / "
              f"{lv['first_audio_p95_ms']:.0f} | {lv['audio_s_per_s']:.0f} | {lv['rtf_p95']:.2f} | "
              f"{1 / lv['rtf_max']:.2f} | {lv['errors']} / {lv['requests']} | {lv['stalls']} "
              f"({lv['stalled_streams']}, {lv['stall_s']:.1f} s) | {sv.get('engine_host_s', float('nan')):.2f} / "
              f"{lv['wall_s']:.2f} | {'/'.join(map(str, lv['client_cpu_pct']))} |")
for name, report in runs:
    for lv in report["levels"]:
        if lv.get("stall_at"):
            print(f"  {name} {lv['format']} {lv['concurrency']}: first stall at piece (index: streams) "
                  f"{lv['stall_at']}")
        pieces = lv.get("pieces_p50", float("nan"))  # absent in a report from before the field
        if pieces == pieces:  # not nan
            print(f"  {name} {lv['format']} {lv['concurrency']}: audio pieces per stream p50 {pieces:.0f}, "
                  f"its end after its last audio p95 {lv['end_after_audio_p95_ms']:.0f} ms")
        if lv["errors"]:
            print(f"  {name} {lv['format']} {lv['concurrency']}, an error: {(lv['error_sample'] or '')[:160]}")
print()
keys = ("first_received", "first_planned", "first_admitted", "queue_wait", "first_started", "engine_first_audio",
        "first_engine_audio", "first_emitted", "first_byte_sent", "loop_lag", "chunk_wake", "chunk_encode",
        "chunk_send", "chunk_total")
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
        if not cpu:  # an untraced server (TTS_TRACE_CHUNKS off)
            continue
        print(f"  {name} {lv['format']} {lv['concurrency']} ({lv['wall_s']:.1f} s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
# a traced RunPod worker (TTS_TRACE_CHUNKS=on: no /metrics there) logs one line per streamed job (handlers/runpod):
# the median over its jobs, all levels together (the warm-up's too), of each figure the line gives
for name, _ in runs:
    log = work / f"server-{name}.log"
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if "trace job " in ln] if log.exists() else []
    if not lines:
        continue
    cols = [[float(x) for x in re.findall(r"(\d+(?:\.\d+)?)", ln.split(": ", 2)[-1])] for ln in lines]
    cols = [c for c in cols if len(c) == 10]  # chunks, pieces, every, wake mean/max, encode mean/max, post, trail
    med = [sorted(c[i] for c in cols)[len(cols) // 2] for i in range(10)] if cols else []
    if med:
        print(f"  {name} traced jobs ({len(cols)}), medians: chunks {med[0]:.0f}, pieces {med[1]:.0f}, arriving every "
              f"{med[2]:.1f} ms, wake {med[3]:.1f} / {med[4]:.1f} ms, encode {med[5]:.1f} / {med[6]:.1f} ms, post "
              f"{med[7]:.1f} / {med[8]:.1f} ms, trail {med[9]:.1f} ms")
