"""`python -m ttsengine soak` against a real server (the tiny model): mixed traffic from two client processes for
~25 s ends with no unexpected outcome and no hang, every kind of request occurred, and the server frees every slot
afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import ROOT
from test_http import _metric, start_server, stop, wait_ready


def test_soak_finds_nothing_unexpected(tmp_path):
    proc, url = start_server(tmp_path, TTS_DEFAULT_MAX_NEW_TOKENS="100")
    try:
        wait_ready(url, proc)
        out = tmp_path / "soak"
        run = subprocess.run([sys.executable, "-m", "ttsengine", "soak", url, "--clients", "6", "--processes", "2",
                              "--minutes", "0.4", "--interval", "8", "--max-frames", "30", "--voice-seconds", "3",
                              "--server-pid", str(proc.pid), "--stall", "60", "--out", str(out)],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        report = json.loads((out / "soak.json").read_text())
        counts = report["counts"]
        assert counts["unexpected"] == 0 and counts["hang"] == 0, report["examples"]
        assert counts["ok"] > 0 and counts["cut"] > 0 and counts["rejected"] > 0, counts
        assert report["voice"] == "soak-voice"
        rows = report["per_interval"]
        assert len(rows) >= 3 and all(r["rss_mb"] and r["rss_mb"] > 50 for r in rows)
        assert "report: " in run.stdout and "first_audio_p95_ms" in run.stdout
        # two client processes shared the six clients, each reporting its CPU
        assert report["processes"] == 2 and len(report["client_cpu_pct"]) == 2, report
        assert "load generator: 2 process(es)" in run.stdout
        # the whole soak as one row: every outcome counted once, its first audio percentiles ordered
        whole = report["whole"]
        assert whole["counts"] == counts and whole["first_audio_p50_ms"] <= whole["first_audio_p95_ms"], whole
        assert "\nall | " in run.stdout
        # the clients that hung up freed their slots
        end = time.time() + 15
        while _metric(url, "tts_active_streams") != 0 and time.time() < end:
            time.sleep(0.2)
        assert _metric(url, "tts_active_streams") == 0
    finally:
        stop(proc)
