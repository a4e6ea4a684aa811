"""`loadtest --door runpod`: the load as RunPod's queue hands it to a worker. The load generator hosts a local job
queue (job_queue.py) at the URL given; `python -m handlers runpod`, started with the queue's RUNPOD_WEBHOOK_*
variables (`JobQueue.env()`), takes the jobs as its concurrency modifier allows and posts each streamed item back.
A request's record: ttfb = when the worker took the job, first = its first streamed audio, end = the job done.
The queue runs in this one process (its HTTP threads share the process's CPU with the clients: reported as the
generator's CPU), so the door takes one client process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from urllib.parse import urlsplit

from .client import add_piece, drive, new_record, seeded, timed_part
from .doors import RecordError, audio_of, request_body
from .job_queue import JobQueue
from .schedule import Share

_ids = itertools.count()


def listen_address(url: str) -> tuple[str, int]:
    """(host, port) of http://HOST:PORT, the address the queue listens at; ValueError saying what is wrong."""
    u = urlsplit(url)
    try:
        port = u.port
    except ValueError:
        port = None
    if u.scheme != "http" or not u.hostname or not port:
        raise ValueError(f"--door runpod takes the queue's address as http://HOST:PORT (a port of its own), "
                         f"got {url!r}")
    return u.hostname, port


def start_queue(url: str, wait_s: float) -> JobQueue:
    """The queue listening at url (listen_address), once a worker has polled it (else TimeoutError); OSError (the
    address taken) names the address."""
    host, port = listen_address(url)
    try:
        queue = JobQueue(host, port).start()
    except OSError as e:
        raise OSError(f"cannot host the RunPod job queue at {url}: {e.strerror or e}") from e
    if not queue.polled.wait(wait_s):
        queue.stop()
        raise TimeoutError(f"no RunPod worker polled {url} within {wait_s:g} s (start it with the queue's "
                           f"variables: {' '.join(f'{k}={v}' for k, v in queue.env().items())})")
    return queue


async def _job(queue: JobQueue, body: dict, timeout: float) -> dict:
    loop = asyncio.get_running_loop()
    t0, out, parts, done = time.perf_counter(), new_record(), [], loop.create_future()

    def listener(kind: str, posted: dict) -> None:  # on a queue thread, until unlisten
        now = time.perf_counter() - t0
        if kind == "job-take":
            out["ttfb"] = now
        elif kind == "job-stream":
            item = posted.get("output") or {}
            try:
                add_piece(out, parts, now, audio_of(item))
                out["rate"] = item.get("sample_rate", out["rate"])
            except (RecordError, ValueError, TypeError) as e:  # an error item, or one that is not audio
                out["error"] = out["error"] or f"streamed error: {e}"
        elif posted.get("status") != "IN_PROGRESS":
            if "error" in posted and out["error"] is None:
                out["error"] = f"job failed: {str(posted['error'])[:200]}"
            with contextlib.suppress(RuntimeError):  # the loop closed between this thread fetching us and unlisten
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(now))

    job_id = f"load-{next(_ids)}"
    queue.listen(job_id, listener)
    queue.submit(job_id, request_body("runpod", body))
    try:
        out["end"] = await asyncio.wait_for(done, timeout)
    except asyncio.TimeoutError:
        queue.cancel(job_id)
        out["error"] = f"TimeoutError: the job was not done within {timeout:g} s"
    finally:
        queue.unlisten(job_id)  # a late post must not reach this loop once it is gone
    out["bytes"] = b"".join(parts)
    return out


def run_share(queue: JobQueue, share: Share, body: dict, timeout: float) -> dict:
    """The share's requests as jobs, closed or open loop; the same part as client.run_share returns."""
    async def run():
        return await drive(share, lambda i: _job(queue, seeded(body, i), timeout))

    return timed_part(lambda: asyncio.run(run()), body, late=0.0)
