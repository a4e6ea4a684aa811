"""How long a RunPod job waits between the SDK fetching it and its handler being called, on the CPU: RunPod's own
JobScaler (the SDK's job loop, or feature runpod_pickup's) against loadtest's job queue, CLIENTS closed-loop clients
each submitting ROUNDS jobs one after another, a handler that yields one small item at once and a second after
WORK_S (so the worker is busy when the next jobs come). Each mode runs in a process of its own (the SDK reads the
queue's address when first imported); the clients are threads of that process. Needs the runpod package (the dev
extras). Feature runpod_pickup came from it (docs/performance.md, "The HTTP path (issue 43)").

    PYTHONPATH=container:. python scripts/runpod_pickup.py [--clients 1,16,64] [--rounds 8] [--work-s 0.3] [--slots 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time

from ttsengine.tools.load.summary import pct

MODES = {"sdk": False, "runpod_pickup": True}


def one_mode(prompt: bool, clients: int, rounds: int, work_s: float, slots: int) -> dict:
    """Runs in the child: -> the delays in ms (take -> handler called, submit -> first item)."""
    from ttsengine.tools.load.job_queue import JobQueue

    queue = JobQueue().start()
    os.environ.update(queue.env())
    os.environ["RUNPOD_DEBUG_LEVEL"] = "ERROR"
    from runpod.serverless.modules import rp_scale

    from handlers.runpod import pickup

    started: dict[str, float] = {}

    async def handler(job: dict):
        started[job["id"]] = time.time()
        yield {"index": 0, "audio": "x" * 64}
        await asyncio.sleep(work_s)
        yield {"index": 1, "audio": "x" * 64}

    config = {"handler": handler, "return_aggregate_stream": False, "concurrency_modifier": lambda current: slots}
    with pickup.installed(prompt) as ours:
        if prompt and not ours:
            raise SystemExit(f"runpod_pickup cannot run here: {pickup.sdk_fits()}")
        scaler = rp_scale.JobScaler(config)
    threading.Thread(target=lambda: asyncio.run(scaler.run()), daemon=True).start()
    if not queue.polled.wait(30):
        raise SystemExit("the SDK never polled the queue")
    pickups, firsts, lock = [], [], threading.Lock()

    def client(c: int) -> None:
        for r in range(rounds):
            job, first, done, seen = f"c{c}-r{r}", threading.Event(), threading.Event(), []

            def listen(kind: str, body: dict, first=first, done=done, seen=seen) -> None:
                if kind == "job-stream" and not first.is_set():
                    seen.append(time.time())
                    first.set()
                elif kind == "job-done":
                    done.set()

            queue.listen(job, listen)
            t0 = time.time()
            queue.submit(job, {"text": "x"})
            if not (first.wait(60) and done.wait(60)):
                raise SystemExit(f"job {job} did not finish")
            queue.unlisten(job)
            taken = next(t for t, ids in list(queue.taken) if job in ids)
            with lock:
                pickups.append(1000 * (started[job] - taken))
                firsts.append(1000 * (seen[0] - t0))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"pickup": pickups, "first": firsts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--work-s", type=float, default=0.3, help="seconds between a job's two items")
    ap.add_argument("--slots", type=int, default=256, help="the concurrency modifier's answer (the worker's jobs at "
                    "most); as many as --clients: a full worker")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, clients = args.child.split(":")
        print(json.dumps(one_mode(MODES[mode], int(clients), args.rounds, args.work_s, args.slots)), flush=True)
        os._exit(0)  # the SDK's loop and the queue's threads end with the process
    print("| clients | job loop | jobs | taken -> handler called p50 / p95 / max ms "
          "| submitted -> first item p50 / p95 ms |")
    print("|---|---|---|---|---|")
    for clients in (int(c) for c in args.clients.split(",")):
        for mode in MODES:
            child = ["--child", f"{mode}:{clients}", "--rounds", str(args.rounds), "--work-s", str(args.work_s),
                     "--slots", str(args.slots)]
            run = subprocess.run([sys.executable, __file__, *child], capture_output=True, text=True, timeout=600)
            if run.returncode != 0:
                raise SystemExit(f"runpod_pickup.py {mode} at {clients} clients: {run.stderr.strip()[-500:]}")
            got = json.loads(run.stdout.strip().splitlines()[-1])
            p, f = got["pickup"], got["first"]
            print(f"| {clients} | {mode} | {len(p)} | {pct(p, 50):.0f} / {pct(p, 95):.0f} / "
                  f"{max(p):.0f} | {pct(f, 50):.0f} / {pct(f, 95):.0f} |")


if __name__ == "__main__":
    main()
