"""`python -m infra.sagemaker.invoke --name ENDPOINT --text "..." --out hello.wav [--stream] [--component NAME]`

Calls a deployed endpoint with boto3: invoke_endpoint (the whole file, Accept chosen from --out's
extension), or with --stream invoke_endpoint_with_response_stream (JSON-lines records of base64 audio,
written as they arrive; the first bytes land on disk while the rest is still being generated). An endpoint
deployed real-time with --scale-to-zero hosts the model as an inference component, which each call names
(--component ENDPOINT-tts); at zero copies it refuses calls until one has started (minutes): retry.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

ACCEPT = {".wav": ("wav", "audio/wav"), ".mp3": ("mp3", "audio/mpeg"), ".ogg": ("opus", "audio/ogg"),
          ".opus": ("opus", "audio/ogg"), ".flac": ("flac", "audio/flac"), ".aac": ("aac", "audio/aac"),
          ".pcm": ("pcm", "audio/pcm")}


def records(parts: Iterable[bytes]) -> Iterator[dict]:
    """JSON-lines records from a byte stream split anywhere (SageMaker's PayloadPart boundaries are not
    line boundaries)."""
    buf = b""
    for part in parts:
        buf += part
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if buf.strip():
        yield json.loads(buf)


def invoke(runtime, name: str, body: dict, out: Path, stream: bool, component: str | None = None) -> dict:
    fmt, accept = ACCEPT.get(out.suffix.lower(), (None, None))
    if fmt is None:
        raise ValueError(f"--out {out}: use one of {', '.join(ACCEPT)}")
    key = "response_format" if "input" in body else "format"
    body = {**body, key: fmt}
    target = {"EndpointName": name, **({"InferenceComponentName": component} if component else {})}
    t0 = time.perf_counter()
    if not stream:
        r = runtime.invoke_endpoint(**target, ContentType="application/json", Accept=accept, Body=json.dumps(body))
        data = r["Body"].read()
        out.write_bytes(data)
        return {"bytes": len(data), "seconds": round(time.perf_counter() - t0, 3)}
    r = runtime.invoke_endpoint_with_response_stream(**target, ContentType="application/json",
                                                     Body=json.dumps({**body, "stream": True}))
    first, total, done = None, 0, {}
    parts = (event["PayloadPart"]["Bytes"] for event in r["Body"] if "PayloadPart" in event)
    with open(out, "wb") as f:
        for rec in records(parts):
            if "error" in rec:
                raise RuntimeError(rec["error"].get("message", rec["error"]))
            if rec.get("done"):
                done = rec
                continue
            data = base64.b64decode(rec["audio"])
            f.write(data)
            f.flush()
            total += len(data)
            first = first if first is not None else round(time.perf_counter() - t0, 3)
    return {"bytes": total, "first_audio_s": first, "seconds": round(time.perf_counter() - t0, 3), **done}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.sagemaker.invoke", description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True, help="endpoint name")
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", type=Path, required=True, help="audio file; its extension picks the format")
    ap.add_argument("--stream", action="store_true", help="InvokeEndpointWithResponseStream")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--reference-id", help="a stored voice")
    ap.add_argument("--component", help="the inference component (deploy --scale-to-zero real-time: ENDPOINT-tts)")
    ap.add_argument("--region")
    ap.add_argument("--endpoint-url", help="SageMaker Runtime URL (local tests)")
    args = ap.parse_args(argv)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    body = {"text": args.text, **({"seed": args.seed} if args.seed is not None else {}),
            **({"reference_id": args.reference_id} if args.reference_id else {})}
    try:
        runtime = boto3.client("sagemaker-runtime", region_name=args.region, endpoint_url=args.endpoint_url)
        result = invoke(runtime, args.name, body, args.out, args.stream, args.component)
    except (ValueError, RuntimeError) as e:
        print(f"invoke: {e}", file=sys.stderr)
        return 1
    except (BotoCoreError, ClientError) as e:
        print(f"invoke: {args.name}: {e}", file=sys.stderr)
        return 1
    print(f"invoke: wrote {args.out}: {json.dumps(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
