"""Who imports a module first: runs `python -m ttsengine ARGS...` with an import hook that prints, to stderr, the
stack that first imports MODULE (then steps aside), and the process age at that moment. Issue 44: what on a start's
path imports torch._dynamo (~1 s). Usage: who_imports.py MODULE ARGS... (e.g. torch._dynamo warm --model DIR ...)"""

import importlib.abc
import runpy
import sys
import traceback
from pathlib import Path


class FirstImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str):
        self.name = name

    def find_spec(self, name, path, target=None):
        if name == self.name:
            sys.meta_path.remove(self)
            ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
            import os

            age = float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
            print(f"== first import of {name} at {age:.2f} s, from:", file=sys.stderr)
            stack = [f for f in traceback.extract_stack()[:-1] if "importlib._bootstrap" not in f.filename]
            print("".join(traceback.format_list(stack[-16:])), file=sys.stderr, flush=True)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, FirstImport(sys.argv[1]))
    sys.argv = ["ttsengine", *sys.argv[2:]]
    runpy.run_module("ttsengine", run_name="__main__", alter_sys=True)
