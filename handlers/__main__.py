"""`python -m handlers serve|runpod|http [args]`: the image's entrypoint; imports only the chosen adapter."""

from __future__ import annotations

import importlib
import sys

MODES = {
    "http": ("handlers.http.server", "local HTTP server: OpenAI + fish-speech APIs, voices, metrics, web page"),
    "serve": ("handlers.sagemaker.serve", "SageMaker endpoint: GET /ping, POST /invocations on 8080"),
    "runpod": ("handlers.runpod.worker", "RunPod serverless worker (RunPod's own flags pass through)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in MODES:
        modes = "\n".join(f"  {name:<7} {help_}" for name, (_, help_) in MODES.items())
        print(f"usage: python -m handlers {{{'|'.join(MODES)}}} [args]\n{modes}", file=sys.stderr)
        return 2
    from ttsengine import build_kernels_ahead, read_weights_ahead  # light: the configuration, a reader, no torch

    read_weights_ahead()  # the disk reads the weights while the adapter imports torch and its web framework
    build_kernels_ahead()  # an empty kernel cache: our Triton kernels compile in other processes meanwhile
    module = importlib.import_module(MODES[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
