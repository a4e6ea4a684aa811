"""The wire protocol as tables: bodies in (JSON, msgpack, OpenAI's and fish-speech's fields), jobs or one-line
errors out. No engine, no network: voices come from a stand-in store."""

from __future__ import annotations

import base64
import json

import msgpack
import numpy as np
import pytest

from ttsengine import InputError, MediaTypeError
from ttsengine.serving.protocol import (
    FishTTSRequest,
    OpenAISpeechRequest,
    fish_job,
    job_from_body,
    openai_job,
    parse_body,
)
from ttsengine.serving.voices import Voice

CODES = np.arange(8, dtype=np.int64).reshape(4, 2)


class Voices:
    """What the protocol asks of a VoiceStore: get(id) and ids()."""

    def get(self, voice_id: str) -> Voice | None:
        return Voice("alice", "hello alice", CODES, 0.1) if voice_id == "alice" else None

    def ids(self) -> list[str]:
        return ["alice"]


def nest(levels: int) -> list:
    """[[...[1]...]]: `levels` lists deep (a body holding it is one level more)."""
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


# ---- bodies -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, ctype, body", [
    (b'{"text": "hi"}', "application/json", {"text": "hi"}),
    (b'{"text": "hi"}', None, {"text": "hi"}),  # no content type: JSON
    (b'{"text": "hi"}', "Application/JSON; charset=utf-8", {"text": "hi"}),
    (b'{"text": "hi"}', "text/json", {"text": "hi"}),
    (msgpack.packb({"text": "hi", "n": 1}), "application/msgpack", {"text": "hi", "n": 1}),
    (msgpack.packb({"a": b"\x00\x01"}), "application/x-msgpack", {"a": b"\x00\x01"}),
    (msgpack.packb({}), "application/vnd.msgpack", {}),
])
def test_parse_body(raw, ctype, body):
    assert parse_body(raw, ctype) == body


def test_parse_body_limits_are_not_too_tight():
    deep = json.dumps({"a": nest(31)})  # 32 levels
    assert parse_body(deep.encode(), None)["a"][0][0][0][0][0]
    body = {"seed": 2**64 - 1, "low": -(2**63), "many": list(range(10_000))}
    assert parse_body(json.dumps(body).encode(), None) == body
    assert parse_body(msgpack.packb(body), "application/msgpack") == body


@pytest.mark.parametrize("raw, ctype, error, words", [
    (b"a,b", "text/csv", MediaTypeError, "unsupported content type 'text/csv'"),
    (b"{bad", "application/json", InputError, "body is not valid JSON"),
    (b"\xff\xfe", "application/json", InputError, "body is not valid JSON"),
    (b"\xc1\xff\x00", "application/msgpack", InputError, "body is not valid msgpack"),
    (b"", "application/json", InputError, "body must be an object"),  # empty: null
    (b"[1, 2]", "application/json", InputError, "body must be an object"),
    (msgpack.packb("text"), "application/msgpack", InputError, "body must be an object"),
    (b"[" * 100_000, "application/json", InputError, r"body is nested too deeply \(the limit is 32 levels\)"),
    (b'{"a":' * 100_000, "application/json", InputError, "body is nested too deeply"),
    (b'{"a":' * 33 + b"1" + b"}" * 33, "application/json", InputError, "body is nested too deeply"),
    (b"\x91" * 100_000, "application/msgpack", InputError, "body is not valid msgpack: StackError"),
    (msgpack.packb({"a": nest(32)}), "application/msgpack",
     InputError, "body is nested too deeply"),
    (b'{"text": "hi", "seed": ' + b"9" * 5000 + b"}", "application/json", InputError,
     r"body has an integer with too many digits \(the limit is 64 bits\)"),
    (b'{"text": "hi", "seed": -' + b"9" * 4000 + b"}", "application/json", InputError, "integer with too many"),
    (json.dumps({"text": "hi", "seed": 2**64}).encode(), "application/json", InputError, "integer with too many"),
])
def test_parse_body_errors(raw, ctype, error, words):
    with pytest.raises(error, match=words) as e:
        parse_body(raw, ctype)
    assert e.value.status == (415 if error is MediaTypeError else 400) and "\n" not in str(e.value)


# ---- OpenAI's speech fields ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body, want", [
    ({"input": "Hi."}, dict(format="mp3", sample_rate=None, speed=1.0, sse=False, refs=0)),
    ({"input": "Hi.", "voice": "default", "response_format": "pcm"}, dict(format="pcm", refs=0)),
    ({"input": "Hi.", "voice": ""}, dict(refs=0)),
    ({"input": "Hi.", "voice": "alice"}, dict(refs=1)),
    ({"input": "Hi.", "stream_format": "sse", "speed": 2.0}, dict(sse=True, speed=2.0)),
    ({"input": "Hi.", "response_format": "opus", "sample_rate": 24000}, dict(format="opus", sample_rate=24000)),
    ({"input": "Hi.", "instructions": "whisper", "model": "tts-1"}, dict(format="mp3")),  # accepted, ignored
])
def test_openai_job(body, want):
    job = openai_job(body, Voices())
    got = dict(format=job.format, sample_rate=job.sample_rate, speed=job.speed, sse=job.sse,
               refs=len(job.request.references))
    assert {k: got[k] for k in want} == want
    assert job.streaming and job.characters == len(body["input"]) and job.request.text == body["input"]


def test_openai_sampling_fields_reach_the_request():
    job = openai_job({"input": "Hi.", "seed": 7, "temperature": 0.5, "top_p": 0.9, "repetition_penalty": 1.2,
                      "max_new_tokens": 30}, None)
    r = job.request
    assert (r.seed, r.temperature, r.top_p, r.repetition_penalty, r.max_new_tokens) == (7, 0.5, 0.9, 1.2, 30)


def test_a_stored_voice_is_its_codes():
    (ref,) = openai_job({"input": "Hi.", "voice": "alice"}, Voices()).request.references
    assert ref.text == "hello alice" and ref.audio is None and ref.codes is CODES


def test_a_validated_request_is_taken_as_it_is():
    """The HTTP route gets the body validated by FastAPI: the job is built from it without a second pass."""
    req = OpenAISpeechRequest.model_validate({"input": "Once.", "response_format": "wav"})
    job = openai_job(req, None)
    assert job.format == "wav" and job.request.text == "Once."
    assert fish_job(FishTTSRequest.model_validate({"text": "Once."}), None).format == "wav"


@pytest.mark.parametrize("body, words", [
    ({"input": "hi", "speed": 9}, "speed: Input should be less than or equal to 4"),
    ({"input": "hi", "speed": 0.1}, "speed: Input should be greater than or equal to 0.25"),
    ({"input": "hi", "response_format": "ogg"}, "response_format: Input should be 'mp3'"),
    ({"input": "hi", "stream_format": "ws"}, "stream_format: Input should be 'audio' or 'sse'"),
    ({"input": "hi", "bogus": 1}, "bogus: Extra inputs are not permitted"),
    ({"input": 5}, "input: Input should be a valid string"),
    ({"input": "hi", "sample_rate": 7000}, "sample_rate: Input should be greater than or equal to 8000"),
    ({"input": "hi", "response_format": "opus", "sample_rate": 22050}, "opus needs a sample_rate of"),
    ({"input": "hi", "voice": "nobody"}, "unknown voice 'nobody'; available: default, alice"),
    ({"input": "hi", "voice": "../x"}, "unknown voice '../x'"),
    ({"input": "hi", "speed": "x", "bogus": 1}, "(and 1 more)"),
])
def test_openai_errors(body, words):
    with pytest.raises(InputError) as e:
        openai_job(body, Voices())
    assert words in str(e.value) and e.value.status == 400


def test_no_voice_store_means_only_the_default_voice():
    with pytest.raises(InputError, match="unknown voice 'alice'; available: default; OpenAI's voice names .* mean "
                                         "default$"):
        openai_job({"input": "hi", "voice": "alice"}, None)


# ---- fish-speech's /v1/tts fields ---------------------------------------------------------------------------
WAV = b"RIFF....WAVEfmt "


@pytest.mark.parametrize("body, want", [
    ({"text": "Hi."}, dict(format="wav", streaming=False, refs=0, chunk_length=200)),
    ({"text": "Hi.", "format": "flac", "streaming": True}, dict(format="flac", streaming=True)),
    ({"text": "Hi.", "chunk_length": 5000}, dict(chunk_length=1000)),  # clamped to what splitting supports
    ({"text": "Hi.", "chunk_length": 10}, dict(chunk_length=50)),
    ({"text": "Hi.", "references": [{"audio": base64.b64encode(WAV).decode(), "text": "t"}]}, dict(refs=1)),
    ({"text": "Hi.", "references": [{"audio": WAV}]}, dict(refs=1)),  # msgpack: raw bytes, text optional
    ({"text": "Hi.", "reference_id": "alice", "references": [{"audio": WAV}]}, dict(refs=1)),  # the id wins
    ({"text": "Hi.", "reference_id": "default"}, dict(refs=0)),  # the model's own voice, as the 400's list says
    ({"text": "Hi.", "reference_id": ""}, dict(refs=0)),
    ({"text": "Hi.", "reference_id": "default", "references": [{"audio": WAV}]}, dict(refs=1)),  # inline ones then
    ({"text": "Hi.", "use_memory_cache": "on", "normalize": False}, dict(format="wav")),  # accepted, unused
    ({"text": "Hi.", "latency": "balanced"}, dict(format="wav")),  # fish-speech's client always sends it
])
def test_fish_job(body, want):
    job = fish_job(body, Voices())
    got = dict(format=job.format, streaming=job.streaming, refs=len(job.request.references),
               chunk_length=job.request.chunk_length)
    assert {k: got[k] for k in want} == want
    assert job.speed == 1.0 and not job.sse and job.characters == len(body["text"])


def test_fish_references_keep_their_bytes_and_order():
    refs = fish_job({"text": "Hi.", "references": [{"audio": WAV, "text": "one"},
                                                   {"audio": base64.b64encode(b"two").decode(), "text": "two"}]},
                    None).request.references
    assert [(r.audio, r.text) for r in refs] == [(WAV, "one"), (b"two", "two")]
    (stored,) = fish_job({"text": "Hi.", "reference_id": "alice"}, Voices()).request.references
    assert stored.codes is CODES and stored.audio is None


@pytest.mark.parametrize("body, words", [
    ({"text": "hi", "format": "wma"}, "format: Input should be 'mp3'"),
    ({"text": "hi", "references": [{"audio": "%%%not-base64", "text": ""}]}, "references.0.audio: not valid base64"),
    ({"text": "hi", "references": [{"text": "no audio"}]}, "references.0.audio: Field required"),
    ({"text": "hi", "reference_id": "nobody"}, "unknown voice 'nobody'"),
    ({"text": "hi", "reference_id": "../etc"}, "invalid voice id"),
    ({"text": "hi", "use_memory_cache": "maybe"}, "use_memory_cache: Input should be 'on' or 'off'"),
    ({"text": "hi", "latency": "fast"}, "latency: Input should be 'normal' or 'balanced'"),
    ({"text": "hi", "sample_rate": 96000}, "sample_rate: Input should be less than or equal to 48000"),
    ({"text": "hi", "input": "both"}, "input: Extra inputs are not permitted"),
])
def test_fish_errors(body, words, tmp_path):
    from ttsengine.serving.voices import VoiceStore

    store = VoiceStore(tmp_path, lambda audio: CODES, "tag", 21.5)  # a real store: it checks ids
    with pytest.raises(InputError) as e:
        fish_job(body, store)
    assert words in str(e.value) and e.value.status == 400


# ---- either schema ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, format, streaming", [
    ({"input": "Hi."}, "mp3", True),  # OpenAI's defaults: mp3, streamed
    ({"text": "Hi."}, "wav", False),  # fish-speech's: wav, whole
    ({"text": "Hi.", "streaming": True, "format": "pcm"}, "pcm", True),
])
def test_job_from_body_tells_the_schemas_apart(body, format, streaming):
    job = job_from_body(body, None)
    assert (job.format, job.streaming) == (format, streaming)


def test_job_from_body_without_a_text_field():
    with pytest.raises(InputError, match="needs `text`.*or `input`"):
        job_from_body({"nothing": 1}, None)


@pytest.mark.parametrize("body", [
    {"input": "Hi.", "voice": "somebody"},
    {"text": "Hi.", "reference_id": "somebody"},
])
def test_check_only_validates_without_the_voices(body):
    """SageMaker's input_fn checks the body before the model (and its voices) exist."""
    job = job_from_body(body, None, check_only=True)
    assert job.request.references == ()
    with pytest.raises(InputError, match="unknown voice 'somebody'"):
        job_from_body(body, None)


def test_check_only_still_refuses_bad_fields():
    with pytest.raises(InputError, match="response_format"):
        job_from_body({"input": "Hi.", "voice": "x", "response_format": "ogg"}, None, check_only=True)


def test_a_body_is_not_changed_by_parsing():
    body = {"input": "Hi.", "voice": "alice"}
    job_from_body(body, None, check_only=True)
    assert body == {"input": "Hi.", "voice": "alice"}


def test_json_and_msgpack_bodies_make_the_same_job():
    body = {"text": "Same.", "seed": 3, "format": "mp3"}
    a = fish_job(parse_body(json.dumps(body).encode(), "application/json"), None)
    b = fish_job(parse_body(msgpack.packb(body), "application/msgpack"), None)
    assert a == b
