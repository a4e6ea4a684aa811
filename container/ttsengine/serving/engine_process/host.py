"""The engine side: `python -m ttsengine.serving.engine_process.host FD`, started by remote_fleet.py with one end
of a socket pair. It reads (config, log level, random weights: bench's --random-weights or None), loads the fleet,
says LOADED (or FAILED), then serves the front's messages until CLOSE or until the front is gone (end of file: the
front died; the engines must not outlive it).

Threads: this one reads commands; a writer sends everything outgoing in batches; submits and voice encodes run on a
small pool (a request with reference audio is encoded by the codec at submit: it must not hold up cancels; a CANCEL
that comes first drops it or stops it at its next reference; with feature plan_thread the requests without reference
audio are planned by one thread of their own instead), the other calls (stats...) on two threads of their own, so
health checks never wait behind planning;
audio leaves from the engine's own codec thread through Stream.relay, with no waiter per stream.
"""

from __future__ import annotations

import functools
import logging
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

from ...engine import features
from ...engine.fleet import Fleet
from ...errors import Abandoned, TTSError
from ...synthesis.stream import Stream, is_end
from ..service import setup_logging
from .wire import (
    ACCEPTED,
    AUDIO,
    CALL,
    CALLS,
    CANCEL,
    CLOSE,
    END,
    FAILED,
    LOADED,
    REFUSED,
    REPLY,
    STATE,
    SUBMIT,
    pack_error,
)

log = logging.getLogger(__name__)
USER_CALLS = ("voice_codes",)  # calls that are user work (a reference encoded): on the planning threads
BATCH = 512  # messages per send at most: a burst of chunks goes out in few system calls, none waits for long
STATE_EVERY = 0.2  # seconds between checks of ready / failure / max_streams (sent when they change)
SHORT_SWITCH_S = 0.0005  # feature short_switch: the engine process's GIL switch interval (Python's default 0.005 s)
# The writer pickles every chunk's audio (float32 arrays: ~100 MB/s at 256 streams on one GPU) holding the GIL the
# engine loop needs. Protocol 5 writes an array's buffer into the stream once; Connection.send's default (4) copies it
# to bytes first: 2-3x the pickling time for a batch of 256 8-frame chunks (16.8 MB: 16-20 ms against 7 ms, stop 61).
# Any protocol reads back with recv().
WIRE_PROTOCOL = 5


class Host:
    def __init__(self, fleet: Fleet, conn: Connection, plan_thread: bool = False):
        """plan_thread: feature plan_thread (requests without reference audio planned by one thread of their own)."""
        self.fleet, self.conn = fleet, conn
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()  # messages for the writer; None stops it
        self.streams: dict[int, Stream] = {}  # sid -> the engine's stream, until its END is queued
        self.early: set[int] = set()  # sids cancelled before their submit returned
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(8, thread_name_prefix="engine-process-call")  # submits, voice encodes
        self.plans = ThreadPoolExecutor(1, thread_name_prefix="engine-process-plan") if plan_thread else self.pool
        # stats and the other calls on threads of their own: /health and /metrics never wait behind planning
        self.control = ThreadPoolExecutor(2, thread_name_prefix="engine-process-control")
        self.stopped = threading.Event()

    def facts(self) -> dict:
        f = self.fleet
        return {"ready": f.ready, "failure": f.failure, "max_streams": f.max_streams if f.ready else 0}

    def serve(self) -> None:
        writer = threading.Thread(target=self._write, name="engine-process-writer", daemon=True)
        writer.start()
        self.outbox.put((LOADED, {**self.facts(), "sample_rate": self.fleet.sample_rate,
                                  "frame_rate": self.fleet.frame_rate, "codec_tag": self.fleet.codec_tag}))
        threading.Thread(target=self._watch_state, name="engine-process-state", daemon=True).start()
        try:
            while True:
                try:
                    batch = self.conn.recv()
                except (EOFError, OSError):
                    log.warning("the front process is gone: the engines close")
                    break
                if not self._handle(batch):
                    break
        finally:
            self.stopped.set()
            self.plans.shutdown(wait=True, cancel_futures=True)
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.control.shutdown(wait=True, cancel_futures=True)
            self.fleet.close()  # ends what is still open with an error: those ENDs go out before the writer stops
            self.outbox.put(None)
            writer.join(10)

    def _handle(self, batch: list) -> bool:
        for msg in batch:
            tag = msg[0]
            if tag == SUBMIT:
                plain = all(r.audio is None for r in msg[2].references)  # nothing to encode: ~0.1 ms of CPU
                read = time.perf_counter()  # the waterfall's `received`
                (self.plans if plain else self.pool).submit(self._submit, *msg[1:], read)
            elif tag == CANCEL:
                with self.lock:
                    stream = self.streams.get(msg[1])
                    if stream is None:
                        self.early.add(msg[1])
                if stream is not None:
                    stream.cancel()
            elif tag == CALL:
                (self.pool if msg[2] in USER_CALLS else self.control).submit(self._call, *msg[1:])
            elif tag == CLOSE:
                return False
        return True

    def _submit(self, sid: int, request, ignore_stop: bool, received: float) -> None:
        try:  # a CANCEL before or while it is planned (the client left): dropped, or stopped at the next reference
            abandoned = functools.partial(self.early.__contains__, sid)
            Abandoned.check(abandoned)
            stream = self.fleet.submit(request, ignore_stop=ignore_stop, abandoned=abandoned)
        except Exception as e:  # noqa: BLE001 - InputError, BusyError, EngineDown... go back as they are
            with self.lock:
                self.early.discard(sid)
            self.outbox.put((REFUSED, sid, pack_error(e)))
            return
        with self.lock:
            self.streams[sid] = stream
            early = sid in self.early
            self.early.discard(sid)
        marks = {"received": received, "planned": time.perf_counter()}
        self.outbox.put((ACCEPTED, sid, list(stream.plan.texts), stream.seed, stream.device, marks))
        stream.relay(functools.partial(self._forward, sid, stream, [0]))  # after ACCEPTED: the front knows the sid
        if early:
            stream.cancel()

    def _forward(self, sid: int, stream: Stream, sent: list[int], item) -> None:
        """In the engine's thread that pushed it: one AudioChunk, or the end. The text chunks' reports that came
        since the last message travel with it (progress: RunPod reports text chunks done while streaming)."""
        reports = stream.plan.reports
        new, sent[0] = reports[sent[0]:], len(reports)
        if not is_end(item):
            self.outbox.put((AUDIO, sid, item.text_index, item.audio, stream.started_at, stream.first_audio_at, new))
            return
        with self.lock:
            self.streams.pop(sid, None)
        plan = stream.plan
        self.outbox.put((END, sid, pack_error(stream.error), new, list(plan.codes) if plan.keep_codes else None,
                         stream.started_at))

    def _call(self, rid: int, name: str, args: tuple) -> None:
        try:
            if name not in CALLS:
                raise ValueError(f"the engine process does not answer {name!r}")
            self.outbox.put((REPLY, rid, True, getattr(self.fleet, name)(*args)))
        except Exception as e:  # noqa: BLE001 - the caller gets the exception
            self.outbox.put((REPLY, rid, False, pack_error(e)))

    def _watch_state(self) -> None:
        last = None
        while not self.stopped.wait(STATE_EVERY):
            now = self.facts()
            if now != last:
                self.outbox.put((STATE, now))
                last = now

    def _write(self) -> None:
        while True:
            item = self.outbox.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < BATCH:
                try:
                    item = self.outbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._send(batch)
                    return
                batch.append(item)
            if not self._send(batch):
                return

    def _send(self, batch: list) -> bool:
        try:
            self.conn.send_bytes(ForkingPickler.dumps(batch, protocol=WIRE_PROTOCOL))
            return True
        except (OSError, ValueError):  # the front is gone
            return False


def switch_interval(features_text: str) -> float | None:
    """The engine process's GIL switch interval: with feature short_switch the engine loop takes the GIL back from a
    planning, writing or codec thread after 0.5 ms instead of 5 ms (a thread waiting for the GIL asks its holder to
    drop it after one interval); None: Python's."""
    return None if features.switched_off(features_text, features.SHORT_SWITCH) else SHORT_SWITCH_S


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("engine process: usage: python -m ttsengine.serving.engine_process.host FD "
              "(started by the server, not by hand)", file=sys.stderr)
        return 2
    # the front decides when to stop (a drain first): Ctrl-C or a SIGTERM sent to the whole process group
    # must not cut the engines under requests it still serves; it says CLOSE, or its end of the socket closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(args[0]))
    config, log_level, random_weights = conn.recv()
    setup_logging(log_level)
    try:
        fleet = Fleet.load(config, random_weights)
    except Exception as e:  # noqa: BLE001 - the front reports it (health: failed) as if it had loaded itself
        if not isinstance(e, TTSError):  # a bug: its traceback to the log (a bad model dir is one line, up there)
            log.exception("the engine failed to load")
        conn.send([(FAILED, pack_error(e))])
        return 1
    interval = switch_interval(config.features)
    if interval is not None:
        sys.setswitchinterval(interval)
    Host(fleet, conn, not features.switched_off(config.features, features.PLAN_THREAD)).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
