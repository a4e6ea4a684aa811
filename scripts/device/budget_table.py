"""Per BIN seconds of a budget trace (scripts/device/budget_trace/sitecustomize.py): how many iterations were
sized, the budget they got (min / median), the positions prefilled, the iterations' mean seconds and the decode
buckets seen, and the garbage collector's traced passes (count, longest ms, generation-2 passes), from the first
record on; idle bins are skipped. Usage: python3 budget_table.py FILE.PID [BIN]"""

import json
import statistics
import sys
from collections import defaultdict

with open(sys.argv[1]) as f:
    rows = [json.loads(line) for line in f]
step = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
t0 = rows[0][0] if rows else 0.0
bins: dict = defaultdict(lambda: {"budgets": [], "prefilled": 0, "seconds": [], "buckets": set(), "cost": None,
                                  "gc": []})
for t, kind, *rest in rows:
    b = bins[int((t - t0) // step)]
    if kind == "gc":
        b["gc"].append(rest)
    elif kind == "tokens":
        b["budgets"].append(rest[2])
    else:
        bucket, prefilled, seconds, _, per_token, cost = rest
        b["prefilled"] += prefilled
        b["seconds"].append(seconds)
        b["buckets"].add(bucket)
        b["cost"] = (per_token, cost)
print("| from s | sized | budget min / median | prefilled | iterations | mean s | buckets | s per position, fit "
      "| gc passes, longest ms, gen 2 |")
print("|---|---|---|---|---|---|---|---|---|")
for k in sorted(bins):
    b = bins[k]
    if not b["seconds"] and not b["budgets"] and not b["gc"]:
        continue
    gcs = (f"{len(b['gc'])}, {max(g[1] for g in b['gc']) * 1000:.0f}, {sum(g[0] == 2 for g in b['gc'])}"
           if b["gc"] else "-")
    budgets = f"{min(b['budgets'])} / {statistics.median(b['budgets']):.0f}" if b["budgets"] else "-"
    mean = f"{statistics.mean(b['seconds']):.4f}" if b["seconds"] else "-"
    print(f"| {k * step:.1f} | {len(b['budgets'])} | {budgets} | {b['prefilled']} | {len(b['seconds'])} | {mean} | "
          f"{','.join(map(str, sorted(b['buckets'])))} | {b['cost']} | {gcs} |")
