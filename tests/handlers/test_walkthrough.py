"""The drop-in walkthrough (issue 20), scripted against a real server (`python -m handlers http`, the tiny model on
CPU, an API key, a browser app's origin allowed): OpenAI's own Python client (models, speech whole and streamed,
its errors, Kokoro's fields through extra_body), a fish-style msgpack request with `latency`, a CORS preflight,
and a body sent without a content type."""

from __future__ import annotations

import io

import httpx
import msgpack
import numpy as np
import pytest
import soundfile as sf
from test_http import FRAME_S, FRAMES, start_server, stop, wait_ready, wav_bytes

openai = pytest.importorskip("openai")  # the dev extra has it

KEY, APP = "walkthrough-key", "http://localhost:5173"
SECONDS = (FRAMES - 1) * FRAME_S  # what one request of the test server speaks


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("walk"), TTS_API_KEY=KEY, TTS_CORS_ORIGINS=APP)
    wait_ready(url, proc)
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


def auth() -> dict:
    return {"Authorization": f"Bearer {KEY}"}


def test_openai_client_lists_the_models(client):
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts", "s1-mini"} <= {m.id for m in client.models.list()}


def test_openai_client_speaks(client):
    # a fixed seed: about 2% of random seeds make the tiny model stop early, and the length is checked
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello from the OpenAI client.",
                                       response_format="wav", extra_body={"seed": 1})
    samples, rate = sf.read(io.BytesIO(audio.content))
    assert rate == 44100 and abs(len(samples) / rate - SECONDS) < 0.002 and np.abs(samples).max() > 0


def test_openai_client_streams(client):
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="coral", input="Streamed through the OpenAI client.",
            instructions="Speak cheerfully.", response_format="pcm", extra_body={"seed": 1}) as response:
        assert response.headers["content-type"] == "audio/pcm" and response.headers["x-seed"]
        chunks = list(response.iter_bytes())
    data = b"".join(chunks)
    assert len(chunks) > 1 and len(data) % 2 == 0  # pieces as they were made, whole 16-bit samples
    assert abs(len(data) / 2 / 24000 - SECONDS) < 0.002  # OpenAI's pcm: 24 kHz


def test_openai_client_with_kokoro_fields(client, server):
    raw = client.audio.speech.with_raw_response.create(
        model="tts-1", voice="alloy", input="Kept for a download.", response_format="wav",
        extra_body={"stream": False, "volume_multiplier": 0.5, "return_download_link": True, "lang_code": "a"})
    assert raw.headers["content-disposition"] == 'inline; filename="speech.wav"'
    data = raw.content
    kept = httpx.get(server + "/v1" + raw.headers["x-download-path"])  # the link needs no key
    assert kept.status_code == 200 and kept.content == data


def test_openai_client_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model="tts-1", voice="nobody", input="hi")
    assert "unknown voice 'nobody'; available: default" in str(e.value)
    wrong = openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.audio.speech.create(model="tts-1", voice="alloy", input="hi")


def test_fish_style_msgpack_request_with_latency(server):
    # fish-speech's tools/api_client.py: ServeTTSRequest packed with msgpack, reference audio as raw bytes (its
    # max_new_tokens default, 1024 frames, is lowered to the test server's length)
    body = {"text": "Hello from a fish client.", "references": [{"audio": wav_bytes(), "text": "noise"}],
            "reference_id": None, "format": "wav", "latency": "balanced", "normalize": True, "chunk_length": 200,
            "max_new_tokens": FRAMES, "top_p": 0.8, "repetition_penalty": 1.1, "temperature": 0.8,
            "streaming": False, "use_memory_cache": "off", "seed": None}
    r = httpx.post(server + "/v1/tts", content=msgpack.packb(body, use_bin_type=True), timeout=120,
                   headers={**auth(), "content-type": "application/msgpack"})
    assert r.status_code == 200, r.text
    samples, rate = sf.read(io.BytesIO(r.content))
    # seed None (what the client sends) is a random seed: the model may stop before FRAMES, never after
    frames = round(len(samples) / rate / FRAME_S)
    assert 0 < frames <= FRAMES - 1 and abs(len(samples) / rate - frames * FRAME_S) < 0.002


def test_cors_preflight_from_a_browser_app(server):
    r = httpx.options(server + "/v1/audio/speech", headers={
        "Origin": APP, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})  # no key: browsers send none here
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    r = httpx.post(server + "/v1/audio/speech", headers={**auth(), "Origin": APP}, timeout=120,
                   json={"input": "From the browser app.", "voice": "alloy", "response_format": "mp3"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    assert "x-seed" in r.headers["access-control-expose-headers"].lower()


def test_a_missing_content_type_is_415(server):
    # `curl -d '{...}'` without -H 'content-type: application/json', and a client that sends no type at all
    for headers in ({"content-type": "application/x-www-form-urlencoded"}, {}):
        r = httpx.post(server + "/v1/audio/speech", content=b'{"input": "hi"}', headers={**auth(), **headers})
        assert r.status_code == 415, r.text
        assert "application/json" in r.json()["error"]["message"]


def test_openapi_lists_the_401_where_the_key_is_needed(server):
    paths = httpx.get(server + "/openapi.json").json()["paths"]  # open: it holds no data
    assert "401" in paths["/v1/audio/speech"]["post"]["responses"]
    assert "401" in paths["/v1/references/add"]["post"]["responses"]
    assert "401" not in paths["/health"]["get"]["responses"] and "401" not in paths["/v1/download/{name}"]["get"][
        "responses"]
    r = httpx.post(server + "/v1/audio/speech", json={"input": "hi"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
