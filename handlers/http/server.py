"""`python -m handlers http`: the local server (uvicorn), port TTS_PORT (8080), model TTS_MODEL_DIR."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from ttsengine import DownloadConfig, ServerConfig, TTSError, ensure_model, from_env
from ttsengine.serving.download import default_max_new_tokens
from ttsengine.serving.network.listen import port_problem
from ttsengine.serving.service import setup_logging

log = logging.getLogger("handlers.http")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m handlers http", description=__doc__)
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    args = ap.parse_args(argv)
    try:
        engine_config = from_env()
        server = ServerConfig.from_env(host=args.host, port=args.port)
    except TTSError as e:
        print(f"handlers http: {e}", file=sys.stderr)
        return 2
    problem = port_problem(server.host, server.port)
    if problem:
        print(f"handlers http: {problem}", file=sys.stderr)
        return 2
    setup_logging(engine_config.log_level)
    try:  # before listening: a missing model is one line, not a server that answers 503 forever
        download = DownloadConfig.from_env()
        ensure_model(engine_config.model_dir, download.model_source, download.hf_token)
    except TTSError as e:
        print(f"handlers http: {e} (set TTS_MODEL_DIR to a model dir, or TTS_MODEL_SOURCE=tiny, hf://fishaudio/"
              "openaudio-s1-mini with HF_TOKEN, s3://... or a dir to fetch one into it)", file=sys.stderr)
        return 2
    frames = default_max_new_tokens(engine_config.model_dir, engine_config.default_max_new_tokens)
    if frames != engine_config.default_max_new_tokens:
        log.info("the tiny test model: requests without max_new_tokens make %d frames (TTS_DEFAULT_MAX_NEW_TOKENS)",
                 frames)
        engine_config = dataclasses.replace(engine_config, default_max_new_tokens=frames)
    from ttsengine.serving.network.connection_guard import Deadlines, max_connections
    from ttsengine.serving.network.shutdown import serve

    from .app import body_error_kind, create_app
    from .errors import error_body

    app = create_app(server, engine_config)
    deadlines = Deadlines(server.idle_timeout, server.header_timeout,
                          reply=lambda e: error_body(str(e), body_error_kind(e.status), e.status),
                          max_connections=max_connections(server.max_connections))
    serve(app, app.state.service, server.host, server.port, engine_config.log_level.lower(), server.drain_seconds,
          deadlines, engine_config.features)
    return 0
