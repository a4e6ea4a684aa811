"""`python -m ttsengine download --s3` against a local moto S3 server (no network)."""

from __future__ import annotations

import io
import shutil
import tarfile

import pytest
from conftest import MODEL_DIR, complete_model, run_cli, s3_client

from ttsengine.errors import CheckpointError, DownloadError
from ttsengine.serving.download import verify_model_dir


@pytest.fixture(scope="module")
def s3_env(s3_server):
    env = s3_server
    s3 = s3_client(env)
    s3.create_bucket(Bucket="models")
    for f in MODEL_DIR.iterdir():  # a complete model dir: its codec_config.json inside
        s3.upload_file(str(f), "models", f"s1/tiny/{f.name}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in MODEL_DIR.iterdir():
            tar.add(f, arcname=f"model/{f.name}")  # one top-level folder: flattened on unpack
    s3.put_object(Bucket="models", Key="packed/model.tar.gz", Body=buf.getvalue())
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    s3.put_object(Bucket="models", Key="evil/model.tar.gz", Body=evil.getvalue())
    s3.put_object(Bucket="models", Key="partial/config.json", Body=b"{}")
    return env


def test_download_prefix_then_synthesize(s3_env, tmp_path):
    dest = tmp_path / "m"
    proc = run_cli("ttsengine", "download", "--to", str(dest), "--s3", "s3://models/s1/tiny", env=s3_env)
    assert proc.returncode == 0, proc.stderr
    assert "model ready in" in proc.stdout
    assert "codec_config.json" in {p.name for p in MODEL_DIR.iterdir()}
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in MODEL_DIR.iterdir())
    assert (dest / "model.pth").read_bytes() == (MODEL_DIR / "model.pth").read_bytes()
    out = tmp_path / "a.wav"
    proc = run_cli("ttsengine", "synth", "--model", str(dest), "--text", "Hi.", "--max-new-tokens", "5",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr


def test_download_tarball_is_unpacked_and_flattened(s3_env, tmp_path):
    dest = tmp_path / "m"
    proc = run_cli("ttsengine", "download", "--to", str(dest), "--s3", "s3://models/packed/model.tar.gz", env=s3_env)
    assert proc.returncode == 0, proc.stderr
    verify_model_dir(dest)
    assert (dest / "codec.pth").read_bytes() == (MODEL_DIR / "codec.pth").read_bytes()


@pytest.mark.parametrize("uri, pattern", [
    ("s3://models/evil/model.tar.gz", "refusing unsafe archive member '../escape.txt'"),
    ("s3://models/partial", "model directory is incomplete, missing: tokenizer.tiktoken, special_tokens.json, "
                            "model.pth or model.safetensors, codec.pth or codec.safetensors"),
    ("s3://models/nothing-here", "no objects under this prefix"),
    ("s3://no-such-bucket/x", "NoSuchBucket"),
    ("s3://models/absent.tar.gz", "404"),
    ("http://example.com/x", "not an s3://bucket/key URI"),
])
def test_download_errors_are_one_line(s3_env, tmp_path, uri, pattern):
    proc = run_cli("ttsengine", "download", "--to", str(tmp_path / "m"), "--s3", uri, env=s3_env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert pattern in proc.stderr
    assert not (tmp_path / "escape.txt").exists()


def test_missing_credentials(s3_env, tmp_path, monkeypatch):
    env = {k: v for k, v in s3_env.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
    env.update({"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"})
    proc = run_cli("ttsengine", "download", "--to", str(tmp_path / "m"), "--s3", "s3://models/s1/tiny", env=env)
    assert proc.returncode == 2
    assert "no AWS credentials" in proc.stderr


def test_verify_names_every_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="missing: config.json, tokenizer.tiktoken"):
        verify_model_dir(tmp_path)


def test_ensure_model_fetches_once_and_keeps_it(s3_env, tmp_path, monkeypatch):
    from ttsengine.serving.download import ensure_model

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    target = tmp_path / "vol" / "models" / "s1"
    assert ensure_model(target, "s3://models/s1/tiny") == target
    verify_model_dir(target)
    assert not (tmp_path / "vol" / "models" / "s1.partial").exists()
    stamp = (target / "model.pth").stat().st_mtime_ns
    assert ensure_model(target, "s3://models/s1/tiny") == target  # complete, from this source: not fetched again
    assert (target / "model.pth").stat().st_mtime_ns == stamp
    with pytest.raises(DownloadError, match="no objects"):  # another source is fetched (and this one fails)
        ensure_model(target, "s3://models/no-such-prefix")
    assert (target / "model.pth").stat().st_mtime_ns == stamp

    local = ensure_model(tmp_path / "copy", str(complete_model(tmp_path / "src")))
    assert (local / "codec_config.json").is_file()
    with pytest.raises(CheckpointError, match="missing: config.json"):
        ensure_model(tmp_path / "empty", None)
    with pytest.raises(DownloadError, match="not hf://"):
        ensure_model(tmp_path / "empty", str(tmp_path / "nowhere"))
    with pytest.raises(DownloadError, match="no objects"):
        ensure_model(tmp_path / "empty", "s3://models/nothing-here")
    assert not (tmp_path / "empty").exists()


def test_download_cli_if_missing_uses_the_source_once(tmp_path):
    src = complete_model(tmp_path / "src")
    dest = tmp_path / "vol" / "current"
    proc = run_cli("ttsengine", "download", "--to", str(dest), "--if-missing", env={"TTS_MODEL_SOURCE": str(src)})
    assert proc.returncode == 0 and "model ready" in proc.stdout, proc.stderr
    shutil.rmtree(src)
    again = run_cli("ttsengine", "download", "--to", str(dest), "--if-missing", env={"TTS_MODEL_SOURCE": str(src)})
    assert again.returncode == 0, again.stderr  # complete from this source already: the source is not read again
    gone = run_cli("ttsengine", "download", "--to", str(dest), "--if-missing", "--source", str(tmp_path / "gone"))
    assert gone.returncode == 2 and "Traceback" not in gone.stderr and "not hf://" in gone.stderr
    verify_model_dir(dest)  # the failed switch left the model in place
    bad = run_cli("ttsengine", "download", "--to", str(tmp_path / "x"), "--if-missing", env={"TTS_MODEL_SOURCE": ""})
    assert bad.returncode != 0 and "missing: config.json" in bad.stderr and "Traceback" not in bad.stderr


# ---- provenance: which source filled a model dir (issue 47) -----------------------------------------------------
def _marked_model(dest, marker):
    complete_model(dest)
    (dest / "marker.txt").write_text(marker)
    return dest


def test_changed_source_is_fetched_fresh_and_switched(tmp_path, caplog):
    from ttsengine.serving.download import PROVENANCE, ensure_model, read_provenance

    a, b = _marked_model(tmp_path / "a", "A"), _marked_model(tmp_path / "b", "B")
    current = tmp_path / "vol" / "current"
    ensure_model(current, str(a))
    assert current.is_symlink() and (current / "marker.txt").read_text() == "A"
    assert read_provenance(current)["source"] == str(a)
    first = current.resolve()
    stamp = (current / "model.pth").stat().st_mtime_ns
    ensure_model(current, str(a) + "/")  # the same source (spelt differently): kept
    assert current.resolve() == first and (current / "model.pth").stat().st_mtime_ns == stamp

    ensure_model(current, str(b))
    assert (current / "marker.txt").read_text() == "B" and read_provenance(current)["source"] == str(b)
    assert current.resolve() != first and not first.exists(), "the old model's directory is removed"
    left = sorted(p.name for p in current.parent.iterdir())
    assert left == ["current", current.resolve().name], left  # no .partial, no stale link
    assert PROVENANCE.startswith(".")  # hidden: `ls` of a model dir shows the model's files

    with pytest.raises(DownloadError, match="not hf://"):  # a failed fetch leaves the served model as it was
        ensure_model(current, str(tmp_path / "nowhere"))
    assert (current / "marker.txt").read_text() == "B"


def test_a_dir_without_a_record_is_served_with_a_warning(tmp_path, caplog):
    from ttsengine.serving.download import ensure_model, read_provenance

    legacy = _marked_model(tmp_path / "vol" / "current", "old")  # filled by hand or by an older version
    with caplog.at_level("WARNING"):
        assert ensure_model(legacy, str(complete_model(tmp_path / "src"))) == legacy
    assert (legacy / "marker.txt").read_text() == "old" and read_provenance(legacy) is None
    assert "no record of its source" in caplog.text and "docker volume rm" in caplog.text


def test_a_recorded_real_dir_is_replaced_by_a_link(tmp_path):
    """A real directory with a record (a copied volume) and a new source: set aside, then the link replaces it."""
    from ttsengine.serving.download import ensure_model, read_provenance

    current = tmp_path / "vol" / "current"
    ensure_model(current, str(_marked_model(tmp_path / "a", "A")))
    real = current.resolve()
    current.unlink()
    real.rename(current)
    ensure_model(current, str(_marked_model(tmp_path / "b", "B")))
    assert current.is_symlink() and (current / "marker.txt").read_text() == "B"
    assert read_provenance(current)["source"] == str(tmp_path / "b")
    assert sorted(p.name for p in current.parent.iterdir()) == ["current", current.resolve().name]


def test_tiny_source_installs_a_complete_model(tmp_path):
    from ttsengine.serving.download import ensure_model, read_provenance

    current = ensure_model(tmp_path / "current", "tiny")
    verify_model_dir(current)
    assert (current / "codec_config.json").is_file() and read_provenance(current)["source"] == "tiny"
    out = tmp_path / "a.wav"
    proc = run_cli("ttsengine", "synth", "--model", str(current), "--text", "Hi.", "--max-new-tokens", "5",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr


def test_s3_tarball_records_its_etag(s3_env, tmp_path, monkeypatch):
    from ttsengine.serving.download import ensure_model, read_provenance

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    current = ensure_model(tmp_path / "current", "s3://models/packed/model.tar.gz")
    record = read_provenance(current)
    etag = s3_client(s3_env).head_object(Bucket="models", Key="packed/model.tar.gz")["ETag"].strip('"')
    assert record["source"] == "s3://models/packed/model.tar.gz" and record["etag"] == etag
    assert not (current / ".s3-etag").exists()


def test_download_cli_switches_when_the_source_changes(tmp_path):
    """The issue's first-hour path: the compose model service with the tiny model, then another source."""
    dest = tmp_path / "vol" / "current"
    first = run_cli("ttsengine", "download", "--to", str(dest), "--if-missing", env={"TTS_MODEL_SOURCE": "tiny"})
    assert first.returncode == 0 and "model ready" in first.stdout, first.stderr
    other = _marked_model(tmp_path / "real", "real")
    second = run_cli("ttsengine", "download", "--to", str(dest), "--if-missing", env={"TTS_MODEL_SOURCE": str(other)})
    assert second.returncode == 0, second.stderr
    assert (dest / "marker.txt").read_text() == "real"


def test_the_tiny_model_gets_a_short_default_length(tmp_path):
    from ttsengine.serving.download import TINY_MAX_NEW_TOKENS, default_max_new_tokens, ensure_model

    installed = ensure_model(tmp_path / "installed", "tiny")
    copied = complete_model(tmp_path / "models" / "tiny")  # the README's other way: a copy under ./models
    fetched = ensure_model(tmp_path / "vol", str(copied))  # that copy fetched as a source of its own (compose)
    for d in (installed, copied, fetched, MODEL_DIR):
        assert default_max_new_tokens(d, 0) == TINY_MAX_NEW_TOKENS
        assert default_max_new_tokens(d, 300) == 300  # a configured length wins
    other = complete_model(tmp_path / "other")
    (other / "config.json").write_text((other / "config.json").read_text().replace('"dim": 64', '"dim": 128'))
    assert default_max_new_tokens(other, 0) == 0
