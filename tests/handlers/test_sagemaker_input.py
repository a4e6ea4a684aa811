"""SageMaker's input handling as tables: custom attributes, how they override a body of either schema, the
Accept header, input_fn's checks and the status of every error. No engine, no network."""

from __future__ import annotations

import json

import msgpack
import pytest

from handlers.sagemaker import inference, serve
from ttsengine import InputError


@pytest.mark.parametrize("header, attrs", [
    (None, {}),
    ("", {}),
    ("stream=true", {"stream": True}),
    ("stream=1; format=mp3, seed=7", {"stream": True, "format": "mp3", "seed": 7}),
    ("Stream=YES", {"stream": True}),
    ("stream=false", {"stream": False}),
    ("stream=no;", {"stream": False}),
    ("sample_rate=16000; speed=1.5", {"sample_rate": 16000, "speed": 1.5}),
    ("temperature=0.5,top_p=0.9, repetition_penalty=1.2", {"temperature": 0.5, "top_p": 0.9,
                                                            "repetition_penalty": 1.2}),
    ("max_new_tokens=40", {"max_new_tokens": 40}),
    (" format = wav ", {"format": "wav"}),
])
def test_custom_attributes(header, attrs):
    assert serve.custom_attributes(header) == attrs


@pytest.mark.parametrize("header, words", [
    ("colour=red", "unknown option 'colour=red'"),
    ("stream", "unknown option 'stream'"),  # no value
    ("seed=seven", "seed='seven' is not a number"),
    ("max_new_tokens=1.5", "max_new_tokens='1.5' is not a number"),
    ("speed=fast", "speed='fast' is not a number"),
])
def test_bad_custom_attributes(header, words):
    with pytest.raises(InputError, match="X-Amzn-SageMaker-Custom-Attributes") as e:
        serve.custom_attributes(header)
    assert words in str(e.value) and e.value.status == 400


@pytest.mark.parametrize("body, attrs, out", [
    ({"text": "x"}, {"format": "mp3"}, {"text": "x", "format": "mp3"}),  # fish-speech's field
    ({"input": "x"}, {"format": "mp3"}, {"input": "x", "response_format": "mp3"}),  # OpenAI's field
    ({"text": "x", "seed": 1}, {"seed": 9, "speed": 2.0}, {"text": "x", "seed": 9, "speed": 2.0}),  # attributes win
    ({"text": "x"}, {"stream": True}, {"text": "x"}),  # a switch of serve, not a field
])
def test_apply_attributes(body, attrs, out):
    before = dict(body)
    assert serve.apply_attributes(body, attrs) == out and body == before


@pytest.mark.parametrize("accept, requested, out", [
    (None, "mp3", ("mp3", False)),
    ("*/*", "flac", ("flac", False)),
    ("audio/*", "wav", ("wav", False)),
    ("audio/wav", "mp3", ("wav", False)),
    ("audio/x-wav", "mp3", ("wav", False)),
    ("audio/mpeg", "wav", ("mp3", False)),
    ("audio/ogg", "wav", ("opus", False)),
    ("audio/flac", "wav", ("flac", False)),
    ("audio/aac", "wav", ("aac", False)),
    ("audio/pcm", "wav", ("pcm", False)),
    ("application/json", "opus", ("opus", True)),
    ("image/png, audio/mpeg;q=0.9", "wav", ("mp3", False)),  # the first type it can produce
    ("AUDIO/WAV", "mp3", ("wav", False)),
])
def test_response_format(accept, requested, out):
    assert inference.response_format(accept, requested) == out


def test_an_accept_it_cannot_produce_is_406():
    with pytest.raises(inference.AcceptError, match="cannot produce 'image/png'; accepted: ") as e:
        inference.response_format("image/png", "wav")
    assert e.value.status == 406


@pytest.mark.parametrize("data, ctype, body", [
    (json.dumps({"text": "hi"}), "application/json", {"text": "hi"}),  # str, as some toolkits hand it
    (json.dumps({"text": "hi"}).encode(), "application/json", {"text": "hi"}),
    (msgpack.packb({"text": "hi", "format": "flac"}), "application/x-msgpack", {"text": "hi", "format": "flac"}),
    (json.dumps({"input": "hi", "voice": "alice"}).encode(), None, {"input": "hi", "voice": "alice"}),  # later
    (json.dumps({"text": "hi", "stream": True}).encode(), "application/json", {"text": "hi", "stream": True}),
])
def test_input_fn_checks_and_keeps_the_body(data, ctype, body):
    assert inference.input_fn(data, ctype) == body


@pytest.mark.parametrize("data, ctype, status, words", [
    (b"a,b", "text/csv", 415, "unsupported content type"),
    (b"{bad", "application/json", 400, "not valid JSON"),
    (b'{"nothing": 1}', "application/json", 400, "needs `text`"),
    (b'{"text": "hi", "top_p": "high"}', "application/json", 400, "top_p"),
    (b'{"input": "hi", "response_format": "exe"}', "application/json", 400, "response_format"),
])
def test_input_fn_errors_carry_their_status(data, ctype, status, words):
    """Under the sagemaker-inference toolkit (installed here) our errors become its errors, status kept."""
    with pytest.raises(Exception) as e:
        inference.input_fn(data, ctype)
    assert inference.http_status(e.value) == status and words in inference.error_message(e.value)


@pytest.mark.parametrize("error, status", [
    (InputError("x"), 400),
    (inference.AcceptError("x"), 406),
    (RuntimeError("x"), 500),
])
def test_http_status(error, status):
    assert inference.http_status(error) == status


def test_job_for_drops_serves_stream_switch():
    job = inference.job_for({"text": "hi", "stream": True, "format": "pcm"}, None)
    assert job.format == "pcm" and job.request.text == "hi"


def test_unknown_fields_follow_tts_strict_fields(monkeypatch):
    data = b'{"text": "hi", "stream": true, "bogus": 1}'
    inference._settings.cache_clear()
    monkeypatch.setenv("TTS_STRICT_FIELDS", "on")
    with pytest.raises(Exception) as e:
        inference.input_fn(data, "application/json")
    assert inference.http_status(e.value) == 400 and "bogus" in inference.error_message(e.value)
    inference._settings.cache_clear()
    monkeypatch.delenv("TTS_STRICT_FIELDS")
    assert inference.job_for(inference.input_fn(data, "application/json"), None, check_only=True).ignored == ("bogus",)
    inference._settings.cache_clear()

