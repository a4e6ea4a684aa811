"""`python -m handlers serve`: SageMaker's container contract (BYOC).

GET /ping answers at once, 200 only when the model is loaded and warm (503 before, so SageMaker's
start-up health check waits for the compile). POST /invocations runs the four functions of
inference.py; with `"stream": true` in the body or `stream=true` in X-Amzn-SageMaker-Custom-Attributes
the response streams (InvokeEndpointWithResponseStream) as JSON lines, one self-delimiting record per
audio chunk: {"index", "audio" (base64), "format", "content_type", "sample_rate"}, then
{"done": true, "seed", "frames", "seconds"}. Custom attributes can also set format, seed,
sample_rate, speed, temperature, top_p, repetition_penalty and max_new_tokens.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.websockets import WebSocketState

from ttsengine import SageMakerConfig, ServerConfig, TTSError, audio_bytes, audio_record, from_env, output_rate
from ttsengine.serving.delivery import generated, unless_gone
from ttsengine.serving.failure import failure
from ttsengine.serving.live.fish_socket import FishConnection
from ttsengine.serving.live.metrics import LiveMetrics
from ttsengine.serving.network.body_limit import BodyLimit
from ttsengine.serving.network.listen import HeadAsGet, port_problem
from ttsengine.serving.protocol import ignored_header
from ttsengine.serving.service import Service, setup_logging

from . import inference

log = logging.getLogger("handlers.serve")
BODY_LIMIT = 1 << 30  # asynchronous inference takes payloads up to 1 GB (TTS_MAX_BODY_BYTES still wins)
ATTRIBUTE_FIELDS = {"format", "seed", "sample_rate", "speed", "temperature", "top_p", "repetition_penalty",
                    "max_new_tokens", "stream"}


def custom_attributes(header: str | None) -> dict:
    """'stream=true; format=mp3, seed=7' -> {"stream": True, "format": "mp3", "seed": 7}."""
    out: dict = {}
    for item in (header or "").replace(",", ";").split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or key not in ATTRIBUTE_FIELDS:
            raise inference.InputError(f"X-Amzn-SageMaker-Custom-Attributes: unknown option {item.strip()!r} "
                                       f"(known: {', '.join(sorted(ATTRIBUTE_FIELDS))})")
        if key == "stream":
            out[key] = value.lower() in ("1", "true", "yes", "on")
        elif key == "format":
            out[key] = value
        else:
            try:
                out[key] = int(value) if key in ("seed", "sample_rate", "max_new_tokens") else float(value)
            except ValueError:
                raise inference.InputError(f"X-Amzn-SageMaker-Custom-Attributes: {key}={value!r} is not a number") \
                    from None
    return out


def apply_attributes(body: dict, attrs: dict) -> dict:
    """Attributes override the body's fields, in whichever schema the body uses."""
    body = dict(body)
    for key, value in attrs.items():
        if key == "format":
            body["response_format" if "input" in body else "format"] = value
        elif key != "stream":
            body[key] = value
    return body


def create_app(server: ServerConfig, service: Service) -> FastAPI:
    """service: inference.service_for(config), not started: it loads in the background, so /ping answers
    at once."""

    async def lifespan(app):
        service.start()
        yield
        await run_in_threadpool(service.close)

    app = FastAPI(title="fish-tts-server (SageMaker)", lifespan=lifespan, docs_url=None, redoc_url=None)
    live_metrics = LiveMetrics(CollectorRegistry())  # serve has no /metrics: the live series stay in the process
    app.add_middleware(BodyLimit, limit=server.max_body_bytes, reply=lambda e: error_body(e.status, str(e)),
                       read_timeout=server.read_timeout, min_rate=server.body_min_rate,
                       rate_grace=server.body_rate_grace, body_timeout=server.body_timeout)
    app.add_middleware(HeadAsGet)  # HEAD /ping as GET, without the body

    @app.get("/ping")
    async def ping():
        if service.error:
            return error(500, f"the model is not serving: {service.error}")
        if service.draining:
            return error(503, "the server is shutting down")
        if not service.ready:
            return error(503, "the model is loading")
        pending = service.warming(server.ready_when, server.ready_max_wait)  # TTS_READY_WHEN, as /ready
        if pending:
            return error(503, f"the model is warming up: {pending} CUDA graph(s) still to capture")
        return {"status": "ready"}

    @app.websocket("/invocations-bidirectional-stream")
    async def bidirectional(ws: WebSocket):
        """InvokeEndpointWithBidirectionalStream: SageMaker's sidecar opens this socket for each stream and passes
        each request payload part as one message (binary parts as binary); Fish's live protocol runs on it, as on
        the HTTP server's /v1/tts/live. SageMaker authenticates the caller (SigV4): no key, no Origin here."""
        await ws.accept()
        await FishConnection(ws, lambda: ws.application_state == WebSocketState.DISCONNECTED, service, server,
                             live_metrics).run()

    # the second path is SageMaker Runtime's own (InvokeEndpoint), so boto3 with endpoint_url= can call
    # this server directly in local tests
    @app.post("/invocations")
    @app.post("/endpoints/{endpoint_name}/invocations", include_in_schema=False)
    async def invocations(request: Request):
        if service.error:
            return error(500, f"the model is not serving: {service.error}")
        if service.draining:
            return error(503, "the server is shutting down; retry shortly")
        if not service.ready:
            return error(503, "the model is loading; retry shortly")
        try:
            raw = await request.body()
            attrs = custom_attributes(request.headers.get("x-amzn-sagemaker-custom-attributes"))
            inference.response_format(request.headers.get("accept"), "wav")  # 406 before any work
            body = apply_attributes(await run_in_threadpool(inference.input_fn, raw,
                                                            request.headers.get("content-type")), attrs)
            stream_flag = attrs.get("stream", body.get("stream", False))
            if stream_flag:
                job = inference.job_for(body, service.voices, server=server)
                stream = await service.admit(job.request, request.is_disconnected)
                return StreamingResponse(_json_lines(stream, job), media_type="application/jsonlines",
                                         headers={"X-Seed": str(stream.seed), **ignored_header(job.ignored)})
            # not predict_fn (one thread blocked for the whole generation): the request is planned in the service's
            # own threads and the generation cancelled if the client leaves before the answer is ready (issue 50)
            job = inference.job_for(body, service.voices, server=server)
            stream = await service.admit(job.request, request.is_disconnected)
            prediction = inference.Prediction(await unless_gone(generated(stream), stream, request.is_disconnected),
                                              job)
            data, content_type = await run_in_threadpool(inference.output_fn, prediction,
                                                         request.headers.get("accept"))
            return Response(data, media_type=content_type,
                            headers={"X-Seed": str(prediction.result.seed), **ignored_header(prediction.job.ignored)})
        except ClientDisconnect:  # gone before its body was read: not a server error, and nobody to answer
            log.info("invocation: the client closed the connection before its body was read")
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001 - a JSON error with a status, never a stack trace
            status = inference.http_status(e)
            known = isinstance(e, TTSError) or hasattr(e, "status_code")
            if not known:
                log.exception("invocation failed")
                return error(500, "internal server error")
            if status >= 500:
                log.error("invocation failed: %s", e)
            return error(status, inference.error_message(e), failure(e.__cause__ or e).retry_after)

    return app


def error_body(status: int, message: str) -> dict:
    return {"error": {"message": message, "code": status}}


def error(status: int, message: str, retry_after: int | None = 5) -> JSONResponse:
    """A JSON error; a 503 says when to retry (the failure table's delay: 1 s for a busy engine, 5 s loading)."""
    headers = {"Retry-After": str(retry_after)} if status == 503 and retry_after else None
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


async def _json_lines(stream, job):
    rate = output_rate(job.format, stream.sample_rate, job.sample_rate)
    index = 0
    try:
        async for data in audio_bytes(stream, job):
            yield (json.dumps(audio_record(index, data, job.format, rate)) + "\n").encode()
            index += 1
        frames = stream.frames
        yield (json.dumps({"done": True, "seed": stream.seed, "frames": frames,
                           "seconds": round(frames * 2048 / stream.sample_rate, 3)}) + "\n").encode()
    except Exception as e:  # noqa: BLE001 - headers are gone: report in-band
        f = failure(e)  # an engine taken out of service mid-stream is a 503: another engine takes the retry
        log.warning("streamed invocation cut short: %s", f.message)
        yield (json.dumps(error_body(f.status, f.message)) + "\n").encode()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m handlers serve", description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    try:
        engine_config = from_env()
        # SageMaker's port wins over TTS_PORT; its 1 GB body limit is a default TTS_MAX_BODY_BYTES overrides
        server = ServerConfig.from_env(defaults={"max_body_bytes": BODY_LIMIT}, port=SageMakerConfig.from_env().port)
        service = inference.service_for(engine_config)
    except TTSError as e:
        print(f"handlers serve: {e}", file=sys.stderr)
        return 2
    problem = port_problem("0.0.0.0", server.port)
    if problem:
        print(f"handlers serve: {problem}", file=sys.stderr)
        return 2
    setup_logging(engine_config.log_level)
    from ttsengine.serving.network.connection_guard import Deadlines, max_connections
    from ttsengine.serving.network.shutdown import serve as serve_draining

    deadlines = Deadlines(server.idle_timeout, server.header_timeout, reply=lambda e: error_body(e.status, str(e)),
                          max_connections=max_connections(server.max_connections))
    serve_draining(create_app(server, service), service, "0.0.0.0", server.port, engine_config.log_level.lower(),
                   server.drain_seconds, deadlines, engine_config.features)
    return 0
