"""GPU equality tests (marker `gpu`; run on a CUDA machine: `python -m pytest -m gpu tests/engine/test_gpu.py`).

Eager is the reference. CUDA graphs replay the same kernels, so graphed tokens must equal eager
tokens exactly (bf16). torch.compile changes kernels: compared in fp32, where the tiny model's
tokens must still match exactly.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import asdict

import numpy as np
import pytest
import torch
from conftest import MODEL_DIR
from torch_helpers import no_tf32

from ttsengine import EagerEngine, Engine, EngineConfig, SynthesisRequest
from ttsengine.compat import precompile_supported
from ttsengine.engine.settings import codec_buckets

pytestmark = pytest.mark.gpu

REQUESTS = [
    SynthesisRequest(text="Hello there.", seed=1, max_new_tokens=40),
    SynthesisRequest(text="A second, rather longer sentence for the batch.", seed=2, max_new_tokens=64,
                     temperature=0.6, repetition_penalty=1.3),
    SynthesisRequest(text="Third.", seed=3, max_new_tokens=25, top_p=0.95),
    SynthesisRequest(text="Fourth one is here. " * 6, seed=4, max_new_tokens=20, chunk_length=60),
]


def tokens(engine_cfg: EngineConfig, stats: dict | None = None, waves: tuple = (REQUESTS,)) -> list:
    """Every generated frame of every text chunk of every request, recorded through the engine's tasks; the
    requests of a wave are submitted at once, a wave after the previous one ended. `stats` gets the engine's
    stats() (as a dict), the prefill graph keys it captured and the fused kernels it ran ("fused"). The first wave is
    queued before the engine's loop starts, so its first step holds every request of it in both runs compared: submitted
    to a running loop, which request steps alone first is a race, and int8's kernels are row-count dependent (issue 46:
    int8_step_diff.py found the eager run stepping request 0 alone where the graphed one stepped all four)."""
    eng = Engine.load(engine_cfg, start=False)
    seen: dict[int, list] = {}
    original = eng._close

    def spy(task, reason):
        seen.setdefault(id(task.stream), []).append(np.stack(task.frames) if task.frames else None)
        original(task, reason)

    eng._close = spy
    try:
        streams = []
        for n, wave in enumerate(waves):
            submitted = [eng.submit(r) for r in wave]
            if n == 0:
                eng.start()  # warms up (captures), then admits the queued wave together
            for s in submitted:
                s.result()
            streams += submitted
        if stats is not None:
            stats.update(asdict(eng.stats()))
            graphs = eng.runner.prefill_graphs
            stats["prefill_graph_keys"] = sorted(graphs.graphs) if graphs is not None else []
            stats["fused"] = eng.runner.fused_in_use
        return [seen[id(s)] for s in streams]
    finally:
        eng.close()


def cfg(**kw) -> EngineConfig:
    return EngineConfig(model_dir=MODEL_DIR, device="cuda", max_batch=8, **kw)


def test_triton_kernel_equals_reference_on_gpu():
    from ttsengine.model.kernels.paged_attention import PagedKV, paged_decode_reference, paged_write_decode_triton

    g = torch.Generator(device="cpu").manual_seed(0)
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        for H, Hk, d in ((16, 8, 128), (4, 2, 32), (8, 8, 64)):
            kv = PagedKV.empty(300, Hk, 64, d, dtype, "cuda")
            kv.k.copy_(torch.randn(kv.k.shape, generator=g))
            kv.v.copy_(torch.randn(kv.v.shape, generator=g))
            B = 37
            table = (torch.randperm(299, generator=g)[: B * 8].view(B, 8) + 1).to("cuda", torch.int32)
            pos = torch.randint(0, 8 * 64, (B,), generator=g).to("cuda")
            q = torch.randn(B, H, d, generator=g).to("cuda", dtype)
            k_new = torch.randn(B, Hk, d, generator=g).to("cuda", dtype)
            v_new = torch.randn(B, Hk, d, generator=g).to("cuda", dtype)
            ref = PagedKV(kv.k.clone(), kv.v.clone())
            ref.write(table, pos[:, None], k_new[:, None], v_new[:, None])
            want = paged_decode_reference(q, ref, table, (pos + 1).to(torch.int32)).float()
            got = paged_write_decode_triton(q, k_new, v_new, kv, table, pos).float()
            assert (got - want).abs().max().item() < tol, (dtype, H, Hk, d)
            assert torch.equal(kv.k, ref.k) and torch.equal(kv.v, ref.v)


@pytest.mark.parametrize("lazy", [True, False])
def test_graphs_equal_eager_tokens_bf16(lazy):
    # lazy: only batch 1 is captured before ready; the 4 requests need batch 4 at once, which is then
    # run for real and recorded at first use (cuda_graphs.py), later buckets while idle or on first use
    graphed = tokens(cfg(features="+cuda_graphs,-compile" + ("" if lazy else ",-lazy_graphs")))
    eager = tokens(cfg(features="-cuda_graphs,-compile"))
    for g, e in zip(graphed, eager):
        assert len(g) == len(e) and all(np.array_equal(a, b) for a, b in zip(g, e))


def test_int8_graphs_equal_eager_tokens_bf16():
    # the fused int8 op (Triton GEMV at 1-2 rows, tiles at 4 and 8) replayed in graphs == run eagerly
    graphed = tokens(cfg(features="+cuda_graphs,-compile", quant="int8"))
    eager = tokens(cfg(features="-cuda_graphs,-compile", quant="int8"))
    for g, e in zip(graphed, eager):
        assert len(g) == len(e) and all(np.array_equal(a, b) for a, b in zip(g, e))


def test_compiled_graphs_equal_eager_tokens_fp32():
    compiled = tokens(cfg(features="+cuda_graphs,+compile", dtype="float32", codec_dtype="float32"))
    eager = tokens(cfg(features="-cuda_graphs,-compile", dtype="float32", codec_dtype="float32"))
    for c, e in zip(compiled, eager):
        assert len(c) == len(e) and all(np.array_equal(a, b) for a, b in zip(c, e))


@pytest.mark.skipif(not precompile_supported(), reason="torch's AOT precompile needs torch >= 2.10")
def test_precompiled_graphs_equal_eager_tokens_fp32(tmp_path):
    # first engine: traces, compiles and saves the units; second: loads them (no trace), same tokens
    config = cfg(features="+cuda_graphs,+compile,-kernels", dtype="float32", codec_dtype="float32",
                 cache_dir=tmp_path)  # every unit traced (the fused sampler replaces the codebooks' sample unit)
    first, second = {}, {}
    traced = tokens(config, first)
    saved = sorted(p.name for p in tmp_path.glob("precompiled-*/*.pt2"))
    # each unit twice: its size-1 variant (the one-row bucket, one_row_bucket) and its dynamic one (2 and up);
    # sampling for two shape families (the vocabulary, a codebook)
    units = Counter(name.split(".")[0] for name in saved)
    assert units == {"fast_head": 2, "fast_layer": 2, "sample": 4, "slow_layer": 2}, saved
    loaded = tokens(config, second)
    n = len(saved)
    assert (first["precompiled"], second["precompiled"]) == (f"0 loaded, {n} traced", f"{n} loaded, 0 traced")
    eager = tokens(cfg(features="-cuda_graphs,-compile", dtype="float32", codec_dtype="float32"))
    for t, lo, e in zip(traced, loaded, eager):
        assert len(t) == len(lo) == len(e)
        assert all(np.array_equal(a, b) and np.array_equal(b, c) for a, b, c in zip(t, lo, e))


@pytest.fixture
def exact_fp32():
    # exact fp32 convs and matmuls (TF32 would put ~1e-3 differences between streamed and whole decode);
    # compat's context manager, because monkeypatch cannot undo torch 2.11's allow_tf32 property
    with no_tf32():
        yield


def test_batched_gpu_engine_equals_reference_engine_fp32(exact_fp32):
    config = cfg(features="+cuda_graphs,-compile", dtype="float32", codec_dtype="float32")
    # the references first: run beside the engine, the eager codec's kernels can land inside a graph the engine's
    # codec thread captures while idle (CUDA refuses other work in a global-mode capture: the test failed so)
    ref = EagerEngine.load(config)
    wants = [ref.synthesize(req) for req in REQUESTS]
    eng = Engine.load(config)
    try:
        streams = [eng.submit(r) for r in REQUESTS]
        for want, s in zip(wants, streams):
            got = s.result()
            assert [(c.frames, c.finish_reason) for c in got.chunks] == \
                   [(c.frames, c.finish_reason) for c in want.chunks]
            assert np.abs(got.audio - want.audio).max() < 1e-3
    finally:
        eng.close()


def test_lazy_start_fills_in_codec_graphs_and_matches_eager(exact_fp32):
    # lazy start-up: the codec's smallest batch is captured before ready, the others while idle (or at
    # first use); then a concurrent batch through every graph equals the graph-free engine's audio
    # with the default cudnn_tuning: cuDNN autotunes inside the codec's capture windows only
    config = cfg(features="+cuda_graphs,-compile", dtype="float32", codec_dtype="float32")
    eng = Engine.load(config)
    try:
        assert eng.settings.cudnn_autotune == "graphs" and not torch.backends.cudnn.benchmark
        # the codec's graph rows: the batch buckets 1, 2, 4, 8, or 1, 4, 8 with codec_sparse_rows (on by default)
        rows = codec_buckets((1, 2, 4, 8), eng.settings.codec.sparse_rows)
        planned = {(r, s) for r in rows for s in (4, 8)}
        assert set(eng.vocoder.graphs.graphs) <= {(1, 4), (1, 8)} or not eng.settings.lazy_graphs
        assert eng.settle(timeout=60) and set(eng.vocoder.graphs.graphs) == planned and not eng.device.graphs.pending
        assert eng.stats().graphs_pending == 0  # what /ready waits for (TTS_READY_WHEN=settled)
        prefill = eng.runner.prefill_graphs  # every padded prefill shape captured while idle
        assert prefill is not None and prefill.planned and set(prefill.graphs) == set(prefill.planned)
        got = [s.result() for s in [eng.submit(r) for r in REQUESTS]]
    finally:
        eng.close()
    plain = Engine.load(config.with_(features="-cuda_graphs,-compile"))
    try:
        want = [s.result() for s in [plain.submit(r) for r in REQUESTS]]
    finally:
        plain.close()
    for g, w in zip(got, want):
        assert g.audio.shape == w.audio.shape and np.abs(g.audio - w.audio).max() < 1e-3


def test_compiled_codec_graphs_equal_eager_codec_fp32(exact_fp32):
    # codec_compile on: one static-shape compile per (rows, chunk) key, replayed in graphs; slots join
    # and leave between chunks, so state rows move through compiled gathers and scatters
    import threading

    from ttsengine.engine.device.vocoder import Vocoder
    from ttsengine.engine.loader import load

    codec = load(cfg(dtype="float32", codec_dtype="float32")).codec
    g = torch.Generator(device="cpu").manual_seed(3)
    codes = torch.cat([torch.randint(0, 32, (4, 1, 24), generator=g), torch.randint(0, 16, (4, 3, 24), generator=g)],
                      dim=1).cuda()
    schedule = [([0, 1, 2], 0, 8), ([0, 2, 3], 8, 8), ([1, 3], 16, 8)]  # (slots, first frame, frames) per chunk

    def run(compiled: bool) -> list:
        voc = Vocoder(codec, 4, 4096, (8,), (1, 4), threading.RLock(), lambda f, s: None, lambda s: None)
        if compiled:
            voc.enable_compile()
        voc.plan_graphs(4)
        return _decode_on_worker(voc, schedule, codes)

    _assert_same_chunks(run(True), run(False))


def _decode_on_worker(voc, schedule: list, codes: torch.Tensor, capture: bool = False) -> list:
    """Each (slots, first frame, frames) chunk of `schedule` decoded by `voc` on its worker thread (its planned graphs
    captured first when `capture`; else recorded at first use), fp32 without TF32 -> the chunks' audio; closes it."""
    out: list = []

    def body():
        if capture:
            voc.capture()
        for slots, f, n in schedule:
            out.append(voc.decode_padded(slots, codes[slots, :, f:f + n]).clone())
        torch.cuda.current_stream().synchronize()  # the worker's stream: done before another stream reads
    try:
        with torch.inference_mode(), no_tf32():
            voc.call(body)
        return out
    finally:
        voc.close()


def _assert_same_chunks(got: list, want: list, tol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and (a - b).abs().max().item() < tol


def test_codec_batch_past_the_largest_graph_keeps_each_rows_audio():
    # 5 rows with graphs of at most 2: pieces of 2, 2 and 1 rows, the first two replays of one graph whose static
    # output the second overwrites; each piece is copied out before the next replay (a cat of the pieces' views after
    # all replays gave rows 0-1 the audio of rows 2-3). Against the same rows decoded uncaptured in one call
    import threading

    from ttsengine.engine.device.vocoder import Vocoder
    from ttsengine.engine.loader import load

    codec = load(cfg(dtype="float32", codec_dtype="float32")).codec
    g = torch.Generator(device="cpu").manual_seed(4)
    codes = torch.cat([torch.randint(0, 32, (5, 1, 8), generator=g), torch.randint(0, 16, (5, 3, 8), generator=g)],
                      dim=1).cuda()

    def decode(graph_rows: int) -> torch.Tensor:
        voc = Vocoder(codec, 5, 4096, (8,), (1, 2), threading.RLock(), lambda f, s: None, lambda s: None)
        voc.plan_graphs(graph_rows)
        out: list = []

        def body():
            if graph_rows:
                voc.capture()
            out.append(voc.decode_padded([4, 0, 3, 1, 2], codes).clone())
            torch.cuda.current_stream().synchronize()
        try:
            with torch.inference_mode(), no_tf32():
                voc.call(body)
            return out[0]
        finally:
            voc.close()

    pieces, whole = decode(2), decode(0)
    assert pieces.shape == whole.shape and (pieces - whole).abs().max().item() < 1e-4
    assert (whole[:2] - whole[2:4]).abs().max().item() > 1e-2  # distinct rows: the aliasing would show


def test_codec_kv_ring_in_graphs_equals_the_plain_codec_fp32(exact_fp32):
    # codec_kv_ring: the transformer's keys and values written in place into each row's ring inside the captured
    # graphs (slots join and leave; 32 frames wrap the tiny codec's ring of 3 + 8 several times), against the plain
    # state decoded uncaptured
    import threading

    from ttsengine.engine.device.vocoder import Vocoder
    from ttsengine.engine.loader import load

    codec = load(cfg(dtype="float32", codec_dtype="float32")).codec
    g = torch.Generator(device="cpu").manual_seed(5)
    codes = torch.cat([torch.randint(0, 32, (4, 1, 32), generator=g), torch.randint(0, 16, (4, 3, 32), generator=g)],
                      dim=1).cuda()
    schedule = [([0, 1, 2], 0, 8), ([0, 2, 3], 8, 8), ([1, 3], 16, 8), ([0, 1, 2, 3], 24, 8)]

    def run(ring: bool, graphs: bool) -> list:
        voc = Vocoder(codec, 4, 4096, (8,), (1, 2, 4), threading.RLock(), lambda f, s: None, lambda s: None,
                      kv_ring=ring)
        voc.plan_graphs(4 if graphs else 0)
        return _decode_on_worker(voc, schedule, codes, capture=graphs)

    _assert_same_chunks(run(True, True), run(False, False))


@pytest.mark.parametrize("fused", [False, True], ids=["own_convs", "fused_convs"])
def test_own_convs_in_graphs_equal_cudnns_codec_fp32(exact_fp32, fused):
    # codec_own_convs: the time-major codec's convs as the Triton implicit GEMM / cuBLAS inside captured graphs (the
    # engine's path), against the same codec on cuDNN's convs uncaptured; fp32 without TF32 on either side; fused:
    # with codec_fused_convs' epilogues (Snake and the residual sum in the convs' stores)
    import threading

    from ttsengine.engine.device.vocoder import Vocoder
    from ttsengine.engine.loader import load

    codec = load(cfg(dtype="float32", codec_dtype="float32")).codec
    g = torch.Generator(device="cpu").manual_seed(6)
    codes = torch.cat([torch.randint(0, 32, (3, 1, 24), generator=g), torch.randint(0, 16, (3, 3, 24), generator=g)],
                      dim=1).cuda()

    def run(own: bool) -> list:
        voc = Vocoder(codec, 3, 4096, (4, 8), (1, 2, 4), threading.RLock(), lambda f, s: None, lambda s: None,
                      time_major=True, kv_ring=True)
        if own:
            voc.use_own_convs(fused)
        voc.plan_graphs(4 if own else 0)
        return _decode_on_worker(voc, [([0, 1, 2], 0, 4), ([0, 2], 4, 8), ([0, 1, 2], 12, 8)], codes, capture=own)

    _assert_same_chunks(run(True), run(False))


@pytest.mark.parametrize("ring", [0, 8], ids=["plain", "kv_ring"])
@pytest.mark.parametrize("time_major", [False, True, "own", "fused"],
                         ids=["channels", "time_major", "own_convs", "fused_convs"])
def test_streaming_decode_bf16_adds_no_error_beyond_bf16(time_major, ring):
    """Streamed and whole decodes in bf16, each against an fp32 whole decode: streaming must not be
    noticeably worse than bf16 itself (SNR within 1 dB), channel-major or time-major (channels-last cuDNN convs,
    the Triton time-major Snake)."""
    from ttsengine.engine.loader import load
    from ttsengine.model.codec.streaming import StreamingCodec

    g = torch.Generator(device="cpu").manual_seed(1)
    codes = torch.cat([torch.randint(0, 32, (3, 1, 40), generator=g), torch.randint(0, 16, (3, 3, 40), generator=g)],
                      dim=1).cuda()

    def snr(x, ref):
        return 10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum()).item()

    with torch.inference_mode():
        ref = load(cfg(codec_dtype="float32")).codec.decode(codes)[:, 0].float()
        codec = load(cfg(codec_dtype="bfloat16")).codec
        whole = codec.decode(codes)[:, 0].float()
        dec = StreamingCodec(codec, 4, 4096, time_major=bool(time_major), ring_chunk=ring)
        if time_major in ("own", "fused"):  # codec_own_convs: the Triton implicit GEMM and cuBLAS, no cuDNN conv
            from ttsengine.model.codec.own_convs import OwnConvs

            dec.own_convs = OwnConvs(kernel=True, fused=time_major == "fused")  # fused: codec_fused_convs
        if time_major:
            from ttsengine.model.kernels.codec.snake import snake_triton_time_major

            dec.snake_time_major = snake_triton_time_major
        slots = torch.tensor([0, 2, 3], device="cuda")
        streamed = torch.cat([dec.codes_to_audio(slots, codes[:, :, i:i + 8]) for i in range(0, 40, 8)], -1).float()
    assert streamed.shape == whole.shape
    assert snr(whole, ref) > 20, snr(whole, ref)
    assert snr(streamed, ref) > snr(whole, ref) - 1.0, (snr(streamed, ref), snr(whole, ref))


@pytest.mark.parametrize("shape", [(768, 768, 7, 9), (96, 1, 7, 1), (1024, 1536, 7, 1), (192, 192, 7, 3)],
                         ids=["768-d9", "96-to-1", "1024-1536", "192-d3"])
def test_own_conv_kernel_equals_cudnn(shape):
    """The codec's dense convs (feature codec_own_convs: model/kernels/codec/conv.py) against cuDNN's on the
    same inputs, fp32 (no TF32 on either side) and bf16 (both accumulate in fp32: within a few bf16 roundings),
    from a view of a wider buffer and at 1 and 64 rows."""
    import torch.nn.functional as F

    from ttsengine.model.kernels.codec.conv import conv_time_major

    ci, co, k, d = shape
    g = torch.Generator(device="cpu").manual_seed(ci + co)
    w32, b32 = torch.randn(co, ci, k, generator=g) / (ci * k) ** 0.5, torch.randn(co, generator=g)
    with no_tf32():
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            w, b = w32.to("cuda", dtype), b32.to("cuda", dtype)
            for rows, n in ((1, 4 * 8), (64, 130)):
                x = torch.randn(rows, 3 + n + (k - 1) * d, ci, generator=g).to("cuda", dtype)[:, 3:]
                want = F.conv1d(x.transpose(1, 2).float(), w.float(), b.float(), dilation=d).transpose(1, 2)
                got = conv_time_major(x, w.permute(2, 1, 0).contiguous(), d, b)
                _assert_close(got, want, dtype, tol, rows)


@pytest.mark.parametrize("shape", [(1536, 768, 16, 8), (384, 192, 8, 4), (192, 96, 4, 2), (1024, 1024, 2, 2)],
                         ids=["1536-768-s8", "384-192-s4", "192-96-s2", "1024-s2"])
def test_own_transposed_conv_equals_cudnn(shape):
    """The codec's upsampling convs (feature codec_own_convs: OwnConvs.conv_transposed, on CUDA the dense conv kernel
    over the input read with k/s - 1 zeros each side) against cuDNN's, fp32 without TF32 and bf16, at 1 and 64 rows."""
    import torch.nn.functional as F

    from ttsengine.model.codec.own_convs import OwnConvs

    ci, co, k, s = shape
    g = torch.Generator(device="cpu").manual_seed(ci + k)
    conv32 = torch.nn.ConvTranspose1d(ci, co, k, stride=s)
    with torch.no_grad():
        conv32.weight.copy_(torch.randn(ci, co, k, generator=g) / (ci * k / s) ** 0.5)
    with no_tf32():
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            conv = copy.deepcopy(conv32).to("cuda", dtype)
            for rows, n in ((1, 8), (64, 66)):
                x = torch.randn(rows, 2 + n, ci, generator=g).to("cuda", dtype)[:, 2:]
                with torch.inference_mode():
                    want = F.conv_transpose1d(x.transpose(1, 2).float(), conv.weight.float(), None, stride=s)
                    got = OwnConvs(kernel=True).conv_transposed(conv, x)
                _assert_close(got, want.transpose(1, 2), dtype, tol, rows)


def _assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, tol: float, rows: int) -> None:
    """got (in dtype) against an fp32 reference, within tol of its largest magnitude."""
    assert got.dtype == dtype and got.shape == want.shape
    err = (got.float() - want.float()).abs().max().item()
    assert err < tol * (1 + want.abs().max().item()), (dtype, rows, err)


@pytest.mark.parametrize("shape", [(96, 96, 7, 9), (192, 192, 1, 1), (768, 768, 7, 3), (384, 384, 1, 1)],
                         ids=["96-d9-snake", "192-1tap-residual", "768-d3-snake", "384-1tap-residual"])
def test_fused_conv_epilogues_equal_the_ops_they_replace(shape):
    """codec_fused_convs: the kernel storing snake(conv + bias) (7-tap convs) or r + (conv + bias) (1-tap) against the
    same kernel's plain output followed by the Triton Snake / residual kernels: the same roundings, so equal up to the
    sine's ulp in bf16 and fp32."""
    from ttsengine.model.kernels.codec.conv import conv_time_major
    from ttsengine.model.kernels.codec.snake import residual_bias_triton, snake_triton_time_major

    ci, co, k, d = shape
    g = torch.Generator(device="cpu").manual_seed(ci + k)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        w = (torch.randn(k, ci, co, generator=g) / (ci * k) ** 0.5).to("cuda", dtype)
        b = torch.randn(co, generator=g).to("cuda", dtype)
        for rows, n in ((1, 32), (64, 130)):
            x = torch.randn(rows, 3 + n + (k - 1) * d, ci, generator=g).to("cuda", dtype)[:, 3:]
            plain = conv_time_major(x, w, d)
            if k > 1:
                alpha = (torch.rand(co, generator=g) * 2 + 0.05).to("cuda", dtype)
                got = conv_time_major(x, w, d, b, snake_alpha=alpha)
                want = snake_triton_time_major(plain, alpha.reshape(1, co, 1), bias=b)
            else:
                r = torch.randn(plain.shape, generator=g).to("cuda", dtype)
                got = conv_time_major(x, w, d, b, residual=r)
                want = residual_bias_triton(r, plain, b)
            _assert_close(got, want, dtype, tol, rows)


def _assert_snake_kernel(kernel, reference, shapes, channel_dim: int, g) -> None:
    """The Triton Snake `kernel` against its fp32 `reference` (either layout: the channels on `channel_dim` of each
    shape), fp32 and bf16, within the sine approximation's tolerance."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for shape in shapes:
            x = (torch.randn(*shape, generator=g) * 3).to("cuda", dtype)
            alpha = (torch.rand(1, shape[channel_dim], 1, generator=g) * 2 + 0.05).to("cuda", dtype)
            want = reference(x.float(), alpha.float())
            got = kernel(x, alpha)
            assert got.dtype == dtype and got.shape == x.shape
            assert (got.float() - want).abs().max().item() < tol * (1 + want.abs().max().item()), (dtype, shape)


def test_snake_kernel_time_major_equals_snake():
    from ttsengine.model.codec.conv import snake_time_major
    from ttsengine.model.kernels.codec.snake import snake_triton_time_major

    g = torch.Generator(device="cpu").manual_seed(3)
    # [B, L, C]: channels last
    _assert_snake_kernel(snake_triton_time_major, snake_time_major, ((1, 5, 3), (3, 2500, 64), (2, 33, 1536)), 2, g)
    x = torch.randn(3, 700, 64, generator=g).to("cuda", torch.bfloat16)
    alpha = (torch.rand(1, 64, 1, generator=g) + 0.1).to("cuda", torch.bfloat16)
    buf = torch.full((3, 18 + 700, 64), 7.0, device="cuda", dtype=torch.bfloat16)
    assert snake_triton_time_major(x, alpha, out=buf[:, 18:]).data_ptr() == buf[:, 18:].data_ptr()
    assert torch.equal(buf[:, 18:], snake_triton_time_major(x, alpha)) and bool((buf[:, :18] == 7).all())
    with pytest.raises(ValueError, match="does not fit"):
        snake_triton_time_major(x, alpha, out=buf[:, 18:].transpose(1, 2).transpose(1, 2)[:, ::2])
    # a conv's bias folded in (snake(x + bias)), and a residual unit's skip sum with its bias: each add rounded
    # as the eager adds round, so bf16 results differ from eager only by the sine's approximation
    from ttsengine.model.codec.conv import residual_bias
    from ttsengine.model.kernels.codec.snake import residual_bias_triton

    bias = torch.randn(64, generator=g).to("cuda", torch.bfloat16)
    want = snake_time_major(x, alpha, bias=bias).float()
    got = snake_triton_time_major(x, alpha, bias=bias).float()
    assert (got - want).abs().max().item() < 2e-2 * (1 + want.abs().max().item())
    y = torch.randn(3, 700, 64, generator=g).to("cuda", torch.bfloat16)
    assert torch.equal(residual_bias_triton(x, y, bias), residual_bias(x, y, bias))
    with pytest.raises(ValueError, match="do not fit"):
        residual_bias_triton(x, y[:, :5], bias)


def test_snake_kernel_equals_snake():
    from ttsengine.model.codec.conv import snake
    from ttsengine.model.kernels.codec.snake import snake_triton

    g = torch.Generator(device="cpu").manual_seed(2)
    _assert_snake_kernel(snake_triton, snake, ((1, 3, 5), (3, 64, 2500), (2, 1536, 33)), 1, g)  # [B, C, L]
    # into the tail of a wider buffer (the streaming codec's conv history sits in front), head untouched
    x = torch.randn(3, 64, 700, generator=g).to("cuda", torch.bfloat16)
    alpha = (torch.rand(1, 64, 1, generator=g) + 0.1).to("cuda", torch.bfloat16)
    buf = torch.full((3, 64, 18 + 700), 7.0, device="cuda", dtype=torch.bfloat16)
    assert snake_triton(x, alpha, out=buf[..., 18:]).data_ptr() == buf[..., 18:].data_ptr()
    assert torch.equal(buf[..., 18:], snake_triton(x, alpha)) and bool((buf[..., :18] == 7).all())
    with pytest.raises(ValueError, match="does not fit"):
        snake_triton(x, alpha, out=buf[..., 18:].transpose(0, 1))
    x = torch.randn(2, 8, 100, device="cuda").transpose(1, 2)  # non-contiguous input
    alpha = torch.rand(1, 100, 1, device="cuda") + 0.1
    assert torch.allclose(snake_triton(x, alpha), snake(x, alpha), atol=1e-5)


@pytest.mark.parametrize("relayed", [False, True], ids=["queued", "relayed"])
def test_pinned_audio_copy_delivers_what_the_plain_copy_does(relayed):
    # codec_pinned_copy: the codec's audio reaches the host through one pinned staging buffer that each call
    # overwrites (it grows for a larger call): every chunk delivered must be its own copy (queued streams) or a view
    # of its call's own copy of the block (relayed streams: the engine process's), equal to the plain copy's bit for
    # bit (the same kernels; only the copy differs)
    import threading

    from ttsengine.engine.device.vocoder import Delivery, Vocoder
    from ttsengine.engine.loader import load

    codec = load(cfg()).codec  # bf16: the conversion to float32 is part of the copy
    calls = [([0, 1], 8), ([0, 1, 2, 3], 8), ([2], 5)]  # (slots, real frames): the buffer grows, then is reused

    class Keep:
        def __init__(self):
            self.chunks = []
            self.relayed = relayed

        def emit(self, audio, text_index):
            self.chunks.append(audio)  # kept as delivered: a view into a reused buffer would change later

    def run(pinned: bool) -> list:
        voc = Vocoder(codec, 4, 4096, (8,), (1, 2, 4), threading.RLock(), lambda f, s: None, lambda s: None)
        voc.pinned_copy = pinned
        out = [Keep() for _ in range(4)]
        rng = np.random.default_rng(5)
        for slots, frames in calls:
            codes = np.concatenate([rng.integers(0, 32, (len(slots), 1, 8)), rng.integers(0, 16, (len(slots), 3, 8))],
                                   axis=1)
            voc.decode(slots, codes, [Delivery(out[s], 0, frames) for s in slots])
        voc.call(lambda: None)
        voc.close()
        return [np.concatenate(k.chunks) if k.chunks else np.zeros(0) for k in out]

    pinned, plain = run(True), run(False)
    for a, b in zip(pinned, plain):  # the staging buffer was overwritten by later calls meanwhile
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.array_equal(a, b)
    assert pinned[2].shape == ((8 + 5) * codec.frame_length,)
