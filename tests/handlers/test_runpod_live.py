"""A live session as a RunPod job ({"live": [events of /v1/tts/live]}): the handler on the CPU engine, and the real
worker loop (`python -m handlers runpod`) against the local fake job queue streaming its items."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest
from fake_runpod import JobQueue
from test_runpod import error_of, run_job, start_worker, stop_worker

from ttsengine import RunPodConfig

pytest.importorskip("runpod", reason="runpod is a dev dependency")
from handlers.runpod import handler as rp  # noqa: E402

SEGMENT = 15 * 2048  # samples of one segment at 44.1 kHz: max_new_tokens 16 -> 15 kept frames
EVENTS = [{"event": "start", "request": {"text": "", "format": "pcm", "sample_rate": 44100, "seed": 4,
                                         "max_new_tokens": 16, "segment_events": True}},
          {"event": "text", "text": "Hello there. How"}, {"event": "text", "text": " are you"},
          {"event": "flush"}, {"event": "text", "text": "today?"}, {"event": "stop"}]


@pytest.fixture
def handler(engine, tmp_path):
    return rp.JobHandler(engine, None, RunPodConfig(data_dir=tmp_path))


def split(items: list[dict]) -> tuple[bytes, list[dict], dict]:
    """-> (the pcm of the audio pieces, the segment items, the done item), checking the order."""
    *body, done = items
    assert done["done"] is True, done
    pcm = b"".join(base64.b64decode(i["audio"]) for i in body if "audio" in i)
    pieces = [i for i in body if "audio" in i]
    assert [p["index"] for p in pieces] == list(range(len(pieces))) == list(range(done["pieces"]))
    assert all(p["sample_rate"] == 44100 and p["content_type"] == "audio/pcm" for p in pieces)
    return pcm, [i["segment"] for i in body if "segment" in i], done


def test_a_live_job_streams_its_segments_audio_in_order(handler, monkeypatch):
    monkeypatch.setattr(rp, "PIECE_BYTES", 8000)  # small, to see pieces split
    items = run_job(handler, {"live": EVENTS})
    pcm, segments, done = split(items)
    # the WebSocket's segmenter: a sentence end, the flush, the stop
    assert [s["text"] for s in segments] == ["Hello there.", "How are you", "today?"]
    assert [(s["start_sample"], s["end_sample"]) for s in segments] == [(i * SEGMENT, (i + 1) * SEGMENT)
                                                                         for i in range(3)]
    assert len(pcm) == 2 * 3 * SEGMENT == done["bytes"] and done["segments"] == 3 and done["seed"] == 4
    assert all(len(base64.b64decode(i["audio"])) <= 8000 for i in items if "audio" in i)
    # segment items come right after their audio: the pcm before each one is its end
    sent, before = 0, []
    for item in items:
        sent += len(base64.b64decode(item["audio"])) // 2 if "audio" in item else 0
        if "segment" in item:
            before.append(sent)
    assert before == [s["end_sample"] for s in segments]
    again = run_job(handler, {"live": EVENTS})
    assert split(again)[0] == pcm  # the seed: the same audio


def test_without_segment_events_and_without_stop(handler):
    start = {**EVENTS[0], "request": {**EVENTS[0]["request"], "segment_events": False}}
    items = run_job(handler, {"live": [start, {"event": "text", "text": "One. Two"}]})  # the input's end is the end
    pcm, segments, done = split(items)
    assert segments == [] and done["segments"] == 2 and len(pcm) == 2 * 2 * SEGMENT


@pytest.mark.parametrize(("live", "words"), [
    ("text", "a list of events"),
    ([], "a list of events"),
    ([{"event": "text", "text": "x"}], "the first event, and only it, is `start`"),
    ([EVENTS[0], EVENTS[0]], "only it, is `start`"),
    ([EVENTS[0], {"event": "cancel"}], "RunPod's /cancel"),
    ([EVENTS[0], {"event": "text", "text": 5}], "live[1]: `text` must be a string"),
    ([EVENTS[0], {"event": "stop"}, {"event": "text", "text": "x"}], "`stop` is the last event"),
    ([{"event": "start", "request": {"format": "exe"}}], "live[0]: format"),
    ([{"event": "start", "request": {"reference_id": "nobody"}}], "unknown voice"),
])
def test_bad_live_input_is_a_clear_error_item(handler, live, words):
    (item,) = run_job(handler, {"live": live})
    err = error_of(item)
    assert err["status"] == 400 and words in err["error_message"], err


def test_live_input_holds_only_live(handler):
    (item,) = run_job(handler, {"live": EVENTS, "stream": True})
    assert "only `live`" in error_of(item)["error_message"]


def test_an_engine_error_ends_the_job_with_an_error_item(handler):
    start = {"event": "start", "request": {"temperature": 99.0}}
    items = run_job(handler, {"live": [start, {"event": "text", "text": "Hello."}]})
    assert "temperature" in error_of(items[-1])["error_message"]


def test_a_cancelled_live_job_frees_its_slot(handler, engine):
    long = " ".join(f"Sentence number {i} is here." for i in range(30))

    async def first_then_stop():
        gen = handler.run({"id": "l", "input": {"live": [{"event": "start", "request": {"max_new_tokens": 400}},
                                                         {"event": "text", "text": long}]}})
        first = await gen.__anext__()
        await gen.aclose()  # RunPod's /cancel: the task is cancelled, the generator closed
        return first

    assert "audio" in asyncio.run(first_then_stop())
    end = time.time() + 10
    while (engine.stats().running or engine.stats().waiting) and time.time() < end:
        time.sleep(0.05)
    assert engine.stats().running == 0 and engine.stats().waiting == 0


def test_the_worker_loop_streams_a_live_job(tmp_path, handler):
    queue = JobQueue().start()
    queue.submit("live", {"live": EVENTS})
    queue.submit("bad", {"live": [{"event": "flush"}]})
    proc = start_worker(tmp_path, queue.env())
    try:
        queue.wait_done(["live", "bad"], timeout=120)
        streamed = queue.streamed["live"]
        assert queue.done["live"]["output"] == streamed  # /runsync's aggregate: the same items
        pcm, segments, done = split(streamed)
        assert [s["text"] for s in segments] == ["Hello there.", "How are you", "today?"]
        assert len(pcm) == 2 * segments[-1]["end_sample"] == done["bytes"]
        assert pcm == split(run_job(handler, {"live": EVENTS}))[0]  # the worker's engine, the same audio
        assert "start" in json.loads(queue.done["bad"]["error"])["error_message"]
    finally:
        stop_worker(proc)
        queue.stop()
        print((tmp_path / "worker.log").read_text()[-3000:])
