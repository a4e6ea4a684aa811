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
import threading
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ttsengine import ServerConfig, TTSError, audio_bytes, audio_record, from_env, output_rate

from . import inference

log = logging.getLogger("handlers.serve")
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


def create_app(server: ServerConfig, model_dir: Path, loader=inference.model_fn) -> FastAPI:
    state: dict = {"model": None, "error": None}

    def load() -> None:
        try:
            state["model"] = loader(str(model_dir))
        except Exception as e:  # noqa: BLE001 - reported by /ping and /invocations
            log.exception("model_fn failed")
            state["error"] = f"{type(e).__name__}: {e}"

    async def lifespan(app):
        threading.Thread(target=load, name="model-loader", daemon=True).start()
        yield
        if state["model"] is not None:
            await run_in_threadpool(state["model"].engine.close)

    app = FastAPI(title="fish-tts-server (SageMaker)", lifespan=lifespan, docs_url=None, redoc_url=None)

    def error(status: int, message: str) -> JSONResponse:
        headers = {"Retry-After": "5"} if status == 503 else None
        return JSONResponse({"error": {"message": message, "code": status}}, status_code=status, headers=headers)

    @app.get("/ping")
    async def ping():
        if state["error"]:
            return error(500, f"the model failed to load: {state['error']}")
        if state["model"] is None:
            return error(503, "the model is loading")
        return {"status": "ready"}

    # the second path is SageMaker Runtime's own (InvokeEndpoint), so boto3 with endpoint_url= can call
    # this server directly in local tests
    @app.post("/invocations")
    @app.post("/endpoints/{endpoint_name}/invocations", include_in_schema=False)
    async def invocations(request: Request):
        if state["error"]:
            return error(500, f"the model failed to load: {state['error']}")
        model = state["model"]
        if model is None:
            return error(503, "the model is loading; retry shortly")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > server.max_body_bytes:
            return error(413, f"request body over {server.max_body_bytes} bytes")
        try:
            raw = await request.body()
            if len(raw) > server.max_body_bytes:
                return error(413, f"request body over {server.max_body_bytes} bytes")
            attrs = custom_attributes(request.headers.get("x-amzn-sagemaker-custom-attributes"))
            inference.response_format(request.headers.get("accept"), "wav")  # 406 before any work
            body = apply_attributes(await run_in_threadpool(inference.input_fn, raw,
                                                            request.headers.get("content-type")), attrs)
            stream_flag = attrs.get("stream", body.get("stream", False))
            if stream_flag:
                job = inference.job_for(body, model.voices)
                stream = await run_in_threadpool(model.engine.submit, job.request)
                return StreamingResponse(_json_lines(stream, job), media_type="application/jsonlines",
                                         headers={"X-Seed": str(stream.seed)})
            prediction = await run_in_threadpool(inference.predict_fn, body, model)
            data, content_type = await run_in_threadpool(inference.output_fn, prediction,
                                                         request.headers.get("accept"))
            return Response(data, media_type=content_type, headers={"X-Seed": str(prediction.result.seed)})
        except Exception as e:  # noqa: BLE001 - a JSON error with a status, never a stack trace
            status = inference.http_status(e)
            known = isinstance(e, TTSError) or hasattr(e, "status_code")
            if not known:
                log.exception("invocation failed")
                return error(500, "internal server error")
            if status >= 500:
                log.error("invocation failed: %s", e)
            return error(status, inference.error_message(e))

    return app


async def _json_lines(stream, job):
    rate = output_rate(job.format, stream.sample_rate, job.sample_rate)
    index = 0
    try:
        async for data in audio_bytes(stream, job):
            yield (json.dumps(audio_record(index, data, job.format, rate)) + "\n").encode()
            index += 1
        frames = sum(r.frames for r in stream.reports)
        yield (json.dumps({"done": True, "seed": stream.seed, "frames": frames,
                           "seconds": round(frames * 2048 / stream.sample_rate, 3)}) + "\n").encode()
    except Exception as e:  # noqa: BLE001 - headers are gone: report in-band
        yield (json.dumps({"error": {"message": str(e), "code": 500}}) + "\n").encode()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m handlers serve", description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    try:
        engine_config = from_env()
        server = ServerConfig.for_sagemaker()
    except TTSError as e:
        print(f"handlers serve: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=engine_config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    uvicorn.run(create_app(server, engine_config.model_dir), host="0.0.0.0", port=server.port,
                log_level=engine_config.log_level.lower(), timeout_graceful_shutdown=10)
    return 0
