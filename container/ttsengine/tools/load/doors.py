"""The doors `loadtest` reaches the engine through, and how each one's response turns into audio as it arrives.

- http: POST /v1/audio/speech (OpenAI's speech API), the audio bytes themselves as the body;
- serve: POST /invocations with `"stream": true` (SageMaker's InvokeEndpointWithResponseStream against `python -m
  handlers serve`), JSON lines of base64 audio, then {"done": true, ...};
- runpod: jobs on a local RunPod job queue that `python -m handlers runpod` takes (runpod_door.py): its streamed
  items are the same records as serve's lines.
"""

from __future__ import annotations

import base64
import json

DOORS = ("http", "serve", "runpod")
PATHS = {"http": "/v1/audio/speech", "serve": "/invocations"}


def request_body(door: str, body: dict) -> dict:
    """The speech request as the door takes it: serve and runpod stream only when asked."""
    return body if door == "http" else {**body, "stream": True}


class RecordError(Exception):
    """An error record in a streamed response (the request failed after its headers)."""


def audio_of(record: dict) -> bytes:
    """A streamed record's audio bytes (b"" for the closing {"done": ...} record); RecordError for an error."""
    if "error" in record:
        raise RecordError(str(record["error"])[:200])
    return base64.b64decode(record["audio"]) if "audio" in record else b""


class JsonLines:
    """serve's streamed body, fed as it arrives: feed(raw) -> the audio of the lines completed by it; `done` once
    the closing {"done": ...} record came (a body that ends without it was cut short)."""

    def __init__(self):
        self._rest: list[bytes] = []  # the unfinished line's pieces: joined once, when its newline arrives
        self.rate: int | None = None  # the first record's sample_rate
        self.done = False

    def feed(self, raw: bytes) -> bytes:
        if b"\n" not in raw:
            self._rest.append(raw)
            return b""
        *lines, rest = raw.split(b"\n")
        lines[0] = b"".join([*self._rest, lines[0]])
        self._rest = [rest] if rest else []
        out = []
        for line in lines:
            if line.strip():
                record = json.loads(line)
                self.rate = self.rate or record.get("sample_rate")
                self.done = self.done or bool(record.get("done"))
                out.append(audio_of(record))
        return b"".join(out)

    def close(self) -> bytes:
        """The body ended: the audio of a last line sent without its newline (b"" when there is none)."""
        return self.feed(b"\n")
