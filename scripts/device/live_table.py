"""One line per livetest run of front_door.sh: the client's text-to-first-audio, the server's segment first audio
and its event loop's lag.   usage: live_table.py WORKDIR NAME...   (each NAME/livetest.json under WORKDIR)"""

import json
import sys
from pathlib import Path


def cell(h: dict | None, *keys: str) -> str:
    if not h or not h.get("count"):
        return "-"
    return "/".join(f"{h[k]:.0f}" for k in keys)


work = Path(sys.argv[1])
print("| run | sessions x processes | turns (errors) | client first audio p50/p95/max ms | stalled turns | "
      "server first segment p95 ms | every segment p95 ms | event loop lag p50/p95 ms | slowest x real time |")
print("|---|---|---|---|---|---|---|---|---|")
for name in sys.argv[2:]:
    try:
        report = json.loads((work / name / "livetest.json").read_text())
    except (OSError, ValueError) as e:
        print(f"| {name} | no report ({type(e).__name__}) |")
        continue
    s, sv = report["summary"], report["summary"].get("server") or {}
    client = "/".join(f"{s[k]:.0f}" if isinstance(s.get(k), (int, float)) else "-"
                      for k in ("first_audio_p50_ms", "first_audio_p95_ms", "first_audio_max_ms"))
    slowest = s.get("x_real_time_min")
    print(f"| {name} | {report['sessions']} x {report['processes']} | {s.get('turns')} ({s.get('errors')}) | "
          f"{client} | {s.get('stalled_turns', '-')} | {cell(sv.get('live_first_segment'), 'p95_ms')} | "
          f"{cell(sv.get('live_first_audio'), 'p95_ms')} | {cell(sv.get('loop_lag'), 'p50_ms', 'p95_ms')} | "
          f"{slowest if slowest is None else f'{slowest:.1f}'} |")
