"""units.frame_ops: which sampler each part of a frame gets for a set of fused kernels (eager units)."""

from ttsengine.engine.device.compile.units import SixteenBit, frame_ops
from ttsengine.model.frame import sample_token, sample_token_blocked
from ttsengine.model.kernels.codebook_sampler import sample_codebook_embed


def test_the_codebooks_never_take_the_vocab_sampler():
    # vocab_sampler is the slow token's (155,776 logits); the codebooks' 1,024 take their kernel or the reference
    ops = frame_ops(None, False, frozenset({"vocab_sampler", "vocab_scan"}))
    assert isinstance(ops.sample, SixteenBit) and ops.sample_codebook is sample_token_blocked
    assert ops.sample_embed is None
    ops = frame_ops(None, False, frozenset({"vocab_sampler", "codebook_sampler"}))
    assert ops.sample_embed is sample_codebook_embed and ops.sample_codebook is None
    ops = frame_ops(None, False, frozenset())
    assert ops.sample is sample_token and ops.sample_codebook is sample_token and ops.sample_embed is None
