"""Issue 43: where the HTTP front's event-loop thread spends its time under load. Runs `python -m handlers http`
in this process with a cProfile that SIGUSR1 starts and SIGUSR2 stops (on Python 3.12 it sees every thread, the
reader's blocking reads included: front_profile.sh's py-spy view splits threads), writing
the stats to $PROFILE_OUT (pstats file) and the top functions by own time to $PROFILE_OUT.txt. cProfile's own
overhead inflates every call alike, so read the shares, not the absolute times. Usage (device, front_profile.sh):
TTS_* env as for the server; python3 scripts/device/front_profile.py"""

import cProfile
import io
import os
import pstats
import runpy
import signal
import sys

profile = cProfile.Profile()
out = os.environ.get("PROFILE_OUT", "/tmp/front.prof")


def start(*_):
    profile.enable()


def stop(*_):
    profile.disable()
    profile.dump_stats(out)
    text = io.StringIO()
    pstats.Stats(out, stream=text).sort_stats("tottime").print_stats(45)
    with open(out + ".txt", "w") as f:
        f.write(text.getvalue())


signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.argv = ["handlers", "http"]
runpy.run_module("handlers", run_name="__main__", alter_sys=True)
