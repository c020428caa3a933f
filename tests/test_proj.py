"""nvtx_gpu_proj against Nsight Systems' nvtx_gpu_proj_trace, and a hand-built case."""

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from conftest import AI_SET

from nsys_recipe_pack import gpu, runner
from nsys_recipe_pack.inputs import RankData
from nsys_recipe_pack.recipes import nvtx_gpu_proj as proj

MS = 1_000_000


def test_projection_equals_nvtx_gpu_proj_trace(nsys, tmp_path):
    data = tmp_path / "ai"
    shutil.copytree(AI_SET, data)
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    ref = tmp_path / "ref"
    subprocess.run([str(nsys.path), "recipe", "nvtx_gpu_proj_trace", "--input", str(data), "--output", str(ref)],
                   check=True, capture_output=True, env=env)
    theirs = pd.read_parquet(ref / "trace.parquet")
    theirs["end"] = theirs["Projected Start"] + theirs["Projected Duration"]
    # like with like: the built-in counts only the launching thread's ranges
    out = runner.run("nvtx_gpu_proj", [str(data)], str(tmp_path / "o"), engine="pack",
                     options={"attribution": "thread"})
    mine = pd.read_parquet(out / "ranges.parquet")
    files = pd.read_parquet(out / "files.parquet")
    mine["File"] = mine["rank"].map(dict(zip(files["rank"], files["file"].map(lambda f: Path(f).stem), strict=True)))
    mine["TID"] = mine["tid"] & 0xFFFFFF
    m = mine[mine["gpu_ops"] > 0].merge(theirs, left_on=["File", "cpu_start_ns", "TID", "name"],
                                        right_on=["File", "Orig Start", "TID", "Name"], how="outer", indicator=True)
    assert set(m["File"]) >= {"baseline_nvtx", "firstOptimization", "secondOptimization", "thirdOptimization"}
    both = m[m["_merge"] == "both"]
    # The only rows not matched: the built-in's nameless pseudo-range holding the GPU ops launched outside every
    # NVTX range, which it writes for `baseline` (a report without NVTX). The pack lists NVTX ranges only.
    unmatched = m[m["_merge"] != "both"]
    assert (unmatched["_merge"] == "right_only").all() and unmatched["Name"].isna().all()
    assert unmatched["File"].tolist() == ["baseline"]
    assert len(both) / len(m) >= 0.99 and len(both) > 56000
    same = ((both["gpu_start_ns"] == both["Projected Start"]) & (both["gpu_end_ns"] == both["end"])
            & (both["gpu_ops"] == both["NumGPUOps"]) & (both["stack_level"] == both["Lvl"]))
    assert same.all()


def test_projection_by_hand_with_overlapping_streams():
    # range A [0,100) ms holds B [10,50); B launches k1 (GPU [20,60)) and k2 (GPU [40,80), another stream);
    # A itself launches k3 (GPU [90,95)); a launch outside every range gives an op that belongs to none
    nvtx = pd.DataFrame({"start_ns": [0, 10 * MS], "end_ns": pd.array([100 * MS, 50 * MS], dtype="Int64"),
                         "event_type": [59, 59], "name": ["A", "B"], "domain": ["", ""], "tid": [5, 5], "pid": [1, 1]})
    rt = pd.DataFrame({"start_ns": [12 * MS, 14 * MS, 60 * MS, 150 * MS],
                       "end_ns": [13 * MS, 15 * MS, 61 * MS, 151 * MS],
                       "tid": [5, 5, 5, 5], "pid": [1, 1, 1, 1],
                       "correlation_id": pd.array([1, 2, 3, 4], dtype="Int64"), "name": ["cudaLaunchKernel"] * 4})
    k = pd.DataFrame({"start_ns": [20 * MS, 40 * MS, 90 * MS, 160 * MS],
                      "end_ns": [60 * MS, 80 * MS, 95 * MS, 170 * MS], "device": [0] * 4, "stream": [7, 8, 7, 7],
                      "correlation_id": pd.array([1, 2, 3, 4], dtype="Int64"),
                      "pid": [1] * 4, "name": ["k1", "k2", "k3", "k4"], "full_name": ["k1", "k2", "k3", "k4"]})
    rd = RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx, kernels=k, runtime=rt, has_cuda=True)
    res = proj.map_rank(rd, {})
    r = res["ranges"].to_pandas().set_index("name")
    assert r.loc["B", "gpu_start_ns"] == 20 * MS and r.loc["B", "gpu_end_ns"] == 80 * MS
    assert r.loc["B", "gpu_busy_ns"] == 60 * MS and r.loc["B", "gpu_ops"] == 2  # 40 + 40 overlapping by 20
    assert r.loc["A", "gpu_start_ns"] == 20 * MS and r.loc["A", "gpu_end_ns"] == 95 * MS
    assert r.loc["A", "gpu_busy_ns"] == 65 * MS and r.loc["A", "gpu_ops"] == 3
    assert r.loc["B", "parent_id"] == r.loc["A", "range_id"] and r.loc["B", "stack_level"] == 1
    out = proj.reduce([{**res, "rank": 0, "offset_ns": 0}], {})
    s = out["summary"].set_index("name")
    assert s.loc["B", "launch_ratio"] == 40 / 60


def test_launches_pair_ops_with_calls_as_an_inner_merge():
    # keys held by no call, by one, and by several calls (each pairing), or each by one call at most (the usual
    # case, paired by one search; the calls in order of key too, as they mostly come): the pairs pandas' inner
    # merge gives
    rng = np.random.default_rng(7)
    for k in range(150):
        op_key = rng.integers(0, 30, rng.integers(0, 40))
        call_key = rng.integers(0, 30, rng.integers(0, 40)) if k % 3 == 0 else rng.permutation(35)[:rng.integers(0, 35)]
        if k % 3 == 2:
            call_key.sort()
        op, call = gpu.pair_launches(op_key, call_key)
        want = pd.DataFrame({"key": op_key, "op": np.arange(len(op_key))}).merge(
            pd.DataFrame({"key": call_key, "call": np.arange(len(call_key))}), on="key", how="inner")
        assert op.tolist() == want["op"].tolist() and call.tolist() == want["call"].tolist()


def test_launched_ops_counts_ops_without_a_call():
    # ops with correlation ids 1, 2, 2 and 5; calls 1 and 2 twice (a key several calls hold pairs with each)
    k = pd.DataFrame({"start_ns": [10, 20, 30, 40], "end_ns": [15, 25, 35, 45], "device": [0] * 4, "stream": [7] * 4,
                      "correlation_id": pd.array([1, 2, 2, 5], dtype="Int64"), "pid": [1] * 4,
                      "name": ["k"] * 4, "full_name": ["k"] * 4})
    for call_ids, pairs, unlinked in (([1, 2], [(0, 0), (1, 1), (2, 1)], 1),
                                      ([2, 1, 2], [(0, 1), (1, 0), (1, 2), (2, 0), (2, 2)], 1),
                                      ([7], [], 4)):
        n = len(call_ids)
        rt = pd.DataFrame({"start_ns": np.arange(n), "end_ns": np.arange(n) + 1, "tid": [3] * n, "pid": [1] * n,
                           "correlation_id": pd.array(call_ids, dtype="Int64"), "name": ["cudaLaunchKernel"] * n})
        ops = gpu.launched_ops(RankData(file="x", pid=1, session_start_ns=0, kernels=k, runtime=rt))
        assert list(zip(ops.op.tolist(), ops.call_start_ns.tolist(), strict=True)) == pairs
        assert ops.unlinked == unlinked


def test_launch_keys_count_the_ops_of_each_key():
    """Every op's launch key read ahead, a batch at a time: the distinct keys in order and how many ops hold each,
    with one op per key (the usual case) and with keys several ops share (a CUDA graph's: more than a byte counts);
    ops without times are not counted, as neither the read ahead (its frames made as inputs.batches makes them) nor
    the spans give them."""
    import pyarrow as pa

    from nsys_recipe_pack.inputs.events import gpu_frame, timed_rows

    class Ahead:
        def __init__(self, batches):
            self.given = batches

        def frames(self, need, columns):
            raws = [pa.table({c: pa.array(b[c], pa.int64()) for c in columns}) for b in self.given.get(need, [])]
            return [gpu_frame(timed_rows(raw, columns, ("start", "end")), columns, None) for raw in raws]

    pid = 7 << 24  # a globalPid: the process in bits 24 to 47
    for corr in ([5, 1, 9, 3], [5, 1, 5, 3, 5, 1], [5] * 100 + [1] + [5] * 100):
        half = len(corr) // 2
        batches = {"kernel": [{"start": [0] * half, "end": [1] * half, "globalPid": [pid] * half,
                               "correlationId": corr[:half]}],
                   "memcpy": [{"start": [0] * (len(corr) - half), "end": [1] * (len(corr) - half),
                               "globalPid": [pid] * (len(corr) - half), "correlationId": corr[half:]},
                              {"start": [None], "end": [None], "globalPid": [pid], "correlationId": [8]}]}
        keys, counts = gpu.launch_keys(Ahead(batches))
        want, want_counts = np.unique(np.array(corr) + 7 * 2**33, return_counts=True)
        assert keys.tolist() == want.tolist() and counts.tolist() == want_counts.tolist()


def test_the_headline_names_the_top_range_below_the_iteration_range(tmp_path):
    """The shipped H100 job: `step` holds every other range and so all the GPU time; the headline names the range with
    the most GPU time below it. outermost_count (ranges inside no other range) equals a direct SQL count."""
    h100 = Path(__file__).resolve().parents[1] / "sample_reports" / "h100_gloo_8rank"
    out = runner.run("nvtx_gpu_proj", [str(h100)], str(tmp_path / "out"), mode="none", log=lambda msg: None)
    summary = pd.read_parquet(out / "summary.parquet")
    with sqlite3.connect(h100 / "rank0.sqlite") as db:
        outermost = dict(db.execute(
            "WITH r AS (SELECT e.rowid AS id, coalesce(e.text, s.value) AS name, e.start, e.end, e.globalTid "
            "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.end IS NOT NULL AND e.eventType = 59) "
            "SELECT a.name, sum(NOT EXISTS (SELECT 1 FROM r b WHERE b.globalTid = a.globalTid AND b.id != a.id AND "
            "b.start <= a.start AND b.end >= a.end AND b.end - b.start > a.end - a.start)) FROM r a GROUP BY a.name"
        ).fetchall())
    mine = summary[summary["rank"] == 0].set_index("name")["outermost_count"]
    assert mine.to_dict() == outermost and outermost["step"] > 0 and set(outermost.values()) == {0, outermost["step"]}
    t = summary.groupby("name")["gpu_busy_total_ns"].sum()
    below = t.drop("step").sort_values(ascending=False)
    assert t.idxmax() == "step"
    assert proj.headline(out) == f"most GPU time below step: {below.index[0]} ({below.iloc[0] / 1e6:,.1f} ms)"
