"""The golden vectors, checked through the parity tool (in-process and as the CLI a user runs), plus
variants of the checkpoint files that must give the same numbers, and a broken one that must fail.
Every check also runs on ../shared/golden_realflags where it exists (CI's lanes run its CLI too)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import GOLDEN, ROOT, run_cli
from safetensors.torch import save_file

from ttsengine.tools import parity

EXPECTED_CHECKS = {
    "tokenizer.ids", "prompt_a", "prompt_b", "slow_logits_all_a", "slow_logits_all_b", "slow_hidden_all_a",
    "slow_logits_last_a (cached)", "fast_logits_tf_a (one pass)", "fast_logits_tf_a (step cache)",
    "decode_step_logits", "decode_step_hidden", "gen_tokens_a", "gen_codes_a", "gen_tokens_b", "gen_codes_b",
    "gen_tokens_a_reppen", "gen_codes_a_reppen", "slow_probs", "fast_probs", "codec.decode_latent",
    "codec.decode_wave", "codec.decode_wave_oob (clamped)", "codec.encoder_out", "codec.encode_codes",
    "codec.encode_lengths", "codec.roundtrip_wave",
}


# ../shared/golden_realflags: the real S1-mini config's flags that tests/assets/golden leaves off (scaled
# codebook embeddings, fast_head_dim != head_dim), beside the q/k norm in the slow layers only that both have
REALFLAGS = ROOT.parent / "shared" / "golden_realflags"
GOLDEN_SETS = [
    pytest.param(GOLDEN, id="golden"),
    pytest.param(REALFLAGS, id="realflags", marks=pytest.mark.skipif(
        not REALFLAGS.is_dir(), reason=f"{REALFLAGS} not found: run with ../shared (golden_realflags) beside the "
                                       "checkout")),
]


@pytest.fixture(scope="module", params=GOLDEN_SETS)
def results(request):
    return {r.name: r for r in parity.run(request.param)}


def test_every_golden_check_runs(results):
    assert EXPECTED_CHECKS <= set(results), EXPECTED_CHECKS - set(results)
    assert sum(name.startswith("tokenizer.case[") for name in results) == 9


@pytest.mark.parametrize("name", sorted(EXPECTED_CHECKS))
def test_golden_check_passes(results, name):
    r = results[name]
    assert r.ok, r.line()


def test_parity_cli_passes_on_golden_folder():
    proc = run_cli("ttsengine", "parity", str(GOLDEN))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert all(line.startswith("PASS") for line in lines[:-1])
    assert "max_err=" in proc.stdout and "tol=1e-03" in proc.stdout and "tol=1e-04" in proc.stdout
    assert lines[-1].endswith("checks passed")


def _variant(tmp_path: Path) -> Path:
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN, root)
    for p in root.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    return root


def test_parity_passes_with_wrapped_and_prefixed_checkpoints(tmp_path):
    """codec.pth as {"state_dict": {"generator.*", "discriminator.*"}} with old-style weight norm,
    model weights `model.`-prefixed and as safetensors: same numbers."""
    root = _variant(tmp_path)
    ck = root / "checkpoint"
    codec = torch.load(ck / "codec.pth", weights_only=True)
    old_style = {}
    for k, v in codec.items():  # new-style parametrization names -> weight_g / weight_v
        k = k.replace(".parametrizations.weight.original0", ".weight_g").replace(
            ".parametrizations.weight.original1", ".weight_v")
        old_style["generator." + k] = v
    old_style["discriminator.conv.weight"] = torch.zeros(3)
    (ck / "codec.pth").unlink()
    torch.save({"state_dict": old_style}, ck / "codec.pth")
    model = torch.load(ck / "model.pth", weights_only=True)
    (ck / "model.pth").unlink()
    save_file({"model." + k: v.contiguous() for k, v in model.items()}, str(ck / "model.safetensors"))

    results = parity.run(root)
    failed = [r.line() for r in results if not r.ok]
    assert not failed, failed
    assert len(results) >= 40


def test_parity_fails_when_a_weight_is_wrong(tmp_path):
    root = _variant(tmp_path)
    sd = torch.load(root / "checkpoint" / "model.pth", weights_only=True)
    sd["layers.1.feed_forward.w2.weight"] = sd["layers.1.feed_forward.w2.weight"] * 1.05
    torch.save(sd, root / "checkpoint" / "model.pth")
    proc = run_cli("ttsengine", "parity", str(root))
    assert proc.returncode == 1
    assert "FAIL  slow_logits_all_a" in proc.stdout
    assert "PASS  codec.decode_wave" in proc.stdout  # the codec is untouched


def test_parity_cli_reports_a_bad_folder_in_one_line(tmp_path):
    proc = run_cli("ttsengine", "parity", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
