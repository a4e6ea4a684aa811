"""`python -m handlers http`: the local server (uvicorn), port TTS_PORT (8080), model TTS_MODEL_DIR."""

from __future__ import annotations

import argparse
import sys

from ttsengine import ServerConfig, TTSError, from_env
from ttsengine.serving.listen import port_problem
from ttsengine.serving.service import setup_logging


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
    from ttsengine.serving.shutdown import serve

    from .app import create_app

    app = create_app(server, engine_config)
    serve(app, app.state.service, server.host, server.port, engine_config.log_level.lower(), server.drain_seconds)
    return 0
