"""model.tar.gz with the codec cache entry: a `warm` run's bf16 codec goes into kernel-cache/weights/, and a start
from the unpacked archive (SageMaker's /opt/ml/model with TTS_CACHE_DIR=/opt/ml/model/kernel-cache) reads it
instead of converting codec.pth again."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

from conftest import ROOT, complete_model

from ttsengine.tools import warm


def test_the_codec_cache_entry_travels_in_the_archive(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TTS_DEVICE", "cpu")
    monkeypatch.setenv("TTS_CODEC_DTYPE", "bfloat16")  # the run dtype the codec cache converts to (bf16 on CUDA)
    model, kc = complete_model(tmp_path / "model"), tmp_path / "kc"
    assert warm.main(["--model", str(model), "--cache-dir", str(kc), "--no-blob", "--until-first-audio"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["codec_cache"] == "miss"
    (entry,) = (kc / "weights").glob("codec-*.pt")

    archive = tmp_path / "model.tar.gz"
    run = subprocess.run([sys.executable, "-m", "infra.sagemaker.package", "--model", str(model), "--out",
                          str(archive), "--codec-cache", str(entry)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    opt = tmp_path / "opt-ml-model"
    with tarfile.open(archive) as tar:
        assert f"kernel-cache/weights/{entry.name}" in tar.getnames()
        tar.extractall(opt)
    assert warm.main(["--model", str(opt), "--cache-dir", str(opt / "kernel-cache"), "--no-blob",
                      "--until-first-audio"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["codec_cache"] == "hit"


def test_a_file_that_is_not_an_entry_is_refused(tmp_path):
    other = tmp_path / "model.pth"
    other.write_bytes(b"x")
    run = subprocess.run([sys.executable, "-m", "infra.sagemaker.package", "--model", str(tmp_path), "--out",
                          str(tmp_path / "m.tar.gz"), "--codec-cache", str(other)], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [
        f"package: --codec-cache {other}: not a codec cache entry (weights/codec-KEY.pt)"]
