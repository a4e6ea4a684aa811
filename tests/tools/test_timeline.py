"""tools/timeline.py: per-stream busy time, time any stream ran and time two streams ran at once."""

from ttsengine.tools.bench import timeline_rows
from ttsengine.tools.timeline import covered, timeline


def test_covered_merges_overlapping_and_touching_spans():
    assert covered([(5, 12), (0, 10), (12, 13), (20, 21), (3, 3)]) == [(0, 13), (20, 21)]


def test_streams_busy_and_shared_time():
    # stream 1: two overlapping kernels [0, 12); stream 2: [11, 20) and [30, 31); stream 3 inside stream 2
    t = timeline([(0, 10, 1), (5, 12, 1), (11, 20, 2), (30, 31, 2), (14, 15, 3)])
    assert t.span_us == 31 and t.busy_us == 21
    assert t.shared_us == 2  # [11, 12): streams 1 and 2; [14, 15): 2 and 3 (three at once never counts twice)
    one, two, three = sorted(t.streams, key=lambda s: s.stream)
    assert (one.kernels, one.kernel_us, one.busy_us) == (2, 17, 12)
    assert (two.kernels, two.kernel_us, two.busy_us) == (2, 10, 10)
    assert three.busy_us == 1 and t.streams[0].stream == 1  # busiest first


def test_a_stream_overlapping_itself_is_not_shared_time():
    t = timeline([(0, 10, 7), (2, 8, 7)])
    assert t.shared_us == 0 and t.busy_us == 10 and t.streams[0].kernel_us == 16


def test_no_kernels_and_the_rows_bench_prints():
    assert timeline([]).busy_us == 0
    rows = timeline_rows(timeline([(0, 2000, "cuda:0 stream 7"), (1000, 4000, "cuda:1 stream 7")]))
    by = {r["name"].split(" (its")[0]: r["ms"] for r in rows}
    assert by["GPU busy (any stream)"] == 4 and by["GPU busy on two or more streams at once"] == 1
    assert by["GPU cuda:1 stream 7 busy"] == 3 and by["GPU cuda:0 stream 7 busy"] == 2  # one stream id, two GPUs
