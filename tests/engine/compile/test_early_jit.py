"""Feature early_jit (engine/device/compile/early_jit.py): Triton's compiler key and our kernels' keys made on a thread
beside the weight load, only where the kernels launch."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch
from conftest import ROOT

from ttsengine import EngineConfig
from ttsengine.engine.device.compile import early_jit
from ttsengine.engine.loader import keys_ahead
from ttsengine.model.kernels.triton_support import triton_major

KEYED = """
import sys
from triton.runtime.cache import triton_key
from ttsengine.engine.device.compile import early_jit, early_kernels, kernel_manifest
thread = early_jit.key_kernels_ahead(sys.argv[1])
assert thread is not None and thread.daemon
early_jit.wait_for_keys(300)
assert not thread.is_alive() and not early_jit._KEYING
assert triton_key.cache_info().currsize == 1  # Triton's compiler key made, kept where Triton looks for it
mine = {e["kernel"] for e in kernel_manifest.ENTRIES if e["quant"] in ("bf16", sys.argv[1])}
unkeyed = sorted(p for p in mine if early_kernels.kernel(p).hash is None)
assert not unkeyed, unkeyed
print(len(mine), "kernels keyed")
"""


@pytest.mark.skipif(triton_major() < 3, reason="the kernels' factories need Triton 3")
@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_the_early_jit_thread_keys_triton_and_every_kernel_of_its_quantization(quant):
    """Feature early_jit's thread, in a fresh interpreter without the tests' TRITON_INTERPRET: afterwards Triton's
    compiler key is cached and every manifest kernel a start of that quantization launches holds its key (the objects
    the engine launches: the factories are cached), so the first launches compute neither."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", KEYED, quant], env=env, capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert run.returncode == 0 and "kernels keyed" in run.stdout, run.stderr[-3000:]


def test_only_a_cuda_load_keys_kernels_and_the_switch_turns_it_off():
    assert keys_ahead(torch.device("cuda"), EngineConfig())
    assert keys_ahead(torch.device("cuda:1"), EngineConfig(features="all"))
    assert not keys_ahead(torch.device("cuda"), EngineConfig(features="-early_jit"))
    assert not keys_ahead(torch.device("cpu"), EngineConfig())


def test_waiting_for_the_keys_takes_the_thread_once():
    """Two engines' warm-ups in one process: the first takes and joins the thread, the second finds none."""
    done = threading.Event()
    thread = threading.Thread(target=done.wait, args=(5,), daemon=True)
    thread.start()
    early_jit._KEYING.append(thread)
    waiters = [threading.Thread(target=early_jit.wait_for_keys, args=(0.2,)) for _ in range(2)]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join(5)
    assert not early_jit._KEYING and not any(w.is_alive() for w in waiters)
    done.set()
