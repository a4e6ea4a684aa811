"""The CLI as a user runs it: real subprocesses, files on disk, one-line errors."""

from __future__ import annotations

import io
import re

import numpy as np
import soundfile as sf
from conftest import MODEL_DIR, run_cli


def test_synth_writes_whole_frames(tmp_path):
    out = tmp_path / "x.wav"
    proc = run_cli("ttsengine", "synth", "--model", str(MODEL_DIR), "--text", "Hello there.", "--out", str(out),
                   "--max-new-tokens", "64", "--seed", "4")
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(out)
    assert rate == 44100 and len(audio) > 0 and len(audio) % 2048 == 0
    assert f"wrote {out}" in proc.stdout and "seed 4" in proc.stdout


def test_synth_on_the_tiny_model_needs_no_weights_and_stays_short(tmp_path):
    # issue 47: `--model tiny` as TTS_MODEL_SOURCE=tiny; without --max-new-tokens the tiny model's short default
    from ttsengine.serving.download import TINY_MAX_NEW_TOKENS

    out, same = tmp_path / "t.wav", tmp_path / "same.wav"
    proc = run_cli("ttsengine", "synth", "--model", "tiny", "--text", "Hello there.", "--out", str(out), "--seed", "4")
    assert proc.returncode == 0, proc.stderr
    frames = int(re.search(r"(\d+) frames", proc.stdout).group(1))
    assert 0 < frames <= TINY_MAX_NEW_TOKENS, proc.stdout
    proc = run_cli("ttsengine", "synth", "--model", str(MODEL_DIR), "--text", "Hello there.", "--out", str(same),
                   "--seed", "4", "--max-new-tokens", str(TINY_MAX_NEW_TOKENS))
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(sf.read(out)[0], sf.read(same)[0])  # the same model as the checkpoint in tests/assets


def test_synth_writes_captions_one_cue_per_text_chunk(tmp_path):
    out, srt, vtt = tmp_path / "c.wav", tmp_path / "c.srt", tmp_path / "sub" / "c.vtt"
    first, second, third = ("The first sentence is right here, long enough.",
                            "The second sentence follows it, also long.", "The third sentence closes the whole thing.")
    for captions in (srt, vtt):
        proc = run_cli("ttsengine", "synth", "--model", str(MODEL_DIR), "--text", f"{first} {second} {third}",
                       "--chunk-length", "50",
                       "--max-new-tokens", "12", "--seed", "4", "--out", str(out), "--captions", str(captions))
        assert proc.returncode == 0, proc.stderr
        assert f"wrote {captions}: 3 cue(s)" in proc.stdout
    seconds = len(sf.read(out)[0]) / 44100
    blocks = srt.read_text().strip().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["1", "2", "3"]
    assert [b.splitlines()[2] for b in blocks] == [first, second, third]
    times = [b.splitlines()[1].split(" --> ") for b in blocks]
    assert times[0][0] == "00:00:00,000" and times[0][1] == times[1][0] and times[1][1] == times[2][0]
    end = times[2][1]
    assert abs(int(end[6:8]) + int(end[9:]) / 1000 - seconds) < 0.001  # the last cue ends with the audio
    assert vtt.read_text().startswith("WEBVTT\n\n00:00:00.000 --> ") and vtt.read_text().count(" --> ") == 3
    bad = run_cli("ttsengine", "synth", "--model", str(MODEL_DIR), "--text", "x", "--out", str(out), "--captions",
                  str(tmp_path / "c.txt"))
    assert "--captions" in _one_line_error(bad) and "use .srt or .vtt" in bad.stderr


def test_synth_progress_line(tmp_path):
    text = " ".join(["A sentence that is long enough to be a text chunk of its own here."] * 3)
    args = ("ttsengine", "synth", "--model", str(MODEL_DIR), "--text", text, "--chunk-length", "70",
            "--max-new-tokens", "12", "--seed", "4", "--out", str(tmp_path / "p.wav"))
    shown = run_cli(*args, "--progress")
    assert shown.returncode == 0, shown.stderr
    assert "text chunk 1/3, " in shown.stderr and re.search(r"3/3 text chunks, [\d.]+ s of audio in", shown.stderr)
    quiet = run_cli(*args)  # not a terminal: no progress unless asked
    assert quiet.returncode == 0 and "text chunk" not in quiet.stderr


def test_synth_with_reference_and_model_dir_from_env(tmp_path):
    ref = tmp_path / "ref.flac"
    sf.write(ref, (0.2 * np.random.default_rng(0).standard_normal((48000, 2))).astype(np.float32), 48000)
    out = tmp_path / "y.flac"
    proc = run_cli("ttsengine", "synth", "--text", "Say it like me.", "--reference", str(ref), "--reference-text",
                   "Some words.", "--max-new-tokens", "10", "--out", str(out), env={"TTS_MODEL_DIR": str(MODEL_DIR)})
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(io.BytesIO(out.read_bytes()))
    # the sampled model may end before the 10-token cap (an unseeded run once stopped after 2 frames):
    # whatever it generated must be in the file, whole frames of 2,048 samples
    frames = int(re.search(r"(\d+) frames", proc.stdout).group(1))
    assert rate == 44100 and 1 <= frames <= 9 and len(audio) == frames * 2048


def _one_line_error(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ttsengine ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_cli_errors_are_one_line(tmp_path):
    out = str(tmp_path / "o.wav")
    assert "model directory not found" in _one_line_error(
        run_cli("ttsengine", "synth", "--model", str(tmp_path / "none"), "--text", "hi", "--out", out))
    assert "top_p=3.0 is outside" in _one_line_error(
        run_cli("ttsengine", "synth", "--model", str(MODEL_DIR), "--text", "hi", "--top-p", "3", "--out", out))
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all" * 10)
    assert "references[0].audio: cannot decode" in _one_line_error(run_cli(
        "ttsengine", "synth", "--model", str(MODEL_DIR), "--text", "hi", "--reference", str(bad),
        "--reference-text", "x", "--out", out))
    assert "--reference" in _one_line_error(run_cli(
        "ttsengine", "synth", "--model", str(MODEL_DIR), "--text", "hi", "--reference", str(tmp_path / "absent.wav"),
        "--reference-text", "x", "--out", out))
    assert "unsupported extension" in _one_line_error(
        run_cli("ttsengine", "synth", "--model", str(MODEL_DIR), "--text", "hi", "--out", str(tmp_path / "o.xyz")))
    assert "TTS_DEVICE" in _one_line_error(
        run_cli("ttsengine", "synth", "--model", str(MODEL_DIR), "--text", "hi", "--out", out,
                env={"TTS_DEVICE": "quantum"}))


def test_bench_with_a_stored_voice_and_poisson_arrivals(tmp_path):
    # the sweep's two load shapes on the tiny model: every stream clones one 2 s voice (its codes are in
    # every prompt), and requests arrive at 40 per second instead of all at once
    import json

    proc = run_cli("ttsengine", "bench", "--model", str(MODEL_DIR), "--concurrency", "1,3", "--frames", "6",
                   "--voice", "2", "--arrivals", "poisson:40", "--profile", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["voice_seconds"] == 2 and report["voice_prompt_tokens"] == 44  # ceil(2 s * 44100 / 2048)
    assert report["arrivals"] == "poisson:40" and report["memory_preset"]["name"] == "cpu"
    assert report["fused_kernels"] == [] and report["prefix_cache"] is True  # CPU: the reference step
    for level in report["levels"]:
        assert level["arrival_rate"] == 40 and level["rejected"] == 0
        assert level["prefill_tokens_per_request"] > 44  # the voice's codes, then the transcript and text
        assert 0 <= level["stall_p95_ms"] <= level["stall_max_ms"]
        # the engine loop's own host time (its iterations less step waits; on a CPU nothing is waited for): within
        # the level's wall time, give or take an iteration at each end of it
        assert 0 < level["time_host_s"] <= level["wall_s"] + 1.0
        assert abs(level["per_engine"][0]["time_host_s"] - level["time_host_s"]) <= 1e-3
        # --check-audio (default 4 a level): the sampled streams' audio is their codes' whole decode (fp32 here)
        assert level["audio_checked"] == min(4, level["concurrency"]) and level["audio_failures"] == 0
        assert level["audio_snr_min_db"] > 60
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 3]
    assert "memory preset" in proc.stdout and "poisson:40" in proc.stdout
    names = [row["name"] for row in report["profile"]]  # --profile: the GPU's streams first (none on a CPU)
    assert names[:3] == ["GPU time, first kernel to last", "GPU busy (any stream)",
                         "GPU busy on two or more streams at once"] and any(n.startswith("CPU ") for n in names)


def test_bench_codec_only_measures_the_engines_codec_by_default(tmp_path):
    # the default mode is the codec built as the engine would build it here (a CPU: channel-major, no Snake kernel,
    # no tuning, no graphs; TTS_FEATURES=+codec_channels_last: time-major); named modes still run
    import json

    proc = run_cli("ttsengine", "bench", "--codec-only", "--model", str(MODEL_DIR), "--concurrency", "2",
                   "--chunk-frames", "4", "--seconds", "0.4", "--codec-modes", "engine,whole", "--out", str(tmp_path),
                   env={"TTS_FEATURES": "+codec_channels_last"})
    assert proc.returncode == 0, proc.stderr
    assert "engine: time-major, cuDNN untuned, graphs off" in proc.stdout
    rows = json.loads((tmp_path / "codec_bench.json").read_text())
    assert [(r["mode"], r["streams"], r["chunk_frames"]) for r in rows] == [("engine", 2, 4), ("whole", 2, 4)]
    assert rows[0]["engine"] == "time-major, cuDNN untuned" and all(r["frames_per_s"] > 0 for r in rows)
    for modes, what in (("fast", "unknown fast"), ("engine+cudnn", "engine takes no +option")):
        line = _one_line_error(run_cli("ttsengine", "bench", "--codec-only", "--model", str(MODEL_DIR),
                                       "--codec-modes", modes))
        assert "--codec-modes" in line and what in line


def test_bench_rejects_a_bad_arrival_spec():
    for spec in ("uniform:3", "poisson:", "poisson:-1"):
        proc = run_cli("ttsengine", "bench", "--model", str(MODEL_DIR), "--arrivals", spec)
        assert "--arrivals" in _one_line_error(proc)


def test_every_tools_help_has_its_whole_description():
    """`python -m ttsengine warm --help` (and every tool's) shows its module docstring whole, not its first line
    cut mid-sentence (issue 47)."""
    import contextlib
    import importlib

    import pytest

    from ttsengine.__main__ import TOOLS

    for tool, where in TOOLS.items():
        module = importlib.import_module(f"ttsengine.tools.{where}")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            module.main(["--help"])
        text = " ".join(out.getvalue().split())
        assert " ".join(module.__doc__.split()) in text, tool
        assert module.__doc__.strip().endswith((".", ")", ":")), tool
