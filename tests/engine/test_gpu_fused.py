"""The decode step's fused kernels (TTS_FEATURES) against the unfused path on the GPU (marker `gpu`).

fp32: tokens must be equal exactly. bf16: the fused kernels round differently from the unfused ones (the
attention's dot products run on tensor cores in bf16, the sampler keeps every probability tied at the
top-p cut where the reference's unstable sort keeps some), so the kernels are compared at a tolerance and
the draws on bf16 logits must agree on >= 99% of rows.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import MODEL_DIR
from real_block import real_block
from test_gpu import REQUESTS, cfg, tokens
from torch_helpers import no_tf32

from ttsengine import SynthesisRequest
from ttsengine.model.frame import sample_token
from ttsengine.model.kernels.codebook_sampler import sample_codebook_triton
from ttsengine.model.kernels.paged_attention import PagedKV, paged_decode_reference, paged_write_decode_triton
from ttsengine.model.kernels.vocab_sampler import sample_vocab_triton
from ttsengine.model.sampling import SamplingTensors

pytestmark = pytest.mark.gpu


def draws(B, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, V, generator=g) * 4).to("cuda", dtype)
    p = SamplingTensors.from_values([(0.3 + 0.9 * torch.rand(1, generator=g).item(),
                                      0.5 + 0.5 * torch.rand(1, generator=g).item(),
                                      1.0 + 0.5 * torch.rand(1, generator=g).item(), 1000 + i) for i in range(B)],
                                    "cuda")
    ids = torch.randint(0, min(V, 1024), (B, 16), generator=g).to("cuda")
    counter = torch.randint(0, 2**40, (B,), generator=g).to("cuda")
    args = (p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi, counter)
    return sample_codebook_triton(logits, *args), sample_token(logits, *args)


@pytest.mark.parametrize("V", [1024, 4096, 160])
def test_codebook_sampler_equals_the_reference_fp32(V):
    for seed in range(4):
        got, want = draws(512, V, torch.float32, seed)
        assert torch.equal(got, want), (got != want).nonzero()


def test_codebook_sampler_agrees_on_bf16_logits():
    got, want = draws(4096, 1024, torch.bfloat16, 0)
    assert (got == want).float().mean().item() >= 0.99


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vocab_sampler_equals_the_reference(dtype):
    # the slow token over the real 155,776-wide vocabulary, 384 rows: flat (random weights), middling and peaked
    # logits, windows of 11 ids (a third of them the rows' best ids). The kept set is the rule's exactly (the cut
    # against a float64 reference, rows whose decision is within fp32 rounding of top_p aside); the draws equal the
    # sorted reference with its cut extended to ties (16-bit logits tie often: the plain sorted reference keeps some
    # of the entries tied at its cut); every row draws the same alone as in the batch, and again in a second call
    from top_p_reference import reference_cut, with_ties

    from ttsengine.model.kernels.vocab_sampler import top_p_cut
    from ttsengine.model.sampling import apply_repetition_penalty

    g = torch.Generator().manual_seed(11)
    B, V = 384, 155_776
    logits = torch.randn(B, V, generator=g) * torch.tensor([0.3, 2.0, 8.0]).repeat(B // 3)[:, None]
    logits = logits.to("cuda", dtype)
    p = SamplingTensors.from_values([(0.3 + 0.9 * torch.rand(1, generator=g).item(),
                                      0.3 + 0.7 * torch.rand(1, generator=g).item(),
                                      1.0 + 0.5 * torch.rand(1, generator=g).item(), 7 + i) for i in range(B)], "cuda")
    ids = torch.randint(0, V, (B, 11), generator=g).to("cuda")
    ids[::3] = logits[::3].float().topk(11, dim=1).indices
    counter = torch.randint(0, 2**40, (B,), generator=g).to("cuda")
    args = (p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi, counter)
    want_cut, margin = reference_cut(apply_repetition_penalty(logits.float(), ids, p.repetition_penalty), p.top_p)
    got_cut = top_p_cut(logits, p.top_p, p.repetition_penalty, ids).cpu().double()
    clear = margin > 2e-6  # fp32 sums of ~1.0 in two orders: ~1e-7 apart
    assert clear.float().mean().item() >= 0.9 and torch.equal(got_cut[clear], want_cut[clear])
    got, (want, _) = sample_vocab_triton(logits, *args), with_ties(logits, p, ids, counter)
    assert (got == want).float().mean().item() >= 0.995, (got != want).nonzero()
    far = (margin > 1e-4).to(got.device)  # no fp32 sum of either side can move these rows' cuts
    assert far.float().mean().item() >= 0.3 and torch.equal(got[far], want[far]), (got != want).nonzero()
    assert torch.equal(sample_vocab_triton(logits, *args), got)
    for b in (0, 1, 2, 200):
        alone = sample_vocab_triton(logits[b:b + 1], *(a[b:b + 1] for a in args))
        assert alone.item() == got[b].item(), b


def test_paged_kernel_as_the_fast_layers_attention():
    # the fast cache [B, Hk, 16, d] as a pool of B one-page rows, positions 0..9 (the real config: 16/8/64)
    g = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
        B, H, Hk, d, L = 64, 16, 8, 64, 16
        for p in range(10):
            kv = PagedKV.empty(B, Hk, L, d, dtype, "cuda")
            kv.k.copy_(torch.randn(kv.k.shape, generator=g))
            kv.v.copy_(torch.randn(kv.v.shape, generator=g))
            table = torch.arange(B, device="cuda", dtype=torch.int32)[:, None]
            pos = torch.full((B,), p, device="cuda")
            q, k_new, v_new = (torch.randn(B, h, d, generator=g).to("cuda", dtype) for h in (H, Hk, Hk))
            ref = PagedKV(kv.k.clone(), kv.v.clone())
            ref.write(table, pos[:, None], k_new[:, None], v_new[:, None])
            want = paged_decode_reference(q, ref, table, (pos + 1).to(torch.int32)).float()
            got = paged_write_decode_triton(q, k_new, v_new, kv, table, pos).float()
            assert (got - want).abs().max().item() < tol, (dtype, p)
            assert torch.equal(kv.k, ref.k) and torch.equal(kv.v, ref.v)


@pytest.mark.parametrize("graphs,compile_", [("+", "+"), ("-", "-")])
def test_fused_step_equals_unfused_tokens_fp32(graphs, compile_):
    # fp32 caches: the fast attention runs its reference path inside the fused layer (the Triton kernel is
    # 16-bit), the codebook sampler its kernel, W1|W3 one matmul; compiled units + graphs and eager both
    with no_tf32():
        fused = tokens(cfg(features=f"{graphs}cuda_graphs,{compile_}compile,-kernels,+fast_attention,+codebook_sampler,"
                                    "+vocab_scan,+merged_ffn", dtype="float32", codec_dtype="float32"))
        plain = tokens(cfg(features="-cuda_graphs,-compile,-kernels", dtype="float32", codec_dtype="float32"))
    assert len(fused) == len(REQUESTS)
    for f, e in zip(fused, plain):
        assert len(f) == len(e) and all(np.array_equal(a, b) for a, b in zip(f, e))


def test_fused_bf16_graphs_equal_fused_bf16_eager():
    # every fused piece (auto, bf16: the fast attention's Triton kernel too) replayed in graphs == run eagerly
    graphed = tokens(cfg(features="+cuda_graphs,-compile"))
    eager = tokens(cfg(features="-cuda_graphs,-compile"))
    for g, e in zip(graphed, eager):
        assert len(g) == len(e) and all(np.array_equal(a, b) for a, b in zip(g, e))


@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_gemv_layer_close_to_the_unfused_layer(quant, fast):
    # layer_gemv (model/fused_layer.py) at 1, 2, 16 and 64 rows (TTS_LAYER_GEMV_ROWS) against the unit it replaces
    # (make_slow_layer: the same weights through norm, linears, RoPE, the paged kernel and SwiGLU as separate ops).
    # Both round in bf16 at the same steps but sum in different orders: outputs agree to a few bf16 ulps of the
    # residual stream
    from ttsengine.engine.device.compile.units import make_slow_layer
    from ttsengine.model import fused_layer
    from ttsengine.model.kernels.paged_attention import write_and_attend_op
    from ttsengine.model.layers import rope_table

    layer, d = real_block(quant, fast)
    page = 16 if fast else 64
    rope_rows = rope_table(2048, d, 1_000_000.0, "cuda")
    unfused, fused = make_slow_layer(write_and_attend_op(), True), fused_layer.make_layer(True)
    assert fused_layer.layer_supported(layer)
    g = torch.Generator().manual_seed(5)
    for B in (1, 2, 16, 64):
        pages = 1 if fast else 4
        kv = PagedKV.empty(B * pages + 1, 8, page, d, torch.bfloat16, "cuda")
        kv.k.copy_(torch.randn(kv.k.shape, generator=g))
        kv.v.copy_(torch.randn(kv.v.shape, generator=g))
        table = (1 + torch.randperm(B * pages, generator=g)).view(B, pages).to("cuda", torch.int32)
        pos = torch.randint(0, page * pages, (B,), generator=g).to("cuda")
        x = torch.randn(B, 1, 1024, generator=g).to("cuda", torch.bfloat16)
        rope = rope_rows[pos][:, None]
        ref = PagedKV(kv.k.clone(), kv.v.clone())
        with torch.inference_mode():
            want = unfused(layer, x, rope, ref.k, ref.v, table, pos).float()
            got = fused(layer, x, rope, kv.k, kv.v, table, pos).float()
        scale = want.abs().max().item()
        assert got.shape == want.shape and (got - want).abs().max().item() <= 2 ** -6 * scale, (B, quant, fast)
        assert (got - want).abs().mean().item() <= 2 ** -10 * scale
        # the stored key and value come from qkv, which the two paths sum in different orders: ulps apart
        for mine, theirs in ((kv.k, ref.k), (kv.v, ref.v)):
            assert (mine.float() - theirs.float()).abs().max().item() <= 2 ** -5 * theirs.abs().max().item()


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_layer_gemv_graphs_equal_layer_gemv_eager(quant):
    # the fused layers (every step of the tiny model's <= 8 rows) replayed in CUDA graphs == run eagerly: the same
    # kernels, and none of them depends on the batch beside it
    fused = "-kernels,+fast_attention,+codebook_sampler,+vocab_scan,+merged_ffn,+layer_gemv"
    graphed = tokens(cfg(features="+cuda_graphs,-compile," + fused, quant=quant))
    eager = tokens(cfg(features="-cuda_graphs,-compile," + fused, quant=quant))
    for g, e in zip(graphed, eager):
        assert len(g) == len(e) and all(np.array_equal(a, b) for a, b in zip(g, e))


def test_split_attention_graphs_equal_eager_and_splits_run():
    # split_attention (the slow layers' pages shared by several programs per row and head, then a combine kernel):
    # replayed in CUDA graphs == run eagerly (the combine's scratch and the splits' partials live in the graph)
    fused = "-kernels,+fast_attention,+codebook_sampler,+vocab_scan,+merged_ffn,+layer_gemv,+split_attention"
    graphed = tokens(cfg(features="+cuda_graphs,-compile," + fused))
    eager = tokens(cfg(features="-cuda_graphs,-compile," + fused))
    for g, e in zip(graphed, eager):
        assert len(g) == len(e) and all(np.array_equal(a, b) for a, b in zip(g, e))


WIDE_WAVE = [SynthesisRequest(text=f"Stream {i} of a wide batch.", seed=40 + i, max_new_tokens=12 + i % 5)
             for i in range(20)]


@pytest.mark.parametrize("wide", [False, True], ids=["8", "wide"])
def test_layer_gemv_fp32_tokens_equal_unfused(wide):
    # fp32 (the attention's reference path; the GEMVs' fp32 dot products without TF32): the tiny model's tokens equal
    # the unfused engine's exactly, compiled units + graphs for the other pieces. wide: 20 streams at once in an
    # engine of 32 with layer_gemv up to 64 rows, so the steps run the 64-row tiles and their norm kernel
    kw = {"max_batch": 32, "layer_gemv_rows": 64} if wide else {}  # fp32: auto would give 16
    waves = (WIDE_WAVE,) if wide else (REQUESTS,)
    with no_tf32():
        fused = tokens(replace(cfg(features="+cuda_graphs,+compile,-kernels,+fast_attention,+codebook_sampler,"
                                            "+vocab_scan,+merged_ffn,+layer_gemv", dtype="float32",
                                   codec_dtype="float32"), **kw), waves=waves)
        plain = tokens(replace(cfg(features="-cuda_graphs,-compile,-kernels", dtype="float32", codec_dtype="float32"),
                               **kw), waves=waves)
    for f, e in zip(fused, plain):
        assert len(f) == len(e) and all(np.array_equal(a, b) for a, b in zip(f, e))


def _no_pdl_launch(monkeypatch):
    # the kernels keep pdl's tiles and weight prefetch but launch as usual: the reference for the launch itself
    from ttsengine.model.kernels import launch

    monkeypatch.setattr(launch, "pdl_runs", lambda device: False)  # what launch_options asks (the runner keeps pdl)


@pytest.mark.parametrize("B", [2, 8, 64])  # 64: the 64-row tile and its norm kernel (TTS_LAYER_GEMV_ROWS)
@pytest.mark.parametrize("quant", [False, True], ids=["bf16", "int8"])
def test_pdl_layers_equal_plain_layers_in_graphs(quant, B, monkeypatch):
    # layer_gemv's kernels launched as programmatic dependents (the feature pdl, kernels/launch.py), each
    # loading weights before it waits on the previous kernel: a chain of slow and fast layers (every kernel reads the
    # one before, each layer's second pass the cache slot its first wrote) replayed in a CUDA graph with new inputs
    # and positions every replay equals the same kernels launched as usual, bit for bit, replay by replay
    from ttsengine.model import fused_layer
    from ttsengine.model.kernels.launch import pdl_runs
    from ttsengine.model.layers import rope_table

    if not pdl_runs(torch.device("cuda")):
        pytest.skip("no programmatic dependent launch here (sm_90+, CUDA 12.3+ driver, Triton's gdc_wait)")
    blocks = [real_block(quant, fast) for fast in (False, True, True)]
    g = torch.Generator().manual_seed(7)
    pools0 = []
    for _, d in blocks:
        kv = PagedKV.empty(B + 1, 8, 64, d, torch.bfloat16, "cuda")
        kv.k.copy_(torch.randn(kv.k.shape, generator=g))
        kv.v.copy_(torch.randn(kv.v.shape, generator=g))
        pools0.append(kv)
    table = torch.arange(1, B + 1, device="cuda", dtype=torch.int32)[:, None]
    ropes = {d: rope_table(64, d, 1_000_000.0, "cuda") for _, d in blocks}
    inputs = [torch.randn(B, 1, 1024, generator=g).to("cuda", torch.bfloat16) for _ in range(6)]

    def run(launch_pdl: bool) -> tuple[list, list]:
        with monkeypatch.context() as m:
            if not launch_pdl:
                _no_pdl_launch(m)
            fn = fused_layer.make_layer(True, True)
            pools = [PagedKV(kv.k.clone(), kv.v.clone()) for kv in pools0]
            x = inputs[0].clone()
            # static: advanced in place between replays (6 replays x 2 from at most 34: inside the 64-slot page)
            pos = torch.arange(B, device="cuda") % 32 + 3

            def chain():
                y = x
                for (layer, d), kv in zip(blocks, pools):
                    for step in range(2):  # the second pass at pos + 1 attends over the slot the first wrote
                        p = pos + step
                        y = fn(layer, y, ropes[d][p][:, None], kv.k, kv.v, table, p)
                return y

            with torch.inference_mode():
                chain()  # compiles the kernels outside the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    y = chain()
                outs = []
                for inp in inputs:
                    x.copy_(inp)
                    graph.replay()
                    outs.append(y.clone())
                    pos.add_(2)
            torch.cuda.synchronize()
        return outs, pools

    (got, got_pools), (want, want_pools) = run(True), run(False)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), i
    for a, b in zip(got_pools, want_pools):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


def test_pdl_engine_tokens_equal_plain_engine(monkeypatch):
    # the whole engine, compiled units + CUDA graphs, its layer_gemv kernels launched as programmatic dependents or as
    # usual (the same tiles and loads): the same tokens
    from ttsengine.model.kernels.launch import pdl_runs

    if not pdl_runs(torch.device("cuda")):
        pytest.skip("no programmatic dependent launch here (sm_90+, CUDA 12.3+ driver, Triton's gdc_wait)")
    names = "-kernels,+fast_attention,+codebook_sampler,+vocab_scan,+merged_ffn,+layer_gemv,+pdl"
    stats: dict = {}
    with_pdl = tokens(cfg(features="+cuda_graphs,+compile," + names), stats)
    assert "pdl" in stats["fused"]
    with monkeypatch.context() as m:
        _no_pdl_launch(m)
        plain = tokens(cfg(features="+cuda_graphs,+compile," + names))
    for a, b in zip(with_pdl, plain):
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("scale", [False, True])
def test_step_glue_kernels_equal_the_eager_ops_bf16(scale, monkeypatch):
    # the step's input embedding + RoPE rows and its end (kernels/step_glue.py) against the eager ops on CUDA, bit
    # for bit: the scale as CUDA divides by a Python scalar (x * its float32 reciprocal)
    import dataclasses

    from step_glue_cases import last_frames, step_state

    from ttsengine import EngineConfig
    from ttsengine.engine.loader import load
    from ttsengine.model.kernels import step_glue
    from ttsengine.model.sampling import RepetitionWindow

    m = load(EngineConfig(model_dir=MODEL_DIR, device="cuda", dtype="bfloat16")).model
    monkeypatch.setattr(m, "cfg", dataclasses.replace(m.cfg, scale_codebook_embeddings=scale))
    for B, seed in ((1, 0), (9, 1), (64, 2)):
        frames, pos = (t.cuda() for t in last_frames(m, B, seed))
        x, rope = step_glue.step_inputs(m, frames, pos)
        want_x, want_rope = step_glue.step_inputs_reference(m, frames, pos)
        assert torch.equal(x, want_x) and torch.equal(rope, want_rope)
    args = [RepetitionWindow(a.frames.cuda(), a.count.cuda()) if isinstance(a, RepetitionWindow) else a.cuda()
            for a in step_state(6, 11, 16, seed=3)]
    clone = [RepetitionWindow(a.frames.clone(), a.count.clone()) if isinstance(a, RepetitionWindow) else a.clone()
             for a in args]
    step_glue.finish_step(*args[:3], args[3][:6], args[4][:6], args[5][:6], args[6][:6], args[7].view(6))
    step_glue.finish_step_reference(*clone[:3], clone[3][:6], clone[4][:6], clone[5][:6], clone[6][:6],
                                    clone[7].view(6))
    for got, want in zip(args, clone):
        if isinstance(got, RepetitionWindow):
            assert torch.equal(got.frames, want.frames) and torch.equal(got.count, want.count)
        else:
            assert torch.equal(got, want)


def test_step_glue_engine_tokens_equal_the_eager_glue():
    # the whole engine (bf16, graphs, the default fused kernels) with and without the glue kernels: the same tokens
    stats: dict = {}
    glued = tokens(cfg(features="+cuda_graphs,+compile"), stats)
    assert "step_glue" in stats["fused"]
    plain = tokens(cfg(features="+cuda_graphs,+compile,-step_glue"))  # every other default kernel as in `glued`
    for a, b in zip(glued, plain):
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
