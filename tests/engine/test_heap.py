"""Feature gc_freeze (engine/control/heap.py): once an engine's start-up captures are in, the process's objects leave
the garbage collector's full passes; a settled /ready waits for it (it counts as a graph pending)."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

from conftest import MODEL_DIR, ROOT

from ttsengine import Engine, EngineConfig, SynthesisRequest

FROZEN = """
import gc, sys, weakref
try:
    import triton  # noqa: F401 - its bindings (nanobind) report frozen objects as leaked at exit, unless handed back
except ImportError:
    pass
from ttsengine.engine.control import heap

class Node:
    pass

dead = Node(); dead.me = dead  # garbage in a cycle: only a collection frees it
gone = weakref.ref(dead); del dead
alive = Node(); alive.me = alive
seconds, frozen = heap.freeze()
assert gone() is None, "the freeze froze garbage"
assert frozen > 1000 and seconds >= 0  # the interpreter's own objects at least
assert not any(o is alive for o in gc.get_objects()), "a live object is still in the collector's generations"
young = Node()
again, more = heap.freeze()  # a second call freezes what came since
assert more > frozen and not any(o is young for o in gc.get_objects())
print("frozen", frozen, more)
"""


def test_freeze_collects_the_garbage_then_freezes_what_lives():
    # in an interpreter of its own: a freeze is the whole process's
    run = subprocess.run([sys.executable, "-c", FROZEN], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0 and "frozen" in run.stdout, run.stderr[-3000:]
    assert run.stderr == ""  # at exit the objects are handed back: no leak report


def test_an_engine_freezes_once_started_and_counts_it_pending_until_then(caplog):
    engine = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2), start=False)
    try:
        assert engine.stats().graphs_pending == 1  # no graphs on a CPU: the freeze is all a settled /ready waits for
        with caplog.at_level("INFO", logger="ttsengine.engine.engine"):
            engine.start()
            assert engine.settle(60)
        assert engine.stats().graphs_pending == 0
        assert [r for r in caplog.records if "froze the heap (gc_freeze)" in r.getMessage()]
        result = engine.synthesize(SynthesisRequest(text="Hello.", seed=3, max_new_tokens=8))
        assert result.audio.size > 0  # serving on after it
    finally:
        engine.close()
    assert gc.get_freeze_count() == 0  # a closed engine hands the objects back: its own cycles can be collected


def test_a_closed_engine_is_collected():
    # an engine holds cycles (its callbacks hold it): frozen with the heap and closed, it must not stay for good
    engine = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2), start=False)
    engine.start()
    assert engine.settle(60) and engine.stats().graphs_pending == 0
    gone = weakref.ref(engine)
    engine.close()
    del engine
    gc.collect()
    assert gone() is None


def test_the_off_switch_leaves_the_heap_alone(caplog):
    engine = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2, features="-gc_freeze"),
                         start=False)
    try:
        assert engine.stats().graphs_pending == 0
        with caplog.at_level("INFO", logger="ttsengine.engine.engine"):
            engine.start()
            assert engine.settle(60)
        assert not [r for r in caplog.records if "gc_freeze" in r.getMessage()]
    finally:
        engine.close()


class _Front:
    """What Service.load needs of a fleet here; `engines_elsewhere`: the mark of RemoteFleet and ProcessFleet."""

    def __init__(self, elsewhere: bool):
        if elsewhere:
            self.engines_elsewhere = True
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_only_a_front_with_engines_elsewhere_freezes_its_heap_and_hands_it_back_on_close():
    from ttsengine.serving.service import Service

    before = gc.get_freeze_count()
    service = Service(lambda: _Front(elsewhere=False), None).load()  # an in-process fleet: its engines freeze
    assert gc.get_freeze_count() == before
    service.close()
    service = Service(lambda: _Front(elsewhere=True), None).load()
    assert gc.get_freeze_count() > before
    service.close()
    assert service.fleet.closed and gc.get_freeze_count() == 0
    service = Service(lambda: _Front(elsewhere=True), None, features="-gc_freeze").load()
    assert gc.get_freeze_count() == 0
    service.close()
