"""The messages between the serving process and an encoder worker process (encoder_process.py <->
encoder_worker.py), one multiprocessing Connection message each (it frames them; no pickle).

To the worker: a header (op, stream id, request id) then the payload:
- OPEN: the encoder's arguments as JSON (no reply: an error there is answered on the stream's next request);
- ENCODE: one chunk, float32 mono samples as raw bytes (native endianness: both ends are one machine);
- FINISH: nothing (the stream's encoder is flushed, answered and forgotten);
- DROP: nothing, no reply (the stream was abandoned: forget its encoder).
From the worker, one reply per ENCODE / FINISH: (request id, ok, output samples so far) then the encoded bytes,
or an error's one-line text when ok is 0.
"""

from __future__ import annotations

import struct

OPEN, ENCODE, FINISH, DROP = 1, 2, 3, 4
REQUEST = struct.Struct("<BQQ")  # op, stream id, request id
REPLY = struct.Struct("<QBQ")  # request id, ok, output samples so far


def request(op: int, stream: int, req: int, payload: bytes = b"") -> bytes:
    return REQUEST.pack(op, stream, req) + payload


def reply(req: int, ok: bool, samples: int, payload: bytes) -> bytes:
    return REPLY.pack(req, int(ok), samples) + payload
