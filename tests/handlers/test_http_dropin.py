"""The drop-in parts of the HTTP API, against the real server (`python -m handlers http`, the tiny model on CPU):
OpenAI voice names and aliases, /v1/models and /v1/audio/voices, Kokoro-FastAPI's fields (stream, volume,
download links), fish-speech's /v1/references/update and fish-audio SDK fields, unknown fields, 415, CORS,
Content-Disposition, offline /docs."""

from __future__ import annotations

import io
import struct
import time

import httpx
import msgpack
import numpy as np
import pytest
import soundfile as sf
from test_http import FRAME_S, FRAMES, _metric, duration, start_server, stop, wait_ready, wav_bytes

ORIGIN = "http://app.example"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(url, data dir): aliases nova -> alice, CORS for ORIGIN, unknown fields tolerated (the default)."""
    tmp = tmp_path_factory.mktemp("dropin")
    proc, url = start_server(tmp, TTS_VOICE_ALIASES="nova=alice", TTS_CORS_ORIGINS=ORIGIN)
    wait_ready(url, proc)
    yield url, tmp / "data"
    stop(proc)


@pytest.fixture
def server(served) -> str:
    return served[0]


def speech(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json={"input": "Hello there.", "seed": 5, **body}, timeout=120)


def pcm(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, "<i2").astype(np.int32)


def same_audio(a: np.ndarray, b: np.ndarray) -> bool:
    """The same speech: equal length and >= 40 dB SNR. Not bit-equal: a fresh-clone CI run on 2 busy cores once gave
    two seed-5 default-voice requests that differed in a few int16 samples (rounding, not tokens: another voice or
    seed changes every sample). Bit-exactness is the parity command's (the golden vectors)."""
    if a.shape != b.shape:
        return False
    noise = float(np.sum((a - b).astype(np.float64) ** 2))
    return noise == 0 or 10 * np.log10(float(np.sum(b.astype(np.float64) ** 2)) / noise) >= 40


def add_voice(url: str, voice_id: str, seed: int = 3, seconds: float = 0.6) -> httpx.Response:
    return httpx.post(url + "/v1/references/add", data={"id": voice_id, "text": f"hello {voice_id}"}, timeout=60,
                      files={"audio": ("a.wav", wav_bytes(seconds=seconds, seed=seed), "audio/wav")})


# ---- OpenAI: voices, aliases, models ---------------------------------------------------------------------------
def test_openai_voice_names_are_the_models_own_voice(server):
    default = pcm(speech(server, response_format="pcm"))
    for voice in ("alloy", "Shimmer", {"id": "cedar"}, "default"):
        assert same_audio(pcm(speech(server, response_format="pcm", voice=voice)), default), voice


def test_a_configured_alias_speaks_with_its_stored_voice(server):
    r = speech(server, voice="nova")  # TTS_VOICE_ALIASES=nova=alice, before alice exists
    assert r.status_code == 400
    assert "'nova' stands for voice 'alice' (TTS_VOICE_ALIASES), which is not stored" in r.json()["error"]["message"]
    assert add_voice(server, "alice").status_code == 201
    try:
        alice = pcm(speech(server, response_format="pcm", voice="alice"))
        assert same_audio(pcm(speech(server, response_format="pcm", voice="NOVA")), alice)
        assert not same_audio(alice, pcm(speech(server, response_format="pcm")))  # a voice, not the default
        voices = httpx.get(server + "/v1/audio/voices").json()["voices"]
        by_id = {v["id"]: v for v in voices}
        assert voices[0] == {"id": "default", "name": "default"} and by_id["alice"] == {"id": "alice", "name": "alice"}
        assert by_id["nova"]["alias_of"] == "alice" and by_id["alloy"]["alias_of"] == "default"
        assert all(set(v) >= {"id", "name"} for v in voices)  # Kokoro-FastAPI's shape (Open WebUI reads v["id"])
        legacy = httpx.get(server + "/v1/audio/voices?legacy=true").json()["voices"]
        assert legacy == [v["id"] for v in voices]
    finally:
        httpx.request("DELETE", server + "/v1/references/delete?reference_id=alice")


def test_models(server):
    listed = httpx.get(server + "/v1/models").json()
    assert listed["object"] == "list"
    ids = [m["id"] for m in listed["data"]]
    assert {"s1-mini", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)
    assert all(m["object"] == "model" and isinstance(m["created"], int) and m["owned_by"] for m in listed["data"])
    assert httpx.get(server + "/v1/models/tts-1").json() == listed["data"][ids.index("tts-1")]
    r = httpx.get(server + "/v1/models/whisper-1")
    assert r.status_code == 404 and "model 'whisper-1' not found" in r.json()["error"]["message"]
    for model in ids:  # every listed model is one the speech route takes
        assert speech(server, model=model, response_format="pcm", max_new_tokens=4).status_code == 200


# ---- Kokoro-FastAPI's fields -------------------------------------------------------------------------------
def test_stream_false_is_one_whole_file_with_exact_sizes(server):
    streamed, whole = speech(server, response_format="wav"), speech(server, response_format="wav", stream=False)
    assert struct.unpack("<I", streamed.content[40:44])[0] == 0xFFFFFFFF  # streamed: "to the end"
    data = whole.content
    assert whole.headers["content-length"] == str(len(data))
    assert struct.unpack("<I", data[4:8])[0] == len(data) - 8 and struct.unpack("<I", data[40:44])[0] == len(data) - 44
    assert data[44:] == streamed.content[44:]  # the same audio (same seed)
    assert abs(sf.info(io.BytesIO(data)).duration - (FRAMES - 1) * FRAME_S) < 0.002


def test_volume_multiplier_scales_and_clips(server):
    def samples(**body) -> np.ndarray:  # wav: the model's own rate, so no resampling after the scaling
        r = speech(server, response_format="wav", stream=False, **body)
        assert r.status_code == 200, r.text
        return np.frombuffer(r.content[44:], "<i2").astype(np.int32)

    base = samples()
    assert np.abs(samples(volume_multiplier=0.5) - base / 2).max() <= 1  # 16-bit rounding
    loud = samples(volume_multiplier=10)
    assert loud.max() == 32767 and loud.min() == -32767  # clipped at full scale, never wrapped around
    big, small = np.abs(base) > 3300, np.abs(base) < 3200  # |x| over / under 1/10 of full scale
    assert big.any() and np.array_equal(loud[big], 32767 * np.sign(base[big]))
    assert np.abs(loud[small] - 10 * base[small]).max() <= 10
    assert speech(server, volume_multiplier=11).status_code == 400


def test_accepted_fields_without_effect_are_named(server):
    """Kokoro's lang_code and normalization_options and OpenAI's instructions are accepted (their clients send
    them) and named in X-Ignored-Fields: S1 has no use for them (issue 47)."""
    r = speech(server, response_format="pcm", lang_code="a", max_new_tokens=4,
               normalization_options={"normalize": False, "unit_normalization": True})
    assert r.status_code == 200 and r.headers["x-ignored-fields"] == "lang_code,normalization_options"
    r = speech(server, response_format="pcm", instructions="Speak cheerfully.", max_new_tokens=4, bogus=1)
    assert r.status_code == 200 and r.headers["x-ignored-fields"] == "instructions,bogus"
    r = speech(server, response_format="pcm", instructions=None, max_new_tokens=4)  # no value: nothing ignored
    assert r.status_code == 200 and "x-ignored-fields" not in r.headers


def test_unknown_fields_are_ignored_and_named(server):
    base = pcm(speech(server, response_format="pcm"))
    r = speech(server, response_format="pcm", bogus=1, download_format="wav")
    assert np.array_equal(pcm(r), base) and r.headers["x-ignored-fields"] == "bogus,download_format"
    assert speech(server, bogus=1, speed=9).status_code == 400  # known fields are still checked


def test_download_link_of_a_streamed_wav(server):
    r = speech(server, response_format="wav", return_download_link=True)
    assert r.status_code == 200 and r.headers["x-download-path"].startswith("/download/")
    assert r.headers["x-download-url"] == "/v1" + r.headers["x-download-path"]  # Kokoro's clients put /v1 first
    kept = httpx.get(server + r.headers["x-download-url"])
    assert kept.status_code == 200 and kept.headers["content-type"] == "audio/wav"
    assert kept.headers["content-disposition"] == 'attachment; filename="speech.wav"'
    data = kept.content
    assert data[44:] == r.content[44:] and struct.unpack("<I", data[40:44])[0] == len(data) - 44  # real sizes
    head = httpx.head(server + r.headers["x-download-url"])
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))


def test_download_link_of_a_whole_mp3(server):
    r = speech(server, response_format="mp3", stream=False, return_download_link=True)
    kept = httpx.get(server + "/v1" + r.headers["x-download-path"])
    assert kept.content == r.content and kept.headers["content-type"] == "audio/mpeg"
    for name in ("0" * 32 + ".mp3", "..%2Fvoices", "x"):
        missing = httpx.get(server + "/v1/download/" + name)
        assert missing.status_code == 404 and "error" in missing.json(), name


def test_an_abandoned_stream_keeps_nothing(served):
    url, data_dir = served
    with httpx.stream("POST", url + "/v1/audio/speech", timeout=120, json={
            "input": "Long.", "response_format": "pcm", "max_new_tokens": 3000, "seed": 1,
            "return_download_link": True}) as r:
        link = r.headers["x-download-url"]
        chunks = r.iter_raw()
        next(chunks)  # generation is under way
    end = time.time() + 10
    while time.time() < end and (_metric(url, "tts_active_streams") or list((data_dir / "downloads").glob("*.part"))):
        time.sleep(0.05)
    assert _metric(url, "tts_active_streams") == 0  # the generation was cancelled
    assert list((data_dir / "downloads").glob("*.part")) == [] and httpx.get(url + link).status_code == 404


# ---- fish-speech and fish-audio -----------------------------------------------------------------------------
def test_fish_audio_sdk_fields(server):
    # what fish-audio's SDK sends: every field of its request model; prosody is real (tempo, volume in dB)
    body = {"text": "Hello there.", "format": "wav", "seed": 5, "chunk_length": 200, "mp3_bitrate": 128,
            "opus_bitrate": 32, "references": [], "reference_id": None, "normalize": True, "latency": "balanced",
            "top_p": 0.7, "temperature": 0.7}
    post = lambda **more: httpx.post(server + "/v1/tts", headers={"content-type": "application/msgpack"},  # noqa: E731
                                     content=msgpack.packb({**body, **more}), timeout=120)
    plain, faster = post(), post(prosody={"speed": 2.0, "volume": 0.0})
    assert plain.status_code == 200 and faster.status_code == 200, (plain.text, faster.text)
    assert abs(duration(faster.content, "wav") - duration(plain.content, "wav") / 2) < 0.01
    quieter = post(prosody={"speed": 1.0, "volume": -6.0})
    a, b = sf.read(io.BytesIO(plain.content))[0], sf.read(io.BytesIO(quieter.content))[0]
    assert np.abs(b - a * 10 ** (-6 / 20)).max() < 2 / 32767


def test_references_update_renames_and_replaces(server):
    assert add_voice(server, "carol").status_code == 201
    assert add_voice(server, "dave").status_code == 201
    update = lambda **kw: httpx.post(server + "/v1/references/update", timeout=60, **kw)  # noqa: E731
    try:
        r = update(json={"old_reference_id": "carol", "new_reference_id": "carol 2"})
        assert r.status_code == 200, r.text
        assert r.json() == {"success": True, "message": "voice 'carol' renamed to 'carol 2'",
                            "old_reference_id": "carol", "new_reference_id": "carol 2"}
        ids = httpx.get(server + "/v1/references/list").json()["reference_ids"]
        assert "carol 2" in ids and "carol" not in ids
        assert speech(server, voice="carol 2", max_new_tokens=4).status_code == 200
        assert speech(server, voice="carol").status_code == 400
        for body, status, words in [
            ({"old_reference_id": "carol", "new_reference_id": "x"}, 404, "voice 'carol' not found"),
            ({"old_reference_id": "carol 2", "new_reference_id": "dave"}, 409, "voice 'dave' already exists"),
            ({"old_reference_id": "dave", "new_reference_id": "dave"}, 400, "the new voice id is the old one"),
            ({"old_reference_id": "dave", "new_reference_id": "../x"}, 400, "invalid voice id"),
            ({"old_reference_id": "dave", "new_reference_id": "default"}, 400, "'default' is reserved"),
            ({"old_reference_id": "dave"}, 400, "new_reference_id: Field required"),
        ]:
            r = update(json=body)
            assert r.status_code == status and words in r.json()["error"]["message"], (body, r.text)
        # fish-speech's client may send msgpack
        r = update(content=msgpack.packb({"old_reference_id": "carol 2", "new_reference_id": "carol"}),
                   headers={"content-type": "application/msgpack"})
        assert r.status_code == 200, r.text
        # replace: same id, new audio and transcript
        before = httpx.get(server + "/v1/voices").json()["voices"]
        r = update(data={"id": "carol", "text": "new words"},
                   files={"audio": ("b.wav", wav_bytes(seconds=1.2, seed=9), "audio/wav")})
        assert r.status_code == 200 and r.json()["message"] == "voice 'carol' replaced", r.text
        after = {v["id"]: v for v in httpx.get(server + "/v1/voices").json()["voices"]}
        assert after["carol"]["text"] == "new words"
        assert after["carol"]["seconds"] > {v["id"]: v for v in before}["carol"]["seconds"]
        r = update(data={"id": "nobody", "text": "t"}, files={"audio": ("b.wav", wav_bytes(), "audio/wav")})
        assert r.status_code == 404 and "add it with /v1/references/add" in r.json()["error"]["message"]
    finally:
        for voice in ("carol", "carol 2", "dave"):
            httpx.request("DELETE", server + "/v1/references/delete", params={"reference_id": voice})


# ---- content types, headers, CORS, docs ---------------------------------------------------------------------
@pytest.mark.parametrize("method, path, send", [
    ("POST", "/v1/audio/speech", dict(content=b'{"input": "hi"}')),  # no content type at all
    ("POST", "/v1/audio/speech", dict(data={"input": "hi"})),  # what `curl -d` sends: form data
    ("POST", "/v1/audio/speech", dict(content=b'{"input": "hi"}', headers={"content-type": "text/plain"})),
    ("POST", "/v1/tts", dict(content=b'{"text": "hi"}')),
    ("POST", "/v1/tts", dict(data={"text": "hi"})),
    ("POST", "/v1/references/update", dict(content=b'{"old_reference_id": "a", "new_reference_id": "b"}')),
    ("DELETE", "/v1/references/delete", dict(content=b'{"reference_id": "a"}')),
    ("POST", "/v1/references/add", dict(json={"id": "a", "text": "t", "audio": "AAAA"})),
])
def test_a_wrong_or_missing_content_type_is_415(server, method, path, send):
    r = httpx.request(method, server + path, timeout=60, **send)
    assert r.status_code == 415, (path, r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == 415 and ("Content-Type" in error["message"] or "content type" in error["message"])
    assert "\n" not in error["message"]


def test_audio_responses_carry_a_file_name(server):
    r = speech(server, response_format="opus", max_new_tokens=4)
    assert r.headers["content-disposition"] == 'inline; filename="speech.opus"'
    r = httpx.post(server + "/v1/tts", json={"text": "Hi.", "max_new_tokens": 4}, timeout=120)
    assert r.headers["content-disposition"] == 'inline; filename="speech.wav"'


def test_cors(server):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(server + "/v1/audio/speech", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= {h.strip().lower() for h in
                                                 r.headers["access-control-allow-headers"].split(",")}
    other = httpx.options(server + "/v1/audio/speech", headers={**preflight, "Origin": "http://evil.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    r = httpx.post(server + "/v1/audio/speech", headers={"Origin": ORIGIN}, timeout=120,
                   json={"input": "Hi.", "response_format": "pcm", "max_new_tokens": 4})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"x-seed", "x-sample-rate", "x-download-path", "content-disposition"} <= exposed
    r = httpx.post(server + "/v1/audio/speech", headers={"Origin": ORIGIN}, content=b"{}")  # errors too
    assert r.status_code == 415 and r.headers["access-control-allow-origin"] == ORIGIN


def test_docs_work_offline(server):
    page = httpx.get(server + "/docs")
    assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from another host
    for asset, ctype in (("swagger-ui-bundle.js", "javascript"), ("swagger-ui.css", "text/css"),
                         ("favicon-32x32.png", "image/png")):
        r = httpx.get(server + "/docs/assets/" + asset)
        assert r.status_code == 200 and ctype in r.headers["content-type"] and len(r.content) > 100, asset
    for other in ("index.html", "swagger-ui-bundle.js.map", "swagger-initializer.js", "../__init__.py"):
        assert httpx.get(server + "/docs/assets/" + other).status_code == 404, other  # only what the page loads
    assert httpx.get(server + "/docs/oauth2-redirect").status_code == 200
    schema = httpx.get(server + "/openapi.json").json()
    assert {"/v1/models", "/v1/audio/voices", "/v1/references/update", "/v1/download/{name}"} <= set(schema["paths"])
    assert {"OpenAISpeechRequest", "FishTTSRequest", "ReferenceUpdate"} <= set(schema["components"]["schemas"])
    assert "/docs" not in schema["paths"] and "/docs/assets" not in str(schema["paths"])


# ---- strict fields, bounded downloads, no CORS: a second server ---------------------------------------------
@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strict")
    proc, url = start_server(tmp, TTS_STRICT_FIELDS="on", TTS_DOWNLOAD_TTL="4", TTS_DOWNLOAD_MAX_BYTES="120000")
    wait_ready(url, proc)
    yield url
    stop(proc)


def test_strict_fields(strict):
    r = speech(strict, bogus=1)
    assert r.status_code == 400 and r.json()["error"]["message"] == "bogus: Extra inputs are not permitted"
    r = httpx.post(strict + "/v1/tts", json={"text": "hi", "emotion": "happy"}, timeout=60)
    assert r.status_code == 400 and "emotion" in r.json()["error"]["message"]
    # every field OpenAI's, Kokoro's and fish-audio's clients send is known, so strict mode takes them
    ok = speech(strict, model="tts-1", voice="alloy", instructions="calm", response_format="pcm", speed=1.0,
                stream_format="audio", stream=True, lang_code="a", volume_multiplier=1.0, max_new_tokens=4,
                normalization_options={"normalize": True})
    assert ok.status_code == 200, ok.text
    assert ok.headers["x-ignored-fields"] == "instructions,lang_code,normalization_options"  # known, without effect
    fish = httpx.post(strict + "/v1/tts", timeout=60, json={
        "text": "hi", "mp3_bitrate": 128, "opus_bitrate": 32, "latency": "balanced", "normalize": True,
        "prosody": {"speed": 1.0, "volume": 0.0}, "max_new_tokens": 4})
    assert fish.status_code == 200, fish.text
    assert fish.headers["x-ignored-fields"] == "mp3_bitrate,opus_bitrate,latency,normalize"


def test_download_links_are_bounded_in_size_and_time(strict):
    # each file: 23 frames of 16-bit pcm at 24 kHz, ~51 kB; the bound (120 kB) holds two
    links = []
    for seed in (1, 2, 3):
        r = speech(strict, response_format="pcm", stream=False, return_download_link=True, seed=seed)
        assert 40_000 < len(r.content) < 60_000
        links.append(r.headers["x-download-url"])
    assert [httpx.get(strict + link).status_code for link in links] == [404, 200, 200]  # oldest went first
    r = speech(strict, response_format="wav", stream=False, return_download_link=True, input="A longer sentence, "
               "so the file is over the whole bound.", max_new_tokens=200, seed=4)
    assert len(r.content) > 120_000 and r.headers["x-download-status"] == "unavailable"
    assert "x-download-path" not in r.headers
    time.sleep(4.5)  # TTS_DOWNLOAD_TTL
    assert [httpx.get(strict + link).status_code for link in links] == [404, 404, 404]


def test_no_cors_by_default(strict):
    r = httpx.options(strict + "/v1/audio/speech", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    r = speech(strict, response_format="pcm", max_new_tokens=4)
    assert "access-control-allow-origin" not in r.headers
