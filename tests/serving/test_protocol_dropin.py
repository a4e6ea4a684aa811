"""The drop-in parts of the wire protocol as tables: OpenAI's voice names and configured aliases, Kokoro-FastAPI's
fields, the fish-audio SDK's fields, strict vs tolerant reading of unknown fields, and the volume a job carries
to delivery. No engine, no network: voices come from a stand-in store."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ttsengine import InputError
from ttsengine.serving.delivery import scaled
from ttsengine.serving.protocol import (
    OPENAI_VOICES,
    FishTTSRequest,
    OpenAISpeechRequest,
    fish_job,
    job_from_body,
    openai_job,
    unknown_fields,
    validate,
)
from ttsengine.serving.voices import Voice

ALICE, ALLOY = np.full((4, 2), 1, np.int64), np.full((4, 3), 2, np.int64)


class Voices:
    """Stored voices: alice, and one literally named alloy (it wins over OpenAI's name)."""

    stored = {"alice": ALICE, "alloy": ALLOY}

    def get(self, voice_id: str) -> Voice | None:
        codes = self.stored.get(voice_id)
        return None if codes is None else Voice(voice_id, f"text of {voice_id}", codes, 0.1)

    def ids(self) -> list[str]:
        return sorted(self.stored)


class NoAlloy(Voices):
    stored = {"alice": ALICE}


def codes_of(job) -> list[np.ndarray]:
    return [r.codes for r in job.request.references]


def test_openai_lists_its_voices():
    assert {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse"} \
        <= set(OPENAI_VOICES)


@pytest.mark.parametrize("voice", OPENAI_VOICES)
def test_every_openai_voice_means_default_without_aliases(voice):
    assert codes_of(openai_job({"input": "hi", "voice": voice}, NoAlloy())) == []
    assert codes_of(openai_job({"input": "hi", "voice": voice.upper()}, None)) == []  # any case, even with no store


@pytest.mark.parametrize("voice", ["af_bella", "AM_ADAM", "bf_emma", "jf_alpha", "zm_yunxi", "af_bella+af_sky",
                                   "af_bella(2)+af_sky(1)", "af_bella(0.5)+bm_george(1.5)"])
def test_kokoro_voice_names_mean_default(voice):  # Kokoro-FastAPI's clients send them (issue 47)
    assert codes_of(openai_job({"input": "hi", "voice": voice}, NoAlloy())) == []


@pytest.mark.parametrize("voice", ["af_", "xf_bella", "af_bella+", "af_bella(2", "af-bella", "af_bella+nobody"])
def test_names_only_like_kokoros_are_unknown(voice):
    with pytest.raises(InputError, match=f"unknown voice {re.escape(repr(voice))}; available: default, alice; "
                                         "OpenAI's voice names .* and Kokoro's .* mean default"):
        openai_job({"input": "hi", "voice": voice}, NoAlloy())


def test_a_stored_voice_named_like_kokoros_is_that_voice():
    class Bella(Voices):
        stored = {"af_bella": ALICE}

    (got,) = codes_of(openai_job({"input": "hi", "voice": "af_bella"}, Bella()))
    assert np.array_equal(got, ALICE)


@pytest.mark.parametrize("voice, aliases, expected", [
    ("alloy", None, ALLOY),  # a stored voice named like OpenAI's is that voice
    ("alloy", {"alloy": "alice"}, ALICE),  # a configured alias wins over the stored voice
    ("Nova", {"nova": "alice"}, ALICE),  # alias names in any case
    ({"id": "nova"}, {"nova": "alice"}, ALICE),  # OpenAI's custom-voice object
    ({"id": "alice"}, None, ALICE),
    ("narrator", {"narrator": "default"}, None),
    ("alice", {"alice": "default"}, None),  # an alias may shadow a stored voice
    ("default", {"nova": "alice"}, None),
])
def test_aliases(voice, aliases, expected):
    got = codes_of(openai_job({"input": "hi", "voice": voice}, Voices(), aliases=aliases))
    assert (got == []) if expected is None else (len(got) == 1 and np.array_equal(got[0], expected))


@pytest.mark.parametrize("voice, aliases, words", [
    ("nobody", None, "unknown voice 'nobody'; available: default, alice, alloy"),
    ("nova", {"nova": "bob"}, "'nova' stands for voice 'bob' (TTS_VOICE_ALIASES), which is not stored; available"),
    ({"id": "nobody"}, None, "unknown voice 'nobody'"),
    ({"name": "x"}, None, "voice"),
])
def test_bad_voices(voice, aliases, words):
    with pytest.raises(InputError) as e:
        openai_job({"input": "hi", "voice": voice}, Voices(), aliases=aliases)
    assert words in str(e.value)


def test_kokoro_fields():
    job = openai_job({"input": "hi", "stream": False, "volume_multiplier": 2.5, "return_download_link": True,
                      "lang_code": "a", "normalization_options": {"normalize": False, "unit_normalization": True}},
                     None)
    assert (job.streaming, job.volume, job.download_link) == (False, 2.5, True)
    plain = openai_job({"input": "hi"}, None)
    assert (plain.streaming, plain.volume, plain.download_link, plain.sse) == (True, 1.0, False, False)


@pytest.mark.parametrize("body, words", [
    ({"volume_multiplier": -0.5}, "volume_multiplier: Input should be greater than or equal to 0"),
    ({"volume_multiplier": 11}, "volume_multiplier: Input should be less than or equal to 10"),
    ({"stream": False, "stream_format": "sse"}, "stream: false asks for one whole file"),
    ({"return_download_link": True, "stream_format": "sse"}, "return_download_link keeps an audio file"),
    ({"lang_code": "x" * 40}, "lang_code"),
])
def test_bad_kokoro_fields(body, words):
    with pytest.raises(InputError) as e:
        openai_job({"input": "hi", **body}, None)
    assert words in str(e.value)


# what fish-audio's Python SDK sends (its TTSRequest, dumped whole): every field, known or not to fish-speech
FISH_SDK = {"text": "hi", "chunk_length": 200, "format": "mp3", "sample_rate": None, "mp3_bitrate": 128,
            "opus_bitrate": 32, "references": [], "reference_id": None, "normalize": True, "latency": "balanced",
            "prosody": {"speed": 2.0, "volume": -6.0}, "top_p": 0.7, "temperature": 0.7}


def test_the_fish_audio_sdk_body_is_accepted_even_strictly():
    job = fish_job(FISH_SDK, None, strict=True)
    assert job.speed == 2.0 and abs(job.volume - 10 ** (-6 / 20)) < 1e-12  # prosody is real: tempo and dB
    assert fish_job({"text": "hi"}, None).volume == 1.0


@pytest.mark.parametrize("model, body", [
    (OpenAISpeechRequest, {"input": "hi", "bogus": 1, "download_format": "wav"}),
    (FishTTSRequest, {"text": "hi", "emotion": "happy"}),
])
def test_strict_and_tolerant_reading(model, body):
    with pytest.raises(InputError, match="Extra inputs are not permitted"):
        validate(model, body, strict=True)
    validate(model, body, strict=False)  # no error: dropped
    assert unknown_fields(model, body) == tuple(k for k in body if k not in ("input", "text"))


def test_tolerant_reading_still_checks_known_fields():
    with pytest.raises(InputError, match="speed"):
        openai_job({"input": "hi", "bogus": 1, "speed": 9}, None, strict=False)


def test_other_adapters_stay_strict_by_default():
    with pytest.raises(InputError, match="bogus"):
        job_from_body({"input": "hi", "bogus": 1}, None)
    assert job_from_body({"input": "hi", "voice": "alloy", "stream": False}, None).streaming is False


def test_volume_scales_and_clips():
    x = np.array([-0.5, -0.1, 0.0, 0.2, 0.6], np.float32)
    assert scaled(x, 1.0) is x
    np.testing.assert_allclose(scaled(x, 0.5), x * 0.5)
    np.testing.assert_allclose(scaled(x, 2.0), [-1.0, -0.2, 0.0, 0.4, 1.0])
    assert scaled(x, 0.0).max() == 0 and scaled(x, 2.0).dtype == np.float32
