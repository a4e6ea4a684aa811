"""An encoder worker process: holds the stateful AudioEncoder of every stream assigned to it and answers its
requests in order (encoder_wire.py). Started by encoder_process.py as a script, with the two pipe ends as its
arguments:

    python .../ttsengine/audio/encoder_worker.py READ_FD WRITE_FD

It exits when its input pipe closes: the serving process ended (however it ended, even SIGKILL), so a worker
never outlives the server. Ctrl-C in a terminal reaches the whole process group: the worker ignores SIGINT so
that a draining server's streams keep their encoders until the server itself exits.
"""

from __future__ import annotations

import json
import signal
import sys
import traceback
import types
from pathlib import Path


def _leaf_package() -> None:
    """`ttsengine` importable without its __init__, which imports the engine and torch (about 1 s and hundreds
    of MB per worker); audio/ imports nothing of ours but errors (tests/test_imports.py), so its modules load
    from the bare package."""
    root = Path(__file__).resolve().parents[1]  # .../ttsengine
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # the script's folder: its modules are only importable as ttsengine.audio.*
    pkg = types.ModuleType("ttsengine")
    pkg.__path__ = [str(root)]
    sys.modules.setdefault("ttsengine", pkg)


def serve(conn_in, conn_out) -> None:
    """The request loop until the input closes: conn_in/conn_out are multiprocessing Connections."""
    import av  # noqa: F401  (the codecs and the resampler load now, not in a stream's first chunk)
    import numpy as np
    import soxr  # noqa: F401

    from ttsengine.audio import encoder_wire as wire
    from ttsengine.audio.encode import AudioEncoder

    encoders: dict[int, AudioEncoder | str] = {}  # stream id -> its encoder, or the error its opening raised
    while True:
        try:
            msg = conn_in.recv_bytes()
        except (EOFError, OSError):
            return
        op, stream, req = wire.REQUEST.unpack_from(msg)
        payload = memoryview(msg)[wire.REQUEST.size:]
        if op == wire.OPEN:
            try:
                encoders[stream] = AudioEncoder(**json.loads(bytes(payload)))
            except Exception as e:
                encoders[stream] = _line(e)
            continue
        if op == wire.DROP:
            encoders.pop(stream, None)
            continue
        enc = encoders.get(stream, "the stream was not opened")
        try:
            if isinstance(enc, str):
                raise RuntimeError(enc)
            if op == wire.ENCODE:
                data = enc.encode(np.frombuffer(payload, dtype=np.float32))  # [n] float32, read-only view
            else:
                data = enc.finish()
                del encoders[stream]
            out = wire.reply(req, True, enc.samples, data)
        except Exception as e:
            traceback.print_exc()
            encoders.pop(stream, None)
            out = wire.reply(req, False, 0, _line(e).encode())
        try:
            conn_out.send_bytes(out)
        except OSError:  # the server is gone
            return


def _line(e: Exception) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _leaf_package()
    from multiprocessing.connection import Connection

    serve(Connection(int(argv[1]), writable=False), Connection(int(argv[2]), readable=False))


if __name__ == "__main__":
    main(sys.argv)
