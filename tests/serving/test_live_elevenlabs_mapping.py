"""ElevenLabs' messages and settings, mapped without a network (serving/live/elevenlabs.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ttsengine.serving.live.elevenlabs import Output, ProtocolError, parse_message, parse_output, parse_settings, ulaw


def test_output_formats_map_to_ours_or_are_refused():
    assert parse_output("pcm_16000") == Output("pcm", 16000)
    assert parse_output("mp3_44100_128") == Output("mp3", 44100)
    assert parse_output("wav_22050") == Output("wav", 22050)
    assert parse_output("ulaw_8000") == Output("pcm", 8000, ulaw=True)
    for bad in ("opus_48000_64", "alaw_8000", "pcm", "pcm_x", "ulaw_16000", "mp3_44100"):
        with pytest.raises(ProtocolError):
            parse_output(bad)
    assert parse_settings({}, 60.0).output == Output("mp3", 44100)  # ElevenLabs' default


def test_mu_law_matches_g711():
    pcm = np.array([0, 1, -1, 100, -100, 32767, -32768, 8000, -8000], dtype="<i2").tobytes()
    assert list(ulaw(pcm)) == [255, 255, 126, 242, 114, 128, 0, 160, 32]  # audioop.lin2ulaw


def test_messages():
    m = parse_message('{"text": "Hi ", "context_id": "a", "flush": true}')
    assert (m.text, m.context_id, m.flush, m.close_context) == ("Hi ", "a", True, False)
    assert parse_message('{"close_socket": true, "try_trigger_generation": true}').close_socket
    with pytest.raises(ProtocolError) as e:
        parse_message('{"flush": "yes"}')
    assert e.value.code == 1007
