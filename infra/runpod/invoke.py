"""`python -m infra.runpod.invoke --endpoint ID --text "..." --out hello.wav [--stream]`

Runs one job on a RunPod endpoint with runpod.Endpoint (RUNPOD_API_KEY): `run` then `output`, or with
--stream the job's stream, writing audio as it arrives; an uploaded result (S3 URL) is downloaded.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

FORMATS = {".wav": "wav", ".mp3": "mp3", ".ogg": "opus", ".opus": "opus", ".flac": "flac", ".aac": "aac",
           ".pcm": "pcm"}


def invoke(endpoint, text: str, out: Path, stream: bool, timeout: int = 600, **fields) -> dict:
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise ValueError(f"--out {out}: use one of {', '.join(FORMATS)}")
    t0 = time.perf_counter()
    job = endpoint.run({"input": {"text": text, "format": fmt, "stream": stream, **fields}})
    if stream:
        first, total, done = None, 0, {}
        with open(out, "wb") as f:
            for item in job.stream():
                if "error" in item:
                    raise RuntimeError(item["error"])
                if item.get("done"):
                    done = item
                    continue
                f.write(base64.b64decode(item["audio"]))
                total += len(base64.b64decode(item["audio"]))
                first = first if first is not None else round(time.perf_counter() - t0, 3)
        if job.status() != "COMPLETED":
            raise RuntimeError(f"job {job.job_id}: {job.status()}: {_error(job)}")
        return {"job": job.job_id, "bytes": total, "first_audio_s": first, **done}
    output = job.output(timeout=timeout)
    status = job.status()
    if status != "COMPLETED" or not output:
        raise RuntimeError(f"job {job.job_id}: {status}: {_error(job)}")
    (item,) = output  # the worker yields one item for a whole file
    data = base64.b64decode(item["audio"]) if "audio" in item else urllib.request.urlopen(item["url"]).read()
    out.write_bytes(data)
    return {"job": job.job_id, "bytes": len(data), "seconds": round(time.perf_counter() - t0, 3),
            "seed": item.get("seed")}


def _error(job) -> str:
    """The failed job's message (the worker's error is JSON with error_message)."""
    state = job._fetch_job()  # the SDK exposes status and output, not the error field
    err = state.get("error", "no error message")
    try:
        return json.loads(err)["error_message"]
    except (TypeError, ValueError, KeyError):
        return str(err)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.runpod.invoke", description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True, help="endpoint id")
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--upload", action="store_true", help="the worker uploads the file to its S3 bucket")
    args = ap.parse_args(argv)
    if not os.environ.get("RUNPOD_API_KEY"):
        print("invoke: set RUNPOD_API_KEY", file=sys.stderr)
        return 1
    import requests
    import runpod

    runpod.api_key = os.environ["RUNPOD_API_KEY"]
    fields = {k: v for k, v in (("seed", args.seed), ("upload", args.upload or None)) if v is not None}
    try:
        result = invoke(runpod.Endpoint(args.endpoint), args.text, args.out, args.stream, **fields)
    except (ValueError, RuntimeError, TimeoutError, OSError, requests.RequestException) as e:
        print(f"invoke: {e}", file=sys.stderr)
        return 1
    print(f"invoke: wrote {args.out}: {json.dumps(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
