"""Reading the weights ahead of the imports (feature early_readahead): which files a load will read, found without
torch (model/loading/readahead.py weight_files), and read_weights_ahead() from the package root in a fresh
interpreter: torch not imported, the files read on background threads; off with the feature, quiet on a bad
environment (the start reports that)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from conftest import ROOT

from ttsengine.model.families import s1
from ttsengine.model.loading.readahead import CODEC_FILES, MODEL_FILES, weight_files


def test_the_file_names_are_the_familys():
    assert MODEL_FILES == s1.MODEL_FILES and CODEC_FILES == s1.CODEC_FILES


def test_the_newest_converted_codec_else_the_codecs_file(tmp_path):
    model, cache = tmp_path / "model", tmp_path / "cache"
    model.mkdir()
    assert weight_files(model, cache) == []  # nothing there: the load says what is missing
    (model / "model.safetensors").write_bytes(b"m")
    (model / "codec.pth").write_bytes(b"c")
    assert weight_files(model, None) == [model / "model.safetensors", model / "codec.pth"]
    assert weight_files(model, cache) == [model / "model.safetensors", model / "codec.pth"]  # no cache yet
    (cache / "weights").mkdir(parents=True)
    old, new = cache / "weights" / "codec-old.pt", cache / "weights" / "codec-new.pt"
    old.write_bytes(b"o")
    new.write_bytes(b"n")
    os.utime(old, (time.time() - 100, time.time() - 100))
    assert weight_files(model, cache) == [model / "model.safetensors", new]


def _ahead(env: dict) -> dict:
    """read_weights_ahead() in a fresh interpreter -> what it saw: torch imported?, threads, files read."""
    code = ("import json, sys; from ttsengine import read_weights_ahead; r = read_weights_ahead(); "
            "torch = 'torch' in sys.modules; r and r.join(30); "
            "print(json.dumps({'torch': torch, 'threads': [t.name for t in r.threads] if r else None, "
            "'alive': any(t.is_alive() for t in r.threads) if r else None}))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TTS_")}
    run = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_read_ahead_before_torch_is_imported(tmp_path):
    (tmp_path / "model.pth").write_bytes(os.urandom(1 << 20))
    (tmp_path / "codec.pth").write_bytes(os.urandom(1 << 20))
    got = _ahead({"TTS_MODEL_DIR": str(tmp_path)})
    assert got == {"torch": False, "threads": ["readahead-model.pth", "readahead-codec.pth"], "alive": False}
    assert _ahead({"TTS_MODEL_DIR": str(tmp_path), "TTS_FEATURES": "-early_readahead"})["threads"] is None
    assert _ahead({"TTS_MODEL_DIR": str(tmp_path), "TTS_MAX_BATCH": "lots"})["threads"] is None  # reported later
    assert _ahead({"TTS_MODEL_DIR": str(tmp_path / "nowhere")})["threads"] is None


def test_warm_reads_ahead_from_its_command_lines_directories(tmp_path):
    """`warm --model DIR --cache-dir DIR` without TTS_MODEL_DIR / TTS_CACHE_DIR: what a start begins before its imports
    (the weights read, our kernels built) follows the command line's directories, as the variables would have it; a
    flag without its value leaves the environment's (warm's own parser reports it)."""
    from ttsengine.__main__ import _dirs_given
    from ttsengine.config import read_ahead_paths, with_dirs

    (tmp_path / "model.pth").write_bytes(os.urandom(1 << 16))
    (tmp_path / "codec.pth").write_bytes(os.urandom(1 << 16))
    argv = ["--until-first-audio", "--model", str(tmp_path), "--cache-dir", str(tmp_path / "kc"), "--no-blob"]
    assert _dirs_given(argv) == (str(tmp_path), str(tmp_path / "kc"))
    assert _dirs_given(["--random-weights", "s1-mini", "--cache-dir=/c"]) == (None, "/c")
    assert _dirs_given(["--model"]) == (None, None)
    assert _dirs_given(["--mod", "x"]) == (None, None)  # no abbreviations: warm's parser decides what --mod is
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TTS_")}
    given = with_dirs(*_dirs_given(argv))
    env = {**clean, "TTS_MODEL_DIR": given["TTS_MODEL_DIR"], "TTS_CACHE_DIR": given["TTS_CACHE_DIR"]}
    assert read_ahead_paths(env) == (tmp_path, tmp_path / "kc")
    code = ("import json, sys; from ttsengine.__main__ import _dirs_given; from ttsengine.config import with_dirs; "
            "from ttsengine import read_weights_ahead; r = read_weights_ahead(with_dirs(*_dirs_given(sys.argv[1:]))); "
            "r and r.join(30); print(json.dumps([t.name for t in r.threads] if r else None))")
    run = subprocess.run([sys.executable, "-c", code, *argv], env=clean, capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == ["readahead-model.pth", "readahead-codec.pth"]
