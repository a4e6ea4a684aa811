"""Checks for the container end-to-end run (scripts/ci/e2e.sh); each prints what it saw and exits non-zero
with one line saying what failed.
  e2e_check.py http URL [SOURCE]   speech over the OpenAI and fish routes of a running `http` container (and
                                   /ready's model fetched from SOURCE)
  e2e_check.py serve URL           SageMaker's /ping, /invocations, a streaming invocation, a 4xx
  e2e_check.py runpod IMAGE MODEL  runs `IMAGE runpod` against a fake job queue on this host
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT_DIR = Path(__file__).resolve().parents[2]
# tests/fake_runpod.py re-exports the package's job queue: this checkout's, whatever the venv was installed from
sys.path[:0] = [str(ROOT_DIR / "tests"), str(ROOT_DIR / "container")]


def fail(message: str) -> None:
    print(f"e2e_check: {message}", file=sys.stderr)
    sys.exit(1)


def wait_for(url: str, timeout: float = 300) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if _status(url) == 200:
            return
        time.sleep(1)
    fail(f"{url} did not answer 200 within {timeout:.0f} s")


def check_http(url: str, source: str | None = None) -> None:
    """source: the model source /ready must name (the compose volume's record), when given."""
    wait_for(url + "/ready", 60)
    model = httpx.get(url + "/ready", timeout=10).json()["model"]
    if source is not None and model.get("source") != source:
        fail(f"/ready serves {model}, not the model from {source}")
    r = httpx.post(url + "/v1/audio/speech", json={"input": "Hello from compose.", "response_format": "wav",
                                                   "seed": 1}, timeout=120)
    if r.status_code != 200 or r.content[:4] != b"RIFF" or len(r.content) < 44 + 2048 * 2:
        fail(f"/v1/audio/speech: {r.status_code} {r.headers.get('content-type')} {len(r.content)} bytes")
    f = httpx.post(url + "/v1/tts", json={"text": "Fish route.", "format": "mp3"}, timeout=120)
    if f.status_code != 200 or f.headers["content-type"] != "audio/mpeg":
        fail(f"/v1/tts: {f.status_code} {f.text[:200]}")
    print(f"http: model {model.get('source')} in {model['dir']}, /v1/audio/speech wav {len(r.content)} bytes, "
          f"/v1/tts mp3 {len(f.content)} bytes")


def check_serve(url: str) -> None:
    first = _status(url + "/ping")  # None while the server is not listening yet
    wait_for(url + "/ping", 300)
    r = httpx.post(url + "/invocations", json={"text": "Hello SageMaker.", "seed": 2},
                   headers={"accept": "audio/wav"}, timeout=120)
    if r.status_code != 200 or r.content[:4] != b"RIFF":
        fail(f"/invocations: {r.status_code} {r.text[:200]}")
    lines = []
    with httpx.stream("POST", url + "/invocations", json={"input": "Streaming.", "response_format": "pcm"},
                      headers={"x-amzn-sagemaker-custom-attributes": "stream=true"}, timeout=120) as s:
        for line in s.iter_lines():
            if line:
                lines.append(json.loads(line))
    if not lines or not lines[-1].get("done") or not all("audio" in x for x in lines[:-1]):
        fail(f"streaming /invocations: {lines[-1:]}")
    bad = httpx.post(url + "/invocations", content=b"a,b", headers={"content-type": "text/csv"}, timeout=30)
    if bad.status_code != 415:
        fail(f"text/csv gave {bad.status_code}, not 415")
    print(f"serve: /ping {'(first ' + str(first) + ') ' if first is not None else ''}200, "
          f"/invocations wav {len(r.content)} bytes, stream {len(lines) - 1} chunks + done, text/csv 415")


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=3).status_code
    except httpx.HTTPError:
        return None


def check_runpod(image: str, model: str) -> None:
    from fake_runpod import JobQueue

    queue = JobQueue("0.0.0.0").start()
    queue.submit("normal", {"text": "A normal job.", "seed": 3})
    queue.submit("streamed", {"input": "A streaming job.", "response_format": "pcm", "stream": True})
    env = queue.env(host="host.docker.internal")
    args = ["docker", "run", "-d", "--name", "e2e-runpod", "--add-host", "host.docker.internal:host-gateway",
            "-v", f"{model}:/opt/ml/model:ro", "-e", "TTS_DEFAULT_MAX_NEW_TOKENS=16"]
    for k, v in env.items():
        args += ["-e", f"{k}={v}"]
    subprocess.run([*args, image, "runpod"], check=True, capture_output=True)
    try:
        queue.wait_done(["normal", "streamed"], timeout=300)
    except TimeoutError as e:
        logs = subprocess.run(["docker", "logs", "--tail", "30", "e2e-runpod"], capture_output=True, text=True)
        print(logs.stdout[-3000:], logs.stderr[-3000:])
        fail(str(e))
    finally:
        stop = subprocess.run(["docker", "stop", "-t", "30", "e2e-runpod"], capture_output=True)
        code = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", "e2e-runpod"], capture_output=True,
                              text=True).stdout.strip()
        subprocess.run(["docker", "rm", "-f", "e2e-runpod"], capture_output=True)
        queue.stop()
    (item,) = queue.done["normal"]["output"]
    if base64.b64decode(item["audio"])[:4] != b"RIFF":
        fail(f"normal job: {str(item)[:200]}")
    pieces, done = queue.streamed["streamed"][:-1], queue.streamed["streamed"][-1]
    if not pieces or not done.get("done") or pieces[0]["sample_rate"] != 24000:
        fail(f"streaming job: {str(done)[:200]}")
    if stop.returncode != 0 or code != "0":
        fail(f"the worker did not exit cleanly on SIGTERM (exit code {code})")
    print(f"runpod: normal job wav {item['bytes']} bytes; streaming job {len(pieces)} chunks + done; "
          f"SIGTERM exit 0; queue saw {sorted({r.split('/')[1] for r in queue.requests})}")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "http":
        check_http(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    elif mode == "serve":
        check_serve(sys.argv[2])
    elif mode == "runpod":
        check_runpod(sys.argv[2], sys.argv[3])
    else:
        fail("usage: e2e_check.py http URL | serve URL | runpod IMAGE MODEL_DIR")
