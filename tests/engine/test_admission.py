"""What an engine lets in (issue 50): its capacity is its free slots plus its queue places, so a burst onto idle
slots is taken whole, also when the loop has not yet moved any of it into the slots; a fleet's is its engines'
summed. Real engines on CPU with the tiny checkpoint."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import MODEL_DIR

from ttsengine import BusyError, Engine, EngineConfig, Fleet, SynthesisRequest

LONG = SynthesisRequest(text="Long.", seed=1, max_new_tokens=2000)


def burst(target, n: int) -> tuple[list, list[Exception]]:
    """n submits at once from n threads -> (streams taken, errors)."""
    def one(_):
        try:
            return target.submit(LONG, ignore_stop=True)
        except Exception as e:  # noqa: BLE001 - counted by the test
            return e

    with ThreadPoolExecutor(n) as pool:
        out = list(pool.map(one, range(n)))
    return [s for s in out if not isinstance(s, Exception)], [e for e in out if isinstance(e, Exception)]


def end(streams: list) -> None:
    for s in streams:
        s.cancel()
    for s in streams:
        list(s)


def until(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_burst_onto_idle_slots_is_taken_whole():
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, max_queue=4))
    try:
        for _ in range(2):  # also once more after the first burst has left
            rejected = eng.metrics.rejected
            streams, errors = burst(eng, 8)  # 4 free slots + 4 queue places
            assert (len(streams), errors) == (8, []), errors
            with pytest.raises(BusyError, match="busy"):
                eng.submit(LONG)
            until(lambda: len(eng.scheduler.running) == 4)
            assert eng.occupancy() == (-4, 4) and eng.metrics.rejected == rejected + 1
            end(streams)
            until(lambda: eng.occupancy() == (4, 0) and eng.open_streams == 0)
    finally:
        eng.close()


def test_a_fleet_takes_all_its_engines_room():
    fleet = Fleet.load(EngineConfig(model_dir=MODEL_DIR, devices="cpu,cpu", max_batch=2, max_queue=2))
    try:
        assert fleet.wait_all(60)
        streams, errors = burst(fleet, 8)  # (2 free slots + 2 queue places) x 2 engines
        assert (len(streams), errors) == (8, []), errors
        assert sorted(s.device for s in streams) == ["cpu"] * 8
        until(lambda: all(len(e.scheduler.running) == 2 for e in fleet.engines))
        assert [e.occupancy() for e in fleet.engines] == [(-2, 2), (-2, 2)]
        with pytest.raises(BusyError, match="the engines are busy"):
            fleet.submit(LONG)
        end(streams)
    finally:
        fleet.close()
