"""The speed features' registry (engine/features.py): TTS_FEATURES read over the defaults, every feature's off switch,
the defaults as the engine resolved them before the registry, and no feature name spelled outside it."""

from __future__ import annotations

import ast
import itertools

import pytest
from conftest import ROOT

from ttsengine.engine import features as F
from ttsengine.engine.features import FEATURES, KERNELS, Platform, resolve

CORE = ROOT / "container" / "ttsengine"
REGISTRY = CORE / "engine" / "features.py"
# everything there is: an H100 with Triton 3, a 16-bit model, PDL, torch with compile and precompile
RICH = Platform(cuda=True, triton=True, triton_major=3, sixteen_bit=True, pdl=True, compile=True, precompile=True)


def platforms():
    for cuda, triton, major, sixteen, pdl, comp, pre in itertools.product(
            (False, True), (False, True), (0, 2, 3), (False, True), (False, True), (False, True), (False, True)):
        if triton or not major:  # a Triton version only where Triton imports
            yield Platform(cuda, triton, major, sixteen, pdl, comp, pre)


def before(p: Platform) -> set[str]:
    """The features the engine turned on with every switch at auto, as settings.py resolved them before the registry
    (graphs_and_compile, fused_kernels, codec_switches, BatchSettings.resolve and Engine.__init__'s precompile)."""
    graphs, compiled = p.cuda, p.cuda and p.compile
    on = {F.ONE_ROW_BUCKET, F.LAZY_GRAPHS, F.CODEC_MERGE, F.CODEC_ROUNDS, F.CODEC_PINNED_COPY, F.CODEC_CACHE}
    on |= {F.EARLY_READAHEAD}  # since stop 56, everywhere
    on |= {F.PLAIN_WEBSOCKET, F.DIRECT_ADMIT}  # since stops 57 and 58, everywhere
    on |= {F.PREFILL_FIT}  # since stop 59, everywhere
    on |= {F.OWN_GPU_VIEW, F.SHORT_SWITCH}  # since stop 62, everywhere (engine processes only)
    on |= {F.RESAMPLE_THREAD}  # since stop 64, everywhere
    on |= {F.LAZY_COMPILER}  # since stop 65, everywhere
    on |= {F.EARLY_KERNELS}  # since stop 66, everywhere (it acts only where a GPU's driver is loaded)
    on |= {F.EARLY_JIT}  # since stop 67, everywhere (it acts only on a CUDA device with Triton)
    on |= {F.GC_FREEZE, F.RUNPOD_COALESCE}  # since stop 68, everywhere
    on |= {F.RUNPOD_PICKUP}  # since stop 69, everywhere (a RunPod worker on runpod 1.12 only)
    on |= {F.CUDA_GRAPHS, F.PREFILL_GRAPHS, F.CUDNN_TUNING, F.CODEC_CHANNELS_LAST} if graphs else set()
    on |= {F.COMPILE} if compiled else set()
    on |= {F.PRECOMPILE} if compiled and p.precompile else set()
    on |= {F.OVERLAP_STEP, F.STEP_PRIORITY} if p.cuda else set()
    on |= {F.CODEC_KV_RING, F.CODEC_SPARSE_ROWS} if p.cuda else set()  # on by default since stop 55's measurement
    on |= {F.SNAKE_KERNEL} if p.cuda and p.triton else set()
    # since stop 61, where it was measured (sm_90+, the PDL probe standing for it) and can run
    on |= {F.CODEC_OWN_CONVS} if graphs and p.triton_major >= 3 and p.pdl else set()
    if p.cuda:
        triton_attention, triton3 = p.triton and p.sixteen_bit, p.triton_major >= 3
        on |= {F.VOCAB_SCAN, F.MERGED_FFN}
        on |= {F.CODEBOOK_SAMPLER, F.VOCAB_SAMPLER, F.STEP_GLUE} if triton3 else set()
        on |= {F.FAST_ATTENTION} if triton_attention else set()
        on |= {F.LAYER_GEMV} if triton_attention and triton3 else set()
        on |= {F.PDL} if triton_attention and triton3 and p.pdl else set()
    return on


def test_the_defaults_are_what_every_auto_switch_gave_before():
    seen = 0
    for p in platforms():
        got = resolve("auto", p)
        assert set(got.on) == before(p), p
        assert got.refused == ()  # nothing asked for: no warning
        seen += 1
    assert seen == 2 ** 6 + 2 ** 6  # Triton absent (any version 0) or present at 0, 2, 3: 128 platforms


def test_cpu_defaults_are_the_engines_without_a_gpu():
    assert resolve("auto", Platform()).on == {F.ONE_ROW_BUCKET, F.LAZY_GRAPHS, F.CODEC_MERGE, F.CODEC_ROUNDS,
                                              F.CODEC_PINNED_COPY, F.CODEC_CACHE, F.EARLY_READAHEAD,
                                              F.PLAIN_WEBSOCKET, F.DIRECT_ADMIT, F.PREFILL_FIT, F.OWN_GPU_VIEW,
                                              F.SHORT_SWITCH, F.RESAMPLE_THREAD,
                                              F.LAZY_COMPILER, F.EARLY_KERNELS, F.EARLY_JIT, F.GC_FREEZE,
                                              F.RUNPOD_COALESCE, F.RUNPOD_PICKUP}


@pytest.mark.parametrize("name", [f.name for f in FEATURES])
def test_every_feature_has_its_off_switch(name):
    for p in (RICH, Platform(), Platform(cuda=True, triton=True, triton_major=3)):
        for text in (f"-{name}", f"all,-{name}", f"+{name},-{name}", "none", f"all,{name},-{name}"):
            assert name not in resolve(text, p).on, (text, p)
    kernel = F.BY_NAME[name].kind == F.KERNEL
    assert (name in resolve("-kernels", RICH).on) is (not kernel and name in resolve("auto", RICH).on)  # the group


@pytest.mark.parametrize("name", [f.name for f in FEATURES])
def test_every_feature_comes_on_where_it_can_run(name):
    # on a platform with everything, asking for one feature with all it builds on turns it on, opt-in ones too
    on = resolve(f"all,-{F.CODEC_COMPILE}" if name == F.SNAKE_KERNEL else "all", RICH).on
    assert name in on


def test_an_asked_for_feature_that_cannot_run_is_refused_with_its_reason():
    got = resolve(f"+{F.CUDA_GRAPHS},+{F.CODEBOOK_SAMPLER},+{F.PDL},+{F.FAST_ATTENTION}", Platform())
    assert got.on == resolve("auto", Platform()).on | {F.FAST_ATTENTION}  # its reference path runs on a CPU
    assert dict(got.refused) == {F.CUDA_GRAPHS: "needs CUDA", F.CODEBOOK_SAMPLER: "needs CUDA and Triton",
                                 F.PDL: "needs `layer_gemv`"}
    # Triton 2 (torch 2.2's): the samplers run, step_glue's aranges do not
    old = Platform(cuda=True, triton=True, triton_major=2)
    got = resolve(f"-kernels,+{F.CODEBOOK_SAMPLER},+{F.VOCAB_SAMPLER},+{F.STEP_GLUE}", old)
    assert got.kernels() == {F.CODEBOOK_SAMPLER, F.VOCAB_SAMPLER} and dict(got.refused) == {
        F.STEP_GLUE: "needs Triton >= 3"}
    # what replaces a feature turns it off: the compiled codec fuses Snake itself
    got = resolve(f"+{F.CODEC_COMPILE},+{F.SNAKE_KERNEL}", RICH)
    assert F.CODEC_COMPILE in got.on and F.SNAKE_KERNEL not in got.on
    assert got.refused == ((F.SNAKE_KERNEL, f"`{F.CODEC_COMPILE}` replaces it"),)
    # a default-on feature that cannot run is off without a word, and so are those `all` or a group turn on
    assert resolve(f"-{F.LAYER_GEMV}", RICH).refused == () and F.PDL not in resolve(f"-{F.LAYER_GEMV}", RICH).on
    assert resolve("all", Platform()).refused == resolve("+kernels", Platform()).refused == ()
    assert resolve(f"+{F.PDL},-kernels", RICH).refused == ()  # named, then off


def test_later_items_win_and_the_reset_words_reset():
    assert F.asked("-pdl,+pdl") == {F.PDL: True}
    assert F.asked("+pdl,auto,-compile") == {F.COMPILE: False}
    assert F.asked("none,+merged_ffn") == {**dict.fromkeys(F.BY_NAME, False), F.MERGED_FFN: True}
    assert F.asked("-kernels") == dict.fromkeys(KERNELS, False)
    assert F.switched_off("none", F.CODEC_CACHE) and not F.switched_off("auto", F.CODEC_CACHE)
    with pytest.raises(ValueError, match="'turbo' is not a feature"):
        F.asked("+merged_ffn,turbo")


def test_resolving_in_registry_order_is_consistent():
    # a feature reads only those before it (its requirements and defaults name earlier ones): resolved again against
    # the final set, every decision stands
    texts = ("auto", "all", "none", "-cuda_graphs", "-compile,+codec_compile", "-layer_gemv", "+cudnn_benchmark",
             "-cudnn_tuning", "all,-kernels,+pdl")
    for text, p in itertools.product(texts, list(platforms())[::7] + [RICH]):
        on, wants = resolve(text, p).on, F.asked(text)
        for f in FEATURES:
            want = wants.get(f.name, f.by_default(p, on))
            assert (f.name in on) == (want and f.why_not(p, on - {f.name}) is None), (text, p, f.name)


def test_the_kernel_cache_key_keeps_its_shape():
    # the description a kernel cache was built for (engine.py): the same keys and values as before the registry, so
    # an existing cache still hits
    on = resolve("auto", RICH).on
    assert F.cache_key(on) == {"fused": sorted(on & set(KERNELS)), "codec_compile": False, "snake_kernel": True,
                               "codec_channels_last": True}


def test_the_docs_table_is_the_registry():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    start = "<!-- features table: rendered by ttsengine.engine.features.table() -->\n"
    assert start in doc, "docs/configuration.md lost its features table"
    table = doc.split(start, 1)[1].split("<!-- end of the features table -->", 1)[0]
    assert table == F.table(), "docs/configuration.md's features table differs from engine/features.py: paste " \
        "features.table()"


def _string_constants(path):
    tree = ast.parse(path.read_text(), str(path))
    compared = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                for c in (node.left, *node.comparators)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node, id(node) in compared


def test_no_feature_name_is_spelled_outside_the_registry():
    # code names a feature by its constant (features.LAYER_GEMV): a kernel's name never appears as a string, and no
    # feature's name is compared as one outside the CLI tools (whose reports and modes use words of their own)
    files = [p for p in sorted(CORE.rglob("*.py")) if p != REGISTRY]
    assert len(files) > 50
    spelled = []
    for path in files:
        tools = path.is_relative_to(CORE / "tools")
        for node, compared in _string_constants(path):
            items = {i.strip().lstrip("+-") for i in node.value.split(",")}
            if items & set(KERNELS) or (compared and not tools and node.value in F.BY_NAME):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not spelled, "feature names spelled as strings (use engine/features.py's constants):\n" + "\n".join(spelled)
