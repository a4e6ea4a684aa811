"""The engine's Vocoder on CPU: decodes queued while its thread is busy merge into one batched call, in
order (a slot's reset runs after its decodes), with the same audio as one call per decode."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import Recorder

from ttsengine.engine.device.vocoder import Delivery, Vocoder

TOL = 5e-5  # fp32: summation order only


class Logged(Recorder):
    """A Recorder that notes its emits and its finish in a shared log, in the order they ran."""

    def __init__(self, name, log: list):
        super().__init__()
        self.name, self.log = name, log

    def emit(self, audio, text_index: int) -> None:
        self.log.append(("emit", self.name))
        super().emit(audio, text_index)

    def finish(self, error=None) -> None:
        self.log.append(("finish", self.name))
        super().finish(error)


def codes(seed: int, frames: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    return np.concatenate([g.integers(0, 32, (1, 1, frames)), g.integers(0, 16, (1, 3, frames))], axis=1)


def run(codec, merge_rows: int, plan: list[tuple[int, int]]) -> tuple[dict[int, np.ndarray], list[int]]:
    """plan: (slot, seed) decodes of 4 frames each, queued while the worker is held, then a reset of slot 0
    and one more decode of slot 0 -> each slot's audio, and the row counts of the calls that ran."""
    calls: list[int] = []
    voc = Vocoder(codec, 4, 4096, (4,), (), threading.RLock(), lambda frames, s: calls.append(frames),
                  lambda stream: None)
    voc.set_merge(merge_rows)
    gate = threading.Event()
    voc.call_async(gate.wait)  # holds the worker so that everything below queues up behind it
    out = {slot: Recorder() for slot, _ in plan}
    for slot, seed in plan:
        voc.decode([slot], codes(seed, 4), [Delivery(out[slot], 0, 4)])
    voc.reset(0)
    again = Recorder()
    voc.decode([0], codes(99, 4), [Delivery(again, 0, 4)])
    gate.set()
    voc.call(lambda: None)  # waits until everything queued before it ran
    voc.close()
    audio = {slot: np.concatenate(r.chunks, axis=-1) for slot, r in out.items()}
    audio[-1] = again.chunks[0]
    return audio, calls


@pytest.mark.parametrize("plan", [[(0, 1), (1, 2), (2, 3)], [(0, 1), (1, 2), (0, 3), (2, 4)]])
def test_queued_decodes_merge_in_order(eager_engine, plan):
    codec = eager_engine.ckpt.codec
    merged, calls = run(codec, 8, plan)
    alone, single = run(codec, 0, plan)
    assert single == [4] * (len(plan) + 1)  # merging off: one call per decode
    assert len(calls) < len(single) and sum(calls) == sum(single)
    assert merged.keys() == alone.keys()
    for slot in merged:
        assert merged[slot].shape == alone[slot].shape
        assert np.abs(merged[slot] - alone[slot]).max() < TOL, slot
    # a slot that comes back (0 in the second plan) starts a new call: its two chunks stay in order
    if plan[2][0] == 0:
        assert calls[0] == 8  # (0, 1) and (1, 2) merged; (0, 3) waits for the next call


def test_a_batch_past_the_largest_graph_runs_in_pieces_in_order(eager_engine):
    # more rows than the largest planned graph (2 here): pieces of 2, 2 and 1 rows, each row's audio where its slot's
    # is (on CPU the pieces run uncaptured; tests/engine/test_gpu.py replays them, where they share one static output)
    import torch

    codec = eager_engine.ckpt.codec
    batch = torch.from_numpy(np.concatenate([codes(20 + s, 4) for s in range(5)]))

    def decode(graph_rows: int):
        voc = Vocoder(codec, 5, 4096, (4,), (1, 2), threading.RLock(), lambda frames, s: None, lambda stream: None)
        voc.plan_graphs(graph_rows)
        box: list = []
        try:
            with torch.inference_mode():
                voc.call(lambda: box.append(voc.decode_padded([4, 0, 3, 1, 2], batch)))
            return box[0], voc._graph_rows
        finally:
            voc.close()

    (pieces, cap), (whole, no_cap) = decode(2), decode(0)
    assert (cap, no_cap) == (2, 0) and pieces.shape == whole.shape == (5, 4 * codec.frame_length)
    assert np.abs(pieces.numpy() - whole.numpy()).max() <= TOL


def test_a_final_call_with_rows_of_different_lengths_equals_one_call_per_row(eager_engine):
    # AudioFeed.send(final=True): the streams that ended in one step share a call, each row padded to the
    # longest (audio_feed.pending_codes): the codec is causal, so each row's real frames decode as they would alone
    codec = eager_engine.ckpt.codec
    first = {slot: codes(40 + slot, 4) for slot in range(3)}
    last = {0: codes(50, 3), 1: codes(51, 1), 2: codes(52, 2)}  # [1, 4, n]: 3, 1 and 2 real frames

    def decode(shared: bool) -> dict[int, np.ndarray]:
        voc = Vocoder(codec, 3, 4096, (4,), (), threading.RLock(), lambda frames, s: None, lambda stream: None)
        out = {slot: Recorder() for slot in first}
        voc.decode(list(first), np.concatenate(list(first.values())), [Delivery(out[s], 0, 4) for s in first])
        if shared:
            padded = [np.pad(c, ((0, 0), (0, 0), (0, 3 - c.shape[-1]))) for c in last.values()]
            voc.decode(list(last), np.concatenate(padded), [Delivery(out[s], 0, c.shape[-1]) for s, c in last.items()])
        else:
            for s, c in last.items():
                voc.decode([s], c, [Delivery(out[s], 0, c.shape[-1])])
        voc.call(lambda: None)
        voc.close()
        return {s: np.concatenate(r.chunks) for s, r in out.items()}

    shared, alone = decode(True), decode(False)
    for slot in first:
        assert shared[slot].shape == alone[slot].shape == ((4 + last[slot].shape[-1]) * codec.frame_length,)
        assert np.abs(shared[slot] - alone[slot]).max() < TOL, slot


def test_final_decodes_merge_across_resets_and_finishes_in_order(eager_engine):
    # streams ending at different steps while the codec thread is busy: each end queues a final decode (narrower
    # than its chunk), its slot's reset and its stream's finish. The decodes join into one call; the resets and
    # finishes run right after it, in order; the slot's next stream (a decode after its reset) does not join
    codec = eager_engine.ckpt.codec
    finals = {0: codes(60, 3), 1: codes(61, 4), 2: codes(62, 1)}

    def run(merge_rows: int):
        calls: list[int] = []
        log: list[tuple] = []

        voc = Vocoder(codec, 3, 4096, (4,), (), threading.RLock(), lambda frames, s: calls.append(frames),
                      lambda stream: None)
        voc.set_merge(merge_rows)
        out = {slot: Logged(slot, log) for slot in finals}
        again = Logged("next", log)
        gate = threading.Event()
        voc.call_async(gate.wait)
        for slot, c in finals.items():
            voc.decode([slot], c, [Delivery(out[slot], 0, c.shape[-1])])
            voc.reset(slot)
            voc.finish(out[slot])
        voc.decode([1], codes(63, 4), [Delivery(again, 0, 4)])  # slot 1's next stream: after slot 1's reset
        gate.set()
        voc.call(lambda: None)
        voc.close()
        audio = {slot: out[slot].chunks[0] for slot in finals} | {"next": again.chunks[0]}
        return audio, calls, log

    merged, calls, log = run(8)
    alone, single, log_alone = run(0)
    assert single == [3, 4, 1, 4] and calls == [8, 4]  # three finals in one call; the next stream after it
    assert log == [("emit", 0), ("emit", 1), ("emit", 2), ("finish", 0), ("finish", 1), ("finish", 2),
                   ("emit", "next")]
    assert log_alone == [("emit", 0), ("finish", 0), ("emit", 1), ("finish", 1), ("emit", 2), ("finish", 2),
                         ("emit", "next")]
    for key in merged:
        assert merged[key].shape == alone[key].shape and np.abs(merged[key] - alone[key]).max() < TOL, key


class Raising(Logged):
    def finish(self, error=None) -> None:
        super().finish(error)
        raise RuntimeError("a listener's failure")


@pytest.mark.parametrize("merge_rows", [0, 8])
def test_queued_resets_run_as_one_after_the_finishes_between_them(eager_engine, merge_rows):
    # streams ending together queue reset, finish, reset, finish ...: the finishes run first, in order, then every
    # slot in one reset; a finish that raises holds back neither the others nor the reset; a slot's next stream (a
    # decode after the run) starts from a clean state
    codec = eager_engine.ckpt.codec
    log: list[tuple] = []

    voc = Vocoder(codec, 3, 4096, (4,), (), threading.RLock(), lambda frames, s: None, lambda stream: None)
    voc.set_merge(merge_rows)
    reset = voc.codec.reset
    voc.codec.reset = lambda rows: (log.append(("reset", rows.tolist())), reset(rows))
    out = {slot: (Raising if slot == 1 else Logged)(slot, log) for slot in range(3)}
    for slot in range(3):  # each slot decodes one chunk: state to forget
        voc.decode([slot], codes(70 + slot, 4), [Delivery(out[slot], 0, 4)])
    voc.call(lambda: None)
    log.clear()
    gate = threading.Event()
    voc.call_async(gate.wait)
    for slot in range(3):
        voc.reset(slot)
        voc.finish(out[slot])
    again = Logged("next", log)
    voc.decode([1], codes(63, 4), [Delivery(again, 0, 4)])
    voc.reset(2)  # after a decode: a run of its own
    gate.set()
    voc.call(lambda: None)
    voc.close()
    assert log == [("finish", 0), ("finish", 1), ("finish", 2), ("reset", [0, 1, 2]), ("emit", "next"), ("reset", [2])]
    fresh = Recorder()
    ref = Vocoder(codec, 3, 4096, (4,), (), threading.RLock(), lambda frames, s: None, lambda stream: None)
    ref.decode([1], codes(63, 4), [Delivery(fresh, 0, 4)])
    ref.call(lambda: None)
    ref.close()
    assert np.abs(again.chunks[0] - fresh.chunks[0]).max() < TOL  # slot 1 was reset before its next stream


def test_a_call_longer_than_the_largest_chunk_is_refused(eager_engine):
    import torch

    voc = Vocoder(eager_engine.ckpt.codec, 2, 4096, (4,), (), threading.RLock(), lambda f, s: None, lambda s: None)
    box: list = []
    try:
        with torch.inference_mode():
            voc.call(lambda: box.append(voc.decode_padded([0], torch.from_numpy(codes(1, 5)))))
    except ValueError as e:
        box.append(str(e))
    finally:
        voc.close()
    assert box == ["a codec call of 5 frames: longer than the largest chunk, 4"]


def test_lag_is_the_age_of_the_oldest_decode_not_done(eager_engine):
    """Goodput admission's codec reading (Vocoder.lag): 0 with nothing queued; while the worker is held, the age of
    the first decode queued (not the last, not a count of frames); 0 again once everything queued was decoded."""
    import time

    voc = Vocoder(eager_engine.ckpt.codec, 4, 4096, (4,), (), threading.RLock(), lambda frames, s: None,
                  lambda stream: None)
    try:
        assert voc.lag == 0.0
        gate = threading.Event()
        voc.call_async(gate.wait)
        voc.decode([0], codes(1, 4), [Delivery(Recorder(), 0, 4)])
        time.sleep(0.2)
        voc.decode([1], codes(2, 4), [Delivery(Recorder(), 0, 4)])
        assert voc.lag >= 0.2  # the first decode's age, though the second was queued just now
        gate.set()
        voc.call(lambda: None)  # everything queued before it ran
        assert voc.lag == 0.0 and voc.frames_done == voc.frames_queued == 8
    finally:
        voc.close()
