"""A job starts the moment the SDK has fetched it, and a full worker fetches the moment a job ends (feature
runpod_pickup).

RunPod's SDK (runpod 1.12, serverless/modules/rp_scale.py) fetches jobs into an asyncio queue on one task,
`get_jobs`, and starts them on another, `run_jobs`. While jobs run, `run_jobs` waits for one of them to end with a
0.1 s timeout and only then looks at the queue: a job reaching a busy worker waited for that tick before its handler
was called, 50 ms on average, up to 100 ms. And `get_jobs`, finding the worker full (as many jobs held as the
concurrency modifier says), sleeps a whole second before it looks again: a slot freed meanwhile stays empty, and the
next job waits in RunPod's queue for up to that second (scripts/runpod_pickup.py, the SDK against loadtest's job queue
with an instant handler: submitted -> first item p50 ~700 ms on a full worker).

Ours: `run_jobs` waits for a job to end *or* for the queue to hand one over, whichever comes first; `get_jobs` on a
full worker waits for its occupancy to drop, a job ending or a fetched one leaving the queue (at most the SDK's
second). And a job taken by a fetch that was under way when the shutdown signal came runs before the loop ends (the
SDK's loop could end first: the job stayed taken and never ran). Everything else stays the SDK's: its job fetch and
`handle_job` (which takes a job out of the queue's and the progress counts), the stop channel, the concurrency
modifier, the back-off after a 429, the drain on shutdown. The subclass is put in place of the SDK's class only while
`runpod.serverless.start` runs, and only for the SDK versions it was written against (PROMPT_SDKS); with any other
the SDK's own loop runs and the worker says so once. Off: TTS_FEATURES=-runpod_pickup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from importlib import metadata

log = logging.getLogger("handlers.runpod")
PROMPT_SDKS = ("1.12.",)  # runpod versions whose JobScaler.run_jobs and get_jobs this replaces (read in 1.12.0)
LIVENESS_S = 0.1  # how often an idle loop looks whether the worker is shutting down (the SDK's own tick)
FULL_WAIT_S = 1.0  # a full worker's fetcher looks again after this long at most (the SDK's sleep), or when a job ends
TOO_MANY_S = 5.0  # the SDK's back-off after RunPod answered 429


def sdk_fits() -> str | None:
    """None when the installed runpod is one this module was written against, else why not (one line)."""
    try:
        version = metadata.version("runpod")
    except metadata.PackageNotFoundError:
        return "the runpod package is not installed"
    if not version.startswith(PROMPT_SDKS):
        return f"runpod {version} is not a version its job loop was checked against ({', '.join(PROMPT_SDKS)}x)"
    from runpod.serverless.modules import rp_scale

    base = getattr(rp_scale, "JobScaler", None)
    methods = ("run_jobs", "get_jobs", "handle_job", "is_alive", "set_scale", "current_occupancy")
    if base is None or not all(hasattr(base, name) for name in methods):
        return f"runpod {version} has no JobScaler with {', '.join(methods)}"
    return None


def prompt_scaler(base: type) -> type:
    """A subclass of the SDK's JobScaler whose run_jobs starts each job as soon as it is queued and whose get_jobs
    fetches as soon as a full worker's job ends."""
    from runpod.http_client import TooManyRequests

    class PromptJobScaler(base):
        def __init__(self, config: dict):
            super().__init__(config)
            # set when the occupancy drops: a running job ended, or a fetched job left the SDK's queue (it counted
            # twice until then); an asyncio.Event binds to the loop that first waits on it (Python 3.10+)
            self.freed = asyncio.Event()
            # a job fetch is under way: a shutdown signal while RunPod's answer is on its way must not end the job
            # loop before the jobs it brings are queued (the SDK's loop ends, they stay taken and never run)
            self.fetching = False

        async def get_jobs(self, session) -> None:
            """The SDK's fetcher, but a full worker waits for its occupancy to drop (at most FULL_WAIT_S) instead of
            sleeping a whole second: the freed slot's next job is fetched at once."""
            while self.is_alive():
                await self.set_scale()
                wanted = self.current_concurrency - self.current_occupancy()
                if wanted <= 0:
                    self.freed.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.freed.wait(), FULL_WAIT_S)
                    continue
                self.fetching = True
                try:
                    jobs = await asyncio.wait_for(self.jobs_fetcher(session, wanted), timeout=self.jobs_fetcher_timeout)
                    for job in jobs or ():
                        await self.jobs_queue.put(job)
                        self.job_progress.add(job)
                except TooManyRequests:
                    await asyncio.sleep(TOO_MANY_S)  # as the SDK: RunPod asked the worker to back off
                except asyncio.TimeoutError:
                    pass  # an empty long poll: ask again
                except Exception as e:  # the SDK logs and goes on too: a fetch that failed is retried (a cancel or
                    # Ctrl-C is a BaseException: it passes)
                    log.error("fetching RunPod jobs failed: %s: %s", type(e).__name__, e)
                    await asyncio.sleep(0)
                finally:
                    self.fetching = False  # after its jobs are queued: the job loop sees one or the other

        async def run_jobs(self, session) -> None:
            tasks: set[asyncio.Task] = set()
            getter: asyncio.Task | None = None  # a get() on `source`, pending while a slot is free
            source: asyncio.Queue | None = None

            def start(job: dict) -> None:
                task = asyncio.create_task(self.handle_job(session, job))
                tasks.add(task)
                self.jobs_tasks[job["id"]] = task
                # out of the queue, the job no longer counts twice towards the occupancy (queued and in progress):
                # a fetcher that saw the worker full after a batch may fetch again (a review found it waited a second)
                self.freed.set()

            try:
                # after a shutdown signal: until the fetch under way has ended (its jobs run, in the drain's window)
                while (self.is_alive() or self.fetching or not self.jobs_queue.empty()
                       or (getter is not None and getter.done())):
                    if getter is not None and (getter.done() or source is not self.jobs_queue):
                        # a job handed over, or set_scale replaced the queue (the pending get would never end)
                        if not getter.done():
                            getter.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await getter  # a cancelled get() leaves its item in the queue
                        if not getter.cancelled():  # taken from the queue: it runs, even past a concurrency
                            start(getter.result())  # lowered meanwhile (the SDK's modifier here is a constant)
                        getter = None
                    while len(tasks) < self.current_concurrency and not self.jobs_queue.empty():
                        start(self.jobs_queue.get_nowait())
                    waiting = set(tasks)
                    if len(tasks) < self.current_concurrency:
                        if getter is None:
                            source = self.jobs_queue
                            getter = asyncio.create_task(source.get())
                        waiting.add(getter)
                    if not waiting:  # no slot at all (a concurrency of 0): look again after a tick
                        await asyncio.sleep(LIVENESS_S)
                        continue
                    done, _ = await asyncio.wait(waiting, timeout=LIVENESS_S, return_when=asyncio.FIRST_COMPLETED)
                    if done & tasks:
                        self.freed.set()  # handle_job has taken the job out of the occupancy by now
                    tasks.difference_update(done)
            finally:
                if getter is not None and not getter.done():
                    getter.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)  # the drain: what runs, ends
            for result in results:
                if isinstance(result, Exception):
                    log.error("a RunPod job failed during the drain: %s", result)

    PromptJobScaler.__qualname__ = PromptJobScaler.__name__ = f"Prompt{base.__name__}"
    return PromptJobScaler


@contextlib.contextmanager
def installed(wanted: bool) -> Iterator[bool]:
    """The SDK's worker builds its JobScaler from rp_scale when it starts: inside this block it builds ours (when
    wanted and the SDK fits). Yields whether ours is in place."""
    why = sdk_fits() if wanted else None
    if not wanted or why is not None:
        if why is not None:
            log.info("runpod_pickup off: %s; the SDK's own job loop starts queued jobs at its 0.1 s tick", why)
        yield False
        return
    from runpod.serverless.modules import rp_scale

    base = rp_scale.JobScaler
    rp_scale.JobScaler = prompt_scaler(base)
    try:
        yield True
    finally:
        rp_scale.JobScaler = base
