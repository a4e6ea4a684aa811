"""Feature resample_thread: pcm and wav streams whose rate changes are encoded on resampler threads, not on the
event loop, with the bytes the inline encoder writes; every other stream goes where it went before; the adapters'
Service turns it on for the process's deliveries from TTS_FEATURES."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_encoder_pool import RATE, chunks, pooled, reference

from ttsengine.audio import encoder_pool
from ttsengine.audio.stream_encoder import StreamEncoder, resampler_threads
from ttsengine.serving import delivery
from ttsengine.serving.protocol import SpeechJob
from ttsengine.serving.service import Service
from ttsengine.synthesis.request import SynthesisRequest


class Recording(ThreadPoolExecutor):
    """A real executor that remembers which threads ran its work."""

    def __init__(self):
        super().__init__(2, thread_name_prefix="recorded")
        self.threads: set[str] = set()

    def submit(self, fn, /, *args, **kwargs):
        def run():
            self.threads.add(threading.current_thread().name)
            return fn(*args, **kwargs)

        return super().submit(run)


@pytest.mark.parametrize("fmt, kw", [("pcm", {}), ("pcm", {"sample_rate": 16000}), ("wav", {"sample_rate": 22050}),
                                     ("wav", {"sample_rate": 8000, "streaming": False})])
def test_resampled_streams_run_off_the_loop_with_the_inline_bytes(fmt, kw):
    executor = Recording()
    try:
        async def run() -> tuple[list[bytes], str]:
            encs = [StreamEncoder(fmt, RATE, resampler=executor, **kw) for _ in range(6)]
            assert {e.where for e in encs} == {"resampler"}
            out = await asyncio.gather(*(pooled(e, chunks(i)) for i, e in enumerate(encs)))
            return out, threading.current_thread().name

        out, loop_thread = asyncio.run(run())
        for i, data in enumerate(out):  # six streams at once, none mixed with another
            assert data == reference(fmt, chunks(i), **kw)[0]
        assert executor.threads and loop_thread not in executor.threads
    finally:
        executor.shutdown()


def test_only_a_rate_change_goes_to_the_resampler():
    threads = resampler_threads()
    assert resampler_threads() is threads  # one per process
    assert StreamEncoder("pcm", RATE, RATE, resampler=threads).where == "inline"  # nothing to resample
    assert StreamEncoder("wav", RATE, resampler=threads).where == "inline"  # wav's default rate is the native one
    assert StreamEncoder("pcm", RATE, resampler=threads).where == "resampler"  # pcm's default: 24 kHz
    assert StreamEncoder("pcm", RATE).where == "inline"  # the off switch: no resampler given
    try:
        encoder_pool.start(1)
        pool = encoder_pool.shared(lambda: 1)
        assert StreamEncoder("mp3", RATE, 24000, pool=pool, resampler=threads).where == "process"
        assert StreamEncoder("pcm", RATE, speed=1.5, pool=pool, resampler=threads).where == "process"
    finally:
        encoder_pool.close()


@pytest.mark.parametrize("features, where", [("+resample_thread", "resampler"), ("auto", "resampler"),
                                             ("all,-resample_thread", "inline")])
def test_the_service_sets_it_for_the_process(features, where):
    job = SpeechJob(SynthesisRequest(text="Hello."), "pcm", None, 1.0, True)
    try:
        delivery.use_resample_thread(where != "resampler")  # the opposite first: only the Service can set it right
        Service(lambda: None, None, features)
        enc = delivery.encoder_for(job, RATE)
        assert (enc.where, enc.rate) == (where, 24000)
    finally:
        delivery.use_resample_thread(True)  # the default, as a process without a Service has it
