"""Finding iterations, sync points and top-level ranges on small hand-built ranks, checked by hand."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from nsys_recipe_pack import iteration_scan, iterations
from nsys_recipe_pack.errors import BadInputError
from nsys_recipe_pack.inputs import RankData
from nsys_recipe_pack.recipes import compute_memory_share as share


def nvtx(rows):
    """rows: (name, start, end, tid[, domain]); end None: never closed."""
    return pd.DataFrame({
        "start_ns": pd.Series([r[1] for r in rows], dtype="int64"),
        "end_ns": pd.Series([r[2] for r in rows], dtype="Int64"),
        "event_type": 59,
        "name": [r[0] for r in rows],
        "domain": [r[4] if len(r) > 4 else "" for r in rows],
        "tid": pd.Series([r[3] for r in rows], dtype="int64"),
        "pid": 1,
    })


def kernels(rows):
    """rows: (name, start, end)."""
    n = len(rows)
    return pd.DataFrame({
        "start_ns": pd.Series([r[1] for r in rows], dtype="int64"),
        "end_ns": pd.Series([r[2] for r in rows], dtype="int64"),
        "device": pd.array([0] * n, dtype="Int64"), "stream": pd.array([7] * n, dtype="Int64"),
        "correlation_id": pd.array(range(n), dtype="Int64"), "graph_node_id": pd.array([pd.NA] * n, dtype="Int64"),
        "pid": 1, "name": [r[0] for r in rows], "full_name": [r[0] + "(float*)" for r in rows],
    })


def test_most_common_breaks_ties_by_first_appearance_as_value_counts_does():
    assert iterations.most_common(np.array([3, 1, 1, 3, 2])) == 3
    assert iterations.most_common(np.array([2, 1, 1, 3, 3])) == 1
    assert iterations.most_common(np.array(["b", "a", "a"], object)) == "a"


def test_auto_delimiter_is_the_outermost_repeat_on_the_busiest_thread():
    rows = []
    for i in range(6):  # thread 1: step [100 i, 100 i + 90) with two nested "op" ranges, one unclosed
        t = 100 * i
        rows += [("step", t, t + 90, 1), ("op", t + 10, t + 20, 1), ("op", t + 30, t + 40, 1)]
    rows += [("lonely", 0, 5, 1), ("step", 700, None, 1)]
    rows += [("poll", 10 * i, 10 * i + 5, 2) for i in range(5)]  # thread 2 repeats, but has fewer ranges
    it = iteration_scan.find_iterations(RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx(rows)))
    # "op" repeats more often but lies inside "step"; the unclosed "step" is left out
    assert it.delimiter.as_dict() == {"kind": "nvtx", "name": "step", "domain": None, "source": "auto"}
    assert it.tid == 1
    assert it.start_ns.tolist() == [0, 100, 200, 300, 400, 500]
    assert it.end_ns.tolist() == [90, 190, 290, 390, 490, 590]


def test_auto_delimiter_passes_over_the_range_covering_most_time_when_it_sits_inside_another():
    # "load" covers the most time (two long ranges of 1000 ns), but four of its six ranges lie inside "step"
    # ranges, so it is not the outermost repeat: "step" (5 x 50 ns) is. "tick" repeats on its own and covers
    # less than "step"; "flat" ranges sit side by side with no other range around them
    rows = [("step", 100 * i, 100 * i + 50, 1) for i in range(5)]
    rows += [("load", 100 * i + 10, 100 * i + 20, 1) for i in range(4)]
    rows += [("load", 1000, 2000, 1), ("load", 3000, 4000, 1)]
    rows += [("tick", 5000 + 20 * i, 5000 + 20 * i + 5, 1) for i in range(5)]
    it = iteration_scan.find_iterations(RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx(rows)))
    assert it.delimiter.name == "step" and it.start_ns.tolist() == [0, 100, 200, 300, 400]
    # many names, each repeating side by side, none inside another: the one covering most time
    flat = [(f"op{k}", 1000 * (5 * k + i), 1000 * (5 * k + i) + 10 + k, 1) for k in range(300) for i in range(5)]
    it = iteration_scan.find_iterations(RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx(flat)))
    assert it.delimiter.name == "op299" and len(it.start_ns) == 5


def test_named_delimiter_with_domain_and_its_errors():
    rows = [("step", 100 * i, 100 * i + 50, 1, "train") for i in range(3)] + [("step", 20, 30, 1, "eval")]
    rd = RankData(file="r.nsys-rep", pid=1, session_start_ns=0, nvtx=nvtx(rows))
    it = iteration_scan.find_iterations(rd, iteration="step@train")
    assert (it.start_ns.tolist(), it.delimiter.domain) == ([0, 100, 200], "train")
    assert iteration_scan.find_iterations(rd, iteration="step").start_ns.tolist() == [0, 100, 200]  # eval's is inside
    with pytest.raises(BadInputError, match="no NVTX range named 'stpe'; closest names: 'step'"):
        iteration_scan.find_iterations(rd, iteration="stpe")


def test_kernel_delimiter_named_or_found_when_no_range_repeats():
    ks = kernels([("gemm", 0, 5), ("relu", 6, 8), ("gemm", 10, 15), ("gemm", 20, 26), ("gemm", 30, 34),
                  ("gemm", 42, 47)])
    rd = RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx([("once", 0, 50, 1)]), kernels=ks)
    for it in (iteration_scan.find_iterations(rd), iteration_scan.find_iterations(rd, iteration_kernel="gemm")):
        assert it.delimiter.kind == "kernel" and it.delimiter.name == "gemm"
        # each launch until the next; the last lasts the median period (10) or to its own end if later
        assert it.start_ns.tolist() == [0, 10, 20, 30, 42]
        assert it.end_ns.tolist() == [10, 20, 30, 42, 52]
    assert iteration_scan.find_iterations(rd, iteration_kernel="relu").start_ns.tolist() == [6]
    with pytest.raises(BadInputError, match="no kernel named 'gem'"):
        iteration_scan.find_iterations(rd, iteration_kernel="gem")


def test_sync_points_collect_collective_ranges_nccl_kernels_named_syncs_and_cuda_syncs():
    rows = [("AllReduce_grads", 0, 10, 1), ("step", 0, 100, 1), ("mine", 20, 30, 1), ("x", 40, 45, 1, "NCCL")]
    ks = kernels([("ncclDevKernel_AllGather", 50, 60), ("gemm", 60, 70)])
    rt = pd.DataFrame({"start_ns": [70, 80], "end_ns": [75, 90], "tid": [1, 1], "pid": [1, 1],
                       "correlation_id": pd.array([100, 101], dtype="Int64"),
                       "name": ["cudaStreamSynchronize_v3020", "cudaLaunchKernel_v7000"]})
    rd = RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx(rows), kernels=ks, runtime=rt)
    ranges = iterations.range_arrays(rd.frame("nvtx"))
    p = iterations.sync_points(rd, ranges)
    assert list(zip(p.start_ns.tolist(), p.end_ns.tolist(), p.source.tolist(), strict=True)) == [
        (0, 10, 0), (40, 45, 0), (50, 60, 1), (70, 75, 3)]
    assert p.on_gpu.tolist() == [False, False, True, False] and p.peer.tolist() == [True, True, True, False]
    assert iterations.sync_points(rd, ranges, ["mine"]).start_ns.tolist() == [0, 20, 40, 50, 70]


def test_top_level_ranges_keep_the_earliest_of_overlaps_across_threads():
    # thread 1: A [0, 50) holds B [10, 20); C [60, 80). Thread 2: D [40, 70) overlaps A and C; E [90, 95)
    tid = np.array([1, 1, 1, 2, 2])
    start = np.array([0, 10, 60, 40, 90])
    end = np.array([50, 20, 80, 70, 95])
    names = pa.chunked_array([pa.array(list("ABCDE")).dictionary_encode()])
    top = share._top_level_windows(share._Tops(), {"start_ns": start, "end_ns": end, "tid": tid, "name": names})
    # A, then E: D starts inside A and C inside D, though both top on their thread
    assert top["start"].tolist() == [0, 90] and top["end"].tolist() == [50, 95]
