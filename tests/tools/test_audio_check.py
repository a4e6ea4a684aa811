"""bench --check-audio (tools/audio_check.py): streams keep their codes, the codec decodes them whole, and delivered
audio is compared with that; the real engine on CPU, the tiny golden model."""
from __future__ import annotations

import numpy as np
import pytest

from ttsengine import SynthesisRequest
from ttsengine.tools.audio_check import CAP_DB, MIN_SNR_DB, compare, sampled, snr_db


def test_snr_by_window_and_its_caps():
    x = np.where(np.arange(20_000) % 2 == 0, 1.0, -1.0).astype(np.float32)  # power 1 in every window
    assert snr_db(x, x) == CAP_DB
    assert snr_db(x, np.zeros_like(x)) == -CAP_DB
    assert abs(snr_db(x + 0.1 * x, x) - 20.0) < 1e-4  # noise a tenth of the signal: 20 dB
    assert abs(snr_db(np.zeros_like(x), x)) < 1e-9  # silence against a signal: 0 dB
    # one window of another signal in a long stream: its window fails it (a whole-stream SNR would be ~13 dB)
    bad = x.copy()
    bad[8192:12288] = -bad[8192:12288]
    assert snr_db(bad, x) < 0
    # a quiet passage: its rounding is measured against a tenth of the stream's power, not against ~0
    quiet = x.copy()
    quiet[:4096] *= 1e-4
    assert snr_db(quiet * (1 + 1e-3), quiet) > 50
    short = compare(x[:900], x)
    assert short.snr_db == CAP_DB and short.samples == 900 and short.expected == 20_000 and not short.ok


def test_sampled_spreads_over_the_level():
    assert sampled(64, 4) == [0, 21, 42, 63]
    assert sampled(3, 4) == [0, 1, 2] and sampled(5, 1) == [0] and sampled(5, 0) == [] and sampled(0, 3) == []
    assert sampled(2, 2) == [0, 1]


def _plan(engine, request: SynthesisRequest):
    plan = engine.planner.plan(request)
    plan.keep_codes = True
    return plan


def test_streams_deliver_their_own_codes_audio_and_another_streams_fails(engine):
    # two streams at once, one of several text chunks (each chunk's codes decoded whole, joined): each stream's audio
    # is the whole decode of its own codes, to fp32 rounding; set against the other stream's codes it fails
    long_text = ("One sentence here, said at some length. Another sentence there, also long enough. "
                 "And a third one to end the request with.")
    plans = [_plan(engine, SynthesisRequest(text=long_text, seed=5, max_new_tokens=12, chunk_length=50)),
             _plan(engine, SynthesisRequest(text="A different voice line.", seed=9, max_new_tokens=14))]
    streams = [engine.submit(p) for p in plans]
    results = [s.result() for s in streams]
    assert len(plans[0].codes) == len(plans[0].texts) >= 2 and len(plans[1].codes) == 1
    for plan, result in zip(plans, results):
        assert sum(c.shape[1] for c in plan.codes) == result.frames
        assert all(c.shape[0] == engine.ckpt.config.num_codebooks and c.dtype == np.int64 for c in plan.codes)
        own = compare(result.audio, engine.vocoder.whole(plan.codes))
        assert own.ok and own.snr_db > 60, own
    swapped = compare(results[0].audio, engine.vocoder.whole(plans[1].codes))
    assert not swapped.ok and swapped.snr_db < MIN_SNR_DB, swapped
    # the same length but another stream's audio: the SNR alone fails it
    a, b = results[0].audio, results[1].audio
    n = min(len(a), len(b))
    assert compare(a[:n], b[:n]).snr_db < MIN_SNR_DB


def test_plans_keep_no_codes_unless_asked(engine):
    stream = engine.submit(SynthesisRequest(text="Nothing kept.", seed=1, max_new_tokens=6))
    stream.result()
    assert stream.plan.keep_codes is False and stream.plan.codes == []


@pytest.mark.parametrize("bad", ["-1"])
def test_bench_rejects_a_negative_check(bad):
    from conftest import MODEL_DIR, run_cli

    proc = run_cli("ttsengine", "bench", "--model", str(MODEL_DIR), "--check-audio", bad)
    assert proc.returncode != 0 and "--check-audio -1" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_fails_loudly_when_a_stream_is_not_its_codes(tmp_path, monkeypatch, capsys):
    # the failure path: a check below the bound makes the bench say so and exit 1, after writing its report (here
    # the comparison is made to fail: streams of a correct engine pass, test_streams_deliver_...)
    import json

    from conftest import MODEL_DIR

    from ttsengine.tools import bench
    from ttsengine.tools.audio_check import AudioCheck

    monkeypatch.setattr(bench, "compare", lambda got, want: AudioCheck(-3.0, len(got), len(got)))
    code = bench.main(["--model", str(MODEL_DIR), "--concurrency", "2", "--frames", "6", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "audio check FAILED at 2 streams: 2 of 2 checked streams" in out and "-3.0 dB" in out
    level = json.loads((tmp_path / "bench.json").read_text())["levels"][0]
    assert (level["audio_checked"], level["audio_failures"], level["audio_wrong_length"]) == (2, 2, 0)
