"""Timing of small GPU calls as the engine runs them: captured in one CUDA graph and replayed (launch costs as in
a graphed decode step). Shared by the device micro-benchmarks (quant_eval.py, small_linear_bench.py)."""
import torch


def graphed_us(fns, reps: int = 20) -> float:
    """Mean microseconds per call of the callables `fns` (run in turn) replayed in one CUDA graph, CUDA events."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    graph.replay()  # (a first replay is slower)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * len(fns))
