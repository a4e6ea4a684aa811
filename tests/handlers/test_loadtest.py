"""`python -m ttsengine loadtest`'s options against a real server (the tiny model on CPU, chunk tracing on):
open-loop arrivals, several client processes, every format in one run, stalls and the server's breakdown; and
the pieces it is built from (schedules, playback stalls, histogram quantiles)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from conftest import ROOT
from test_http import served

from ttsengine.tools.load.playback import stalls
from ttsengine.tools.load.schedule import arrival_offsets, poisson_rate, shares
from ttsengine.tools.load.scrape import quantile


def test_closed_loop_shares_split_clients_and_requests_without_overlap():
    parts = shares(clients=5, requests=11, processes=2, rate=None)
    assert [(p.clients, p.requests) for p in parts] == [(3, 6), (2, 5)]
    assert sorted(i for p in parts for i in p.indices) == list(range(11))
    assert all(p.offsets is None for p in parts)
    assert len(shares(clients=1, requests=2, processes=4, rate=None)) == 1  # no idle processes


def test_open_loop_shares_deal_out_seeded_poisson_arrivals():
    offsets = arrival_offsets(2000, rate=50.0)
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets == arrival_offsets(2000, 50.0)
    assert 2000 / offsets[-1] == pytest.approx(50.0, rel=0.1)
    parts = shares(clients=0, requests=7, processes=3, rate=10.0)
    assert [p.indices for p in parts] == [(0, 3, 6), (1, 4), (2, 5)]
    assert parts[1].offsets == tuple(arrival_offsets(7, 10.0)[1::3])
    assert poisson_rate("closed") is None and poisson_rate("poisson:2.5") == 2.5
    for bad in ("poisson:0", "poisson:x", "uniform:3"):
        with pytest.raises(ValueError):
            poisson_rate(bad)


def test_stalls_count_the_audio_running_dry_after_playback_started():
    assert stalls([(1.0, 0.5), (1.4, 0.5), (1.9, 0.5)]) == (0, 0.0)  # always ahead: a late first piece is no stall
    count, waited = stalls([(0.0, 0.5), (0.8, 0.5), (1.3, 0.1), (2.0, 0.2)])
    assert count == 2 and waited == pytest.approx(0.3 + 0.6)
    assert stalls([(0.0, 0.1), (0.1005, 0.1)])[0] == 0  # under a millisecond: seconds only


def test_quantile_interpolates_within_buckets_like_prometheus():
    buckets = [(0.1, 0.0), (0.2, 10.0), (0.5, 20.0), (math.inf, 20.0)]
    assert quantile(buckets, 0.5) == pytest.approx(0.2)
    assert quantile(buckets, 0.25) == pytest.approx(0.15)
    assert math.isnan(quantile([(1.0, 0.0), (math.inf, 0.0)], 0.5))


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    with served(tmp_path_factory.mktemp("lt"), TTS_TRACE_CHUNKS="on") as url:
        yield url


def test_open_loop_over_two_processes_in_every_format_with_the_servers_breakdown(traced, tmp_path):
    out = tmp_path / "lt"
    proc = subprocess.run([sys.executable, "-m", "ttsengine", "loadtest", traced, "--concurrency", "2",
                           "--arrivals", "poisson:20", "--processes", "2", "--format", "pcm,wav,mp3,opus,flac",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads((out / "loadtest.json").read_text())
    levels = report["levels"]
    assert [lv["format"] for lv in levels] == ["pcm", "wav", "mp3", "opus", "flac"]
    for lv in levels:
        assert lv["errors"] == 0 and lv["requests"] == 4 and lv["arrivals"] == "poisson:20", lv
        assert lv["processes"] == 2 and len(lv["client_cpu_pct"]) == 2 and lv["send_lag_p95_ms"] is not None
        assert lv["audio_s_per_s"] > 0 and lv["first_audio_p50_ms"] > 0 and lv["stall_s"] >= 0
        sv = lv["server"]
        assert sv["first_byte_sent"]["count"] == 4 and sv["queue_wait"]["count"] == 4
        assert sv["engine_first_audio"]["count"] == 4 and sv["engine_loop_s"] > 0
        assert sv["chunk_encode"]["count"] == sv["chunk_total"]["count"]
        if lv["format"] != "flac":  # FLAC's streaming encoder hands its bytes on at the end: no traced piece
            assert sv["chunk_total"]["count"] >= 4
        assert sv["thread_cpu_s"]["tts-engine"] > 0
    assert "chunk_total" in proc.stdout and "client_cpu_pct" in proc.stdout


def test_untraced_server_exports_no_trace_metrics_and_loadtest_still_breaks_down(tmp_path):
    with served(tmp_path) as url:
        run = subprocess.run([sys.executable, "-m", "ttsengine", "loadtest", url, "--concurrency", "1",
                              "--out", str(tmp_path / "lt")], capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        sv = json.loads((tmp_path / "lt" / "loadtest.json").read_text())["levels"][0]["server"]
        assert sv["first_byte_sent"]["count"] == 2 and "chunk_total" not in sv and "thread_cpu_s" not in sv
        import httpx

        assert "tts_trace" not in httpx.get(url + "/metrics").text


def test_raw_and_httpx_clients_receive_the_same_audio(traced, tmp_path):
    """The raw client (the default) and httpx, closed loop, same seeds: the same audio seconds per request, and
    every request's bytes timed (first audio, stalls) by both."""
    got = {}
    for client in ("raw", "httpx"):
        out = tmp_path / client
        proc = subprocess.run([sys.executable, "-m", "ttsengine", "loadtest", traced, "--concurrency", "2",
                               "--requests", "3", "--max-new-tokens", "8", "--client", client, "--out", str(out)],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        report = json.loads((out / "loadtest.json").read_text())
        lv = report["levels"][0]
        assert report["client"] == client and lv["errors"] == 0 and lv["requests"] == 3, lv
        assert lv["first_audio_p50_ms"] > 0
        got[client] = lv["audio_s_per_s"] * lv["wall_s"]  # every request's audio seconds, summed
    assert got["raw"] == pytest.approx(got["httpx"], rel=1e-9) and got["raw"] > 0
    run = subprocess.run([sys.executable, "-m", "ttsengine", "loadtest", traced, "--client", "curl"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2 and "invalid choice: 'curl'" in run.stderr
