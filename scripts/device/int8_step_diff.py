"""Where int8's graphed decode first parts from its eager decode (issue 46; test_gpu.py's
test_int8_graphs_equal_eager_tokens_bf16 and int8_graphs_check.py: the four requests alone agree, together they part
at request 0's frame 38 of 40, with or without prefill graphs, lazy graphs, the one-row bucket, prefill_fit or pdl).
Its answer (stop 71): the eager run stepped request 0 alone first, the graphed one all four (int8's kernels depend
on the row count). The test now queues its requests before the engine's loop starts and passes (stop 72); this script
still submits to a running engine, as a server's requests come.

Both engines run the test's four requests at once with every slow layer's output and the slow head's logits copied
into buffers of their own inside the step (so a CUDA graph records the copies too), and after each decode step is
launched the host reads them (a sync: diagnostics only) for each row, keyed by (request, text chunk, frame). Then,
in the eager run's order, the first frame whose values differ in any layer names the step: the layer, the largest
difference, and each run's rows and bucket at that step (a bucket above the rows means padding rows beside it).
Usage (device): PYTHONPATH=$PWD/container:$PWD:$PWD/tests python3 scripts/device/int8_step_diff.py [FEATURES]
  FEATURES: added to both runs' (e.g. -overlap_step); env KERNEL: TTS_INT8_KERNEL of both (default auto), DEVICE
  (cuda; cpu checks the taps and the bookkeeping only)"""

import dataclasses
import os
import sys

import numpy as np
import torch

sys.path[:0] = ["tests", "tests/engine"]
from test_gpu import REQUESTS, cfg  # noqa: E402

from ttsengine import Engine  # noqa: E402
from ttsengine.engine.device import device as device_mod  # noqa: E402
from ttsengine.engine.device import runner as runner_mod  # noqa: E402

EXTRA = sys.argv[1] if len(sys.argv) > 1 else ""
KERNEL = os.environ.get("KERNEL", "auto")
DEVICE = os.environ.get("DEVICE", "cuda")  # cpu: a smoke run of this script's taps (no graphs there: no difference)
_init, _step_ops, _execute = runner_mod.Runner.__init__, runner_mod.Runner.step_ops, device_mod.Device.execute


def init(self, *a, **kw):
    _init(self, *a, **kw)
    m = self.model
    S, D = self.frames.shape[0], m.cfg.dim
    self.taps = torch.zeros(len(m.layers), S, D, dtype=torch.float32, device=self.device)  # before any capture
    self.logit_tap = None
    self.layer_of = {id(layer): i for i, layer in enumerate(m.layers)}
    head = m.slow_head

    def tapped_head(hidden):
        logits = head(hidden)
        if self.logit_tap is None or self.logit_tap.shape[1] != logits.shape[-1]:
            self.logit_tap = torch.zeros(S, logits.shape[-1], dtype=torch.float32, device=self.device)
        self.logit_tap[: logits.shape[0]].copy_(logits.reshape(logits.shape[0], -1))
        return logits

    m.slow_head = tapped_head


def step_ops(self, bb):
    ops = _step_ops(self, bb)
    layer_fn = ops.slow_layer

    def tapped(layer, x, *rest):
        out = layer_fn(layer, x, *rest)
        self.taps[self.layer_of[id(layer)], : out.shape[0]].copy_(out[:, 0])
        return out

    return dataclasses.replace(ops, slow_layer=tapped)


RECORD: dict = {}  # (request, chunk, frame) -> (order, rows, bucket, [layer values...] + [logits])
STREAMS: dict = {}  # id(stream) -> request index


def execute(self, plan, started):
    launched = _execute(self, plan, started)
    if plan.rows:
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)
        r = self.runner
        taps = r.taps[:, : plan.bucket].cpu().numpy()
        logits = r.logit_tap[: plan.bucket].cpu().numpy() if r.logit_tap is not None else None
        rows = sum(j is not None for j in plan.rows)
        for i, job in enumerate(plan.rows):
            if job is None:
                continue
            task = job.owner
            key = (STREAMS.get(id(task.stream), -1), task.index, job.generated + job.in_flight - 1)
            values = [taps[layer, i] for layer in range(taps.shape[0])]
            values.append(logits[i] if logits is not None else np.zeros(1))
            RECORD.setdefault(key, (len(RECORD), rows, plan.bucket, values))
    return launched


runner_mod.Runner.__init__, runner_mod.Runner.step_ops, device_mod.Device.execute = init, step_ops, execute


def run(features: str) -> dict:
    RECORD.clear()
    STREAMS.clear()
    eng = Engine.load(dataclasses.replace(cfg(features=features, quant="int8", int8_kernel=KERNEL), device=DEVICE))
    try:
        streams = [eng.submit(r) for r in REQUESTS]
        for i, s in enumerate(streams):
            STREAMS[id(s)] = i
        for s in streams:
            s.result()
    finally:
        eng.close()
    return dict(RECORD)


eager = run(",".join(f for f in ("-cuda_graphs,-compile", EXTRA) if f))
graphed = run(",".join(f for f in ("+cuda_graphs,-compile", EXTRA) if f))
print(f"frames recorded: eager {len(eager)}, graphed {len(graphed)}; features added: {EXTRA or 'none'}; "
      f"int8 kernel {KERNEL}")
first = None
for key, (_order, rows, bucket, values) in sorted(eager.items(), key=lambda kv: kv[1][0]):
    if key not in graphed:
        continue
    _, g_rows, g_bucket, g_values = graphed[key]
    for layer, (a, b) in enumerate(zip(values, g_values)):
        if a.shape != b.shape or not np.array_equal(a, b):
            diff = float(np.abs(a - b).max()) if a.shape == b.shape else float("nan")
            where = "logits" if layer == len(values) - 1 else f"slow layer {layer}"
            first = (key, where, diff, (rows, bucket), (g_rows, g_bucket))
            break
    if first:
        break
if first is None:
    print("no difference in any slow layer or the logits of any frame both runs made")
else:
    (req, chunk, frame), where, diff, (er, eb), (gr, gb) = first
    print(f"first difference: request {req}, chunk {chunk}, frame {frame}: {where}, max |diff| {diff:.3g}; eager "
          f"{er} rows in bucket {eb}, graphed {gr} rows in bucket {gb}")
    start = eager[first[0]][0]
    print("| step (eager order) | request, chunk, frame | eager rows/bucket | graphed rows/bucket | first differing |")
    print("|---|---|---|---|---|")
    later = [(key, v) for key, v in sorted(eager.items(), key=lambda kv: kv[1][0]) if v[0] >= start and key in graphed]
    for key, (order, rows, bucket, values) in later[:12]:  # the first difference and the frames after it
        _, g_rows, g_bucket, g_values = graphed[key]
        bad = next((i for i, (a, b) in enumerate(zip(values, g_values)) if not np.array_equal(a, b)), None)
        what = "-" if bad is None else ("logits" if bad == len(values) - 1 else f"layer {bad}")
        print(f"| {order} | {key} | {rows}/{bucket} | {g_rows}/{g_bucket} | {what} |")
