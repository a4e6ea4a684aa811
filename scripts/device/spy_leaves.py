"""A py-spy raw record (--threads, idle samples left out) summed: busy samples per thread, and the top leaves of the
main thread (the event loop's, in our servers and in loadtest). Usage: spy_leaves.py SPY_RAW_FILE [TOP=30]
`samples(path)` reads such a record for the other scripts here (start_stages.py)."""

import collections
import sys
from collections.abc import Iterator


def samples(path: str) -> Iterator[tuple[list[str], int]]:
    """(frames, root first: the thread, then the calls; samples) per line of a py-spy raw (collapsed) record."""
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if n.isdigit():
                yield stack.split(";"), int(n)


if __name__ == "__main__":
    leaf, total = collections.Counter(), collections.Counter()
    for frames, n in samples(sys.argv[1]):
        thread = frames[0]
        total[thread] += n
        if "MainThread" in thread or "main" in thread.lower():
            leaf[frames[-1][:140]] += n
    print("py-spy samples per thread:", ", ".join(f"{t[:60]} {n}" for t, n in total.most_common(8)))
    print("main thread, top leaves:")
    for frame, n in leaf.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
        print(f"  {n:6d}  {frame}")
