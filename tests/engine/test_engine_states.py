"""The engine's state machine with a scripted device: the real Engine (scheduler, planner, vocoder on the tiny
codec) around a host-side stand-in for engine/device/device.py that emits known frames at once, so each test can stop
the loop at a chosen step and check what happens to every stream: cancel while queued or running, a long text
continued with the previous chunk as context, slots moving when a stream in the middle finishes, one failing
step failing every request, backpressure. Equality with the eager engine on the real runner is test_batch_engine.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from conftest import MODEL_DIR

from ttsengine import (
    BusyError,
    CancelledError,
    Engine,
    EngineConfig,
    EngineDown,
    InputError,
    SynthesisRequest,
    TTSError,
)
from ttsengine.engine.control.faults import MAX_CONSECUTIVE
from ttsengine.engine.control.step_plan import Move, StepPlan
from ttsengine.engine.device.in_flight import InFlight
from ttsengine.engine.device.runner import PrefillItem
from ttsengine.engine.loader import load

AUDIO_TOL = 5e-5  # streaming vs whole decode, fp32


@dataclass
class Script:
    """The frame a request makes at RNG counter `index` depends only on its seed and that index; a chunk ends
    with <|im_end|> as its `stops[seed]`-th frame (no entry: it runs to its frame budget)."""

    eos: int
    semantic_begin: int
    num_semantic: int
    residual_size: int  # the codec's residual codebooks
    stops: dict[int, int] = field(default_factory=dict)

    def codes(self, seed: int, start: int, count: int) -> torch.Tensor:
        """Frames start..start+count-1 without token 0 -> int64 [n, count] (n = 4, the tiny model's)."""
        i = torch.arange(start, start + count)
        return torch.stack([(seed * 5 + i) % self.num_semantic, torch.full_like(i, seed % self.residual_size),
                            i % self.residual_size, (i // self.residual_size) % self.residual_size])

    def frame(self, seed: int, index: int, last: bool) -> torch.Tensor:
        """-> int64 [n+1]: token 0, then the codes."""
        codes = self.codes(seed, index, 1)[:, 0]
        token = self.eos if last else self.semantic_begin + int(codes[0])
        return torch.cat([torch.tensor([token]), codes])


class ScriptedDevice:
    """The device plane's interface (device/device.py) on the host: execute(plan) carries out the scheduler's plan
    (slot moves and resets, prefill, a decode step in which each armed row emits its script's frames) and returns
    the step as the real device does. The pages are the real control plane's (the engine's scheduler owns them), so
    a plan that runs out of pages fails as it would on the GPU. A gate lets the test stop the loop inside a decode
    step: pause(), allow(k) more steps, resume()."""

    graphs = None  # nothing to capture
    compile_error = None
    compiled = False
    fused_in_use = frozenset()  # no device kernels

    def __init__(self, engine: Engine, script: Script):
        self.pool, self.script = engine.scheduler.pool, script
        self.device = torch.device("cpu")
        slots = engine.settings.max_slots
        self.rows: list[tuple[int, int, int] | None] = [None] * slots  # (seed, frame index, chunk frames)
        self.out = torch.zeros(slots, 5, dtype=torch.int64)
        self.prefills: list[PrefillItem] = []  # the last chunk of each prompt (the one that arms its row)
        self.moves: list[tuple[int, int]] = []
        self.resets: list[list[int]] = []
        self.steps = 0
        self._fail: Exception | None = None
        self._gate = threading.Condition()
        self._allowed: int | None = None  # decode steps that may still run; None: any number
        self._blocked = False

    def precompiled(self) -> None:
        return None  # not a compiled device

    def bind_thread(self) -> None:
        pass

    def warm_up(self) -> float:
        return 0.0  # nothing to compile or capture

    def describe(self) -> str:
        return "scripted device"

    def graphs_pending(self) -> bool:
        return False

    # ---- the one entry point, as Engine calls it -----------------------------------------------
    def execute(self, plan: StepPlan, started: float) -> InFlight | None:
        for op in plan.slot_ops:
            if isinstance(op, Move):
                self.rows[op.dst], self.rows[op.src] = self.rows[op.src], None
                self.moves.append((op.src, op.dst))
            else:
                for slot in op.slots:
                    self.rows[slot] = None
                self.resets.append(list(op.slots))
        for c in plan.chunks:
            job = c.job
            assert len(plan.pages[job.slot]) * self.pool.page_size > (c.end if c.last else c.end - 1)
            if c.last:  # a whole prompt (or its last chunk) arms the row
                self.prefills.append(PrefillItem(job.slot, job.prompt, job.sampling, job.frame_offset, c.start, c.end))
                self.rows[job.slot] = (job.sampling[3], job.frame_offset, 0)
        if not plan.decodes:
            return None
        frames = self._decode_step(plan.bucket)
        return InFlight(list(plan.rows), frames[: len(plan.rows)].clone(), None, plan.bucket, plan.tokens, started)

    def _decode_step(self, bb: int) -> torch.Tensor:
        with self._gate:
            while self._allowed == 0:
                self._blocked = True
                self._gate.notify_all()
                if not self._gate.wait(timeout=30):
                    raise TimeoutError("the test never let the step run")
            if self._allowed is not None:
                self._allowed -= 1
            fail, self._fail = self._fail, None
        self.steps += 1
        if fail is not None:
            raise fail
        for r in range(bb):
            if self.rows[r] is not None:
                seed, index, made = self.rows[r]
                self.out[r] = self.script.frame(seed, index, last=made + 1 == self.script.stops.get(seed))
                self.rows[r] = (seed, index + 1, made + 1)
        return self.out[:bb]

    # ---- the test's controls -----------------------------------------------------------------
    def pause(self) -> None:
        """The next decode step waits."""
        with self._gate:
            self._allowed = 0

    def allow(self, steps: int) -> None:
        """`steps` more decode steps run, then the loop waits again."""
        with self._gate:
            self._allowed += steps
            self._blocked = False
            self._gate.notify_all()

    def resume(self) -> None:
        with self._gate:
            self._allowed, self._blocked = None, False
            self._gate.notify_all()

    def wait_blocked(self) -> bool:
        """Waits until the loop stands inside a decode step, held by the gate."""
        with self._gate:
            return self._gate.wait_for(lambda: self._blocked, timeout=30)

    def fail_next_step(self, error: Exception) -> None:
        with self._gate:
            self._fail = error

    @property
    def idle(self) -> bool:
        return all(r is None for r in self.rows) and len(self.pool.free) == self.pool.total


@pytest.fixture(scope="module")
def ckpt():
    return load(EngineConfig(model_dir=MODEL_DIR, device="cpu"))


@contextlib.contextmanager
def scripted_engine(ckpt, stops: dict[int, int] | None = None, **config):
    tok = ckpt.tokenizer
    script = Script(tok.im_end_id, tok.semantic_begin_id, tok.num_semantic, ckpt.codec_config.codebook_size,
                    stops or {})
    eng = Engine(ckpt, EngineConfig(model_dir=MODEL_DIR, device="cpu", **config),
                 device=lambda engine: ScriptedDevice(engine, script))
    eng.start()
    try:
        yield eng, eng.device, script
    finally:
        eng.close()


def audio_of(ckpt, *codes: torch.Tensor) -> np.ndarray:
    """The whole-chunk decode of each text chunk's codes [n, F], joined: what the stream must deliver."""
    with torch.inference_mode():
        return np.concatenate([ckpt.codec.decode(c[None])[0, 0].numpy() for c in codes])


def test_cancel_while_queued_never_reaches_the_runner(ckpt):
    with scripted_engine(ckpt, max_batch=1) as (eng, runner, _):
        runner.pause()
        running = eng.submit(SynthesisRequest(text="Running.", seed=1, max_new_tokens=500), ignore_stop=True)
        assert runner.wait_blocked()
        queued = eng.submit(SynthesisRequest(text="Queued.", seed=2, max_new_tokens=500))
        queued.cancel()
        runner.allow(1)  # the step in flight; the next iteration takes the request in and drops it
        with pytest.raises(CancelledError):
            queued.result()
        assert [(r.finish_reason, r.frames) for r in queued.reports] == [("cancelled", 0)]
        assert runner.wait_blocked() and not running.done
        running.cancel()
        runner.resume()
        list(running)  # ends once the engine let go of it: its slot and pages are free by then
        assert runner.idle
        assert [it.params[3] for it in runner.prefills] == [1]  # the cancelled request was never prefilled
        assert eng.stats().cancelled == 2


@pytest.mark.parametrize("overlap, delivered", [(False, 16), (True, 16)])
def test_cancel_while_running_frees_the_slot_after_the_step_in_flight(ckpt, overlap, delivered):
    # without overlap the 21st step's frame is read before the cancel is seen: 21 frames, 20 kept, 16 as audio (chunks
    # 4, 4, 8; the next chunk is 8). With overlap the 21st step was launched before the 20th was read: the cancel
    # comes with 19 read (16 as audio), the 20th is read after it (kept: 19, not a whole chunk more) and the 21st is
    # dropped
    overlapped = "+overlap_step" if overlap else "-overlap_step"
    with scripted_engine(ckpt, max_batch=2, features=overlapped) as (eng, runner, script):
        runner.pause()
        stream = eng.submit(SynthesisRequest(text="Long one.", seed=3, max_new_tokens=500), ignore_stop=True)
        runner.allow(20)
        assert runner.wait_blocked()  # 20 frames made, the 21st step waits
        stream.cancel()
        runner.resume()
        audio = np.concatenate([c.audio for c in stream])  # ends once the engine let go of the stream
        assert runner.idle and runner.steps == 21  # the step in flight, none after it
        report = stream.reports[-1]
        assert report.finish_reason == "cancelled" and report.frames == delivered  # what was delivered as audio
        assert np.abs(audio - audio_of(ckpt, script.codes(3, 0, delivered))).max() < AUDIO_TOL
        assert runner.resets == [[0]]
        nxt = eng.submit(SynthesisRequest(text="Next.", seed=4, max_new_tokens=5)).result()
        assert nxt.frames == 4 and runner.prefills[-1].slot == 0


def test_long_text_continues_with_the_previous_chunk_as_context(ckpt):
    text = "First part of a long text. " * 5 + "And the end."
    with scripted_engine(ckpt, stops={7: 6}, max_batch=1) as (eng, runner, script):
        runner.pause()
        long = eng.submit(SynthesisRequest(text=text, seed=7, max_new_tokens=50, chunk_length=60))
        assert runner.wait_blocked()
        behind = eng.submit(SynthesisRequest(text="Waiting behind.", seed=8, max_new_tokens=3))
        runner.resume()
        result, _ = long.result(), behind.result()
    n = len(result.chunks)
    assert n > 2 and all((c.finish_reason, c.frames, c.context_dropped) == ("stop", 5, False) for c in result.chunks)
    # each chunk generated 6 frames (5 kept + <|im_end|>); its continuation went ahead of the waiting request
    assert [(it.params[3], it.frame_offset) for it in runner.prefills] == [(7, 6 * i) for i in range(n)] + [(8, 0)]
    texts = [c.text for c in result.chunks]
    codes = [script.codes(7, 6 * i, 5) for i in range(n)]
    assert torch.equal(runner.prefills[0].prompt, eng.planner.prompt(texts[0], []))
    for i in range(1, n):
        assert torch.equal(runner.prefills[i].prompt, eng.planner.prompt(texts[i], [(texts[i - 1], codes[i - 1])]))
        assert result.chunks[i].prompt_tokens == runner.prefills[i].prompt.shape[1]
    assert np.abs(result.audio - audio_of(ckpt, *codes)).max() < AUDIO_TOL


def test_a_stream_in_the_middle_finishing_moves_the_last_one_into_its_slot(ckpt):
    with scripted_engine(ckpt, stops={1: 40, 2: 6, 3: 40}, max_batch=4) as (eng, runner, script):
        runner.pause()
        a = eng.submit(SynthesisRequest(text="First.", seed=1, max_new_tokens=60))
        assert runner.wait_blocked()  # a in slot 0
        b = eng.submit(SynthesisRequest(text="Second.", seed=2, max_new_tokens=60))
        c = eng.submit(SynthesisRequest(text="Third.", seed=3, max_new_tokens=60))
        runner.resume()  # b and c join together: slots 1 and 2
        results = [s.result() for s in (a, b, c)]
        assert [it.slot for it in runner.prefills] == [0, 1, 2]
        # b leaves first: c moves 2 -> 1; a leaves next (one step ahead of c): c moves 1 -> 0
        assert runner.moves == [(2, 1), (1, 0)] and runner.resets == [[2], [1], [0]]
        assert runner.idle
    for seed, result in zip((1, 2, 3), results):
        kept = script.stops[seed] - 1
        assert [(r.finish_reason, r.frames) for r in result.chunks] == [("stop", kept)]
        assert np.abs(result.audio - audio_of(ckpt, script.codes(seed, 0, kept))).max() < AUDIO_TOL


def test_a_failing_step_fails_every_request_and_the_engine_serves_on(ckpt):
    with scripted_engine(ckpt, max_batch=2) as (eng, runner, _):
        runner.pause()
        streams = [eng.submit(SynthesisRequest(text="Running.", seed=1, max_new_tokens=500), ignore_stop=True)]
        assert runner.wait_blocked()
        streams += [eng.submit(SynthesisRequest(text=f"Joins {i}.", seed=2 + i, max_new_tokens=500),
                               ignore_stop=True) for i in range(2)]
        runner.allow(2)  # the first stream's step; then the second joins, the third waits for a slot
        assert runner.wait_blocked()
        assert len(eng.scheduler.running) == 2 and eng.scheduler.queue_depth == 1
        streams.append(eng.submit(SynthesisRequest(text="Just arrived.", seed=9, max_new_tokens=5)))
        runner.fail_next_step(RuntimeError("scripted failure"))
        runner.resume()
        for stream in streams:  # running, waiting, and not yet taken in
            with pytest.raises(TTSError, match="^internal engine error on cpu; see the server logs$"):
                stream.result()
        assert runner.idle  # released before the streams were failed
        assert eng.submit(SynthesisRequest(text="After.", seed=5, max_new_tokens=5)).result().frames == 4


def test_a_sticky_device_error_takes_the_engine_out_of_service(ckpt):
    with scripted_engine(ckpt, max_batch=2) as (eng, runner, _):
        runner.pause()
        stream = eng.submit(SynthesisRequest(text="Running.", seed=1, max_new_tokens=500), ignore_stop=True)
        assert runner.wait_blocked()
        runner.fail_next_step(RuntimeError("CUDA error: an illegal memory access was encountered"))
        runner.resume()
        with pytest.raises(EngineDown, match="^the engine on cpu failed and was taken out of service; see the server "
                                             "logs$"):  # the clients' words; the error's own are the log's
            stream.result()
        assert eng.error == "RuntimeError: CUDA error: an illegal memory access was encountered"  # the stats' copy
        assert eng.state == "down" and eng.stats().failed_streams == 1 and eng.stats().state == "down"
        with pytest.raises(EngineDown, match="^the engine on cpu is out of service; see the server logs$"):
            eng.submit(SynthesisRequest(text="After.", seed=5, max_new_tokens=5))


def test_failures_in_a_row_take_the_engine_down_and_one_success_resets_the_count(ckpt):
    with scripted_engine(ckpt, max_batch=1) as (eng, runner, _):
        for _ in range(MAX_CONSECUTIVE - 1):
            runner.fail_next_step(RuntimeError("flaky"))
            with pytest.raises(TTSError, match="internal engine error"):
                eng.submit(SynthesisRequest(text="Fails.", seed=1, max_new_tokens=5)).result()
        assert eng.submit(SynthesisRequest(text="Works.", seed=2, max_new_tokens=5)).result().frames == 4
        for i in range(MAX_CONSECUTIVE):
            runner.fail_next_step(RuntimeError("flaky"))
            with pytest.raises(TTSError) as e:
                eng.submit(SynthesisRequest(text="Fails.", seed=1, max_new_tokens=5)).result()
            assert isinstance(e.value, EngineDown) == (i == MAX_CONSECUTIVE - 1)
        assert eng.state == "down" and f"{MAX_CONSECUTIVE} engine steps failed in a row" in eng.error


def test_a_full_engine_answers_busy_at_once(ckpt):
    with scripted_engine(ckpt, max_batch=1, max_queue=1) as (eng, runner, _):
        runner.pause()
        long = SynthesisRequest(text="Long.", seed=1, max_new_tokens=4000)
        running = eng.submit(long, ignore_stop=True)
        assert runner.wait_blocked()
        waiting = eng.submit(long, ignore_stop=True)  # waits for the slot
        t0 = time.perf_counter()
        with pytest.raises(BusyError, match="busy"):
            eng.submit(long)
        assert time.perf_counter() - t0 < 0.5 and eng.stats().rejected == 1
        running.cancel()
        waiting.cancel()
        runner.resume()
        assert list(running) == [] and list(waiting) == []
        assert runner.idle and len(runner.prefills) == 1


def test_capacity_guard_uses_the_engines_kv_cache(ckpt):
    with scripted_engine(ckpt, kv_cache_tokens=128) as (eng, runner, _):
        assert eng.kv_positions == 128
        with pytest.raises(InputError, match=r"needs up to \d+ KV positions; this engine's cache holds 128 "
                                             r"\(max_new_tokens=\d+ or less fits\)"):
            eng.submit(SynthesisRequest(text="Too long to fit.", seed=1, max_new_tokens=500))
        assert eng.submit(SynthesisRequest(text="Fits.", seed=1, max_new_tokens=20)).result().frames == 19
        assert [it.params[3] for it in runner.prefills] == [1]


def test_a_failure_before_the_slot_operations_ran_leaves_no_row_armed(ckpt):
    # a release's row moves and resets go to the device as a plan of their own; when that fails before they ran, the
    # failure's cleanup must still reset every row: one left armed would write keys into pages the pool has given
    # away (found in review: row 2 stayed armed after b's release and a failed plan)
    with scripted_engine(ckpt, stops={1: 40, 2: 6, 3: 40}, max_batch=4) as (eng, device, _):
        failed, run = [], device.execute

        def execute(plan, started):
            if not failed and any(isinstance(op, Move) for op in plan.slot_ops):
                failed.append(list(plan.slot_ops))
                raise RuntimeError("scripted failure before the slot operations ran")
            return run(plan, started)

        device.execute = execute
        device.pause()
        a = eng.submit(SynthesisRequest(text="First.", seed=1, max_new_tokens=60))
        assert device.wait_blocked()
        b = eng.submit(SynthesisRequest(text="Second.", seed=2, max_new_tokens=60))
        c = eng.submit(SynthesisRequest(text="Third.", seed=3, max_new_tokens=60))
        device.resume()
        # b ended first (its release moved c into its row and reset the last one); that plan failed before it ran, b
        # not yet closed: every stream gets the error
        for stream in (a, b, c):
            with pytest.raises(TTSError, match="internal engine error"):  # the scripted failure (asserted below)
                stream.result()
        assert failed and any(isinstance(op, Move) for op in failed[0])
        deadline = time.monotonic() + 10
        while not device.idle and time.monotonic() < deadline:
            time.sleep(0.01)
        assert device.idle  # every row reset, every page back in the pool
        assert eng.submit(SynthesisRequest(text="Next.", seed=4, max_new_tokens=5)).result().frames == 4


def test_a_long_texts_continuation_takes_the_slot_its_chunk_freed(ckpt):
    # one slot, a queue of two: b and c are let in while the long stream's first text chunk makes its last frame;
    # its continuation goes to the front of the queue then, into the slot that chunk freed, so it does not push
    # out the requests let in (room is free slots + queue places: issue 50): all three finish, none is refused,
    # none stays open. A fourth while they wait is refused at once.
    text = "First part of a long text. " * 5 + "And the end."
    with scripted_engine(ckpt, stops={7: 6}, max_batch=1, max_queue=2) as (eng, device, _):
        device.pause()
        long = eng.submit(SynthesisRequest(text=text, seed=7, max_new_tokens=50, chunk_length=60))
        device.allow(5)  # frames 1-5 of the first chunk; the step of its last frame waits
        assert device.wait_blocked()
        b = eng.submit(SynthesisRequest(text="Second.", seed=8, max_new_tokens=3))
        c = eng.submit(SynthesisRequest(text="Third.", seed=9, max_new_tokens=3))
        with pytest.raises(BusyError, match="busy"):
            eng.submit(SynthesisRequest(text="Fourth.", seed=10, max_new_tokens=3))
        device.resume()
        assert len(long.result().chunks) > 2 and b.result().frames == 2 and c.result().frames == 2
        deadline = time.monotonic() + 10
        while eng.open_streams and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.open_streams == 0 and eng.metrics.rejected == 1


def test_every_engine_of_a_process_captures_under_one_lock(ckpt):
    # cuDNN's autotune flag, turned on inside codec captures, is process-wide: two engines built apart (a test's
    # reference engine beside a fleet, bench beside a server's engine) must take turns, so they share one lock
    # (issue 42's GPU failures: each engine had a lock of its own and one's capture broke the other's)
    from ttsengine.engine.device.cuda_graphs import PROCESS_CAPTURE_LOCK

    with scripted_engine(ckpt) as (a, _, _), scripted_engine(ckpt) as (b, _, _):
        assert a.capture_lock is b.capture_lock is PROCESS_CAPTURE_LOCK
        assert a.vocoder.graphs.lock is PROCESS_CAPTURE_LOCK
