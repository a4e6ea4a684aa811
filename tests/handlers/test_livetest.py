"""`python -m ttsengine livetest` against a real server (the tiny model on CPU): voice-agent sessions over Fish's live
WebSocket fed by a simulated LLM, two turns each, over two client processes, the server's live histograms read from
/metrics; a barge-in run (cancel after the first audio); bad options; and how the simulated LLM cuts text into
tokens."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT
from test_http import FRAMES, served

from ttsengine.tools.load.live import TEXT, tokens


def livetest(url: str, out, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ttsengine", "livetest", url, "--out", str(out),
                           "--max-new-tokens", str(FRAMES), *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


def test_tokens_are_word_pieces_that_join_back_into_the_text():
    pieces = tokens("Hi there. It's 3.5 km, ok?")
    assert pieces == ["Hi", " there", ".", " It's", " 3", ".", "5", " km", ",", " ok", "?"]
    assert "".join(pieces) == "Hi there. It's 3.5 km, ok?"
    assert "".join(tokens(TEXT)) == TEXT and len(tokens(TEXT)) > 50


def test_sessions_fed_by_a_simulated_llm_speak_every_sentence(tmp_path):
    with served(tmp_path, TTS_MAX_BATCH="4") as url:
        run = livetest(url, tmp_path / "lt", "--sessions", "2", "--turns", "2", "--tokens-per-s", "400",
                       "--processes", "2", "--text", "One small test. And a second sentence here.")
        assert run.returncode == 0, run.stderr + run.stdout
        report = json.loads((tmp_path / "lt" / "livetest.json").read_text())
        s = report["summary"]
        assert s["turns"] == 4 and s["errors"] == 0, s
        assert report["processes"] == 2 and len(s["client_cpu_pct"]) == 2  # a session in each client process
        for r in report["records"]:
            assert r["reason"] == "stop" and r["first_audio_ms"] > 0 and r["x_real_time"] > 0
            assert r["connect_ms"] > 0 and 0 < r["complete_ms"] < 1000 * r["audio_s"] + 60_000
            # two sentences -> two segments of FRAMES frames each (the tiny model may end one early: at least one)
            assert FRAMES * 2048 / 44100 * 0.9 <= r["audio_s"] <= 2 * FRAMES * 2048 / 44100 * 1.05
        live = s["server"]["live_first_audio"]
        assert 4 <= live["count"] <= 8 and live["mean_ms"] > 0  # each turn's segments, as the server timed them
        assert "first_audio_p95_ms" in run.stdout and "server live_first_audio" in run.stdout
        assert run.stdout.count("slow turn: first audio") == 3 and "s into the run, connect" in run.stdout

        # the default text's five sentences: cancelled in the first segment's audio, four more never made
        barge = livetest(url, tmp_path / "bi", "--sessions", "1", "--barge-in", "0", "--tokens-per-s", "400")
        assert barge.returncode == 0, barge.stderr + barge.stdout
        report = json.loads((tmp_path / "bi" / "livetest.json").read_text())
        (r,) = report["records"]
        assert r["reason"] == "cancelled" and r["cancel_to_finish_ms"] >= r["cancel_to_last_audio_ms"] >= 0, r
        assert report["summary"]["server"]["live_barge_in"]["count"] == 1


def test_bad_options_are_one_line_errors(tmp_path):
    for args in (["--sessions", "0"], ["--tokens-per-s", "0"], ["--processes", "0"], ["--text", "   "]):
        run = livetest("http://127.0.0.1:9", tmp_path, *args)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert run.stderr.strip().splitlines()[-1].startswith("python -m ttsengine livetest: error:"), run.stderr
