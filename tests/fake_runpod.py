"""The tests' RunPod job queue: ttsengine's own stand-in (tools/load/job_queue.py, also what `loadtest --door
runpod` drives), re-exported here for the tests. `python tests/fake_runpod.py PORT` runs a standalone
queue for the container's end-to-end run: jobs come in over stdin as JSON lines."""

from __future__ import annotations

import json
import sys

from ttsengine.tools.load.job_queue import JobQueue  # noqa: F401 - re-exported for the tests

if __name__ == "__main__":
    q = JobQueue("0.0.0.0", int(sys.argv[1])).start()
    print(json.dumps({"url": q.url}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        q.submit(cmd["id"], cmd["input"])
        q.wait_done([cmd["id"]], timeout=float(cmd.get("timeout", 300)))
        print(json.dumps({"id": cmd["id"], "streamed": q.streamed[cmd["id"]], "done": q.done[cmd["id"]]}),
              flush=True)
