"""A local stand-in for RunPod's job queue, speaking the worker protocol of runpod-python's serverless
loop: GET job-take (one job) / job-take-batch (a list, batch_size=N), long-polled; GET job-stop
({"jobsToStop": [...]}); POST job-stream (one streamed item per call) and job-done (the final result,
or {"status": "IN_PROGRESS"} progress updates). Bodies are JSON sent as form-encoded text, as the SDK
sends them. What drives a real worker (`python -m handlers runpod`) in the tests (tests/fake_runpod.py), the
container's end-to-end run and `loadtest --door runpod` (tools/load/runpod_door.py: `listen` hands each job's
posts to its client as they arrive, so a client waits on its own job, not on the queue's one condition).
Connections are kept alive (HTTP/1.1): the worker posts every streamed chunk, hundreds a second under load."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

POLL_S = 1.0  # how long an empty take or stop poll is held open, like RunPod's long poll


def worker_env(base: str, pod: str = "fake-worker") -> dict[str, str]:
    """The variables RunPod sets for a worker polling the queue at base (http://HOST:PORT)."""
    return {"RUNPOD_WEBHOOK_GET_JOB": f"{base}/job-take/$ID?gpu=fake",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{base}/job-done/$RUNPOD_POD_ID/$ID?gpu=fake",
            "RUNPOD_WEBHOOK_POST_STREAM": f"{base}/job-stream/$RUNPOD_POD_ID/$ID?gpu=fake",
            "RUNPOD_POD_ID": pod, "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true", "RUNPOD_SKIP_GPU_CHECK": "true"}


KEPT = 4096  # calls kept in `requests` and `taken` (what tests inspect): a long load run must not grow them


class _Server(ThreadingHTTPServer):
    """The queue's HTTP server with a listen backlog for a load's bursts. socketserver's default backlog is 5: a burst
    of a worker's posts on new connections overflowed it, and each dropped SYN was retried by the kernel after 1 s,
    then 3 s (64 jobs through the runpod door on this repo's CPU: first items p95 1.1-2.9 s against ~0.1 s; 243 listen
    overflows in `nstat`). The kernel caps it at net.core.somaxconn."""

    request_queue_size = 4096
    daemon_threads = True


class BodyError(ValueError):
    """A request body whose length cannot be read (a bad Content-Length or chunk size)."""


class JobQueue:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.jobs: deque[dict] = deque()
        self.to_stop: list[str] = []
        self.streamed: dict[str, list] = defaultdict(list)
        self.stream_times: dict[str, list[float]] = defaultdict(list)
        self.progress: dict[str, list] = defaultdict(list)
        self.done: dict[str, dict] = {}
        self.taken: deque[tuple[float, list[str]]] = deque(maxlen=KEPT)  # (time, ids) per take call that returned jobs
        self.requests: deque[str] = deque(maxlen=KEPT)  # "GET /job-take/..." per call, the latest KEPT
        self.polled = threading.Event()  # set on a worker's first take call
        self.listeners: dict[str, Callable[[str, dict], None]] = {}  # job id -> called with (kind, body) per post
        self.cond = threading.Condition()
        self.server = _Server((host, port), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self, host: str | None = None) -> dict[str, str]:
        """The variables RunPod sets for a worker; `host` when the worker reaches us by another name."""
        return worker_env(self.url if host is None else f"http://{host}:{self.server.server_address[1]}")

    def start(self) -> JobQueue:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def submit(self, job_id: str, job_input: dict) -> None:
        with self.cond:
            self.jobs.append({"id": job_id, "input": job_input})
            self.cond.notify_all()

    def listen(self, job_id: str, listener: Callable[[str, dict], None]) -> None:
        """listener(kind, body) when a worker takes the job ("job-take", {}) and for each of its posts ("job-stream"
        or "job-done", progress included), on the queue's thread for that call, before it is answered; set before
        the job is submitted, called until `unlisten` (its final done post included)."""
        self.listeners[job_id] = listener

    def unlisten(self, job_id: str) -> None:
        """No more calls for the job (its client gave up on it: a late post then goes to the queue's records)."""
        self.listeners.pop(job_id, None)

    def cancel(self, job_id: str) -> None:
        with self.cond:
            self.to_stop.append(job_id)
            self.cond.notify_all()

    def wait_done(self, job_ids, timeout: float = 120) -> None:
        end = time.time() + timeout
        with self.cond:
            while not all(j in self.done for j in job_ids):
                left = end - time.time()
                if left <= 0:
                    raise TimeoutError(f"jobs not done: {[j for j in job_ids if j not in self.done]}")
                self.cond.wait(left)

    def wait_streamed(self, job_id: str, count: int = 1, timeout: float = 120) -> None:
        end = time.time() + timeout
        with self.cond:
            while len(self.streamed[job_id]) < count:
                left = end - time.time()
                if left <= 0:
                    raise TimeoutError(f"{job_id}: {len(self.streamed[job_id])} streamed items, wanted {count}")
                self.cond.wait(left)

    # ---- the protocol ---------------------------------------------------------------------------
    def _take(self, batch: int | None):
        with self.cond:
            if not self.jobs:
                self.cond.wait(POLL_S)
            got = [self.jobs.popleft() for _ in range(min(batch or 1, len(self.jobs)))]
            if got:
                self.taken.append((time.time(), [j["id"] for j in got]))
        for job in got:
            if (listener := self.listeners.get(job["id"])) is not None:
                listener("job-take", {})
        if not got:
            return 204, None
        return 200, got if batch is not None else got[0]

    def _stops(self):
        with self.cond:
            if not self.to_stop:
                self.cond.wait(POLL_S)
            ids, self.to_stop = self.to_stop, []
        return (200, {"jobsToStop": ids}) if ids else (204, None)

    def _post(self, kind: str, job_id: str, body: dict) -> None:
        listener = self.listeners.get(job_id)
        if listener is not None:
            listener(kind, body)  # its client unlistens once it is done with the job (or gave up on it)
            return  # a listened job's items go to its listener only (a load run keeps no audio here)
        with self.cond:
            if kind == "job-stream":
                self.streamed[job_id].append(body.get("output"))
                self.stream_times[job_id].append(time.time())
            elif body.get("status") == "IN_PROGRESS":
                self.progress[job_id].append(body.get("output"))
            else:
                self.done[job_id] = body
            self.cond.notify_all()

    def _handler(self):
        queue = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: every reply has a Content-Length
            # a reply goes out as two writes (head, then body): with Nagle's algorithm the body waited for the
            # worker's delayed ACK of the head, ~40 ms on every job taken and every post answered
            disable_nagle_algorithm = True

            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status: int, payload=None) -> None:
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                if self.close_connection:
                    self.send_header("Connection", "close")
                if payload is not None:
                    self.send_header("Content-Type", "application/json")
                if status != 204:  # a 204 has no body and no length
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                """The request's body, sent with a Content-Length or chunked (a kept-alive connection must read it
                whole either way, or the next request starts inside it); BodyError for a length that is not one."""
                if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
                    length = self.headers.get("Content-Length") or "0"
                    if not length.isdigit():
                        raise BodyError(f"Content-Length {length!r} is not a length")
                    return self.rfile.read(int(length))
                data = bytearray()
                while True:
                    line = self.rfile.readline().split(b";")[0].strip() or b"0"
                    try:
                        size = int(line, 16)
                    except ValueError:
                        raise BodyError(f"chunk size {line[:20]!r} is not hexadecimal") from None
                    if size < 0:
                        raise BodyError(f"chunk size {line[:20]!r} is negative")
                    if size == 0:
                        break
                    data += self.rfile.read(size)
                    self.rfile.readline()  # the CRLF after each chunk
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers up to the blank line
                    pass
                return bytes(data)

            def do_GET(self):
                url = urlparse(self.path)
                queue.requests.append(f"GET {url.path}")
                kind = url.path.split("/")[1]
                if kind.startswith("job-take"):
                    queue.polled.set()
                if kind == "job-take":
                    self._reply(*queue._take(None))
                elif kind == "job-take-batch":
                    self._reply(*queue._take(int(parse_qs(url.query)["batch_size"][0])))
                elif kind == "job-stop":
                    self._reply(*queue._stops())
                else:
                    self._reply(404, {"error": "unknown route"})

            def do_POST(self):
                url = urlparse(self.path)
                queue.requests.append(f"POST {url.path}")
                parts = url.path.split("/")  # /job-done/<worker>/<job id>
                try:
                    raw = self._body()
                except BodyError as e:  # the body's end is unknown: this connection cannot carry another request
                    self.close_connection = True
                    self._reply(400, {"error": f"unreadable body: {e}"})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError as e:
                    self._reply(400, {"error": f"the body is not JSON: {e}"})
                    return
                if parts[1] in ("job-done", "job-stream") and len(parts) == 4:
                    queue._post(parts[1], parts[3], body)
                    self._reply(200, {})
                else:
                    self._reply(404, {"error": "unknown route"})

        return Handler

