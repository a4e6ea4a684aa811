"""A py-spy raw record of a start (--threads --idle) summed for the main thread: seconds inclusive per frame (a frame
counted once per sample however deep it recurs), the top ones that are not the whole thread, and the seconds of
every other thread. Usage: start_stages.py SPY_RAW_FILE [TOP=40] [RATE=200]"""

import collections
import sys

from spy_leaves import samples  # this directory is the script's: on sys.path

path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
rate = float(sys.argv[3]) if len(sys.argv) > 3 else 200.0
inclusive, threads = collections.Counter(), collections.Counter()
main = 0
for frames, n in samples(path):
    threads[frames[0]] += n
    if "MainThread" not in frames[0]:
        continue
    main += n
    for frame in set(frames[1:]):
        inclusive[frame] += n
print("threads (s):", ", ".join(f"{t[:50]} {n / rate:.2f}" for t, n in threads.most_common(8)))
print(f"main thread {main / rate:.2f} s; inclusive seconds per frame (under 95% of it):")
for frame, n in [(f, n) for f, n in inclusive.most_common() if n < 0.95 * main][:top]:
    print(f"  {n / rate:6.2f}  {frame[:150]}")
