"""A local stand-in for RunPod's cloud APIs, for the infra tools: the GraphQL API the SDK's management
functions call (templates and endpoints; every query is recorded) and the serverless endpoint API that
runpod.Endpoint calls (/v2/ID/run, /status/JOB, /stream/JOB), whose jobs run through a real job handler."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY = "test-key"


def _fields(text: str) -> dict:
    """`name: "x", workersMax: 3, flashBootType: FLASHBOOT` -> dict (strings and numbers only)."""
    out = {}
    for key, value in re.findall(r'(\w+)\s*:\s*("(?:[^"\\]|\\.)*"|[\w.]+)', text):
        out.setdefault(key, json.loads(value) if value.startswith('"') else
                       (int(value) if value.isdigit() else value))
    return out


class FakeRunPodCloud:
    def __init__(self, handler=None):
        self.handler = handler  # async generator function(job) -> items, e.g. JobHandler.run
        self.queries: list[str] = []
        self.templates: list[dict] = []
        self.endpoints: list[dict] = []
        self.jobs: dict[str, dict] = {}
        self.ids = itertools.count(1)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._http())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def env(self) -> dict:
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        return {"RUNPOD_API_KEY": KEY, "RUNPOD_API_BASE_URL": base, "RUNPOD_ENDPOINT_BASE_URL": base + "/v2"}

    def stop(self) -> None:
        self.server.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)

    # ---- GraphQL ----------------------------------------------------------------------------------
    def graphql(self, query: str) -> dict:
        self.queries.append(query)
        if "podTemplates" in query:
            return {"myself": {"podTemplates": [{"id": t["id"], "name": t["name"]} for t in self.templates]}}
        if "saveTemplate" in query:
            fields = _fields(query.split("saveTemplate", 1)[1].split(")", 1)[0])
            if any(t["name"] == fields["name"] for t in self.templates):
                raise ValueError(f"Template name must be unique: {fields['name']}")
            env = dict(re.findall(r'\{\s*key:\s*"([^"]*)",\s*value:\s*"([^"]*)"\s*\}', query))
            t = {"id": f"tpl{next(self.ids)}", "env": env, **fields}
            self.templates.append(t)
            return {"saveTemplate": t}
        if "updateEndpointTemplate" in query:
            fields = _fields(query)
            ep = next(e for e in self.endpoints if e["id"] == fields["endpointId"])
            ep["templateId"] = fields["templateId"]
            return {"updateEndpointTemplate": {"id": ep["id"], "templateId": ep["templateId"]}}
        if "saveEndpoint" in query:
            fields = _fields(query.split("input:", 1)[1])
            if "id" in fields:
                ep = next(e for e in self.endpoints if e["id"] == fields["id"])
                ep.update(fields)
            else:
                ep = {"id": f"ep{next(self.ids)}", **fields}
                self.endpoints.append(ep)
            return {"saveEndpoint": ep}
        if "endpoints" in query:
            return {"myself": {"endpoints": self.endpoints}}
        raise ValueError("unknown query")

    # ---- serverless endpoint API -------------------------------------------------------------------
    def run(self, endpoint_id: str, body: dict) -> dict:
        job_id = f"job{next(self.ids)}"
        job = {"id": job_id, "endpoint": endpoint_id, "input": body.get("input"), "status": "IN_QUEUE",
               "items": [], "sent": 0, "error": None}
        self.jobs[job_id] = job
        asyncio.run_coroutine_threadsafe(self._execute(job), self.loop)
        return {"id": job_id, "status": "IN_QUEUE"}

    async def _execute(self, job: dict) -> None:
        job["status"] = "IN_PROGRESS"
        async for item in self.handler({"id": job["id"], "input": job["input"]}):
            if set(item) == {"error"}:
                job["error"], job["status"] = item["error"], "FAILED"
                return
            job["items"].append(item)
        job["status"] = "COMPLETED"

    def status(self, job_id: str) -> dict:
        job = self.jobs[job_id]
        out = {"id": job_id, "status": job["status"]}
        if job["status"] == "COMPLETED":
            out["output"] = job["items"]
        if job["error"]:
            out["error"] = job["error"]
        return out

    def stream(self, job_id: str) -> dict:
        job = self.jobs[job_id]
        new, job["sent"] = job["items"][job["sent"]:], len(job["items"])
        return {"status": job["status"], "stream": [{"output": i} for i in new]}

    def _http(self):
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization", "").removeprefix("Bearer ") != KEY:
                    self._reply(401, {"error": "unauthorized"})
                    return False
                return True

            def do_POST(self):
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/graphql":
                    try:
                        self._reply(200, {"data": cloud.graphql(body["query"])})
                    except (ValueError, StopIteration, KeyError) as e:
                        self._reply(200, {"errors": [{"message": str(e) or type(e).__name__}]})
                elif re.fullmatch(r"/v2/\w+/run", self.path):
                    self._reply(200, cloud.run(self.path.split("/")[2], body))
                else:
                    self._reply(404, {"error": "unknown route"})

            def do_GET(self):
                if not self._authorized():
                    return
                m = re.fullmatch(r"/v2/\w+/(status|stream)/(\w+)", self.path)
                if m and m.group(2) in cloud.jobs:
                    self._reply(200, getattr(cloud, m.group(1))(m.group(2)))
                else:
                    self._reply(404, {"error": "unknown job"})

        return Handler
