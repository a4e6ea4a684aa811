"""The RunPod worker's input handling as tables: a job's `input` -> (speech job, worker options) or a clear
error item, the worker's config with and without a network volume, and the concurrency it asks for. No
engine, no network, no runpod package."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from handlers.runpod import handler as rp
from handlers.runpod.worker import volume_defaults
from ttsengine import BusyError, InputError, MediaTypeError, RunPodConfig, TTSError, from_env
from ttsengine.serving.failure import ModelLoading

NO_BUCKET, BUCKET = RunPodConfig(), RunPodConfig(s3_bucket="b")


@pytest.mark.parametrize("raw, cfg, stream, upload, fmt", [
    ({"text": "hi"}, NO_BUCKET, False, False, "wav"),
    ({"text": "hi", "streaming": True}, NO_BUCKET, True, False, "wav"),  # fish's own switch streams
    ({"text": "hi", "streaming": True, "stream": False}, NO_BUCKET, False, False, "wav"),  # ours wins
    ({"input": "hi"}, NO_BUCKET, False, False, "mp3"),  # OpenAI's fields: whole unless asked
    ({"input": "hi", "stream": True, "response_format": "pcm"}, NO_BUCKET, True, False, "pcm"),
    ({"text": "hi", "upload": True}, BUCKET, False, True, "wav"),
    ({"text": "hi", "upload": False}, NO_BUCKET, False, False, "wav"),
])
def test_parse_input(raw, cfg, stream, upload, fmt):
    before = dict(raw)
    job, opts = rp.parse_input(raw, None, cfg)
    assert (opts.stream, opts.upload, job.format, job.request.text) == (stream, upload, fmt, "hi")
    assert raw == before  # the job's input is not changed


@pytest.mark.parametrize("raw, words", [
    ("just a string", "input must be an object"),
    (None, "input must be an object"),
    ([{"text": "hi"}], "input must be an object"),
    ({}, "needs `text`"),
    ({"text": "x", "format": "exe"}, "format"),
    ({"text": "x", "stream": "yes"}, "stream: must be true or false"),
    ({"text": "x", "upload": 1}, "upload: must be true or false"),
    ({"text": "x", "upload": True}, "RUNPOD_S3_BUCKET"),
    ({"input": "x", "voice": "nobody"}, "unknown voice 'nobody'"),
    ({"text": "x", "references": [{"text": "t", "audio": "%%%"}]}, "not valid base64"),
])
def test_bad_input(raw, words):
    with pytest.raises(InputError) as e:
        rp.parse_input(raw, None, NO_BUCKET)
    assert words in str(e.value)
    err = json.loads(rp.error_item(e.value)["error"])
    assert err == {"error_type": "invalid_input", "error_message": str(e.value), "status": 400}


@pytest.mark.parametrize("error, kind, status", [
    (InputError("bad"), "invalid_input", 400),
    (MediaTypeError("bad type"), "invalid_input", 415),
    (rp.OutputTooLarge("too big"), "invalid_input", 400),
    (BusyError("full"), "busy", 503),
    (ModelLoading("loading"), "busy", 503),
    (TTSError("broken"), "server_error", 500),
])
def test_error_items(error, kind, status):
    item = rp.error_item(error)
    assert set(item) == {"error"}
    assert json.loads(item["error"]) == {"error_type": kind, "error_message": str(error), "status": status}


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 767, 768, 3 * (1 << 18)])
def test_b64_size_is_the_encoded_length(n):
    assert rp.b64_size(n) == len(rp.b64(b"x" * n))


def test_a_piece_is_one_mebibyte_of_base64():
    assert rp.b64_size(rp.PIECE_BYTES) == 1 << 20


class Slots:
    max_streams = 6


@pytest.mark.parametrize("cfg, want", [(RunPodConfig(), 6), (RunPodConfig(concurrency=2), 2)])
def test_concurrency(cfg, want):
    assert rp.JobHandler(Slots(), None, cfg).concurrency(0) == want


# ---- config: the worker's variables, the volume's defaults under them ----------------------------------------
def test_config_from_env():
    cfg = RunPodConfig.from_env({"RUNPOD_CONCURRENCY": "12", "RUNPOD_S3_BUCKET": "b",
                                 "RUNPOD_MAX_INLINE_BYTES": "5000", "RUNPOD_S3_URL_EXPIRES": "60"})
    assert (cfg.concurrency, cfg.s3_bucket, cfg.max_inline_bytes, cfg.url_expires) == (12, "b", 5000, 60)
    assert (cfg.data_dir, cfg.progress_updates) == (Path("data"), False)
    assert RunPodConfig.from_env({"RUNPOD_WEBHOOK_POST_OUTPUT": "https://api.runpod.ai/v2/x"}).progress_updates


def test_without_a_volume_nothing_moves():
    assert volume_defaults(None) == ({}, {})
    assert RunPodConfig.from_env({}, defaults={}).data_dir == Path("data")


@pytest.mark.parametrize("env, model_dir, cache_dir, data_dir", [
    ({}, "vol/models/openaudio-s1-mini", "vol/kernel-cache", "vol/voices"),
    ({"TTS_MODEL_DIR": "/m"}, "/m", "vol/kernel-cache", "vol/voices"),
    ({"TTS_CACHE_DIR": "/c", "TTS_DATA_DIR": "/d"}, "vol/models/openaudio-s1-mini", "/c", "/d"),
])
def test_a_volume_holds_what_the_environment_does_not_place(env, model_dir, cache_dir, data_dir):
    engine_defaults, worker_defaults = volume_defaults(Path("vol"))
    engine, worker = from_env(env, defaults=engine_defaults), RunPodConfig.from_env(env, defaults=worker_defaults)
    assert (engine.model_dir, engine.cache_dir, worker.data_dir) == (Path(model_dir), Path(cache_dir), Path(data_dir))


def test_unknown_fields_and_voice_aliases_follow_the_servers_variables():
    # the same bodies work on every adapter: tolerant by default (what was dropped is named), strict on request
    job, _ = rp.parse_input({"text": "x", "bogus": 1, "latency": "normal"}, None, NO_BUCKET)
    assert job.ignored == ("bogus", "latency")  # unknown, and accepted without effect
    cfg = RunPodConfig.from_env({"TTS_STRICT_FIELDS": "on", "TTS_VOICE_ALIASES": "Narrator=nobody"})
    assert cfg.strict_fields and cfg.voice_aliases == (("narrator", "nobody"),)
    with pytest.raises(InputError, match="bogus"):
        rp.parse_input({"text": "x", "bogus": 1}, None, cfg)
    with pytest.raises(InputError, match="TTS_VOICE_ALIASES"):  # the alias is read: it names a voice not stored
        rp.parse_input({"input": "x", "voice": "narrator"}, None, cfg)
    job, _ = rp.parse_input({"input": "x", "voice": "alloy"}, None, cfg)  # OpenAI's names still mean default
    assert job.request.references == ()



def test_drain_chains_only_onto_the_sdks_handler_and_never_in_a_forked_child():
    import os
    import signal

    from handlers.runpod.drain import Drain
    from ttsengine.serving.service import Service

    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        service = Service(lambda: None, None)  # never loaded: the drain has nothing to wait for
        drain = Drain(service, 1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        drain.install()  # the worker's own call before the SDK starts: the default action is left alone
        assert not drain.installed and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        calls = []
        signal.signal(signal.SIGTERM, lambda sig, frame: calls.append(sig))  # the SDK's handler
        signal.signal(signal.SIGINT, lambda sig, frame: calls.append(sig))
        drain.install()
        assert drain.installed
        pid = os.fork()
        if pid == 0:  # a forked child (the SDK's heartbeat): SIGTERM must end it as by default
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(3)  # not reached when the signal ends the process
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
        assert calls == []  # the child ran neither the SDK's handler nor the drain
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # in this process: the SDK's, then the drain
        assert calls == [signal.SIGTERM]
        for _ in range(100):
            if service._closed:
                break
            time.sleep(0.02)
        assert service._closed  # the drain ran (nothing in flight) and closed the engines
    finally:
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])
