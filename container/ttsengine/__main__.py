"""Command line: `python -m ttsengine synth|download ...`.

Errors print one line (`ttsengine: ...`) and exit 2; nothing prints a stack trace for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

from .config import DownloadConfig, from_env
from .errors import TTSError

log = logging.getLogger("ttsengine")


def _synth(args: argparse.Namespace) -> int:
    import soundfile as sf

    from .engine.engine import Engine
    from .serving.download import default_max_new_tokens
    from .synthesis.request import Reference, SynthesisRequest

    if len(args.reference) != len(args.reference_text):
        raise TTSError("give one --reference-text per --reference (in the same order)")
    if args.text is None and args.text_file is None:
        raise TTSError("give --text or --text-file")
    text = args.text if args.text is not None else _read_text(args.text_file)
    refs = []
    for audio, ref_text in zip(args.reference, args.reference_text):
        try:
            refs.append(Reference(text=ref_text, audio=Path(audio).read_bytes()))
        except OSError as e:
            raise TTSError(f"--reference {audio}: {e.strerror}") from None
    fmt = args.out.suffix.lstrip(".").upper() or "WAV"
    if fmt not in ("WAV", "FLAC", "OGG", "MP3"):
        raise TTSError(f"--out {args.out}: unsupported extension (use .wav, .flac, .ogg or .mp3)")
    caption_fmt = args.captions.suffix.lstrip(".").lower() if args.captions else None
    if caption_fmt is not None and caption_fmt not in ("srt", "vtt"):
        raise TTSError(f"--captions {args.captions}: unsupported extension (use .srt or .vtt)")

    config = from_env(model_dir=_model_dir(args.model), device=args.device)
    frames = default_max_new_tokens(config.model_dir, config.default_max_new_tokens)  # the tiny model: short
    engine = Engine.load(dataclasses.replace(config, default_max_new_tokens=frames))
    try:
        stream = engine.submit(SynthesisRequest(
            text=text, references=tuple(refs), seed=args.seed, temperature=args.temperature, top_p=args.top_p,
            repetition_penalty=args.repetition_penalty, max_new_tokens=args.max_new_tokens,
            chunk_length=args.chunk_length))
        show = sys.stderr.isatty() if args.progress is None else args.progress
        progress = _Progress(stream.text_chunks) if show else None
        result = stream.result(progress.update if progress else None)
        if progress:
            progress.close()
    finally:
        engine.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(args.out), result.audio, result.sample_rate, format=fmt)
    if caption_fmt is not None:
        from .synthesis.captions import cues, render

        per_frame = len(result.audio) / result.sample_rate / max(result.frames, 1)  # the codec's hop, exactly
        cue_list = cues(result.chunks, per_frame)
        args.captions.parent.mkdir(parents=True, exist_ok=True)
        args.captions.write_text(render(cue_list, caption_fmt), encoding="utf-8")
        print(f"wrote {args.captions}: {len(cue_list)} cue(s), one per text chunk")
    seconds = len(result.audio) / result.sample_rate
    print(f"wrote {args.out}: {len(result.audio)} samples, {seconds:.2f} s at {result.sample_rate} Hz, "
          f"{result.frames} frames, {len(result.chunks)} text chunk(s), seed {result.seed}")
    return 0


def _model_dir(model: Path | None) -> Path | None:
    """--model: a model dir, or `tiny` (the tiny random test model, as TTS_MODEL_SOURCE=tiny: no weights needed)."""
    from .serving.download import TINY, tiny_model_dir

    return tiny_model_dir() if model is not None and str(model) == TINY else model


class _Progress:
    """One line on stderr, rewritten as audio arrives: text chunk i/n, audio seconds, elapsed, a rough ETA (the
    time per finished chunk so far times the chunks left)."""

    def __init__(self, chunks: int):
        self.chunks, self.start, self.audio_s, self.last = chunks, time.perf_counter(), 0.0, 0.0

    def update(self, chunk) -> None:
        self.audio_s += len(chunk.audio) / chunk.sample_rate
        now = time.perf_counter()
        if now - self.last < 0.2:  # a terminal needs no more than five lines a second
            return
        self.last = now
        elapsed = now - self.start
        done = chunk.text_index  # chunks before the one now speaking are finished
        eta = f", ~{elapsed / done * (self.chunks - done):.0f} s left" if done else ""
        print(f"\rtext chunk {chunk.text_index + 1}/{self.chunks}, {self.audio_s:.1f} s of audio, "
              f"{elapsed:.0f} s{eta}   ", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        print(f"\r{self.chunks}/{self.chunks} text chunks, {self.audio_s:.1f} s of audio in "
              f"{time.perf_counter() - self.start:.1f} s" + " " * 20, file=sys.stderr, flush=True)


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TTSError(f"--text-file {path}: {e}") from None


def _download(args: argparse.Namespace) -> int:
    from .serving.download import download_hf, download_s3, ensure_model, fetch, read_provenance

    dl = DownloadConfig.from_env()
    if args.if_missing:  # compose's model service: fetch once into the volume, later starts keep it
        source = args.source or (f"hf://{args.hf}" if args.hf else args.s3)
        path = ensure_model(args.to, source or dl.model_source, dl.hf_token)
    elif args.hf:
        path = download_hf(args.hf, args.to, token=dl.hf_token, revision=args.revision)
    elif args.s3:
        path = download_s3(args.s3, args.to)
    elif args.source:
        path = fetch(args.source, args.to, dl.hf_token)
    else:
        raise TTSError("download: give --hf, --s3 or --source (or --if-missing with TTS_MODEL_SOURCE)")
    record = read_provenance(path)
    print(f"model ready in {path}" + (f" (from {record['source']})" if record else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ttsengine", description="Fish-Speech S1 inference engine")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("bench", help="concurrency benchmark (see: python -m ttsengine bench --help)")
    sub.add_parser("warm", help="compile, capture and save the kernel cache (see: python -m ttsengine warm --help)")
    sub.add_parser("loadtest", help="concurrency sweep against a running server (python -m ttsengine loadtest --help)")
    sub.add_parser("livetest", help="voice-agent sessions over the live WebSocket, fed by a simulated LLM "
                               "(python -m ttsengine livetest --help)")
    sub.add_parser("soak", help="minutes of mixed traffic against a running server, judged per minute "
                               "(python -m ttsengine soak --help)")
    sub.add_parser("parity", help="check this implementation against a golden folder (python -m ttsengine parity DIR)")
    sub.add_parser("plan", help="instances, autoscaling settings, cost and a simulated day for a traffic "
                               "(python -m ttsengine plan --help)")
    sub.add_parser("info", help="sizes, parameter counts and KV memory of a model, without loading its weights "
                               "(python -m ttsengine info --help)")

    s = sub.add_parser("synth", help="text -> audio file")
    s.add_argument("--model", type=Path, default=None,
                   help="model dir (default: $TTS_MODEL_DIR or /opt/ml/model), or `tiny`: the tiny random test model "
                        "(noise; no weights needed; 64 frames unless --max-new-tokens)")
    s.add_argument("--text")
    s.add_argument("--text-file", type=Path)
    s.add_argument("--reference", action="append", default=[], help="reference audio file (repeatable)")
    s.add_argument("--reference-text", action="append", default=[], help="transcript of each --reference")
    s.add_argument("--seed", type=int)
    s.add_argument("--temperature", type=float)
    s.add_argument("--top-p", type=float)
    s.add_argument("--repetition-penalty", type=float)
    s.add_argument("--max-new-tokens", type=int, help="frames per text chunk (0 = fill the context)")
    s.add_argument("--chunk-length", type=int, help="characters per text chunk of a long text")
    s.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    s.add_argument("--out", type=Path, required=True, help=".wav, .flac, .ogg or .mp3")
    s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress line on stderr (default: when stderr is a terminal)")
    s.add_argument("--captions", type=Path, help="also write captions, one cue per text chunk: .srt or .vtt")
    s.set_defaults(func=_synth)

    d = sub.add_parser("download", help="fetch a model dir from the Hugging Face Hub or S3")
    d.add_argument("--to", type=Path, required=True)
    src = d.add_mutually_exclusive_group()
    src.add_argument("--hf", metavar="REPO_ID", help="e.g. fishaudio/openaudio-s1-mini (uses HF_TOKEN)")
    src.add_argument("--s3", metavar="URI", help="s3://bucket/prefix/ or s3://bucket/path/model.tar.gz")
    src.add_argument("--source", help="hf://owner/name[@rev], s3://..., a model dir or tiny (the test model) "
                   "(default $TTS_MODEL_SOURCE)")
    d.add_argument("--revision", help="HF branch, tag or commit")
    d.add_argument("--if-missing", action="store_true",
                   help="keep --to when it is complete and holds this source; otherwise fetch it into a fresh "
                   "sibling dir and switch the --to link to it")
    d.set_defaults(func=_download)
    return ap


# subcommands with their own argument parsers (modules in tools/): python -m ttsengine <tool> ...
TOOLS = {"bench": "bench", "warm": "warm", "loadtest": "loadtest", "livetest": "load.live", "soak": "soak",
         "parity": "parity", "info": "info", "plan": "plan"}  # name -> its module under tools/
ENGINE_TOOLS = ("bench", "warm")  # log the engine's start (cache status, warm-up); loadtest is a quiet HTTP client
READ_AHEAD_TOOLS = ("warm",)  # start reading the model's weights and building kernels before their imports
# (serving/prefetch.py)


def _dirs_given(argv: list[str]) -> tuple[str | None, str | None]:
    """(--model, --cache-dir) as a tool's command line gives them (its own parser reports anything wrong later): what
    a start reads and builds ahead, before its imports, besides the environment's."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    ap.add_argument("--model")
    ap.add_argument("--cache-dir")
    try:
        known, _ = ap.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit):  # e.g. a flag without its value: the tool's parser says so
        return None, None
    return known.model, known.cache_dir


def _log_to_stderr() -> None:
    logging.basicConfig(level=from_env().log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in TOOLS:
        import importlib

        if argv[0] in READ_AHEAD_TOOLS:
            from .config import with_dirs
            from .serving.prefetch import build_kernels_ahead, read_weights_ahead

            env = with_dirs(*_dirs_given(argv[1:]))
            read_weights_ahead(env)
            build_kernels_ahead(env)
        tool = importlib.import_module(f".tools.{TOOLS[argv[0]]}", __package__)
        try:
            if argv[0] in ENGINE_TOOLS:
                _log_to_stderr()  # beside their JSON on stdout
            return tool.main(argv[1:])
        except TTSError as e:
            print(f"ttsengine {argv[0]}: {e}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    try:
        _log_to_stderr()
        return args.func(args)
    except TTSError as e:
        print(f"ttsengine {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
