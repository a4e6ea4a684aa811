"""The speed features, declared once: every fused kernel of the decode step, every way the codec can run faster and
every switchable engine behaviour, with what it needs to run, when it is on by default, its reference and fast
paths and where it plugs in.

TTS_FEATURES (config.py) reads a list over the defaults: `auto` (the defaults), `none`, `all`, `kernels` (the step's
fused kernels as a group) and `+NAME` / `-NAME` (a bare NAME is `+NAME`), later items winning. `resolve` turns that
list and a `Platform` (the device's facts, probed by engine/settings.py) into the features on; settings, the runner,
the compile units, the vocoder, the kernel-cache key, the ready log and the docs' table read the result. Code
names a feature by its constant here (`features.LAYER_GEMV`), never by a string of its own.

This module is plain data: it imports neither torch nor anything of ours, so config.py may read the names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

KERNEL, CODEC, ENGINE = "step kernel", "codec", "engine"  # kinds
GROUPS = {"kernels": KERNEL}  # group words: every feature of that kind

# the decode step's fused kernels (engine/device/runner.py, engine/device/compile/units.py)
FAST_ATTENTION = "fast_attention"
CODEBOOK_SAMPLER = "codebook_sampler"
VOCAB_SCAN = "vocab_scan"
VOCAB_SAMPLER = "vocab_sampler"
MERGED_FFN = "merged_ffn"
LAYER_GEMV = "layer_gemv"
FAST_STACK = "fast_stack"
PDL = "pdl"
SPLIT_ATTENTION = "split_attention"
STEP_GLUE = "step_glue"
# the engine: graphs, compile, the loop
CUDA_GRAPHS = "cuda_graphs"
COMPILE = "compile"
PRECOMPILE = "precompile"
ONE_ROW_BUCKET = "one_row_bucket"
LAZY_GRAPHS = "lazy_graphs"
PREFILL_GRAPHS = "prefill_graphs"
OVERLAP_STEP = "overlap_step"
STEP_PRIORITY = "step_priority"
SEGMENT_SLACK = "segment_slack"
SLACK_PREFILL = "slack_prefill"
EARLY_READAHEAD = "early_readahead"
LAZY_COMPILER = "lazy_compiler"
EARLY_KERNELS = "early_kernels"
EARLY_JIT = "early_jit"
PLAIN_WEBSOCKET = "plain_websocket"
DIRECT_ADMIT = "direct_admit"
PREFILL_FIT = "prefill_fit"
PLAN_THREAD = "plan_thread"
SHORT_SWITCH = "short_switch"
OWN_GPU_VIEW = "own_gpu_view"
RESAMPLE_THREAD = "resample_thread"
GC_FREEZE = "gc_freeze"
RUNPOD_COALESCE = "runpod_coalesce"
RUNPOD_PICKUP = "runpod_pickup"
# the codec (engine/device/vocoder.py, engine/audio_feed.py, model/codec_cache.py)
CODEC_COMPILE = "codec_compile"
SNAKE_KERNEL = "snake_kernel"
CUDNN_TUNING = "cudnn_tuning"
CUDNN_BENCHMARK = "cudnn_benchmark"
CODEC_CHANNELS_LAST = "codec_channels_last"
CODEC_MERGE = "codec_merge"
CODEC_ROUNDS = "codec_rounds"
CODEC_PINNED_COPY = "codec_pinned_copy"
CODEC_CACHE = "codec_cache"
CODEC_KV_RING = "codec_kv_ring"
CODEC_SPARSE_ROWS = "codec_sparse_rows"
CODEC_OWN_CONVS = "codec_own_convs"
CODEC_FUSED_CONVS = "codec_fused_convs"


@dataclass(frozen=True)
class Platform:
    """What the features' probes read about the engine's device (engine/settings.py `platform` fills it in)."""

    cuda: bool = False  # the DualAR's device is a CUDA GPU
    triton: bool = False  # Triton imports
    triton_major: int = 0  # its major version (0: none)
    sixteen_bit: bool = False  # the model (and so the KV cache) is bf16 / fp16
    pdl: bool = False  # kernels launch as programmatic dependents: sm_90+, a CUDA 12.3+ driver, Triton's gdc
    compile: bool = False  # torch.compile of the step works here (torch >= 2.6 with custom ops)
    precompile: bool = False  # torch's AOT precompile (torch >= 2.10)


@dataclass(frozen=True)
class Condition:
    text: str  # in the docs' table and in warnings: "needs <text>"
    holds: Callable[[Platform, frozenset[str]], bool]  # (platform, the features resolved on so far) -> holds?


CUDA = Condition("CUDA", lambda p, on: p.cuda)
TRITON = Condition("Triton", lambda p, on: p.triton)
TRITON3 = Condition("Triton >= 3", lambda p, on: p.triton and p.triton_major >= 3)
SIXTEEN_BIT = Condition("a 16-bit model", lambda p, on: p.sixteen_bit)
SM90_PDL = Condition("an sm_90+ GPU launching programmatic dependents", lambda p, on: p.pdl)
TORCH_COMPILE = Condition("torch >= 2.6", lambda p, on: p.compile)
TORCH_PRECOMPILE = Condition("torch >= 2.10", lambda p, on: p.precompile)


def feature(name: str) -> Condition:
    """Holds where the feature `name` (earlier in FEATURES) is on."""
    return Condition(f"`{name}`", lambda p, on: name in on)


TUNED_CODEC = Condition(f"cuDNN tuning the codec (`{CUDNN_TUNING}` or `{CUDNN_BENCHMARK}`)",
                        lambda p, on: CUDNN_TUNING in on or CUDNN_BENCHMARK in on)


@dataclass(frozen=True)
class Feature:
    name: str
    kind: str  # KERNEL | CODEC | ENGINE
    does: str  # one line: what it does
    reference: str  # what runs when it is off
    plugs_in: str  # where the fast path is chosen
    requires: tuple[Condition, ...] = ()  # it cannot run without these: off, with a warning if asked for
    auto: tuple[Condition, ...] = ()  # on by default only where these hold as well
    default: bool = True  # False: opt-in, on only when asked for
    unless: str = ""  # a feature that replaces it: off where that one is on
    keyed: bool = False  # shapes compiled code: part of the kernel-cache key (kernels always are)

    def why_not(self, platform: Platform, on: frozenset[str]) -> str | None:
        """Why it cannot run here ("needs CUDA"), or None."""
        missing = [c.text for c in self.requires if not c.holds(platform, on)]
        if missing:
            return "needs " + " and ".join(missing)
        return f"`{self.unless}` replaces it" if self.unless in on else None

    def by_default(self, platform: Platform, on: frozenset[str]) -> bool:
        return self.default and all(c.holds(platform, on) for c in self.auto)


_GEMV = (feature(LAYER_GEMV),)
RUNNER, UNITS = "engine/device/runner.py", "engine/device/compile/units.py `frame_ops`"  # where most plug in
FEATURES = (
    # ---- the engine (first: kernels and the codec read graphs and compile) ----
    Feature(CUDA_GRAPHS, ENGINE, "replay each batch size's decode step as a CUDA graph", "eager launches",
            "engine/engine.py `_step_graphs`", requires=(CUDA,)),
    Feature(COMPILE, ENGINE, "torch.compile the decode step's units", "eager units", "engine/device/compile/units.py",
            requires=(TORCH_COMPILE,), auto=(CUDA,)),
    Feature(PRECOMPILE, ENGINE, "keep the compiled units in TTS_CACHE_DIR (AOT precompile): a warm start skips Dynamo",
            "Dynamo traces at every start", "engine/device/compile/precompiled.py",
            requires=(feature(COMPILE), TORCH_PRECOMPILE)),
    Feature(ONE_ROW_BUCKET, ENGINE, "a lone stream steps at one row (its own graph and compiled variant)",
            "with compile, the 2-row bucket with a padding row", "engine/settings.py buckets"),
    Feature(LAZY_GRAPHS, ENGINE, "capture the smallest bucket before ready, the others when idle or at first use",
            "every graph before ready", "engine/engine.py `_warm_up`"),
    Feature(PREFILL_GRAPHS, ENGINE, "the prefill as CUDA graphs of a few padded shapes", "eager prefill launches",
            "engine/engine.py, engine/device/runner.py `prefill`", requires=(feature(CUDA_GRAPHS),)),
    Feature(OVERLAP_STEP, ENGINE, "queue the next decode step before reading the last one's frames",
            "each step waits for the host", "engine/engine.py `_iteration`", auto=(CUDA,)),
    Feature(STEP_PRIORITY, ENGINE, "the decode step and prefill on a high-priority CUDA stream",
            "the default stream's priority", "engine/engine.py `_run`", requires=(CUDA,)),
    # segment_slack: opt-in until measured on a GPU with livetest (docs/voice-agents.md, "stop 56")
    Feature(SEGMENT_SLACK, ENGINE, "a live session's next segment queues behind requests due before it while its "
            "listener still has audio to play (earliest deadline first)", "first come, first served",
            "engine/engine.py `_enqueue`", default=False),
    # slack_prefill: opt-in: measured once (docs/http-breakdown.md, "Stop 58"): the first burst's first audio p95 778
    # against 1,010-1,033 ms, the steady load's unchanged (some stream has always just started there)
    Feature(SLACK_PREFILL, ENGINE, "while every playing stream's listener has more than 1 s of audio ahead, a step "
            "may prefill past the real-time budget (up to that audio less 1 s, at most 0.1 s a step)",
            "every step within 80% of a frame's time", "engine/control/prefill_budget.py", default=False),
    # prefill_fit: stop 58's waterfall put ~120 / ~390 ms (p50 / p95) in the engine's queue when 256 requests came
    # back at once beside a full batch. On by default since its GPU A/B (docs/http-breakdown.md, "Stop 59"): first
    # audio p95 lower than without in every same-call pairing, burst, closed loop and Poisson arrivals
    Feature(PREFILL_FIT, ENGINE, "the prefill budget fits a step's prefill cost as a fixed part plus a part per "
            "position over the recent steps, so a wave of arrivals goes in in fewer steps",
            "one moving average per position, the fixed part included", "engine/control/prefill_budget.py"),
    Feature(EARLY_READAHEAD, ENGINE, "the servers and `warm` start reading the weight files from disk before they "
            "import torch and the web framework", "read from the load's start on", "serving/prefetch.py"),
    # lazy_compiler: stop 65's py-spy of a warm start put ~1 s of its ~6.8 s in torch._dynamo's import, which only the
    # compile units (buckets above the fused layers' rows, captured after the first audio) use
    # early_kernels: stop 66's census of an empty-cache start: 31 Triton compiles, ~16 s, one at a time on two threads
    Feature(EARLY_KERNELS, ENGINE, "a start whose kernel cache lacks our Triton kernels compiles them in background "
            "processes from the recorded manifest while it imports and loads", "each compiled at its first use, one "
            "at a time", "engine/device/compile/early_kernels.py, serving/prefetch.py"),
    # early_jit: stop 67's py-spy of a warm start: the first Triton launches on the engine's and the codec's threads
    # spent ~0.3 s in Triton's compiler key (a sha256 of its ~500 MB library) and parsing our kernels' sources
    Feature(EARLY_JIT, ENGINE, "a GPU start computes Triton's compiler key and our kernels' keys in a thread while "
            "it loads the weights", "computed at the first launches, on the engine's and the codec's threads",
            "engine/device/compile/early_jit.py, engine/loader.py"),
    Feature(LAZY_COMPILER, ENGINE, "torch's compiler (torch._dynamo, ~1 s of imports) is imported at the first "
            "compile, not on a start's path to its first audio (eager calls skip our custom ops' wrappers)",
            "imported in the weight load (its 'compiler' phase)", "model/loading/checkpoint.py, compat.py"),
    # plain_websocket: audio barely deflates (a tenth of its bytes), and deflating it on the one event loop made
    # every other socket wait behind it: live sessions' first audio measured with and without in docs/voice-agents.md
    Feature(PLAIN_WEBSOCKET, ENGINE, "the servers' WebSockets decline permessage-deflate: audio goes uncompressed",
            "uvicorn's default: each message deflated on the event loop when the client offers it",
            "serving/network/shutdown.py `serve`"),
    # direct_admit: a front thread per request in planning only waited for the engine process's answer; 8 of them
    # queued a burst's hand-offs (docs/http-breakdown.md, "Stop 58": on the GPU host 62 / 271 ms p50 / p95 before the
    # engine process saw a request; on 2 CPU cores, a burst of 256, 195-236 / 471-479 ms without, 39-66 / 81-97 with).
    # Measured on the GPU since (docs/http-breakdown.md, "Stop 59"): a burst's first audio p95 a third of what it is
    # without
    Feature(DIRECT_ADMIT, ENGINE, "with the engines in processes of their own, the event loop hands each request "
            "over and awaits the answer (no front thread waits on the round trip)",
            "a front planning thread per request waits for the engine process's answer (8 per engine process)",
            "serving/service.py `admit`"),
    # plan_thread: opt-in until measured on a GPU (front_door.sh `restart:+plan_thread`). Stop 59's waterfall put
    # p50 ~56 / p95 ~165 ms between the engine process reading a request and having planned it, for 0.1 ms of CPU
    # a plan: its 8 planning threads take the GIL turn about with the engine loop and each other (each small torch
    # op in a plan gives it up and waits to take it back); one thread does the same work with one waiter
    Feature(PLAN_THREAD, ENGINE, "in an engine process, the requests without reference audio are planned by one "
            "thread, in arrival order (reference audio to encode still goes to the pool)",
            "8 pool threads plan every request", "serving/engine_process/host.py `_handle`", default=False),
    # short_switch: on by default since stop 62: bench through the engine process was faster with it in two
    # sessions' pairings, first audio p95 no worse (docs/performance.md, "The HTTP path (issue 43)")
    Feature(SHORT_SWITCH, ENGINE, "an engine process's threads hand the GIL over every 0.5 ms: the engine loop waits "
            "less for it behind planning, writing and the codec thread", "Python's 5 ms switch interval",
            "serving/engine_process/host.py `main`"),
    # own_gpu_view: on by default. The first worker on a second GPU spent ~10 s more of its settled start in the
    # decode-step captures than the next one (docs/performance.md, "Start time and kernel cache"): the variants'
    # guards check the device index, so the first process on cuda:1 traced its own
    Feature(OWN_GPU_VIEW, ENGINE, "each engine process sees only its own GPUs, numbered from cuda:0: the kernel "
            "cache `warm` filled on one GPU serves the processes of every GPU", "every process sees every GPU and "
            "traces decode-step variants of its own per device index", "engine/placement.py `gpu_view`"),
    # resample_thread: on by default since stop 64. A profile of the HTTP front at 256 pcm streams put most of the
    # event loop's busy samples in soxr's resampling (44.1 to 24 kHz, pcm's default rate; soxr releases the GIL);
    # with the threads the loop's lag and the first audio's tail at 256 streams came down through HTTP on a GPU
    # (docs/performance.md, "The HTTP path (issue 43)")
    # gc_freeze: stop 68's trace of a new server's first bursts (scripts/device/budget_trace) put a 0.18-0.21 s full
    # collection in the engine process in the first 256-burst after /ready, none in the same burst once warm, and
    # 0.1-0.14 s ones in the front's bursts
    Feature(GC_FREEZE, ENGINE, "once an engine's start-up captures are in (and once a front has its engine "
            "processes), the objects alive are frozen out of the garbage collector's full passes",
            "every full pass scans the process's start-up objects (0.1-0.2 s holding the GIL)",
            "engine/control/heap.py, engine/engine.py `_run`, serving/service.py `load`"),
    # runpod_coalesce: RunPod's SDK posts a streamed job's items one at a time, each formatted and serialised on the
    # worker's event loop: its own job code on a CPU (scripts/runpod_item_cost.py, 64 jobs) sent 776-829 audio-s/s in
    # 18 kB items (one 8-frame pcm chunk), 1,317-1,463 in 71 kB ones (stop 68)
    Feature(RUNPOD_COALESCE, ENGINE, "a RunPod worker's streamed job sends all the audio made since its last item "
            "as one item (the first chunk alone): fewer, larger posts when the worker falls behind",
            "one item per audio chunk", "serving/coalesce.py, handlers/runpod/handler.py `_streamed`"),
    # runpod_pickup: the SDK's job loop looks at its queue of fetched jobs only when a running job ends or 0.1 s
    # passed, and a full worker's fetcher sleeps 1 s: the SDK against loadtest's job queue with an instant handler
    # (scripts/runpod_pickup.py) started jobs on a busy worker 50 ms after they were taken on average, and a full
    # worker's jobs got their first item ~0.7 s after they were submitted (stop 69)
    Feature(RUNPOD_PICKUP, ENGINE, "a RunPod worker starts a job the moment the SDK has fetched it, and a full "
            "worker fetches the moment a job ends; a job taken as the shutdown signal comes still runs (runpod "
            "1.12's job loop, replaced while the worker runs)",
            "the SDK's own loop: fetched jobs start at its 0.1 s tick while others run, a full worker looks for "
            "jobs once a second, a job taken as the shutdown signal comes may never run", "handlers/runpod/pickup.py"),
    Feature(RESAMPLE_THREAD, ENGINE, "pcm and wav streams whose rate changes are resampled and converted on a "
            "resampler thread (soxr runs without the GIL), not on the event loop", "on the event loop, inline",
            "audio/stream_encoder.py `StreamEncoder`"),
    # ---- the decode step's fused kernels ----
    # Why the defaults (the figures: docs/performance.md, "Fused decode-step kernels"): each kernel on by default was
    # measured faster than the unfused path. merged_ffn: int8/int4 linears are left unmerged by merge_inputs. The
    # samplers' tl.sort / tl.cumsum: tested on Triton 3.x (torch 2.2's Triton 2.2 keeps the unfused sampler).
    # fast_stack stays opt-in: slower than layer_gemv per fast position, its grid barriers being costly. pdl:
    # layer_gemv's kernels as programmatic dependents, their 1-2-row tiles holding all of K. split_attention stays
    # opt-in: faster at long contexts but slower at the bench's short ones, and a graph cannot pick by context length.
    # step_glue replaces ~35 torch ops; its aranges fail in Triton 2.2
    Feature(FAST_ATTENTION, KERNEL, "the fast layers' cache write + attention as one Triton kernel over paged KV",
            "gather + SDPA (also what CPUs run when it is asked for)", UNITS,
            auto=(CUDA, TRITON, SIXTEEN_BIT)),
    Feature(MERGED_FFN, KERNEL, "each layer's W1 and W3 as one matmul", "two matmuls", RUNNER, auto=(CUDA,)),
    Feature(VOCAB_SCAN, KERNEL, "top-p's cumulative sum over the vocabulary in 1,024-wide blocks",
            "one sort + cumsum", UNITS, auto=(CUDA,)),
    Feature(CODEBOOK_SAMPLER, KERNEL, "a codebook's penalty, top-p, temperature and draw as one kernel",
            "the torch sampler", UNITS, requires=(CUDA, TRITON), auto=(TRITON3,)),
    Feature(VOCAB_SAMPLER, KERNEL, "the slow token's sampling without a sort (a histogram of the 16-bit logits)",
            "the sorted sampler", UNITS, requires=(CUDA, TRITON), auto=(TRITON3,)),
    Feature(STEP_GLUE, KERNEL, "the step's input embedding + RoPE and its end as two kernels", "~35 torch ops",
            RUNNER, requires=(CUDA, TRITON3)),
    Feature(LAYER_GEMV, KERNEL, "at up to TTS_LAYER_GEMV_ROWS rows each layer as five Triton kernels",
            "compiled units over cuBLAS", "engine/device/runner.py `step_ops`", auto=(CUDA, TRITON3, SIXTEEN_BIT)),
    Feature(PDL, KERNEL, "layer_gemv's kernels launched as programmatic dependents", "plain launches",
            "model/kernels/launch.py", requires=_GEMV, auto=(SM90_PDL,)),
    Feature(FAST_STACK, KERNEL, "all fast layers of a position as one persistent kernel", "layer_gemv's kernels",
            "engine/device/runner.py `step_ops`", requires=_GEMV, default=False),
    Feature(SPLIT_ATTENTION, KERNEL, "at few rows the slow attention's pages shared by up to 8 programs a head",
            "one program a head", "model/fused_layer.py", requires=_GEMV, default=False),
    # ---- the codec ----
    Feature(CODEC_COMPILE, CODEC, "torch.compile the streaming codec too (~18 s more per start)", "the eager codec",
            "engine/device/vocoder.py `apply`", requires=(feature(COMPILE),), default=False, keyed=True),
    Feature(SNAKE_KERNEL, CODEC, "the codec's Snake activation as one Triton kernel", "five torch ops",
            "engine/device/vocoder.py `apply`", requires=(CUDA, TRITON), unless=CODEC_COMPILE, keyed=True),
    Feature(CUDNN_TUNING, CODEC, "cuDNN times the codec's convolutions while its CUDA graphs are captured",
            "cuDNN's heuristics", "engine/device/vocoder.py `cudnn_autotuned`", requires=(CUDA, feature(CUDA_GRAPHS))),
    Feature(CUDNN_BENCHMARK, CODEC, "cuDNN times every new convolution shape, everywhere (syncs the GPU)",
            "tuning in graph captures only", "engine/engine.py", requires=(CUDA,), default=False),
    Feature(CODEC_CHANNELS_LAST, CODEC, "the streaming codec time-major with channels-last convolutions",
            "channel-major convolutions", "model/codec/streaming.py", auto=(CUDA, TUNED_CODEC), keyed=True),
    # codec_own_convs: measured as fast as cuDNN's tuned convs, the whole model and the codec alone, with an eighth
    # of the codec's capture time (docs/speed.md, "The codec's own convolutions"), on the sm_90 GPU its tiles were
    # chosen on: on by default on sm_90+ (the PDL probe stands for it), unmeasured elsewhere
    Feature(CODEC_OWN_CONVS, CODEC, "the time-major codec's convolutions as GEMMs of our own (a Triton implicit GEMM, "
            "cuBLAS): no cuDNN plan or tuning per shape", "cuDNN's channels-last convolutions",
            "model/codec/own_convs.py", requires=(CUDA, TRITON3, feature(CODEC_CHANNELS_LAST)), auto=(SM90_PDL,)),
    # codec_fused_convs: opt-in until measured on a GPU (two activation passes fewer per residual unit)
    Feature(CODEC_FUSED_CONVS, CODEC, "a residual unit's Snake and residual sum in its own convs' stores",
            "a Snake pass and a sum pass per residual unit", "model/kernels/codec/conv.py",
            requires=(feature(CODEC_OWN_CONVS),), default=False),
    # codec_kv_ring and codec_sparse_rows: measured faster (the ring) and half the capture and cuDNN tuning at the
    # same speed (sparse rows) on a GPU (docs/speed.md); GPU parity in tests/engine/test_gpu.py. Unmeasured on a
    # CPU: off there.
    Feature(CODEC_KV_RING, CODEC, "the codec transformer's keys and values in a ring per row, new ones written only",
            "the window's keys gathered, joined and written back whole each call", "model/codec/streaming.py",
            auto=(CUDA,)),
    Feature(CODEC_SPARSE_ROWS, CODEC, "codec calls padded to 1, 4, 16 or 64 rows: half the CUDA graphs to capture",
            "1, 2, 4, 8, 16, 32 or 64 rows", "engine/settings.py `codec_buckets`", auto=(CUDA,)),
    Feature(CODEC_MERGE, CODEC, "codec decodes queued behind a busy codec thread join into one call",
            "one call per decode step", "engine/device/vocoder.py `set_merge`"),
    Feature(CODEC_ROUNDS, CODEC, "later audio chunks of every stream go to the codec together",
            "each chunk when it is due", "engine/audio_feed.py `CodecRounds`"),
    Feature(CODEC_PINNED_COPY, CODEC, "the codec's audio reaches the host through a pinned buffer",
            "a copy to pageable memory", "engine/device/vocoder.py `_to_host`"),
    Feature(CODEC_CACHE, CODEC, "keep the codec converted to its run dtype in TTS_CACHE_DIR",
            "convert the fp32 codec.pth at every start", "model/codec_cache.py"),
)
BY_NAME = {f.name: f for f in FEATURES}
KERNELS = tuple(f.name for f in FEATURES if f.kind == KERNEL)
WORDS = ("auto", "none", "all")  # reset words: the defaults, everything off, everything on


# ---- TTS_FEATURES: parsing --------------------------------------------------------------------------------------
def _items(text: str) -> list[str]:
    return [item.strip() for item in text.lower().split(",") if item.strip()]


def _names(word: str) -> tuple[str, ...] | None:
    """A feature's name or a group word -> the features it names (None: neither)."""
    if word in BY_NAME:
        return (word,)
    kind = GROUPS.get(word)
    return None if kind is None else tuple(f.name for f in FEATURES if f.kind == kind)


def normalise(text: str) -> str:
    """The list in one spelling ("auto" when empty; a bare NAME as +NAME), for config.py to keep."""
    items = ["+" + i if _names(i) is not None else i for i in _items(text)]  # others stay as given, for `check`
    return ",".join(items) or "auto"


def check(text: str) -> str | None:
    """Why the list is refused, in one line (None: every item is a word, a group or a feature)."""
    for item in _items(text):
        if item in WORDS:
            continue
        word = item[1:] if item[:1] in "+-" else item
        if _names(word) is None:
            words = ", ".join(WORDS + tuple(GROUPS))
            return (f"{item!r} is not a feature: give {words} or +NAME / -NAME of "
                    f"{', '.join(f.name for f in FEATURES)}")
    return None


def asked(text: str) -> dict[str, bool]:
    """The list's answer per feature: True (+), False (-); features it leaves to their default are absent."""
    return _asked(text)[0]


def _asked(text: str) -> tuple[dict[str, bool], set[str]]:
    """-> (asked, the features named on one by one: a warning where they cannot run, not for `all` or a group)."""
    why = check(text)
    if why:
        raise ValueError(why)
    out: dict[str, bool] = {}
    named: set[str] = set()
    for item in _items(text):
        if item in WORDS:
            out = {} if item == "auto" else dict.fromkeys(BY_NAME, item == "all")
            named = set()
            continue
        word, on = (item[1:] if item[:1] in "+-" else item), not item.startswith("-")
        for name in _names(word):
            out[name] = on
        named = (named | {word}) if on and word in BY_NAME else named - set(_names(word))
    return out, named


def switched_off(text: str, name: str) -> bool:
    """Whether the list turns `name` off (for a feature with no probe, read before the device is known)."""
    return asked(text).get(name, BY_NAME[name].default) is False


# ---- resolving ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resolved:
    on: frozenset[str]  # the features in effect
    refused: tuple[tuple[str, str], ...]  # (name, why) of those named (+NAME) that cannot run here

    def kernels(self) -> frozenset[str]:
        return frozenset(n for n in self.on if n in KERNELS)


def resolve(text: str, platform: Platform) -> Resolved:
    """TTS_FEATURES on this platform: each feature, in FEATURES order, on where it was asked for or is on by
    default, and where it can run (its requirements, including the features it builds on, hold). `all` and a group
    turn on what can run here; a feature named on its own that cannot is `refused` (settings.py warns)."""
    wants, named = _asked(text)
    on: set[str] = set()
    refused = []
    for f in FEATURES:
        done = frozenset(on)
        if not wants.get(f.name, f.by_default(platform, done)):
            continue
        why = f.why_not(platform, done)
        if why is None:
            on.add(f.name)
        elif f.name in named:
            refused.append((f.name, why))
    return Resolved(frozenset(on), tuple(refused))


def cache_key(on: frozenset[str]) -> dict[str, object]:
    """What of the features shapes the compiled code: the kernels on, and the keyed codec features on or off."""
    return {"fused": sorted(n for n in on if n in KERNELS),
            **{f.name: f.name in on for f in FEATURES if f.keyed}}


def describe(on: frozenset[str]) -> str:
    """The ready log's list: the features on other than the kernels (the log names those in use)."""
    return ",".join(f.name for f in FEATURES if f.name in on and f.kind != KERNEL) or "none"


def table() -> str:
    """The features table of docs/configuration.md (a test keeps the doc's copy equal to this)."""
    rows = ["| feature | kind | what it does | on by default | needs | when off | plugs in at |",
            "|---|---|---|---|---|---|---|"]
    for f in FEATURES:
        default = "no (opt-in)" if not f.default else (
            "with " + ", ".join(c.text for c in f.auto) if f.auto else "yes")
        needs = " and ".join(c.text for c in f.requires) or "-"
        if f.unless:
            needs += f"; off with `{f.unless}`"
        rows.append(f"| `{f.name}` | {f.kind} | {f.does} | {default} | {needs} | {f.reference} | {f.plugs_in} |")
    return "\n".join(rows) + "\n"
