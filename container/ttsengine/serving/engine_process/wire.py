"""What travels between the front process and the engine process, over one socket pair (multiprocessing's
Connection: length-prefixed pickles). Each send carries a list of messages (tuples, tag first), so a burst of
audio chunks costs one system call.

front -> engine: (SUBMIT, sid, request, ignore_stop) | (CANCEL, sid) | (CALL, rid, name, args) | (CLOSE,)
engine -> front: (LOADED, facts) | (FAILED, why) | (ACCEPTED, sid, texts, seed, device, marks: received, planned)
                 | (REFUSED, sid, error) | (AUDIO, sid, text_index, audio float32 [L], started_at, first_audio_at,
                 new reports) | (END, sid, error, new reports, codes, started_at) | (REPLY, rid, ok, value)
                 | (STATE, facts)
Times are time.perf_counter() readings: CLOCK_MONOTONIC on Linux, one clock for every process of the machine.
"""

from __future__ import annotations

import pickle

SUBMIT, CANCEL, CALL, CLOSE = "submit", "cancel", "call", "close"
LOADED, FAILED, ACCEPTED, REFUSED, AUDIO, END, REPLY, STATE = (
    "loaded", "failed", "accepted", "refused", "audio", "end", "reply", "state")
# what the front may ask of the engine's fleet by name (CALL): everything else is refused
CALLS = ("stats", "voice_codes", "forget_voice", "settle", "wait_all")


def pack_error(error: BaseException | None) -> bytes | None:
    """An exception as bytes that unpickle in the front: its own type where it pickles (TTSError and its kind
    decide the HTTP status there), else a RuntimeError with its text (one unpicklable error must not sink the
    batch of messages it travels in)."""
    if error is None:
        return None
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - any failure to round-trip: the text survives
        return pickle.dumps(RuntimeError(f"{type(error).__name__}: {error}"))


def unpack_error(data: bytes | None) -> BaseException | None:
    return None if data is None else pickle.loads(data)
