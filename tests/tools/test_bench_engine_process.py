"""bench --engine-process (issue 49): the sweep over the engines in this process (off, the old figures' layout) and
over one engine process per device behind bench's front (on, as the server runs them); the real CLI on two CPU
engines with the tiny golden checkpoint."""

from __future__ import annotations

import json
import time

import pytest
from conftest import MODEL_DIR, run_cli

from ttsengine.config import from_env
from ttsengine.errors import InputError
from ttsengine.synthesis.request import SynthesisRequest
from ttsengine.tools.bench_fleet import IN_PROCESS_ONLY, BenchFleet


def _bench(tmp_path, *args: str):
    return run_cli("ttsengine", "bench", "--model", str(MODEL_DIR), "--devices", "cpu,cpu", "--out", str(tmp_path),
                   *args)


@pytest.mark.parametrize("mode", ["off", "on"])
def test_bench_reports_each_engine_in_either_layout(tmp_path, mode):
    # two engines, a level of 2 streams (one slot each): both engines' rows, their streams summing to the level; the
    # stored voice is encoded by the fleet's codec (in the engine process with on) and in every prompt
    proc = _bench(tmp_path, "--engine-process", mode, "--concurrency", "2", "--frames", "8", "--voice", "1")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["engine_process"] == mode and report["engines"] == ["cpu", "cpu"] and report["device"] == "cpu"
    assert report["submit"] == {"on": "event loop", "off": "one after another"}[mode]
    assert report["voice_prompt_tokens"] == 22  # ceil(1 s * 44100 / 2048)
    (level,) = report["levels"]
    rows = level["per_engine"]
    assert [r["device"] for r in rows] == ["cpu", "cpu"]
    assert sum(r["streams"] for r in rows) == level["concurrency"] == 2
    assert all(r["frames_per_second"] > 0 for r in rows) and level["rejected"] == 0
    assert level["ttfa_p50_ms"] > 0 and 0 <= level["stall_p95_ms"] <= level["stall_max_ms"]
    assert level["prefill_tokens_per_request"] > 22 and level["time_step_s"] > 0
    assert report["memory_preset"]["name"] == "cpu" and report["kv_positions"] > 0  # from the engines' stats
    if mode == "off":  # --check-audio's default, 4 a level; the settings of an engine in this process
        assert level["audio_checked"] == 2 and level["audio_failures"] == 0 and level["vram_peak_gb"] == 0
        assert report["dtype"] == "torch.float32" and report["prefix_cache"] is True
        assert report["in_process_only"] is None
    else:  # no check (its default there is 0), no torch peak, and the fields only an in-process engine gives: None
        assert level["audio_checked"] == 0 and level["vram_peak_gb"] is None
        assert all(report[f] is None for f in IN_PROCESS_ONLY) and "engine processes" in report["in_process_only"]
    assert "per engine: cpu 1 streams" in proc.stdout


@pytest.mark.parametrize("flag, words", [
    (("--check-audio", "2"), "--check-audio 2 needs the engines in this process"),
    (("--profile", "2"), "--profile needs the engines in this process"),
])
def test_bench_says_in_one_line_what_engine_processes_cannot_do(tmp_path, flag, words):
    proc = _bench(tmp_path, "--engine-process", "on", *flag)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ttsengine bench: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert words in errors[0] and "--engine-process off" in errors[0]
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("features", ["auto", "-direct_admit"])
def test_submit_all_hands_requests_over_at_their_times_and_counts_refusals(features):
    # two CPU engine processes, one slot and one queue place each: 6 requests at once, 4 taken and 2 refused, every
    # taken one generating all its frames, past its stop token (ignore_stop reaches the engine either way); then two
    # arrivals 0.3 s apart sent no earlier than their times. auto: the event loop admits them (direct_admit);
    # -direct_admit: one after another from this thread, as before

    config = from_env({}, model_dir=str(MODEL_DIR), devices="cpu,cpu", max_batch=1, max_queue=1, features=features)
    fleet = BenchFleet.start(config, None, engine_process=True)
    inner, flight = fleet.fleet, {"now": 0, "most": 0}

    def counted(now: int) -> None:
        flight["now"] += now
        flight["most"] = max(flight["most"], flight["now"])

    async def admit(*args, **kw):  # how many hand-overs are awaiting their answers at once
        counted(1)
        try:
            return await inner.admit(*args, **kw)
        finally:
            counted(-1)

    def submit(*args, **kw):
        counted(1)
        try:
            return inner.submit(*args, **kw)
        finally:
            counted(-1)

    fleet.fleet = type("Counted", (), {"admit": staticmethod(admit), "submit": staticmethod(submit)})()
    try:
        assert fleet.direct is (features == "auto")
        refusals = []

        def request(i: int) -> SynthesisRequest:
            return SynthesisRequest(text="Number 2.", seed=2, max_new_tokens=60)  # stops after 42 frames unless told

        t0 = time.perf_counter()
        streams = fleet.submit_all([0.0] * 6, request, t0, lambda: refusals.append(1))
        assert len(streams) == 4 and len(refusals) == 2
        assert all(s.result().frames == 59 for s in streams)  # 60 tokens, 59 frames (bench's frames - 1)
        t0 = time.perf_counter()
        late = fleet.submit_all([0.0, 0.3], request, t0, lambda: refusals.append(1))
        assert late[1].submitted_at - t0 >= 0.3 > late[0].submitted_at - t0 and len(refusals) == 2
        assert [s.result().frames for s in late] == [59, 59]
        # the event loop sends all six before the first answer; one after another, one at a time
        assert flight["most"] == (6 if features == "auto" else 1)
    finally:
        fleet.fleet = inner
        fleet.close()


def test_submit_all_ends_the_level_on_an_error_with_nothing_left_generating():
    # a request the engine refuses as bad input among good ones: the error is raised (bench exits with its line)
    # and the streams already taken are cancelled, not left generating until bench closes the engines
    config = from_env({}, model_dir=str(MODEL_DIR), devices="cpu", max_batch=4)
    fleet = BenchFleet.start(config, None, engine_process=True)
    taken = []
    inner = fleet.fleet

    async def admit(request, **kw):
        stream = await inner.admit(request, **kw)
        taken.append(stream)
        return stream

    fleet.fleet = type("Kept", (), {"admit": staticmethod(admit)})()
    try:
        def request(i: int) -> SynthesisRequest:
            return SynthesisRequest(text="" if i == 2 else f"Number {i}.", seed=i, max_new_tokens=2000)

        with pytest.raises(InputError):
            fleet.submit_all([0.0, 0.0, 0.1], request, time.perf_counter(), lambda: None)
        assert len(taken) == 2
        end = time.monotonic() + 30
        while not all(s.done for s in taken) and time.monotonic() < end:
            time.sleep(0.05)
        assert all(s.done for s in taken)  # cancelled: 2,000 frames would take minutes here
    finally:
        fleet.fleet = inner
        fleet.close()
