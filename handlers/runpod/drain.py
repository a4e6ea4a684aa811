"""A bounded drain for the RunPod worker. RunPod's SDK handles SIGTERM itself: it stops taking jobs and waits for
the running ones without a limit, and RunPod kills the container when its grace period ends, so a job still
running then ends without a word. Chained after the SDK's handler, this gives the jobs in flight
TTS_DRAIN_SECONDS and then cuts what is left with ShuttingDown: each such job ends with an error item (status
503, "retry it") that RunPod records, and the worker exits.
"""

from __future__ import annotations

import logging
import signal
import threading

from ttsengine.serving.service import Service

log = logging.getLogger("handlers.runpod")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Drain:
    def __init__(self, service: Service, seconds: int):
        self.service, self.seconds = service, seconds
        self._ours: dict[int, object] = {}
        self._started = False

    @property
    def installed(self) -> bool:
        return bool(self._ours) and all(signal.getsignal(sig) is h for sig, h in self._ours.items())

    def install(self) -> None:
        """Chains onto the handlers in place (the SDK's). It must run on the main thread after the SDK installed
        them, that is from inside its loop: the worker calls it from the concurrency modifier, which the SDK
        also calls before it installs its own, so this checks each time and chains again where it was replaced."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            current = signal.getsignal(sig)
            if current is not self._ours.get(sig):
                self._ours[sig] = self._handler(current)
                signal.signal(sig, self._ours[sig])

    def _handler(self, previous):
        def on_signal(sig, frame):
            if callable(previous):
                previous(sig, frame)  # the SDK stops taking jobs
            if not self._started:
                self._started = True
                log.warning("signal %d: the jobs in flight get up to %d s, then are cut", sig, self.seconds)
                threading.Thread(target=self._drain, daemon=True, name="drain").start()

        return on_signal

    def _drain(self) -> None:
        self.service.drain(self.seconds)
        self.service.close()  # what is left ends with ShuttingDown: an error item per job
