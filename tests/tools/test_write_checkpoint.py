"""`warm` / `bench --random-weights NAME --write-checkpoint DIR`: bad input is one line and exit status 2 before
anything is generated; a good run writes the directory, loads from it like a real model and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import GOLDEN, MODEL_DIR, ROOT

from ttsengine.model.loading import synthetic
from ttsengine.tools import warm

ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'container'}:{ROOT}", "TTS_DEVICE": "cpu"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ttsengine", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


def _one_line_error(p: subprocess.CompletedProcess, tool: str, pattern: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ttsengine {tool}: ") and pattern in lines[0], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_bad_targets_are_one_line_errors(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    kc = ["--cache-dir", str(tmp_path / "kc")]
    _one_line_error(_cli("warm", "--random-weights", "s1-mini", "--write-checkpoint", str(full), *kc), "warm",
                    f"{full}: not empty")
    _one_line_error(_cli("warm", "--random-weights", "s1-mini", "--write-checkpoint", str(blocker / "ck"), *kc),
                    "warm", "cannot write there")
    _one_line_error(_cli("warm", "--model", str(MODEL_DIR), "--write-checkpoint", str(tmp_path / "new"), *kc),
                    "warm", "--write-checkpoint needs --random-weights")
    _one_line_error(_cli("bench", "--random-weights", "s1-mini", "--write-checkpoint", str(full)), "bench",
                    "not empty")
    _one_line_error(_cli("warm", "--random-weights", "s2-pro", "--write-checkpoint", str(tmp_path / "n"), *kc),
                    "warm", "unknown synthetic model 's2-pro'")
    assert (full / "x").read_text() == "x" and not (tmp_path / "new").exists()


@pytest.fixture()
def tiny_preset(monkeypatch):
    spec = synthetic.PresetSpec(json.loads((MODEL_DIR / "config.json").read_text()),
                                json.loads((GOLDEN / "codec_config.json").read_text()), base_vocab=300)
    monkeypatch.setitem(synthetic.FAMILIES, "tiny", spec)


def test_warm_writes_then_loads_from_the_directory(tmp_path, tiny_preset, monkeypatch, capsys):
    monkeypatch.setenv("TTS_DEVICE", "cpu")
    monkeypatch.setenv("TTS_CODEC_DTYPE", "bfloat16")  # the run dtype the codec cache converts to
    ck, kc = tmp_path / "ck", tmp_path / "kc"
    assert warm.main(["--random-weights", "tiny", "--write-checkpoint", str(ck), "--cache-dir", str(kc)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["model"] == str(ck) and report["write_checkpoint_s"] > 0
    assert report["codec_cache"] == "miss" and report["process_to_first_audio_s"] > 0
    assert {"model.pth", "codec.pth", "config.json", "tokenizer.tiktoken", "special_tokens.json"} <= {
        p.name for p in ck.iterdir()}
    # the next start reads the same directory, and the codec from the cache
    assert warm.main(["--model", str(ck), "--cache-dir", str(kc), "--no-blob", "--until-first-audio"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["codec_cache"] == "hit" and again["write_checkpoint_s"] is None
