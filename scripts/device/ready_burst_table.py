"""The table of scripts/device/ready_burst.sh: per server (TTS_READY mode), ready-after seconds and the first burst's
first-audio p50/p95 per concurrency, fresh (sent the moment /ready said 200) vs warm (every graph in), then the
/ready JSON at the moment it turned 200. Usage: python3 scripts/device/ready_burst_table.py WORKDIR MODE [MODE ...]"""

import json
import sys
from pathlib import Path

work, modes = Path(sys.argv[1]), sys.argv[2:]


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def levels(path: Path) -> dict:
    report = load(path / "loadtest.json") or {"levels": []}
    return {lv["concurrency"]: lv for lv in report["levels"]}


print(f"{'mode':6} {'ready s':>7} {'settled s':>9} {'conc':>5}  {'fresh p50/p95 ms':>18} {'err':>4}  "
      f"{'warm p50/p95 ms':>18} {'err':>4}  admit@ready")
for mode in modes:
    ready, settled = load(work / f"{mode}-ready.json"), load(work / f"{mode}-settled.json")
    fresh, warm = levels(work / f"{mode}-fresh"), levels(work / f"{mode}-warm")
    r_s = f"{ready['ready_after_s']:.1f}" if ready else "-"
    s_s = f"{settled['ready_after_s']:.1f}" if settled and settled.get("ready_after_s") is not None else "-"
    admit = ready["ready"].get("admit_streams") if ready else "-"
    for c in sorted(set(fresh) | set(warm)) or [0]:
        f, w = fresh.get(c), warm.get(c)

        def cell(lv):
            return (f"{lv['first_audio_p50_ms']:.0f}/{lv['first_audio_p95_ms']:.0f}", str(lv["errors"])) \
                if lv else ("-", "-")

        (fp, fe), (wp, we) = cell(f), cell(w)
        print(f"{mode:6} {r_s:>7} {s_s:>9} {c:>5}  {fp:>18} {fe:>4}  {wp:>18} {we:>4}  {admit}")
for mode in modes:
    ready = load(work / f"{mode}-ready.json")
    if ready:
        r = ready["ready"]
        print(f"\n/ready of TTS_READY={mode} when it turned 200 (after {ready['ready_after_s']:.1f} s):")
        print(json.dumps({k: r.get(k) for k in ("warmup_seconds", "kernel_cache", "max_streams", "ready_mode",
                                                   "admit_streams", "graphs_pending")}))
        for e in r.get("engines", []):
            print(f"  engine {e['index']} {e['device']}: {json.dumps(e.get('graphs'))}")
