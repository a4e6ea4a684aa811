"""RunPod Hub entry point: the same worker as the image's `python -m handlers runpod`."""

import sys

from handlers.runpod.worker import main

if __name__ == "__main__":
    sys.exit(main())
