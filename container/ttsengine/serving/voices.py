"""Named reference voices on disk: audio + transcript, with the codec codes computed once at upload.

Layout: <root>/<id>/{audio.<ext>, text.txt, codes.npy, meta.json}. Ids: letters, digits, space, '_'
and '-' (upstream's charset), 1-64 characters, starting with a letter or digit, so an id can never
name a path outside the root. Writes go to a temporary directory renamed into place, so a crash
never leaves half a voice. Codes are tagged with the codec that made them and recomputed from the
stored audio when the model changes.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _-]{0,63}$")
AUDIO_EXTENSIONS = ("wav", "flac", "mp3", "ogg", "opus", "m4a", "aac", "aiff", "aif", "webm")
# a reference transcript longer than this cannot be what a clip of at most a minute says, and its prompt would
# leave no room for a request's own text
MAX_TRANSCRIPT_CHARS = 5000


@dataclass(frozen=True)

class Voice:
    id: str
    text: str
    codes: np.ndarray  # int64 [n, F]
    seconds: float


log = logging.getLogger(__name__)

class VoiceExists(InputError):
    """The id a voice would take is already a stored voice's (HTTP 409)."""

    status = 409


class VoiceNotFound(InputError):
    """No stored voice of that id (HTTP 404): never added, or deleted or renamed while a replace encoded."""

    status = 404


def check_id(voice_id: object) -> str:
    if not isinstance(voice_id, str):
        raise InputError(f"a voice id is a string, not {type(voice_id).__name__}")
    if not ID_PATTERN.fullmatch(voice_id) or voice_id != voice_id.strip():
        raise InputError(f"invalid voice id {str(voice_id)[:80]!r}: use 1-64 letters, digits, spaces, '_' or '-', "
                         "starting with a letter or digit")
    return voice_id


class VoiceStore:
    def __init__(self, root: Path, encode: Callable[[bytes], np.ndarray], codec_tag: str, frame_rate: float,
                 forget: Callable[[str, np.ndarray], None] | None = None):
        """encode(audio bytes) -> codes [n, F] (raises InputError for unreadable audio); forget(text, codes): told
        about a voice deleted or replaced, so the engines drop its cached prompt prefix
        (engine/control/prefix_cache.py)."""
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as its files are (_private)
        tempfile.TemporaryFile(dir=self.root).close()  # OSError now, not at the first upload, if not writable
        self.encode, self.codec_tag, self.frame_rate = encode, codec_tag, frame_rate
        self.forget = forget
        self._lock = threading.Lock()
        # which voice an id names: a new number whenever a voice comes to the id (add, rename to it) or leaves it
        # (delete, rename away), not when its audio is replaced. A replace encodes outside the lock and commits
        # only if the id still names the voice it started with, so it never brings back a deleted voice or
        # leaves a renamed one behind twice; of two replaces, the later to commit wins.
        self._generation: dict[str, int] = {}
        self._numbers = itertools.count(1)

    def _new_generation(self, *voice_ids: str) -> None:
        for voice_id in voice_ids:
            self._generation[voice_id] = next(self._numbers)

    def _dir(self, voice_id: str) -> Path:
        path = (self.root / check_id(voice_id)).resolve()
        if path.parent != self.root.resolve():  # belt and braces: the pattern already forbids this
            raise InputError(f"invalid voice id {voice_id!r}")
        return path

    def add(self, voice_id: str, audio: bytes, text: str, filename: str = "audio.wav", replace: bool = False) -> Voice:
        """A new voice (VoiceExists when the id is taken); replace=True: see replace()."""
        if replace:
            return self.replace(voice_id, audio, text, filename)
        target = self._dir(voice_id)
        ext, codes = self._checked(audio, text, filename)  # the encode, outside the lock
        with self._lock:
            if target.exists():
                raise VoiceExists(f"voice {voice_id!r} already exists (delete it first)")
            self._write(target, audio, text, ext, codes)
            self._new_generation(voice_id)
        return Voice(voice_id, text, codes, codes.shape[1] / self.frame_rate)

    def replace(self, voice_id: str, audio: bytes, text: str, filename: str = "audio.wav") -> Voice:
        """New audio and transcript for a stored voice; VoiceNotFound when there is none, or when it was deleted
        or renamed while the new audio was encoded."""
        target = self._dir(voice_id)
        with self._lock:
            if not (target / "text.txt").is_file():
                raise VoiceNotFound(f"voice {voice_id!r} not found (add it with /v1/references/add)")
            generation = self._generation.setdefault(voice_id, next(self._numbers))
        ext, codes = self._checked(audio, text, filename)
        with self._lock:
            if self._generation.get(voice_id) != generation or not (target / "text.txt").is_file():
                raise VoiceNotFound(f"voice {voice_id!r} was deleted or renamed while its new audio was encoded")
            old = self._stored(target)
            self._write(target, audio, text, ext, codes)
        self._forget(old)
        return Voice(voice_id, text, codes, codes.shape[1] / self.frame_rate)

    def _checked(self, audio: bytes, text: str, filename: str) -> tuple[str, np.ndarray]:
        """(the audio's file extension, its codes [n, F]); InputError for a bad transcript or unreadable audio."""
        if not isinstance(text, str):
            raise InputError("text must be a string")
        if len(text) > MAX_TRANSCRIPT_CHARS:  # before the encode: a voice no request could use is not stored
            raise InputError(f"text: the transcript has {len(text)} characters; a reference's is at most "
                             f"{MAX_TRANSCRIPT_CHARS} (a 60 s clip's is about 1,000)")
        ext = Path(filename or "").suffix.lstrip(".").lower()
        ext = ext if ext in AUDIO_EXTENSIONS else "bin"
        return ext, np.asarray(self.encode(audio), dtype=np.int64)  # validates the audio before anything is written

    def _write(self, target: Path, audio: bytes, text: str, ext: str, codes: np.ndarray) -> None:
        """Under the lock: the voice's files written aside, then renamed into place (over the old ones)."""
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        _private(tmp / f"audio.{ext}", audio)
        _private(tmp / "text.txt", text.encode("utf-8"))
        self._save_codes(tmp, codes)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)

    def _stored(self, path: Path) -> tuple[str, np.ndarray] | None:
        """The transcript and codes a voice's prompt prefix was made of (None: unreadable, nothing to drop)."""
        try:
            return (path / "text.txt").read_text(encoding="utf-8"), np.load(path / "codes.npy", allow_pickle=False)
        except (OSError, ValueError):
            return None

    def _forget(self, old: tuple[str, np.ndarray] | None) -> None:
        if old is not None and self.forget is not None:
            try:
                self.forget(*old)
            except Exception:  # noqa: BLE001 - the cache entry is only memory: LRU eviction frees it anyway
                log.exception("dropping a cached voice prefix failed")

    def get(self, voice_id: str) -> Voice | None:
        """None when there is no such voice; InputError when its files are damaged (that voice only)."""
        path = self._dir(voice_id)
        if not (path / "text.txt").is_file():
            return None
        try:
            return self._load(voice_id, path)
        except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError; np.load raises both
            log.warning("stored voice %r is damaged: %s: %s", voice_id, type(e).__name__, e)
            raise InputError(f"voice {voice_id!r} is {_damaged(e)}") from None

    def _load(self, voice_id: str, path: Path) -> Voice | None:
        text = (path / "text.txt").read_text(encoding="utf-8")
        meta = _read_json(path / "meta.json")
        if meta.get("codec") == self.codec_tag and (path / "codes.npy").is_file():
            codes = np.load(path / "codes.npy", allow_pickle=False)
        else:  # another model made these codes: encode the stored audio again, once
            audio = next(path.glob("audio.*"), None)
            if audio is None:
                return None
            codes = np.asarray(self.encode(audio.read_bytes()), dtype=np.int64)
            self._save_codes(path, codes)
        return Voice(voice_id, text, codes, codes.shape[1] / self.frame_rate)

    def _save_codes(self, path: Path, codes: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, codes)
        _private(path / "codes.npy", buf.getvalue())
        _private(path / "meta.json", json.dumps({"codec": self.codec_tag, "frames": int(codes.shape[1])}).encode())

    def rename(self, old_id: str, new_id: str) -> bool:
        """False when there is no voice `old_id`; VoiceExists when `new_id` is taken. One directory rename, so
        a reader sees the voice under one name or the other, never half of it."""
        source, target = self._dir(old_id), self._dir(new_id)
        if source == target:
            raise InputError("the new voice id is the old one")
        with self._lock:
            if not (source / "text.txt").is_file():
                return False
            if target.exists():
                raise VoiceExists(f"voice {new_id!r} already exists (delete it first)")
            source.rename(target)
            self._new_generation(old_id, new_id)
            return True

    def delete(self, voice_id: str) -> bool:
        path = self._dir(voice_id)
        with self._lock:
            if not path.exists():
                return False
            old = self._stored(path)
            shutil.rmtree(path)
            self._new_generation(voice_id)
        self._forget(old)
        return True

    def ids(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and (p / "text.txt").is_file())

    def summary(self) -> list[dict]:
        """Every stored voice; a damaged one is listed with an `error` instead of failing the list."""
        out = []
        for voice_id in self.ids():
            path = self.root / voice_id
            meta = _read_json(path / "meta.json")
            try:
                text = (path / "text.txt").read_text(encoding="utf-8")
            except (OSError, ValueError) as e:
                out.append({"id": voice_id, "text": "", "seconds": 0, "error": _damaged(e)})
                continue
            out.append({"id": voice_id, "text": text, "seconds": round(meta.get("frames", 0) / self.frame_rate, 2)})
        return out


def _private(path: Path, data: bytes) -> None:
    """Writes a file only this user can read (0600, as kept downloads are): a reference is someone's voice and its
    transcript, not for the machine's other users."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _damaged(e: Exception) -> str:
    return f"damaged ({type(e).__name__}); delete it and add it again"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
