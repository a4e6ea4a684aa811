"""ElevenLabs' text-to-speech WebSocket protocols, as messages: `/v1/text-to-speech/{voice_id}/stream-input` (one
context per socket) and `.../multi-stream-input` (several contexts, each a LiveSession of its own). Pure mapping, no
network: the query string -> the output and limits, a client message -> a ClientMessage, a context's first message
-> the SpeechJob its segments are made from, and the server's messages. The adapter (handlers/http) drives them.

Output formats: `pcm_<rate>` (16-bit little-endian mono), `mp3_<rate>_<kbps>` (the bitrate is ours: 128 kbit/s),
`wav_<rate>`, `ulaw_8000` (G.711 mu-law, 8 kHz, made here from 16-bit pcm). Opus and a-law are refused with the list
of what is served. Alignment is never sent: the engine has no character timings, and a made-up one would mislead the
captions clients build from it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ...audio.encode import output_rate
from ...errors import InputError
from ...synthesis.request import SynthesisRequest
from ..protocol import SpeechJob, voice_references
from ..voices import VoiceStore

DEFAULT_FORMAT = "mp3_44100_128"  # ElevenLabs' default
MAX_CONTEXTS = 5  # contexts open at once on one multi-stream socket (ElevenLabs' limit too)
DEFAULT_CONTEXT = "default"  # a multi-stream message without context_id speaks in this one
MAX_INACTIVITY = 180.0  # seconds: ElevenLabs' upper bound for inactivity_timeout
SUPPORTED = "pcm_<8000..48000>, mp3_<rate>_<kbps>, wav_<rate>, ulaw_8000"


class ProtocolError(Exception):
    """A message or setting the protocol refuses: `error` is the machine-readable kind, `code` the close code."""

    def __init__(self, message: str, error: str = "invalid_message", code: int = 1008):
        super().__init__(message)
        self.message, self.error, self.code = message, error, code


@dataclass(frozen=True)
class Output:
    format: str  # ours: pcm | mp3 | wav
    sample_rate: int
    ulaw: bool = False  # pcm turned into G.711 mu-law bytes


@dataclass(frozen=True)
class Settings:
    """A socket's query string, read once at the handshake."""

    output: Output
    inactivity_timeout: float
    seed: int | None = None  # ours: the seed every context's segments use (default: one drawn per context)


def parse_output(name: str) -> Output:
    parts = name.split("_")
    try:
        kind, rate = parts[0], int(parts[1])
    except (IndexError, ValueError):
        raise ProtocolError(f"output_format {name!r} is not one this server makes ({SUPPORTED})") from None
    if kind == "ulaw" and rate == 8000 and len(parts) == 2:
        return Output("pcm", 8000, ulaw=True)
    if kind == "mp3" and len(parts) == 3 and parts[2].isdigit() or kind in ("pcm", "wav") and len(parts) == 2:
        try:
            output_rate(kind, 44100, rate)
        except InputError as e:
            raise ProtocolError(f"output_format {name!r}: {e}") from None
        return Output(kind, rate)
    raise ProtocolError(f"output_format {name!r} is not one this server makes ({SUPPORTED})")


def parse_settings(query: Mapping[str, str], default_timeout: float) -> Settings:
    """model_id and ElevenLabs' other switches (auto_mode, sync_alignment, language_code, ...) are accepted and
    ignored: one model is served, text is cut at sentence ends, no alignment is sent."""
    output = parse_output(query.get("output_format") or DEFAULT_FORMAT)
    timeout = default_timeout
    if query.get("inactivity_timeout"):
        try:
            timeout = float(query["inactivity_timeout"])
        except ValueError:
            raise ProtocolError("inactivity_timeout must be a number of seconds") from None
        if not 0 < timeout <= max(MAX_INACTIVITY, default_timeout):
            raise ProtocolError(f"inactivity_timeout must be within (0, {max(MAX_INACTIVITY, default_timeout):g}]")
    seed = None
    if query.get("seed"):
        try:
            seed = int(query["seed"])
        except ValueError:
            raise ProtocolError("seed must be an integer") from None
        if not 0 <= seed < 2**63:
            raise ProtocolError("seed must be within [0, 2**63)")
    return Settings(output, timeout, seed)


@dataclass(frozen=True)
class ClientMessage:
    context_id: str | None
    text: str | None  # None: the message has no text ("" keeps the context alive; stream-input: the end)
    flush: bool = False
    close_context: bool = False
    close_socket: bool = False
    voice_settings: dict | None = None


def parse_message(raw: str | None) -> ClientMessage:
    """One text frame -> a ClientMessage; ProtocolError (1007) for anything that is not a JSON object of the known
    fields' types. Unknown fields (try_trigger_generation, generation_config, pronunciation_dictionary_locators, the
    key fields) are accepted and ignored."""
    if raw is None:
        raise ProtocolError("send JSON objects in text messages (a binary message came)", code=1007)
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError):
        raise ProtocolError("a message is not valid JSON", code=1007) from None
    if not isinstance(msg, dict):
        raise ProtocolError("each message is a JSON object (text, context_id, flush, close_context, ...)", code=1007)
    context_id, text, settings = msg.get("context_id"), msg.get("text"), msg.get("voice_settings")
    if context_id is not None and (not isinstance(context_id, str) or not 0 < len(context_id) <= 200):
        raise ProtocolError("context_id must be a string of 1..200 characters", code=1007)
    if text is not None and not isinstance(text, str):
        raise ProtocolError("text must be a string", code=1007)
    if settings is not None and not isinstance(settings, dict):
        raise ProtocolError("voice_settings must be an object", code=1007)
    flags = {}
    for name in ("flush", "close_context", "close_socket"):
        value = msg.get(name, False)
        if not isinstance(value, bool) and value is not None:
            raise ProtocolError(f"{name} must be true or false", code=1007)
        flags[name] = bool(value)
    return ClientMessage(context_id, text, voice_settings=settings, **flags)


def context_job(voice_id: str, voices: VoiceStore | None, aliases: Mapping[str, str], settings: Settings,
                voice_settings: dict | None) -> SpeechJob:
    """The job a context's segments are made from. voice_id resolves as the HTTP routes resolve `voice` (an alias,
    a stored voice, 'default' or one of OpenAI's names; else an unknown voice). voice_settings: `speed` is the tempo
    (pitch kept); stability, similarity_boost, style and use_speaker_boost have no S1 counterpart and are ignored."""
    refs = voice_references(voice_id, voices, aliases)
    speed = (voice_settings or {}).get("speed")
    if speed is None:
        speed = 1.0
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
        raise InputError(f"voice_settings.speed must be a number within 0.25..4.0, got {speed!r}")
    seed = settings.seed if settings.seed is not None else secrets.randbits(63)
    out = settings.output
    return SpeechJob(SynthesisRequest(text="", references=refs, seed=seed), out.format, out.sample_rate,
                     float(speed), streaming=True)


def ulaw(pcm: bytes) -> bytes:
    """16-bit little-endian pcm -> one G.711 mu-law byte per sample (on the 14-bit magnitude, as the standard)."""
    v = np.frombuffer(pcm, dtype="<i2").astype(np.int32) >> 2
    mag = np.minimum(np.abs(v), 8159) + 0x21
    seg = np.maximum(0, np.floor(np.log2(mag)).astype(np.int32) - 5)  # mag <= 0x3F: 0, <= 0x7F: 1, ...
    code = np.where(seg > 7, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0x0F))  # past the top segment: its end
    return (code ^ np.where(v < 0, 0x7F, 0xFF)).astype(np.uint8).tobytes()


def audio_message(audio: str, context_id: str | None) -> dict:
    """audio: base64 text. stream-input's messages carry no contextId."""
    return {"audio": audio, "contextId": context_id} if context_id is not None else {"audio": audio}


def final_message(context_id: str | None) -> dict:
    return {"isFinal": True, "contextId": context_id} if context_id is not None else {"isFinal": True}


def error_message(message: str, error: str, code: int) -> dict:
    return {"message": message, "error": error, "code": code}
