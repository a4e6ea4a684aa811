"""Feature runpod_pickup (handlers/runpod/pickup.py) with RunPod's own SDK against loadtest's job queue: a job that
reaches a busy worker starts while the other runs, neither waiting for a job to end nor for a timer (the loop's
liveness tick is set to a minute here); a worker that fetched a batch fetches again once it started them; a full
worker fetches its next job when one ends (its look-again wait a minute too); several jobs at once; the SDK's class
is back after the block; a job whose take answer arrives after the shutdown signal still runs; the off switch and an
SDK version it was not written for leave the SDK's loop alone. The worker process's own loop with the feature on and
off: tests/handlers/test_runpod.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

pytest.importorskip("runpod")

from handlers.runpod import pickup  # noqa: E402

# each scenario runs in a process of its own: the SDK reads its queue's addresses from the environment when first
# imported
START = textwrap.dedent("""
    import asyncio, json, os, sys, threading, time
    from ttsengine.tools.load.job_queue import JobQueue
    queue = JobQueue().start()
    os.environ.update(queue.env())
    os.environ["RUNPOD_DEBUG_LEVEL"] = "ERROR"
    from runpod.serverless.modules import rp_scale
    from handlers.runpod import pickup
""")
SCENARIO = START + textwrap.dedent("""
    pickup.LIVENESS_S = 60.0  # a job must start because it was queued, not because the loop looked again
    pickup.FULL_WAIT_S = 60.0  # ... and a full worker fetch because a job ended, not because it looked again
    slots, holders = int(sys.argv[1]), int(sys.argv[2])

    state = {}

    async def handler(job):
        ids = job["id"]
        state.setdefault("events", {})[ids] = asyncio.Event()
        state.setdefault("started", []).append((ids, time.monotonic()))
        if ids.startswith("holder") and slots == 1:  # a full worker: the holder ends on its own
            await asyncio.sleep(0.5)
            yield {"saw_late": "late" in dict(state["started"])}
        elif ids.startswith("holder"):  # runs until the late job has started beside it
            try:
                await asyncio.wait_for(state["events"].setdefault("late-started", asyncio.Event()).wait(), 20)
                yield {"saw_late": True}
            except asyncio.TimeoutError:
                yield {"saw_late": False}
        else:
            if ids == "late":
                state["events"].setdefault("late-started", asyncio.Event()).set()
            yield {"job": ids}

    with pickup.installed(True) as ours:
        scaler = rp_scale.JobScaler({"handler": handler, "return_aggregate_stream": True,
                                     "concurrency_modifier": lambda current: slots})
    restored = rp_scale.JobScaler.__name__
    names = [f"holder-{i}" for i in range(holders)]
    for name in names:  # queued before the worker's first take: fetched together, as one batch
        queue.submit(name, {"text": "x"})
    threading.Thread(target=lambda: asyncio.run(scaler.run()), daemon=True).start()
    deadline = time.monotonic() + 20
    while len(state.get("started", ())) < holders:
        assert time.monotonic() < deadline, "the holders never started"
        time.sleep(0.01)
    time.sleep(0.3)  # the holder runs; the loop now waits on it (and on the queue)
    t0 = time.monotonic()
    queue.submit("late", {"text": "x"})
    for i in range(6):
        queue.submit(f"burst-{i}", {"text": "x"})
    queue.wait_done(names + ["late"] + [f"burst-{i}" for i in range(6)], timeout=30)
    late_at = dict(state["started"])["late"]
    print(json.dumps({"ours": ours, "class": type(scaler).__name__, "restored": restored,
                      "holders": [queue.done[n]["output"] for n in names], "late_after_s": late_at - t0,
                      "burst_done": sorted(j for j in queue.done if j.startswith("burst"))}))
    sys.stdout.flush()
    os._exit(0)
""")

# a shutdown signal while a job fetch is answered: RunPod has handed the job to this worker, the answer is on its way
SHUTDOWN = START + textwrap.dedent("""
    async def handler(job):
        yield {"job": job["id"]}

    with pickup.installed(sys.argv[1] == "ours") as ours:
        scaler = rp_scale.JobScaler({"handler": handler, "return_aggregate_stream": True,
                                     "concurrency_modifier": lambda current: 2})
    loop = {}

    async def main():
        loop["it"] = asyncio.get_running_loop()
        await scaler.run()

    def on_take(kind, body):  # on the queue's thread, before the take call is answered
        if kind == "job-take":
            loop["it"].call_soon_threadsafe(scaler.kill_worker)  # what the SDK's SIGTERM handler does
            time.sleep(1.5)  # the answer arrives well after the signal (the SDK's loop ends on its 0.1 s tick)
            queue.unlisten("last")  # its posts go to the queue's records

    queue.listen("last", on_take)
    runner = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    runner.start()
    assert queue.polled.wait(20), "the worker never polled"
    queue.submit("last", {"text": "x"})
    runner.join(30)
    print(json.dumps({"ours": ours, "ended": not runner.is_alive(), "done": queue.done.get("last")}))
    sys.stdout.flush()
    os._exit(0)
""")


def run_scenario(script: str, *args: object) -> dict:
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT,
                         env={"PYTHONPATH": f"{ROOT / 'container'}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(pickup.sdk_fits() is not None, reason=f"{pickup.sdk_fits()}")
def test_a_job_reaching_a_busy_worker_starts_while_the_other_runs_without_a_timer():
    got = run_scenario(SCENARIO, 8, 1)
    assert got["ours"] and got["class"] == "PromptJobScaler" and got["restored"] == "JobScaler"
    assert got["holders"] == [[{"saw_late": True}]]  # the late job started while the holder still ran
    assert got["late_after_s"] < 10  # with the loop's own look-again tick at 60 s
    assert got["burst_done"] == [f"burst-{i}" for i in range(6)]


@pytest.mark.skipif(pickup.sdk_fits() is not None, reason=f"{pickup.sdk_fits()}")
def test_a_worker_that_fetched_a_batch_fetches_again_once_it_started_them():
    # 4 slots, 2 jobs fetched in one batch: until they leave the SDK's queue each counts twice (queued and in
    # progress), so the fetcher saw the worker full; starting them must wake it, or the late job waits for a job's end
    got = run_scenario(SCENARIO, 4, 2)  # slots, holders
    assert got["ours"] and got["holders"] == [[{"saw_late": True}], [{"saw_late": True}]]
    assert got["late_after_s"] < 10


@pytest.mark.skipif(pickup.sdk_fits() is not None, reason=f"{pickup.sdk_fits()}")
def test_a_full_worker_fetches_the_next_job_when_one_ends_without_a_timer():
    # one slot: the late job waits in the queue while the holder runs, and is fetched the moment the holder ends
    # (the fetcher's look-again wait is a minute here; the SDK's own fetcher sleeps a second when full)
    got = run_scenario(SCENARIO, 1, 1)
    assert got["ours"] and got["holders"] == [[{"saw_late": False}]]  # never two at once
    assert got["late_after_s"] < 10  # when the holder ended, long before the minute
    assert got["burst_done"] == [f"burst-{i}" for i in range(6)]


@pytest.mark.skipif(pickup.sdk_fits() is not None, reason=f"{pickup.sdk_fits()}")
@pytest.mark.parametrize("loop", ["ours", "sdk"])
def test_a_job_taken_as_the_shutdown_signal_comes_runs_before_the_worker_exits(loop):
    # RunPod counts a taken job as this worker's: one whose take answer arrives after SIGTERM must run (in the drain's
    # window) and be reported, not be dropped with the job loop. The SDK's own loop (runpod 1.12) ends on its 0.1 s
    # tick and drops it: the scenario reproduces the race, and ours closes it
    got = run_scenario(SHUTDOWN, loop)
    assert got["ended"] and got["ours"] == (loop == "ours")  # the worker exits either way
    if loop == "ours":
        assert got["done"] is not None and got["done"]["output"] == [{"job": "last"}], got
    else:
        assert got["done"] is None, "the SDK's loop ran the job: its shutdown race is gone, drop pickup.py's note"


def test_off_or_an_sdk_it_was_not_written_for_leaves_the_sdks_loop(monkeypatch, caplog):
    from runpod.serverless.modules import rp_scale

    sdk = rp_scale.JobScaler
    with pickup.installed(False) as ours:
        assert not ours and rp_scale.JobScaler is sdk
    monkeypatch.setattr(pickup.metadata, "version", lambda name: "9.0.0")
    assert "runpod 9.0.0 is not a version" in pickup.sdk_fits()
    with caplog.at_level("INFO", logger="handlers.runpod"), pickup.installed(True) as ours:
        assert not ours and rp_scale.JobScaler is sdk
    assert "runpod_pickup off: runpod 9.0.0" in caplog.text
