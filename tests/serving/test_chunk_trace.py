"""chunk_trace.job_summary: a RunPod job's chunk times in one line (the worker has no /metrics to put them in)."""

from ttsengine.serving.chunk_trace import job_summary


def test_a_jobs_line_gives_the_arrival_pace_each_stages_mean_and_max_and_the_trail():
    marks = [(10.000, 10.001, 10.003), (10.050, 10.052, 10.053), (10.100, 10.101, 10.104)]  # emitted, picked, encoded
    posts = [(10.004, 10.010), (10.105, 10.125)]  # (handed, next asked): the second item held two chunks
    assert job_summary(marks, posts) == ("chunks 3, pieces 2, arriving every 50.0 ms, wake 1.3 / 2.0 ms, "
                                         "encode 2.0 / 3.0 ms, post 13.0 / 20.0 ms, trail 25.0 ms")


def test_a_job_with_nothing_timed_says_so():
    assert job_summary([], [(1.0, 2.0)]) == "chunks 0, pieces 1: nothing to time"
    assert job_summary([(1.0, 1.0, 1.0)], [(1.0, 1.0)]).startswith("chunks 1, pieces 1, arriving every 0.0 ms")
