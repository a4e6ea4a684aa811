"""The HTTP server's drop-in settings (config.py's SERVER_VARS): voice aliases, the unknown-field policy, CORS
origins, download links. Each bad value is one line naming the variable; `python -m handlers http` ends with it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import MODEL_DIR, ROOT

from ttsengine import ConfigError, ServerConfig
from ttsengine.config import VOICE_ID
from ttsengine.serving.voices import ID_PATTERN


def test_defaults():
    cfg = ServerConfig.from_env({})
    assert cfg.voice_aliases == () and cfg.cors_origins == ()  # OpenAI's names fall back to default in protocol
    assert cfg.strict_fields is False and cfg.download_ttl == 3600 and cfg.download_max_bytes == 512 << 20


def test_values():
    cfg = ServerConfig.from_env({"TTS_VOICE_ALIASES": " Alloy=my voice, nova=default,narrator=bob_2 ",
                                 "TTS_STRICT_FIELDS": "on", "TTS_CORS_ORIGINS": "http://localhost:3000, app://x",
                                 "TTS_DOWNLOAD_TTL": "60", "TTS_DOWNLOAD_MAX_BYTES": "0"})
    assert cfg.voice_aliases == (("alloy", "my voice"), ("nova", "default"), ("narrator", "bob_2"))
    assert cfg.strict_fields is True and cfg.cors_origins == ("http://localhost:3000", "app://x")
    assert (cfg.download_ttl, cfg.download_max_bytes) == (60, 0)
    assert ServerConfig.from_env({"TTS_CORS_ORIGINS": "*"}).cors_origins == ("*",)


@pytest.mark.parametrize("env, words", [
    ({"TTS_VOICE_ALIASES": "alloy"}, "TTS_VOICE_ALIASES: 'alloy' names no voice (write NAME=VOICE"),
    ({"TTS_VOICE_ALIASES": "alloy="}, "'alloy' names no voice"),
    ({"TTS_VOICE_ALIASES": "alloy=../etc"}, "'../etc' is not a voice name"),
    ({"TTS_VOICE_ALIASES": "=alice"}, "'' is not a voice name"),
    ({"TTS_VOICE_ALIASES": "nova=a,NOVA=b"}, "'nova' is given twice"),
    ({"TTS_VOICE_ALIASES": "default=alice"}, "'default' is the model's own voice"),
    ({"TTS_STRICT_FIELDS": "sometimes"}, "TTS_STRICT_FIELDS='sometimes': expected auto, on or off"),
    ({"TTS_CORS_ORIGINS": "https://app.example/"}, "'https://app.example/': a browser's Origin has no path"),
    ({"TTS_CORS_ORIGINS": "localhost:3000"}, "'localhost:3000': expected scheme://host[:port]"),
    ({"TTS_CORS_ORIGINS": "*, http://a.b"}, "'*' allows every origin: give it alone"),
    ({"TTS_DOWNLOAD_TTL": "0"}, "TTS_DOWNLOAD_TTL: must be >= 1"),
    ({"TTS_DOWNLOAD_MAX_BYTES": "-1"}, "TTS_DOWNLOAD_MAX_BYTES: must be >= 0"),
])
def test_bad_values_are_one_line(env, words):
    with pytest.raises(ConfigError) as e:
        ServerConfig.from_env(env)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_alias_names_follow_the_voice_id_rule():
    assert VOICE_ID.pattern == ID_PATTERN.pattern


def test_the_server_refuses_to_start_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "handlers", "http"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TTS_MODEL_DIR": str(MODEL_DIR), "TTS_CORS_ORIGINS": "https://a.b/"},
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("handlers http: TTS_CORS_ORIGINS: 'https://a.b/': a browser's Origin has no path "
                                   "(drop the trailing /)")
