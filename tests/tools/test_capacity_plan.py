"""`python -m ttsengine plan`: capacity from a recorded bench JSON, instance counts per platform, and a three-hour
simulation whose totals are worked out by hand below."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from ttsengine.errors import TTSError
from ttsengine.tools.plan.capacity import capacity, first_audio_ms, realtime_x
from ttsengine.tools.plan.policy import Policy
from ttsengine.tools.plan.simulate import hours, simulate, weighted_p95
from ttsengine.tools.plan.traffic import from_curve, from_trace

# A small bench of an l4 (preset: 48 slots): 32 streams is the highest level with every stream >= 1.2x real time.
LEVELS = [(16, 3.0, 100.0), (32, 1.5, 200.0), (64, 0.3, 400.0)]


@pytest.fixture
def bench(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({
        "device": "NVIDIA L4", "load_s": 5.0, "warmup_s": 15.0,
        "memory_preset": {"name": "l4", "max_batch": 48, "positions_per_stream": 1024, "memory_utilization": 0.85},
        "levels": [{"concurrency": c, "realtime_x_min": x, "ttfa_p95_ms": ms, "aggregate_fps": 0.0}
                   for c, x, ms in LEVELS]}))
    return path


def _plan(*args: str) -> dict:
    proc = run_cli("ttsengine", "plan", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_instance_counts_from_a_bench(bench, tmp_path):
    plan = _plan("--bench", str(bench), "--peak", "100", "--curve", "0.32,1,0.32", "--price", "l4=2",
                 "--stream-s", "60", "--out", str(tmp_path / "out"))
    cap = plan["capacity"]
    assert (cap["streams_per_instance"], cap["slots"], cap["source"]) == (32, 48, "measured (bench)")
    assert cap["ready_s"] == 180 + 20  # the assumed provisioning + the bench's load_s + warmup_s
    assert plan["instances_at_capacity"] == 4  # ceil(100 / 32)
    by = {p["platform"]: p for p in plan["platforms"]}
    assert by["sagemaker"]["settings"]["TargetValue"] == 21  # round(0.65 x 32)
    assert by["sagemaker"]["peak_instances"] == 5  # ceil(100 / 21)
    assert by["sagemaker"]["cost_per_hour_at_peak"] == 10.0  # 5 x $2
    assert by["runpod"]["settings"]["scalerValue"] == 21 and by["runpod"]["peak_instances"] == 5  # as SageMaker
    assert by["kubernetes"]["peak_instances"] == 4  # 0.65 of the pod's 48 slots = 31.2: ceil(100 / 31.2)
    assert (tmp_path / "out" / "plan.html").read_text().startswith("<html>")
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["gpu"] == "l4"


def test_presets_without_a_measurement():
    plan = _plan("--gpu", "a10g", "--peak", "1000", "--price", "a10g=1")
    assert plan["capacity"]["source"] == "preset" and plan["capacity"]["streams_per_instance"] == 64
    assert plan["instances_at_capacity"] == 16  # ceil(1000 / 64)
    assert all(h["first_audio_p95_ms"] is None for p in plan["platforms"] for h in p["hours"])


def test_curve_between_and_beyond_the_levels(bench):
    curve = capacity(None, bench, None).curve
    assert realtime_x(curve, 48) == pytest.approx(0.9)  # halfway from 1.5 to 0.3
    assert realtime_x(curve, 128) == pytest.approx(0.15)  # the 64-level's throughput over twice the streams
    assert first_audio_ms(curve, 8) == 100 and first_audio_ms(curve, 24) == pytest.approx(150)


def test_a_three_hour_day_by_hand(bench):
    """Streams wanted 32, 100, 32 (one hour each), stream_s 60 (requests a minute = streams), 48 slots, target 20
    per instance, ready 120 s after a decision, scale-out cooldown 60 s, scale-in after 15 minutes low.

    hour 0: desired ceil(32/20) = 2 from the start; 16 streams each: first audio 100 ms; 2 instances.
    hour 1: minute 60 still has 2 ready (96 slots): 4 refused a minute; 48 each runs at 0.9x (below real time:
            96 requests a minute), first audio 300 ms. The decision at its end adds 3, serving from minute 63
            (3660 + 120 s). Minutes 60-62: 3 x 4 = 12 refused, 3 x 96 = 288 below real time. Minutes 63-119:
            100 streams on 5, 20 each: 125 ms. p95: 5700 of 5988 requests at 125 ms is 95.2%, so 125 ms.
            Billed: minute 60 two, minutes 61-119 five: (2 + 59 x 5) / 60 = 4.95.
    hour 2: desired 2 from minute 120; after 15 such minutes (the decision ending minute 134) scale-in to 2:
            15 minutes at 5, 45 at 2: (75 + 90) / 60 = 2.75. 6.4 and 16 streams each: 100 ms.
    day: 2 + 4.95 + 2.75 = 9.7 instance-hours; served 32 + (288 + 5700) / 60 + 32 = 163.8 stream-hours.
    With a 10 s first-burst penalty, minute 63's 100 requests go 3/5 to new instances (60 at 10,125 ms): then
    5640 + 288 = 5928 of 5988 (99%) are at or below 300 ms, and 5640 (94.2%) at or below 125: p95 300 ms."""
    cap = capacity(None, bench, None)
    traffic = from_curve("0.32,1,0.32", 100, burst=1.0)
    policy = Policy("test", 20, {}, out_cooldown_s=60, in_cooldown_s=600, in_window_s=900)
    hs = hours(simulate(traffic.minutes, cap, policy, slots=48, ready_s=120, stream_s=60))
    assert [h.instances_mean for h in hs] == pytest.approx([2, 4.95, 2.75])
    assert [h.instances_max for h in hs] == [2, 5, 5]
    assert [h.refused for h in hs] == pytest.approx([0, 12, 0])
    assert [h.below_realtime for h in hs] == pytest.approx([0, 288, 0])
    assert [h.first_audio_p95_ms for h in hs] == pytest.approx([100, 125, 100])
    assert sum(h.instance_hours for h in hs) == pytest.approx(9.7)
    assert sum(h.stream_hours for h in hs) == pytest.approx(163.8)
    burst = hours(simulate(traffic.minutes, cap, policy, slots=48, ready_s=120, stream_s=60, first_burst_s=10))
    assert burst[1].first_audio_p95_ms == pytest.approx(300)


def test_weighted_p95():
    assert weighted_p95([(1.0, 95), (9.0, 5)]) == 1.0
    assert weighted_p95([(1.0, 94), (9.0, 6)]) == 9.0
    assert weighted_p95([]) is None


def test_trace(tmp_path):
    trace = tmp_path / "day.csv"
    trace.write_text("time,concurrent_streams\n0,10\n30,40\n00:02,20\n00:03:30,5\n")
    t = from_trace(trace)
    assert t.minutes == (40, 40, 20, 5)  # minute 1 keeps minute 0's last sample; each minute its highest
    assert from_trace(trace, peak=80).minutes == (80, 80, 40, 10)


@pytest.mark.parametrize("args, words", [
    (("--bench", "/nonexistent/bench.json", "--peak", "10"), "No such file"),
    (("--gpu", "h200", "--peak", "10", "--curve", "0.5,oops"), "--curve"),
    (("--gpu", "h200", "--peak", "10", "--curve", "0.5,1.5"), "in [0, 1]"),
    (("--gpu", "nosuchgpu", "--peak", "10"), "--gpu='nosuchgpu'"),
    (("--gpu", "h200"), "--peak"),
    (("--gpu", "h200", "--peak", "10", "--price", "h200"), "--price"),
    (("--gpu", "h200", "--peak", "10", "--burst", "0.5"), "--burst"),
])
def test_bad_input_is_one_line(args, words, tmp_path):
    proc = run_cli("ttsengine", "plan", *args, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("ttsengine plan: ") and words in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TTSError, match="not JSON"):
        capacity(None, bad, None)
    bad.write_text(json.dumps({"levels": []}))
    with pytest.raises(TTSError, match="no levels"):
        capacity(None, bad, None)
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"memory_preset": {"name": "l4"},
                                "levels": [{"concurrency": 8, "realtime_x_min": 1.1, "ttfa_p95_ms": 50}]}))
    with pytest.raises(TTSError, match="no measured level"):
        capacity(None, slow, None)
    trace = tmp_path / "t.csv"
    trace.write_text("time,streams\n0,10\nnoon,x\n")
    with pytest.raises(TTSError, match="line 3"):
        from_trace(trace)
