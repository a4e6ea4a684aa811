"""A py-spy raw record (--threads, idle samples left out) summed: busy samples per thread, and the top leaves of the
main thread (the event loop's, in our servers and in loadtest). Usage: spy_leaves.py SPY_RAW_FILE [TOP=30]"""

import collections
import sys

leaf, total = collections.Counter(), collections.Counter()
with open(sys.argv[1]) as f:
    for line in f:
        stack, _, n = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        thread = frames[0]
        total[thread] += int(n)
        if "MainThread" in thread or "main" in thread.lower():
            leaf[frames[-1][:140]] += int(n)
print("py-spy samples per thread:", ", ".join(f"{t[:60]} {n}" for t, n in total.most_common(8)))
print("main thread, top leaves:")
for frame, n in leaf.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
    print(f"  {n:6d}  {frame}")
