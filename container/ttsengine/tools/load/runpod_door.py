"""`loadtest --door runpod`: the load as RunPod's queue hands it to a worker. The load generator hosts a local job
queue (job_queue.py) at the URL given; `python -m handlers runpod`, started with the queue's RUNPOD_WEBHOOK_*
variables (`JobQueue.env()`), takes the jobs as its concurrency modifier allows and posts each streamed item back.
A request's record: ttfb = when the worker took the job, first = its first streamed audio, end = the job done.
The queue runs in this one process (its HTTP threads share the process's CPU with the clients: reported as the
generator's CPU), so the door takes one client process."""

from __future__ import annotations

import asyncio
import itertools
import time
from urllib.parse import urlsplit

from .client import add_piece, closed_loop, finished, new_record, open_loop, seeded
from .doors import RecordError, audio_of, request_body
from .job_queue import FakeQueue as JobQueue
from .schedule import Share

_ids = itertools.count()


def start_queue(url: str, wait_s: float) -> JobQueue:
    """The queue listening at url's host and port, once a worker has polled it (else TimeoutError)."""
    u = urlsplit(url)
    queue = JobQueue(u.hostname or "127.0.0.1", u.port or 80).start()
    end = time.monotonic() + wait_s
    while not any(r.startswith("GET /job-take") for r in queue.requests):
        if time.monotonic() > end:
            queue.stop()
            raise TimeoutError(f"no RunPod worker polled {url} within {wait_s:g} s (start it with the queue's "
                               f"variables: {' '.join(f'{k}={v}' for k, v in queue.env().items())})")
        time.sleep(0.2)
    return queue


async def _job(queue: JobQueue, body: dict, timeout: float) -> dict:
    loop = asyncio.get_running_loop()
    t0, out, parts, done = time.perf_counter(), new_record(), [], loop.create_future()

    def listener(kind: str, posted: dict) -> None:  # on a queue thread
        now = time.perf_counter() - t0
        if kind == "job-take":
            out["ttfb"] = now
        elif kind == "job-stream":
            item = posted.get("output") or {}
            try:
                add_piece(out, parts, now, audio_of(item))
                out["rate"] = item.get("sample_rate", out["rate"])
            except RecordError as e:
                out["error"] = f"streamed error: {e}"
        elif posted.get("status") != "IN_PROGRESS":
            if "error" in posted and out["error"] is None:
                out["error"] = f"job failed: {str(posted['error'])[:200]}"
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(now))

    job_id = f"load-{next(_ids)}"
    queue.listen(job_id, listener)
    queue.submit(job_id, request_body("runpod", body))
    try:
        out["end"] = await asyncio.wait_for(done, timeout)
    except asyncio.TimeoutError:
        queue.cancel(job_id)
        out["error"] = f"TimeoutError: the job was not done within {timeout:g} s"
    out["bytes"] = b"".join(parts)
    return out


def run_share(queue: JobQueue, share: Share, body: dict, timeout: float) -> dict:
    """The share's requests as jobs, closed or open loop; the same part as client.run_share returns."""
    results, lags = [], []
    send = lambda i: _job(queue, seeded(body, i), timeout)  # noqa: E731

    async def run():
        if share.offsets is None:
            await closed_loop(share, send, results)
        else:
            await open_loop(share, send, results, lags)

    begin, cpu0 = time.monotonic(), time.process_time()
    asyncio.run(run())
    end, cpu = time.monotonic(), time.process_time() - cpu0
    fmt = body.get("response_format", "pcm")
    return {"records": [finished(r, fmt) for r in results], "begin": begin, "end": end, "cpu_s": cpu,
            "late_start_s": 0.0, "lags": lags}
