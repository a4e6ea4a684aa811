"""The batched serving engine on CPU with the real runner: equal to the eager engine, streaming, async iteration,
slot churn. The loop's states (cancel, backpressure, continuation, slot moves, failure) are test_engine_states.py."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from ttsengine import InputError, NoAudio, Reference, SynthesisRequest
from ttsengine.model.kernels.triton_support import triton_major
from ttsengine.model.quant import Int8Linear

AUDIO_TOL = 5e-5  # streaming vs whole-chunk decode, fp32


def same(a, b) -> None:
    assert [(c.frames, c.finish_reason, c.prompt_tokens) for c in a.chunks] == \
           [(c.frames, c.finish_reason, c.prompt_tokens) for c in b.chunks]
    assert a.seed == b.seed and len(a.audio) == len(b.audio)
    if len(a.audio):
        assert np.abs(a.audio - b.audio).max() < AUDIO_TOL


def serve_all(eng, eager_engine, reqs) -> None:
    """Submits every request at once to `eng`; each result must equal the eager engine's."""
    streams = [eng.submit(r) for r in reqs]
    for req, stream in zip(reqs, streams):
        same(eager_engine.synthesize(req), stream.result())


def test_concurrent_requests_equal_the_reference(engine, eager_engine):
    ref_audio = np.random.default_rng(0).standard_normal(30000).astype(np.float32) * 0.1
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, ref_audio, 44100, format="WAV")
    reqs = [
        SynthesisRequest(text="Hello there.", seed=1, max_new_tokens=30),
        SynthesisRequest(text="A different sentence, longer than the first one.", seed=2, max_new_tokens=45,
                         temperature=0.5, top_p=0.9, repetition_penalty=1.3),
        SynthesisRequest(text="Short.", seed=3, max_new_tokens=12),
        SynthesisRequest(text="First part of a long text. " * 5 + "And the end.", seed=4, max_new_tokens=9,
                         chunk_length=60),
        SynthesisRequest(text="Cloned voice.", seed=5, max_new_tokens=20,
                         references=(Reference(text="some words", audio=buf.getvalue()),)),
    ]
    streams = [engine.submit(r) for r in reqs]
    results = [s.result() for s in streams]
    assert len(results[3].chunks) > 2  # the long text continued chunk by chunk
    for req, got in zip(reqs, results):
        same(eager_engine.synthesize(req), got)


def test_more_requests_than_slots_all_finish_equal(engine, eager_engine):
    rng = np.random.default_rng(7)
    reqs = [SynthesisRequest(text=f"Request number {i}.", seed=100 + i, max_new_tokens=int(rng.integers(2, 40)))
            for i in range(16)]  # 16 requests through 8 slots: joins, leaves and slot moves every step
    streams = [engine.submit(r) for r in reqs]
    for req, stream in zip(reqs, streams):
        same(eager_engine.synthesize(req), stream.result())


def test_the_fused_fast_attention_path_equals_the_reference(eager_engine):
    # TTS_FEATURES=+fast_attention on CPU: the fast layers read their cache as a paged pool through the
    # slow layers' write + attention op (its reference path here; the Triton kernel on the GPU, test_gpu.py)
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, features="fast_attention"))
    try:
        frame = eng.runner.ops.frame
        assert frame.paged_fast and frame.sample_codebook is frame.sample  # the codebooks: the reference sampler
        reqs = [SynthesisRequest(text=f"Fused path {i}.", seed=40 + i, max_new_tokens=10 + 7 * i,
                                 repetition_penalty=1.0 + 0.2 * i) for i in range(6)]
        serve_all(eng, eager_engine, reqs)  # 6 requests through 4 slots: joins, leaves, slot moves
    finally:
        eng.close()


def test_a_lone_prompt_is_prefilled_in_one_call(engine):
    # nothing decodes: the whole TTS_PREFILL_TOKENS budget, not a chunk per step
    calls, original = [], engine.runner.prefill

    def spy(items):
        calls.append([(it.start, it.stop, it.last) for it in items])
        original(items)

    engine.runner.prefill = spy
    try:
        engine.submit(SynthesisRequest(text="In one call, please.", seed=1, max_new_tokens=3)).result()
    finally:
        engine.runner.prefill = original
    assert len(calls) == 1 and len(calls[0]) == 1 and calls[0][0][0] == 0 and calls[0][0][2]


def test_audio_streams_before_the_request_ends(engine):
    stream = engine.submit(SynthesisRequest(text="Stream me.", seed=9, max_new_tokens=60), ignore_stop=True)
    chunks = list(stream)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    sizes = [len(c.audio) // 2048 for c in chunks]
    assert sizes[0] == engine.settings.first_chunk_frames and len(chunks) > 5
    assert sizes[:3] == [4, 4, 8]  # later chunks grow from the first, each at most the audio already made
    assert sum(sizes) == 59  # 60 generated, the last dropped; ignore_stop generates all of them
    assert stream.first_audio_at < stream.finished_at and stream.ttfa > 0


def test_async_iteration(engine):
    async def run():
        stream = engine.submit(SynthesisRequest(text="Async.", seed=3, max_new_tokens=20))
        return [c async for c in stream]

    chunks = asyncio.run(run())
    assert sum(len(c.audio) for c in chunks) == 19 * 2048


def test_bad_request_fails_at_submit(engine):
    with pytest.raises(InputError, match="top_p"):
        engine.submit(SynthesisRequest(text="x", top_p=0))


def test_max_new_tokens_one_is_no_audio(engine):
    stream = engine.submit(SynthesisRequest(text="hi", seed=1, max_new_tokens=1))
    with pytest.raises(NoAudio, match="produced no audio") as e:
        stream.result()
    assert e.value.status == 422 and stream.reports[0].frames == 0
    # one kept frame is audio
    r = engine.submit(SynthesisRequest(text="hi", seed=1, max_new_tokens=2)).result()
    assert r.frames == 1


@pytest.mark.parametrize("int8_kernel", ["off", "dequant"])
def test_merged_ffn_leaves_quantized_layers_alone(int8_kernel):
    # merged_ffn is on by default on CUDA: a quantized model must still start. Our int8 layers are not nn.Linear;
    # torchao's (int8_kernel=off with torchao installed) are nn.Linear with a quantized weight tensor, which a cat of
    # W1 and W3 cannot take: both stay unmerged and the engine serves as without merged_ffn
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    config = EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, quant="int8", int8_kernel=int8_kernel)
    plain = Engine.load(config)
    eng = Engine.load(config.with_(features="merged_ffn"))
    gemv = Engine.load(config.with_(features="fast_attention,layer_gemv", max_batch=2))
    try:
        assert not any(hasattr(layer.feed_forward, "w13") for layer in eng.runner.model.layers)
        req = SynthesisRequest(text="Quantized.", seed=7, max_new_tokens=12)
        same(plain.synthesize(req), eng.synthesize(req))
        # layer_gemv reads our int8 layers (merged W1|W3 as views), not torchao's: where it cannot, the runner turns it
        # off and what the engine reports as in use (ready log, bench JSON) says so
        ours = all(isinstance(layer.attention.wqkv, Int8Linear) for layer in gemv.runner.model.layers)
        assert (gemv.runner.gemv_rows > 0) == ours and ("layer_gemv" in gemv.runner.fused_in_use) == ours
        assert "layer_gemv" in gemv.settings.runner.fused  # as configured
    finally:
        gemv.close()
        eng.close()
        plain.close()


def test_merged_ffn_equals_the_reference_and_adds_no_memory(eager_engine):
    # TTS_FEATURES=+merged_ffn,+fast_attention on CPU: the step's layers run W1|W3 as one matmul (the fast
    # layers too: they share the slow layers' function with fast_attention); w1/w3 become views of the merged weight
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig
    from ttsengine.model.quant import weight_bytes

    config = EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4)
    plain = Engine.load(config)
    eng = Engine.load(config.with_(features="merged_ffn,fast_attention"))
    try:
        ff = eng.runner.model.layers[0].feed_forward
        assert ff.w13.data_ptr() == ff.w1.weight.data_ptr() and not hasattr(plain.runner.model.layers[0].feed_forward,
                                                                             "w13")
        assert weight_bytes(eng.runner.model) == weight_bytes(plain.runner.model)
        serve_all(eng, eager_engine, [SynthesisRequest(text=f"Merged {i}.", seed=60 + i, max_new_tokens=12 + 5 * i)
                                      for i in range(5)])
    finally:
        eng.close()
        plain.close()


def test_channels_last_codec_equals_the_reference(eager_engine):
    # TTS_FEATURES=+codec_channels_last (on by default with CUDA only): the engine's streaming codec time-major, each
    # conv a channels-last convolution, biases folded into Snake / the residual sums; the audio is the eager engine's
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2, features="+codec_channels_last"))
    try:
        assert eng.settings.codec_channels_last and eng.vocoder.codec.time_major
        serve_all(eng, eager_engine, [SynthesisRequest(text=f"Layout {i}.", seed=60 + i, max_new_tokens=10 + 7 * i)
                                      for i in range(3)])
    finally:
        eng.close()
    auto = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2))
    try:
        assert not auto.vocoder.codec.time_major  # auto: CUDA only
    finally:
        auto.close()


@pytest.mark.parametrize("layout", ["", ",+codec_channels_last"])
def test_the_codec_kv_ring_equals_the_reference(eager_engine, layout):
    # TTS_FEATURES=+codec_kv_ring (on by default on a GPU, off on a CPU): the codec transformer's keys and
    # values in a ring per row, written in place; streams longer than the tiny codec's window wrap the ring many times
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2, features="+codec_kv_ring" + layout))
    try:
        assert eng.settings.codec.kv_ring and eng.vocoder.codec.ring_chunk == max(eng.vocoder.chunk_sizes)
        serve_all(eng, eager_engine, [SynthesisRequest(text=f"Ring {i}.", seed=70 + i, max_new_tokens=12 + 9 * i)
                                      for i in range(3)])
    finally:
        eng.close()


def test_sparse_codec_rows_equal_the_reference(eager_engine):
    # TTS_FEATURES=+codec_sparse_rows (default on a GPU, off on a CPU): codec calls padded to 1, 4,
    # 16 or 64 rows, half the graphs to capture; two streams here decode in calls padded to 4 rows
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig
    from ttsengine.engine.settings import codec_buckets

    assert codec_buckets((1, 2, 4, 8, 16, 32, 64, 128, 256), True) == (1, 4, 16, 64, 256)
    assert codec_buckets((2, 4, 8, 16, 24), True) == (4, 16, 24) and codec_buckets((1, 2), False) == (1, 2)
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, features="+codec_sparse_rows"))
    try:
        assert eng.vocoder.buckets == (1, 4) and eng.settings.buckets == (1, 2, 4)
        serve_all(eng, eager_engine, [SynthesisRequest(text=f"Sparse {i}.", seed=80 + i, max_new_tokens=10 + 6 * i)
                                      for i in range(2)])
    finally:
        eng.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_overlapped_and_serial_steps_equal_the_reference_and_free_every_page(eager_engine, overlap):
    # overlap_step: step k+1 is launched before step k's frames are read, so a stream that ends at step k makes
    # one more frame in step k+1 that must be dropped (and its KV position must lie in its own pages); off: the
    # serial loop. Both equal the eager engine, and every page is back in the pool once the streams are done.
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=3, max_queue=8,
                                   features="+overlap_step" if overlap else "-overlap_step", prefix_cache=False))
    try:
        assert eng.settings.overlap_step is overlap
        # 7 requests through 3 slots, ending at every step
        serve_all(eng, eager_engine, [SynthesisRequest(text=f"Overlap {i}.", seed=70 + i, max_new_tokens=3 + 5 * i)
                                      for i in range(7)])
        deadline = time.monotonic() + 10  # the loop may still be finishing its last iteration
        while eng._in_flight is not None and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.01)
        assert eng._in_flight is None  # noqa: SLF001 - an idle engine has no step in flight
        m = eng.metrics  # the loop's time (bench's time_host_s); on a CPU the step is done when launched: no waits
        assert m.loop_seconds > 0 and m.step_wait_seconds == 0
        pool = eng.scheduler.pool
        assert len(pool.free) == len(pool.refs) - 1 and not any(pool.refs[1:])
    finally:
        eng.close()


@pytest.mark.skipif(triton_major() < 3, reason="needs Triton >= 3 (its interpreter on CPU)")
def test_fast_stack_equals_the_reference(eager_engine):
    # TTS_FEATURES=+fast_stack on CPU: steps of one or two rows run every fast layer at a position as the one
    # persistent kernel (interpreted, one program, fp32; native with grid barriers: tests/model/test_fast_stack.py);
    # steps of 3-4 rows the layer_gemv kernels; the tokens are the eager engine's
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4,
                                   features="fast_attention,layer_gemv,fast_stack"))
    try:
        r = eng.runner
        assert r.stack_rows == 2 and "fast_stack" in r.fused_in_use
        assert r.step_ops(2).frame.fast_stack is not None and r.step_ops(4).frame.fast_stack is None
        serve_all(eng, eager_engine, [SynthesisRequest(text=f"Stack {i}.", seed=90 + i, max_new_tokens=2 + 2 * i)
                                      for i in range(3)])
    finally:
        eng.close()


@pytest.mark.skipif(triton_major() < 3, reason="needs Triton >= 3 (its interpreter on CPU)")
def test_layer_gemv_rows_bound_the_steps_that_run_it(eager_engine):
    # TTS_LAYER_GEMV_ROWS: steps of up to that many rows run layer_gemv's kernels, larger ones the step's other ops;
    # three streams step at 3-4 rows (the other ops) and, as they end, at 1-2 (the kernels): the eager engine's tokens
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, layer_gemv_rows=2,
                                   features="fast_attention,layer_gemv"))
    try:
        r = eng.runner
        assert r.gemv_rows == 2 and "layer_gemv" in r.fused_in_use
        assert r.step_ops(2).slow_layer is r._gemv_layer and r.step_ops(3) is r.ops
        serve_all(eng, eager_engine, [SynthesisRequest(text=f"Rows {i}.", seed=70 + i, max_new_tokens=2 + 2 * i)
                                      for i in range(3)])
    finally:
        eng.close()


def test_split_attention_is_reported_only_where_it_runs():
    # split_attention shares the slow attention's pages in the 16-bit Triton kernel of layer_gemv; on CPU (fp32 cache,
    # the reference attention) a named split_attention is not among the kernels in use, and the step runs
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2,
                                   features="merged_ffn,split_attention"))
    try:
        assert eng.runner.splits == 1 and "split_attention" not in eng.runner.fused_in_use
        assert len(eng.submit(SynthesisRequest(text="Unsplit.", seed=3, max_new_tokens=3)).result().audio) > 0
    finally:
        eng.close()


@pytest.mark.skipif(triton_major() < 3, reason="needs Triton >= 3 (its interpreter on CPU)")
def test_pdl_named_where_it_cannot_run_is_dropped_with_a_warning(caplog):
    # programmatic dependent launch needs an sm_90+ GPU: on CPU (layer_gemv through the interpreter) a named pdl is
    # left out of the kernels in use (what the ready log and the bench report) with one warning, and the step runs
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    with caplog.at_level("WARNING"):
        eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2,
                                       features="fast_attention,layer_gemv,pdl"))
    try:
        assert not eng.runner.pdl and "layer_gemv" in eng.runner.fused_in_use
        assert "pdl" not in eng.runner.fused_in_use
        assert sum("pdl needs" in r.getMessage() for r in caplog.records) == 1
        assert len(eng.submit(SynthesisRequest(text="Plain launch.", seed=3, max_new_tokens=3)).result().audio) > 0
    finally:
        eng.close()


@pytest.mark.skipif(triton_major() < 3, reason="needs Triton >= 3 (its interpreter on CPU)")
def test_layer_gemv_equals_the_reference(eager_engine):
    # TTS_FEATURES=+layer_gemv on CPU: steps of up to 16 rows (auto, off an H100) run each layer as the five fused
    # kernels (Triton's interpreter here, fp32; the native kernels on the GPU, test_gpu_fused.py); buckets above run
    # the plain layers
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4,
                                   features="fast_attention,layer_gemv"))
    try:
        assert eng.runner.gemv_rows == 16 and eng.runner.step_ops(4).slow_layer is not eng.runner.ops.slow_layer
        serve_all(eng, eager_engine, [SynthesisRequest(text=f"Gemv {i}.", seed=80 + i, max_new_tokens=2 + 2 * i)
                                      for i in range(3)])
    finally:
        eng.close()


def test_streams_ending_together_share_their_last_codec_call(eager_engine):
    # the last audio of every job released in one step goes in one codec call per round (audio_feed.final_calls):
    # one call per stream, each followed by its reset and finish, left a queue of one-row calls behind the last step.
    # The audio still equals the whole decode of each stream's kept codes
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, features="-codec_rounds"))
    releases: list[tuple[int, int]] = []  # (jobs with audio left, codec calls queued while releasing them)
    decode, release = eng.vocoder.decode, eng._finished  # noqa: SLF001
    calls = []

    def counting_decode(slots, codes, deliveries):
        calls.append(len(slots))
        decode(slots, codes, deliveries)

    def counting_release(jobs):
        before = len(calls)
        left = sum(j.owner.kept > j.owner.decoded for j in jobs if j.finish_reason != "cancelled")
        release(jobs)
        releases.append((left, len(calls) - before))

    eng.vocoder.decode, eng._finished = counting_decode, counting_release  # noqa: SLF001
    try:
        plans = []
        for i in range(4):  # kept codes: the delivered audio is checked against their whole decode
            plan = eng.planner.plan(SynthesisRequest(text=f"Together {i}.", seed=90 + i, max_new_tokens=11))
            plan.keep_codes = True
            plans.append(plan)
        with eng.intake.cv:  # the loop takes all four in one intake: one prefill, the same last step
            streams = [eng.submit(p, ignore_stop=True) for p in plans]
        results = [s.result() for s in streams]
        assert [left for left, _ in releases] == [4] and [n for _, n in releases] == [1], releases
        for s, r in zip(streams, results):
            whole = eng.vocoder.whole(s.plan.codes)
            assert len(r.audio) == len(whole) == r.frames * eng.vocoder.frame_length
            assert np.abs(r.audio - whole).max() < AUDIO_TOL
    finally:
        eng.close()


def test_a_shared_final_call_pads_the_shorter_rows_without_changing_their_audio(engine):
    # AudioFeed.send(final=True) on tasks with 3, 8 and 5 frames left: one call of 8 frames, the 3- and
    # 5-frame rows zero-padded (audio_feed.pending_codes); each row's audio == the whole decode of its own frames
    from conftest import Recorder

    from ttsengine.engine.audio_feed import Task

    g = np.random.default_rng(11)
    cfg = engine.ckpt.config
    calls = []
    decode = engine.vocoder.decode

    def counting_decode(slots, codes, deliveries):
        calls.append((len(slots), codes.shape[-1]))
        decode(slots, codes, deliveries)

    tasks = []
    for slot, left in zip((1, 2, 3), (3, 8, 5)):
        frames = [np.concatenate([[0], g.integers(0, engine.ckpt.tokenizer.num_semantic, 1),
                                  g.integers(0, cfg.codebook_size, cfg.num_codebooks - 1)]) for _ in range(left + 1)]
        tasks.append(Task(stream=Recorder(), plan=None, index=0, prompt=None, context_dropped=False, frame_offset=0,
                          frames=frames, voc_slot=slot))  # kept = left (the last generated frame may be dropped)
    assert engine.open_streams == 0  # the shared engine is idle: slots 1-3 are free
    engine.vocoder.decode = counting_decode
    try:
        engine.audio.send(tasks, final=True)
    finally:
        engine.vocoder.decode = decode
    for t in tasks:
        engine.vocoder.reset(t.voc_slot)
    engine.vocoder.call(lambda: None)  # everything queued before it ran
    assert calls == [(3, 8)] and [t.decoded for t in tasks] == [3, 8, 5]
    for t in tasks:
        codes = np.stack(t.frames[:t.kept], axis=1)[1:]  # [n, kept]
        whole = engine.vocoder.whole([codes])
        (audio,) = t.stream.chunks
        assert audio.shape == whole.shape == (t.kept * engine.vocoder.frame_length,)
        assert np.abs(audio - whole).max() < AUDIO_TOL


@pytest.mark.parametrize("first_chunk", [64, 1])
def test_the_prefill_budget_holds_back_a_prompt_only_beside_streams_whose_audio_started(first_chunk):
    # A decodes, then B (a long prompt) arrives. While A's audio has not started nothing can stall: B goes in whole,
    # in one step. Once A's audio has started, B goes in the budget's chunks (made one page a step here)
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, first_chunk_frames=first_chunk))
    try:
        budget = eng.budget
        budget.step_seconds, budget.token_seconds = {b: 1.0 for b in eng.settings.buckets}, 1.0  # -> the floor
        budget.observe = lambda *a: None  # held there
        calls, playing, original = [], [], eng.runner.prefill

        def spy(items):  # on the engine's loop thread: what the budget saw
            calls.append([(it.start, it.stop) for it in items])
            playing.append(any(j.decoding and j.owner.playing for j in eng.scheduler.running))
            original(items)

        eng.runner.prefill = spy
        a = eng.submit(SynthesisRequest(text="Decoding first.", seed=1, max_new_tokens=400), ignore_stop=True)
        deadline = time.monotonic() + 60
        while (a.first_audio_at is None if first_chunk == 1 else
               not any(j.decoding for j in list(eng.scheduler.running))) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert (a.first_audio_at is None) == (first_chunk == 64)
        calls.clear()
        playing.clear()
        b = eng.submit(SynthesisRequest(text="A much longer prompt than a page of the cache. " * 2, seed=2,
                                        max_new_tokens=3))
        b.result()
        assert playing and all(p == (first_chunk == 1) for p in playing)  # A's audio had not started / had
        positions = calls[-1][0][1]  # B's prompt: its last call ends at its last prefilled position
        assert positions > budget.floor
        if first_chunk == 64:
            assert calls == [[(0, positions)]]
        else:
            assert len(calls) == -(-positions // budget.floor) and all(len(c) == 1 for c in calls)
        a.result()
    finally:
        eng.close()
