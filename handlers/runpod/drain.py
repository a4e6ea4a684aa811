"""A bounded drain for the RunPod worker. RunPod's SDK handles SIGTERM itself: it stops taking jobs and waits for
the running ones without a limit, and RunPod kills the container when its grace period ends, so a job still
running then ends without a word. Chained after the SDK's handler, this gives the jobs in flight
TTS_DRAIN_SECONDS and then cuts what is left with ShuttingDown: each such job ends with an error item (status
503, "retry it") that RunPod records, and the worker exits.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from ttsengine.serving.service import Service

log = logging.getLogger("handlers.runpod")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Drain:
    def __init__(self, service: Service, seconds: int):
        self.service, self.seconds = service, seconds
        self._ours: dict[int, object] = {}
        self._pid = os.getpid()
        self._signals = 0

    @property
    def installed(self) -> bool:
        return bool(self._ours) and all(signal.getsignal(sig) is h for sig, h in self._ours.items())

    def install(self) -> None:
        """Chains onto the SDK's handlers. Called from the concurrency modifier, which the SDK calls on the main
        thread inside its loop, after it installed them (the worker's own call before the SDK starts finds the
        default action: nothing is chained then, so a process the SDK forks, its heartbeat, inherits nothing of
        ours). Checked on every call: a handler put in place later is chained too."""
        if threading.current_thread() is not threading.main_thread() or os.getpid() != self._pid:
            return
        for sig in SIGNALS:
            current = signal.getsignal(sig)
            if callable(current) and current is not self._ours.get(sig):
                self._ours[sig] = self._handler(current)
                signal.signal(sig, self._ours[sig])

    def _handler(self, previous):
        def on_signal(sig, frame):
            if os.getpid() != self._pid:  # a forked child: the default action, as if nothing were chained
                signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
                return
            previous(sig, frame)  # the SDK stops taking jobs
            self._signals += 1
            if self._signals == 1:
                log.warning("signal %d: the jobs in flight get up to %d s, then are cut (a second signal cuts at "
                            "once)", sig, self.seconds)
                threading.Thread(target=self._drain, daemon=True, name="drain").start()
            elif self._signals == 2:
                log.warning("signal %d again: the jobs in flight are cut now", sig)
                threading.Thread(target=self.service.close, daemon=True, name="cut").start()

        return on_signal

    def _drain(self) -> None:
        # new submits are not refused: the jobs the SDK took before the signal (its queue, a long poll that was
        # answered) still run in the window instead of failing at once
        self.service.drain(self.seconds, refuse_new=False)
        self.service.close()  # what is left ends with ShuttingDown: an error item per job
