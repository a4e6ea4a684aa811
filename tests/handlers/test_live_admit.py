"""How a live session hands its segments to the engine (serving/live/session.py LiveSession): a coroutine admit
(Service.admit, which with engine processes sends the segment from the event loop) is awaited on the event loop and
asked whether the session is gone; a plain submit (a bare Engine or Fleet) runs in a worker thread. Real engine:
the tiny model on CPU."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conftest import MODEL_DIR

from ttsengine import Engine, EngineConfig
from ttsengine.errors import Abandoned
from ttsengine.serving.live.session import LiveSession, live_job


@pytest.fixture(scope="module")
def engine():
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2))
    yield eng
    eng.close()


def speak(submit, text: str = "One short sentence. And a second one. ") -> list:
    async def run():
        job, _ = live_job({"text": "", "format": "pcm", "max_new_tokens": 8}, None)
        s = LiveSession(submit, job, max_chars=10_000)
        s.text(text)
        s.end()
        return [piece async for piece in s.audio()]

    return asyncio.run(run())


def test_a_coroutine_admit_is_awaited_on_the_event_loop(engine):
    on_loop = []

    async def admit(request, gone):
        on_loop.append(threading.current_thread() is threading.main_thread())
        assert await gone() is False
        return engine.submit(request)

    out = speak(admit)
    assert on_loop == [True, True] and any(isinstance(p, bytes) and p for p in out)


def test_a_plain_submit_runs_in_a_worker_thread(engine):
    on_loop = []

    def submit(request, abandoned):
        on_loop.append(threading.current_thread() is threading.main_thread())
        assert abandoned() is False
        return engine.submit(request)

    out = speak(submit)
    assert on_loop == [False, False] and any(isinstance(p, bytes) and p for p in out)


def test_a_barge_in_while_a_segment_is_admitted_ends_the_audio_without_an_error(engine):
    # the admit waits (as for a busy engine process) until gone() says the session was cancelled, then gives up as
    # Service.admit does (Abandoned): audio() ends quietly, with no audio and no error

    async def admit(request, gone):
        while not await gone():
            await asyncio.sleep(0.01)
        raise Abandoned("the client left before the request was taken in")

    async def run():
        job, _ = live_job({"text": "", "format": "pcm"}, None)
        s = LiveSession(admit, job, max_chars=10_000)
        s.text("A sentence to say. ")
        task = asyncio.create_task(_collect(s))
        await asyncio.sleep(0.1)
        s.cancel()
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(run()) == []


async def _collect(session: LiveSession) -> list:
    return [piece async for piece in session.audio()]
