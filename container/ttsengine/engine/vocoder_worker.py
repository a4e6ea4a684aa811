"""Codec decoding on its own thread (and CUDA stream), so decode steps never wait for audio.

Commands run strictly in submission order, which is what keeps it simple: a slot's reset is queued
after its last decode, and a stream is finished only after its last chunk was emitted. The loop
thread may hand a slot to a new stream right after queueing the reset.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..synthesis.stream import Stream
from .vocoder import StreamingDecoder

log = logging.getLogger(__name__)


@dataclass
class Delivery:
    stream: Stream
    text_index: int
    frames: int  # real frames in this row (the rest of the chunk is padding)


class VocoderWorker:
    def __init__(self, decoder: StreamingDecoder, on_decoded: Callable[[int, float], None],
                 on_finished: Callable[[Stream], None]):
        """on_decoded(frames, seconds) after each decode; on_finished(stream) when a stream completed."""
        self.decoder = decoder
        self.on_decoded, self.on_finished = on_decoded, on_finished
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._cuda = decoder.device.type == "cuda"
        self._stream = torch.cuda.Stream(decoder.device) if self._cuda else None
        self._thread = threading.Thread(target=self._run, name="tts-vocoder", daemon=True)
        self._thread.start()

    # ---- loop thread --------------------------------------------------------------------------
    def decode(self, slots: list[int], codes: np.ndarray, deliveries: list[Delivery]) -> None:
        """codes: int64 [b, n, K] for the streams in `slots` (one row each)."""
        self._q.put(("decode", slots, codes, deliveries))

    def reset(self, slot: int) -> None:
        self._q.put(("reset", slot))

    def finish(self, stream: Stream, error: BaseException | None = None, completed: bool = False) -> None:
        """Ends the stream after everything queued before; completed: count it as a finished request."""
        self._q.put(("finish", stream, error, completed))

    def call(self, fn: Callable[[], None]) -> None:
        """Runs fn on the worker thread and waits (warm-up: compile and capture where it runs)."""
        self.call_async(fn)()

    def call_async(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Queues fn for the worker thread -> wait(), which blocks until fn is done and re-raises its error."""
        done = threading.Event()
        box: list = []

        def job():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                box.append(e)
            finally:
                done.set()

        self._q.put(("call", job))

        def wait() -> None:
            done.wait()
            if box:
                raise box[0]

        return wait

    def close(self) -> None:
        self._q.put(("stop",))
        self._thread.join(timeout=30)

    # ---- worker thread ------------------------------------------------------------------------
    def _run(self) -> None:
        ctx = torch.cuda.stream(self._stream) if self._cuda else contextlib.nullcontext()
        with torch.inference_mode(), ctx:
            while True:
                cmd = self._q.get()
                kind = cmd[0]
                if kind == "stop":
                    return
                try:
                    if kind == "decode":
                        self._decode(*cmd[1:])
                    elif kind == "reset":
                        self.decoder.reset(torch.tensor([cmd[1]], device=self.decoder.device))
                    elif kind == "finish":
                        cmd[1].finish(cmd[2])
                        if cmd[3]:
                            self.on_finished(cmd[1])
                    elif kind == "call":
                        cmd[1]()
                except Exception as e:  # noqa: BLE001 - fail the affected streams, keep serving
                    log.exception("vocoder command %s failed", kind)
                    if kind == "decode":
                        for d in cmd[3]:
                            d.stream.finish(RuntimeError(f"audio decoding failed: {type(e).__name__}: {e}"))

    def _decode(self, slots: list[int], codes: np.ndarray, deliveries: list[Delivery]) -> None:
        t0 = time.perf_counter()
        audio = self.decoder.decode_padded(slots, torch.from_numpy(codes).to(self.decoder.device))
        audio = audio.float().cpu().numpy()  # waits for this stream only
        for wave, d in zip(audio, deliveries):
            d.stream.emit(wave[: d.frames * self.decoder.frame_length], d.text_index)
        self.on_decoded(sum(d.frames for d in deliveries), time.perf_counter() - t0)

