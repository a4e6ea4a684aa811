"""What RunPod's SDK costs per streamed item, on the CPU: its own `handle_job` (the code a worker runs for each job of a
generator handler: the debug f-strings, the aggregate, json.dumps, one POST per item awaited before the next) for JOBS
concurrent jobs against a local sink that answers every post, per item size, with plain dict items and with the
RunPod handler's Item (a repr that does not copy the base64). The sink shares the event loop (the figures are the
two sides together). Needs the runpod and aiohttp packages (the dev extras). Feature runpod_coalesce and the Item
came from it (docs/performance.md, "The HTTP path (issue 43)").

    PYTHONPATH=container:. python scripts/runpod_item_cost.py [--jobs 64] [--audio-s 8.9] [--sizes 17800,71200,284800]
        [--aggregate on|off|both]

Sizes are pcm bytes per item: 17,800 is one 8-frame chunk at 24 kHz (0.37 s), each job carries AUDIO_S of audio.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import time

PCM_BYTES_PER_S = 48_000  # 24 kHz, 16-bit mono: pcm's default rate


async def one_size(size: int, jobs: int, audio_s: float, item_type: type, port: int,
                   aggregate: bool = True) -> tuple[float, float, int]:
    """-> (wall seconds, CPU seconds, items sent) for `jobs` concurrent jobs of items of `size` pcm bytes; aggregate:
    the SDK's return_aggregate_stream (the job's items posted again as one list when it is done)."""
    from aiohttp import web
    from runpod.http_client import AsyncClientSession
    from runpod.serverless.modules import rp_http
    from runpod.serverless.modules.rp_job import handle_job

    rp_http.JOB_STREAM_URL = f"http://127.0.0.1:{port}/stream/$ID?gpu=x"
    rp_http.JOB_DONE_URL = f"http://127.0.0.1:{port}/done/$ID?gpu=x"  # the done post (the aggregate, if any) too

    async def sink(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    app = web.Application(client_max_size=1 << 26)
    app.router.add_post("/stream/{job}", sink)
    app.router.add_post("/done/{job}", sink)
    runner = web.AppRunner(app, access_log=None)  # a line per post would bury the table
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    audio = base64.b64encode(os.urandom(size)).decode()
    per_job = max(1, round(audio_s * PCM_BYTES_PER_S / size))

    async def handler(job: dict):
        for i in range(per_job):
            yield item_type({"index": i, "audio": audio, "format": "pcm", "content_type": "audio/pcm",
                             "sample_rate": 24000})

    config = {"handler": handler, "return_aggregate_stream": aggregate}
    try:
        async with AsyncClientSession() as session:
            wall, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(handle_job(session, config, {"id": f"job-{j}"}) for j in range(jobs)))
            return time.perf_counter() - wall, time.process_time() - cpu, jobs * per_job
    finally:
        await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=64)
    ap.add_argument("--audio-s", type=float, default=8.9, help="audio seconds per job (192 frames: 8.9 s)")
    ap.add_argument("--sizes", default="17800,71200,284800", help="pcm bytes per item, comma-separated")
    ap.add_argument("--port", type=int, default=8777)
    ap.add_argument("--aggregate", choices=("on", "off", "both"), default="on",
                    help="the SDK's return_aggregate_stream (RUNPOD_AGGREGATE_STREAM; the worker's default: on)")
    args = ap.parse_args()
    os.environ.setdefault("RUNPOD_DEBUG_LEVEL", "ERROR")  # the SDK's log level: its f-strings are formatted anyway
    from handlers.runpod.handler import Item

    print("| pcm bytes per item | items | item type | aggregate | wall s | CPU s | audio s per s |")
    print("|---|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        for aggregate in {"on": (True,), "off": (False,), "both": (True, False)}[args.aggregate]:
            for kind in (dict, Item):
                wall, cpu, items = asyncio.run(one_size(size, args.jobs, args.audio_s, kind, args.port, aggregate))
                audio = items * size / PCM_BYTES_PER_S
                print(f"| {size:,} | {items:,} | {kind.__name__} | {'on' if aggregate else 'off'} | {wall:.2f} | "
                      f"{cpu:.2f} | {audio / wall:,.0f} |")


if __name__ == "__main__":
    main()
