"""GPU equality of prefix-cached and chunked prefill (marker `gpu`; run on a CUDA machine:
`python -m pytest -m gpu tests/engine/test_gpu_prefix.py`).

With CUDA graphs and prefill graphs on, in fp32 without TF32: an engine that reads a stored voice's prefix from
the prefix cache and prefills every prompt in chunks of at most 48 positions (so each chunk past the first and
each hit's prefill runs the with-history path, captured as graphs keyed by their gathered pages) gives the
tokens of an engine that prefills every prompt whole from position 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MODEL_DIR
from test_gpu import tokens
from torch_helpers import no_tf32

from ttsengine import EngineConfig, Reference, SynthesisRequest

pytestmark = pytest.mark.gpu


def _codes(seed: int, frames: int) -> np.ndarray:
    rng = np.random.default_rng(seed)  # the tiny model: semantic codes < 32, the others < 16
    return np.concatenate([rng.integers(0, 32, (1, frames)), rng.integers(0, 16, (3, frames))]).astype(np.int64)


VOICE = (Reference(text="the stored voice's transcript", codes=_codes(0, 150)),)  # a ~170-position prefix: 2 pages
FIRST = [SynthesisRequest(text="The first request with the voice.", seed=1, max_new_tokens=30, references=VOICE)]
LATER = [  # concurrent, all hits, one a long text whose continuation chunks hit too, one without a voice
    SynthesisRequest(text="Hello there.", seed=2, max_new_tokens=40, references=VOICE),
    SynthesisRequest(text="A second, rather longer sentence for the batch.", seed=3, max_new_tokens=48,
                     temperature=0.6, repetition_penalty=1.3, references=VOICE),
    SynthesisRequest(text="Fourth one is here. " * 6, seed=4, max_new_tokens=20, chunk_length=60, references=VOICE),
    SynthesisRequest(text="No voice at all, just text.", seed=5, max_new_tokens=25, top_p=0.95),
]


def cfg(**kw) -> EngineConfig:
    return EngineConfig(model_dir=MODEL_DIR, device="cuda", max_batch=8, features="+cuda_graphs,-compile",
                        dtype="float32", codec_dtype="float32", **kw)


def test_cached_and_chunked_prefill_equal_plain_prefill_tokens_fp32():
    with no_tf32():
        plain_stats, cached_stats, chunked_stats = {}, {}, {}
        plain = tokens(cfg(prefix_cache=False), plain_stats, (FIRST, LATER))
        cached = tokens(cfg(), cached_stats, (FIRST, LATER))
        chunked = tokens(cfg(prefill_tokens=48), chunked_stats, (FIRST, LATER))
    assert plain_stats["prefix_hits"] == 0 and plain_stats["prefill_graph_keys"]
    for stats in (cached_stats, chunked_stats):
        assert stats["prefix_misses"] == 1 and stats["prefix_hits"] >= 4  # the long text's chunks hit too
        assert stats["prefix_tokens_saved"] >= 4 * 128
        assert stats["prefill_tokens"] < plain_stats["prefill_tokens"] - 3 * 128
        # hits (and chunks past the first) ran the with-history prefill through graphs keyed by gathered pages
        assert any(key[2] for key in stats["prefill_graph_keys"]), stats["prefill_graph_keys"]
    for got in (cached, chunked):
        assert len(got) == len(plain)
        for g, p in zip(got, plain):
            assert len(g) == len(p)
            assert all((a is None and b is None) or np.array_equal(a, b) for a, b in zip(g, p))
