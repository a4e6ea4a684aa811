"""`python -m ttsengine parity DIR`: check this implementation against a golden folder.

DIR is laid out like shared/golden (checkpoint/, codec_config.json, meta.json and the
*.safetensors vectors; its README defines each). Everything is read from DIR, so other folders of
the same layout work too. One line per check with its max error and tolerance; exit 0 only if all
pass. Runs in float32 without autocast, like the vectors were made.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..model.generation import Generation, raw_frames
from ..model.layers import causal_mask_from_positions
from ..model.loading.checkpoint import Checkpoint, load_checkpoint
from ..model.sampling import SamplingTensors, logits_to_probs

LOGITS_TOL, WAVE_TOL, PROBS_TOL = 1e-3, 1e-4, 1e-5


@dataclass
class Result:
    name: str
    ok: bool
    error: float | None  # max abs error (None for exact/integer checks)
    tol: float | None
    note: str = ""

    def line(self) -> str:
        status = "PASS" if self.ok else "FAIL"
        err = "exact" if self.error is None else f"max_err={self.error:.2e}"
        tol = "" if self.tol is None else f"  tol={self.tol:.0e}"
        return f"{status}  {self.name:<34} {err}{tol}{('  ' + self.note) if self.note else ''}"


def close(name: str, got: Tensor, want: Tensor, tol: float) -> Result:
    if got.shape != want.shape:
        return Result(name, False, None, tol, f"shape {list(got.shape)} != {list(want.shape)}")
    err = (got.float().cpu() - want.float()).abs().max().item() if want.numel() else 0.0
    return Result(name, err <= tol, err, tol)


def exact(name: str, got: Tensor | list, want: Tensor | list) -> Result:
    got_t, want_t = torch.as_tensor(got).cpu(), torch.as_tensor(want)
    ok = got_t.shape == want_t.shape and torch.equal(got_t.to(torch.int64), want_t.to(torch.int64))
    return Result(name, ok, None, None, "" if ok else f"got {got_t.tolist()} want {want_t.tolist()}"[:300])


class Golden:
    def __init__(self, root: Path, device: str):
        from safetensors.torch import load_file

        self.root = root
        self.meta = json.loads((root / "meta.json").read_text())
        self.vectors: dict[str, Tensor] = {}
        for name in ("prompts", "llm_logits", "generation", "sampling", "codec_vectors"):
            path = root / f"{name}.safetensors"
            if path.is_file():
                self.vectors.update(load_file(str(path)))
        self.device = torch.device(device)
        self.ckpt: Checkpoint = load_checkpoint(root / "checkpoint", self.device, torch.float32, torch.float32)

    def has(self, *names: str) -> bool:
        return all(n in self.vectors for n in names)

    def __getitem__(self, name: str) -> Tensor:
        return self.vectors[name]

    def prompt(self, case: str) -> Tensor:
        texts, ck = self.meta["texts"], self.ckpt
        refs = [(texts["ref_text_b"], self["ref_codes_b"])] if case == "b" else []
        return ck.family.build_prompt(ck.tokenizer, ck.config.num_codebooks, texts[f"text_{case}"], refs, True)

    def prefill(self, prompt: Tensor, extra: int = 1):
        """Cached prefill of prompt [n+1, T] -> (hidden last [1, D], caches)."""
        m, T = self.ckpt.model, prompt.shape[1]
        caches = m.new_caches(1, T + extra, torch.float32, self.device)
        pos = torch.arange(T, device=self.device)[None]
        h = m.slow_forward(m.embed(prompt.to(self.device)[None]), pos, causal_mask_from_positions(pos, T), caches, T)
        return h[:, -1], caches


def tokenizer_checks(g: Golden) -> Iterator[Result]:
    tok, facts = g.ckpt.tokenizer, g.meta["tokenizer"]
    yield exact("tokenizer.ids", [len(tok.specials), tok.semantic_begin_id, tok.semantic_end_id, tok.im_end_id],
                [facts["n_special"], facts["semantic_begin_id"], facts["semantic_end_id"], facts["im_end_id"]])
    for i, case in enumerate(facts["cases"]):
        ids = tok.encode(case["text"])
        r = exact(f"tokenizer.case[{i}]", ids, case["ids"])
        if r.ok and tok.decode(ids) != case["text"]:
            r = Result(r.name, False, None, None, "decode does not round-trip")
        yield r


def prompt_checks(g: Golden) -> Iterator[Result]:
    for case in "ab":
        if g.has(f"prompt_{case}"):
            yield exact(f"prompt_{case}", g.prompt(case), g[f"prompt_{case}"])


def slow_checks(g: Golden) -> Iterator[Result]:
    m = g.ckpt.model
    for case in "ab":
        if not g.has(f"prompt_{case}", f"slow_logits_all_{case}"):
            continue
        p = g[f"prompt_{case}"].to(g.device)[None]
        T = p.shape[-1]
        pos = torch.arange(T, device=g.device)[None]
        hidden = m.slow_forward(m.embed(p), pos, causal_mask_from_positions(pos, T))[0]
        yield close(f"slow_logits_all_{case}", m.slow_head(hidden), g[f"slow_logits_all_{case}"], LOGITS_TOL)
        yield close(f"slow_hidden_all_{case}", hidden, g[f"slow_hidden_all_{case}"], LOGITS_TOL)
        last, _ = g.prefill(g[f"prompt_{case}"])  # the cached prefill path
        yield close(f"slow_logits_last_{case} (cached)", m.slow_head(last)[0], g[f"slow_logits_last_{case}"],
                    LOGITS_TOL)
        yield close(f"slow_hidden_last_{case} (cached)", last[0], g[f"slow_hidden_last_{case}"], LOGITS_TOL)


def fast_checks(g: Golden) -> Iterator[Result]:
    if not g.has("fast_tf_codes", "fast_logits_tf_a", "slow_hidden_last_a"):
        return
    m, n = g.ckpt.model, g.ckpt.config.num_codebooks
    codes = g["fast_tf_codes"].to(g.device)
    x = torch.cat([m.fast_input(g["slow_hidden_last_a"].to(g.device))[None], m.fast_embeddings(codes[: n - 1])])
    pos = torch.arange(n, device=g.device)[None]
    yield close("fast_logits_tf_a (one pass)", m.fast_forward(x[None], pos, causal_mask_from_positions(pos, n))[0],
                g["fast_logits_tf_a"], LOGITS_TOL)
    caches = m.new_fast_caches(1, torch.float32, g.device)
    rows = []
    for k in range(n):
        p = torch.tensor([[k]], device=g.device)
        rows.append(m.fast_forward(x[None, k:k + 1], p, causal_mask_from_positions(p, k + 1), caches, k + 1)[0, 0])
    yield close("fast_logits_tf_a (step cache)", torch.stack(rows), g["fast_logits_tf_a"], LOGITS_TOL)


def decode_step_checks(g: Golden) -> Iterator[Result]:
    if not g.has("prompt_a", "decode_step_frame", "decode_step_logits"):
        return
    m = g.ckpt.model
    T = g["prompt_a"].shape[1]
    _, caches = g.prefill(g["prompt_a"])
    pos = torch.tensor([[T]], device=g.device)
    h = m.slow_forward(m.embed(g["decode_step_frame"].to(g.device)[None, :, None]), pos,
                       causal_mask_from_positions(pos, T + 1), caches, T + 1)[0, 0]
    yield close("decode_step_logits", m.slow_head(h), g["decode_step_logits"], LOGITS_TOL)
    yield close("decode_step_hidden", h, g["decode_step_hidden"], LOGITS_TOL)


def generation_checks(g: Golden) -> Iterator[Result]:
    gm, ck = g.meta["generation"], g.ckpt
    runs = (("a", "a", gm["repetition_penalty_greedy"]), ("b", "b", gm["repetition_penalty_greedy"]),
            ("a_reppen", "a", gm["repetition_penalty_reppen"]))
    for name, case, penalty in runs:
        if not g.has(f"gen_tokens_{name}", f"prompt_{case}"):
            continue
        params = SamplingTensors.from_values([(gm["temperature"], gm["top_p"], penalty, 0)], g.device)
        frames = list(raw_frames(ck.model, g[f"prompt_{case}"], params, gm["max_new_tokens"],
                                 ck.tokenizer.im_end_id, ck.family.RULES.penalty_window))
        yield exact(f"gen_tokens_{name}", torch.stack(frames, 1), g[f"gen_tokens_{name}"])
        kept = list(Generation(iter(frames), ck.tokenizer.im_end_id))  # drops the last frame
        codes = torch.stack(kept, 1)[1:] if kept else torch.zeros(ck.config.num_codebooks, 0)
        yield exact(f"gen_codes_{name}", codes, g[f"gen_codes_{name}"])


def sampling_checks(g: Golden) -> Iterator[Result]:
    if not g.has("slow_logits", "slow_probs"):
        return
    s = g.meta["sampling"]
    one = lambda v: torch.tensor([v], dtype=torch.float32)  # noqa: E731
    for kind in ("slow", "fast"):
        probs = logits_to_probs(g[f"{kind}_logits"][None], one(s["temperature"]), one(s["top_p"]),
                                one(s["repetition_penalty"]), g[f"{kind}_previous_tokens"][None])
        yield close(f"{kind}_probs", probs[0], g[f"{kind}_probs"], PROBS_TOL)


def codec_checks(g: Golden) -> Iterator[Result]:
    if not g.has("decode_codes", "decode_wave"):
        return
    codec, dev = g.ckpt.codec, g.device
    yield close("codec.decode_latent", codec.quantizer.decode(g["decode_codes"].to(dev)[None])[0],
                g["decode_latent"], WAVE_TOL)
    yield close("codec.decode_wave", codec.decode(g["decode_codes"].to(dev)[None])[0, 0], g["decode_wave"], WAVE_TOL)
    yield close("codec.decode_wave_oob (clamped)", codec.decode(g["decode_codes_oob"].to(dev)[None])[0, 0],
                g["decode_wave_oob"], WAVE_TOL)
    wave = g["encode_wave"].to(dev)[None, None]
    yield close("codec.encoder_out", codec.encoder(codec.pad_to_frames(wave))[0], g["encode_encoder_out"], WAVE_TOL)
    codes = codec.encode(wave)
    yield exact("codec.encode_codes", codes[0], g["encode_codes"])
    yield exact("codec.encode_lengths", [codes.shape[-1]], g["encode_lengths"])
    yield close("codec.roundtrip_wave", codec.decode(codes)[0, 0], g["encode_roundtrip_wave"], WAVE_TOL)


CHECKS: tuple[Callable[[Golden], Iterator[Result]], ...] = (
    tokenizer_checks, prompt_checks, slow_checks, fast_checks, decode_step_checks, generation_checks,
    sampling_checks, codec_checks,
)


def run(root: Path, device: str = "cpu") -> list[Result]:
    g = Golden(Path(root), device)
    results = [Result("checkpoint loads strictly", True, None, None)]
    with torch.inference_mode():
        for check in CHECKS:
            results.extend(check(g))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="golden folder (checkpoint/, meta.json, *.safetensors)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    from ..errors import TTSError

    try:
        results = run(args.dir, args.device)
    except (TTSError, FileNotFoundError, KeyError, json.JSONDecodeError) as e:
        print(f"parity: {args.dir}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for r in results:
        print(r.line())
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)}/{len(results)} checks passed")
    return 0 if not failed and len(results) > 1 else 1


if __name__ == "__main__":
    sys.exit(main())
