"""sync_summary: counts against Nsight Systems' own sync recipes, and hand-checked nesting and idle time."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import AI_SET, MPI_SET

from nsys_recipe_pack import runner
from nsys_recipe_pack.inputs import RankData
from nsys_recipe_pack.nvtx import innermost_nested, innermost_of, nesting
from nsys_recipe_pack.recipes import sync_summary as sync

BUILTIN = {"cuda_api_sync": ["device", "stream"], "cuda_memcpy_async": ["memcpy_pageable"],
           "cuda_memcpy_sync": ["memcpy_sync"], "cuda_memset_sync": ["memset_sync"]}


@pytest.mark.parametrize("source", [AI_SET, MPI_SET], ids=["ai_profiler_a100", "mpi_jacobi"])
def test_counts_match_nsys_builtin_recipes(nsys, tmp_path, source):
    data = tmp_path / "data"  # the built-ins write exports beside the reports
    shutil.copytree(source, data)
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    out = runner.run("sync_summary", [str(data)], str(tmp_path / "o"), engine="pack")
    calls = pd.read_parquet(out / "sync_calls.parquet")
    files = pd.read_parquet(out / "files.parquet")
    stem_of = {r: Path(f).name.split(".")[0] for r, f in zip(files["rank"], files["file"], strict=True)}
    calls["File"] = calls["rank"].map(stem_of)
    compared = 0
    for recipe, kinds in BUILTIN.items():
        ref = tmp_path / recipe
        subprocess.run([str(nsys.path), "recipe", recipe, "--input", str(data), "--output", str(ref)],
                       check=True, capture_output=True, env=env)
        theirs = (pd.read_parquet(ref / "analysis.parquet").groupby("File").size()
                  if (ref / "analysis.parquet").exists() else pd.Series(dtype="int64"))
        mine = calls[calls["kind"].isin(kinds)].groupby("File").size()
        both = sorted(set(stem_of.values()))
        assert mine.reindex(both, fill_value=0).to_dict() == theirs.reindex(both, fill_value=0).to_dict(), recipe
        compared += int(theirs.sum())
    assert compared > 0


MS = 1_000_000


def _threads_starts_ends(ranges: pd.DataFrame) -> tuple:
    return tuple(ranges[c].to_numpy(np.int64) for c in ("tid", "start_ns", "end_ns"))


def test_innermost_range_and_levels_by_hand():
    # thread 1: A [0,100) > B [10,50) > C [20,30); D [60,90) inside A. thread 2: E [0,100)
    ranges = pd.DataFrame({"name": list("ABCDE"), "tid": [1, 1, 1, 1, 2],
                           "start_ns": [0, 10, 20, 60, 0], "end_ns": [100, 50, 30, 90, 100]})
    assert [lv.tolist() for lv in nesting(*_threads_starts_ends(ranges))] == [[0, 1, 2, 1, 0], [-1, 0, 1, 0, -1]]
    # a range of no length at the instant another starts is nested in it, and does not lift it a level
    zero = pd.DataFrame({"tid": [1, 1, 1], "start_ns": [0, 5, 5], "end_ns": [10, 5, 8]})
    assert [lv.tolist() for lv in nesting(*_threads_starts_ends(zero))] == [[0, 2, 1], [-1, 2, 0]]
    # two of no length at one instant: the second starts while the first is open
    zeros = pd.DataFrame({"tid": [1, 1, 1], "start_ns": [0, 5, 5], "end_ns": [10, 5, 5]})
    assert [lv.tolist() for lv in nesting(*_threads_starts_ends(zeros))] == [[0, 1, 2], [-1, 0, 1]]
    tid = np.array([1, 1, 1, 1, 2, 1, 3, 1])
    start = np.array([25, 40, 55, 70, 5, 95, 5, 85])
    end = np.array([28, 45, 58, 80, 6, 99, 6, 120])
    pos = innermost_of(*_threads_starts_ends(ranges), tid, start, end)
    names = [ranges["name"][p] if p >= 0 else None for p in pos]
    # [85, 120) outlives every range it started in; thread 3 has no ranges
    assert names == ["C", "B", "A", "D", "E", "A", None, None]


def test_innermost_range_against_brute_force():
    # random properly nested ranges on three threads, shared start and end times and ranges of no length
    # included; a range is open at t when start <= t < end, and the innermost open one is the latest started
    # (of two that start together, the shorter one)
    rng = np.random.default_rng(7)
    def nest(rows, tid, a, b, depth):
        cuts = np.sort(rng.integers(a, b + 1, size=2 * int(rng.integers(0, 4))))
        for s, e in cuts.reshape(-1, 2):
            rows.append((tid, s, e))
            if depth < 4 and e - s > 1:
                nest(rows, tid, s, e, depth + 1)

    for _ in range(200):
        rows = []
        for tid in (1, 2, 3):
            nest(rows, tid, 0, int(rng.integers(2, 150)), 0)
        if not rows:
            continue
        r = np.array(rows, np.int64)[rng.permutation(len(rows))]
        m = 40
        tid, start = rng.integers(1, 5, m), rng.integers(0, 160, m)
        end = start + rng.integers(0, 15, m)
        got = innermost_of(r[:, 0], r[:, 1], r[:, 2], tid, start, end)
        # the same from the ranges in range order with their parents
        order = np.lexsort((r[:, 1] - r[:, 2], r[:, 1]))
        o = r[order]
        _, parents = nesting(o[:, 0], o[:, 1], o[:, 2])
        nested = innermost_nested(o[:, 0], o[:, 1], o[:, 2], parents, tid, start, end)
        assert np.where(nested >= 0, order[np.maximum(nested, 0)], -1).tolist() == got.tolist()
        for q in range(m):
            open_ = np.flatnonzero((r[:, 0] == tid[q]) & (r[:, 1] <= start[q]) & (start[q] < r[:, 2]))
            want = None
            if len(open_):
                best = open_[np.lexsort((r[open_, 1] - r[open_, 2], r[open_, 1]))[-1]]
                want = tuple(r[best]) if r[best, 2] >= end[q] else None
            assert (tuple(r[got[q]]) if got[q] >= 0 else None) == want


def test_parents_against_brute_force():
    # properly nested ranges on three threads, in any order or in order of start as an export holds them, close in
    # time or far apart: a range's parent is the latest started range one level up on its thread (of two started
    # together, the later in order)
    rng = np.random.default_rng(5)
    for k in range(200):
        rows = []
        for tid in (1, 2, 3):
            cuts = np.sort(rng.integers(0, 100, size=2 * int(rng.integers(0, 6))))
            rows += [(tid, a, b) for a, b in cuts.reshape(-1, 2)]
            inner = [(tid, a + 1, b - 1) for a, b in cuts.reshape(-1, 2) if b - a > 2]
            rows += inner + [(tid, a + 1, b - 1) for _, a, b in inner if b - a > 2]
        if not rows:
            continue
        r = np.array(rows, np.int64)
        r = r[np.lexsort((r[:, 1] - r[:, 2], r[:, 1]))] if k % 2 else r[rng.permutation(len(r))]
        r[:, 1:] *= 2**56 if k % 4 > 1 else 1  # close in time, or far apart
        tid, start = r[:, 0], r[:, 1]
        levels, parents = nesting(tid, start, r[:, 2])
        want = []
        for i in range(len(r)):
            up = np.flatnonzero((tid == tid[i]) & (levels == levels[i] - 1) & (start <= start[i]))
            want.append(int(up[np.lexsort((up, start[up]))[-1]]) if len(up) else -1)
        assert parents.tolist() == want


def _depth_walk(ranges: np.ndarray, queries: np.ndarray) -> tuple[list, list, list]:
    """Levels and parents of ranges (thread, start, end) and the range each query (thread, start, end) is in, by
    walking the events one at a time: at one instant ends first (of a range of no length, after the starts), then
    starts (longer first, then in input order), then queries; a range's parent, and the range a query is in, is the
    last range started at depth - 1."""
    events = []
    for i, (t, s, e) in enumerate(ranges.tolist()):
        events += [(t, s, 1, s - e, i, "start", i), (t, e, 2 if e == s else 0, 0, i, "end", i)]
    events += [(t, s, 3, 0, j, "query", j) for j, (t, s, _) in enumerate(queries.tolist())]
    depth, last, levels, inside = {}, {}, [None] * len(ranges), [None] * len(queries)
    parents = [None] * len(ranges)
    for t, _, _, _, _, kind, i in sorted(events):
        d = depth.get(t, 0)
        if kind == "start":
            levels[i], parents[i], last[t, d], depth[t] = d, last.get((t, d - 1), -1), i, d + 1
        elif kind == "end":
            depth[t] = d - 1
        else:
            c = last.get((t, d - 1))
            inside[i] = c if c is not None and ranges[c, 2] >= queries[i, 2] else -1
    return levels, parents, inside


def test_levels_and_innermost_range_of_overlapping_ranges_against_a_walk():
    # start/end ranges may overlap without nesting: levels and enclosing ranges are then the depth's, as a walk
    # over the events in time order gives them; threads (a few, or more than are taken a pass each), input order,
    # shared instants and no length all mixed
    rng = np.random.default_rng(11)
    for k in range(300):
        n, m, threads = int(rng.integers(0, 25)), int(rng.integers(0, 20)), 3 if k % 3 else 11
        r = np.c_[rng.integers(1, threads + 1, n), rng.integers(0, 40, n), np.zeros(n, np.int64)]
        r[:, 2] = r[:, 1] + rng.integers(0, 20, n)
        q = np.c_[rng.integers(1, threads + 2, m), rng.integers(0, 45, m), np.zeros(m, np.int64)]
        q[:, 2] = q[:, 1] + rng.integers(0, 6, m)
        levels, parents, _ = _depth_walk(r, q)
        assert [a.tolist() for a in nesting(r[:, 0], r[:, 1], r[:, 2])] == [levels, parents]
        # a range of no length encloses nothing and does not count in the depth
        long = np.flatnonzero(r[:, 2] > r[:, 1])
        _, _, inside = _depth_walk(r[long], q)
        got = innermost_of(r[:, 0], r[:, 1], r[:, 2], q[:, 0], q[:, 1], q[:, 2])
        assert got.tolist() == [long[c] if c >= 0 else -1 for c in inside]
        for t in (1, 2):  # the queries of one thread alone, which are answered on their own
            one = np.flatnonzero(q[:, 0] == t)
            assert innermost_of(r[:, 0], r[:, 1], r[:, 2], *q[one].T).tolist() == got[one].tolist()


def test_gpu_idle_while_blocked_by_hand():
    # host: cudaDeviceSynchronize [10, 30) ms inside NVTX "step"; the GPU works [5, 15) and [20, 22) ms
    rt = pd.DataFrame({"start_ns": [10 * MS], "end_ns": [30 * MS], "tid": [7], "pid": [1],
                       "correlation_id": pd.array([1], dtype="Int64"), "name": ["cudaDeviceSynchronize_v3020"]})
    k = pd.DataFrame({"start_ns": [5 * MS, 20 * MS], "end_ns": [15 * MS, 22 * MS], "device": [0, 0], "stream": [7, 7],
                      "correlation_id": pd.array([2, 3], dtype="Int64"), "pid": [1, 1], "name": ["k", "k"],
                      "full_name": ["k", "k"]})
    nvtx = pd.DataFrame({"start_ns": [0], "end_ns": pd.array([40 * MS], dtype="Int64"), "event_type": [59],
                         "name": ["step"], "domain": [""], "tid": [7], "pid": [1]})
    rd = RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx, kernels=k, runtime=rt, has_cuda=True)
    res = sync.map_rank(rd, {})
    call = res["calls"].to_pandas().iloc[0]  # an Arrow table, one per rank
    assert call["kind"] == "device" and call["nvtx_range"] == "step"
    assert call["gpu_idle_ns"] == 20 * MS - (5 + 2) * MS
    out = sync.reduce([{**res, "rank": 0, "offset_ns": 0}], {})
    finding = out["findings"]
    assert finding["finding"].tolist() == ["sync that leaves the GPU idle"]
    assert "13.00 of 20.00 ms idle" in finding["evidence"].iloc[0]


def test_a_copy_that_waited_behind_kernels_is_not_blamed_for_their_time():
    """An 8-byte pageable device-to-host copy (loss.item() style) called at 10 ms behind a kernel running
    [0, 1200) ms: the call blocks until 1200.01 ms, but only the last 0.01 ms is the copy. An MPI code gets
    MPI advice, and a call outside every range says so in words."""
    rt = pd.DataFrame({"start_ns": [10 * MS], "end_ns": [1200 * MS + 10_000], "tid": [7], "pid": [1],
                       "correlation_id": pd.array([5], dtype="Int64"), "name": ["cudaMemcpyAsync_v3020"]})
    k = pd.DataFrame({"start_ns": [0], "end_ns": [1200 * MS], "device": [0], "stream": [7],
                      "correlation_id": pd.array([4], dtype="Int64"), "pid": [1], "name": ["k"], "full_name": ["k"]})
    mem = pd.DataFrame({"start_ns": [1200 * MS], "end_ns": [1200 * MS + 8_000], "device": [0], "stream": [7],
                        "correlation_id": pd.array([5], dtype="Int64"), "pid": [1], "bytes": [8], "copy_kind": [2],
                        "src_kind": [2], "dst_kind": [0], "src_device": pd.array([0], dtype="Int64"),
                        "dst_device": pd.array([pd.NA], dtype="Int64")})
    rd = RankData(file="x", pid=1, session_start_ns=0, kernels=k, memcpy=mem, runtime=rt, has_cuda=True,
                  env={"OMPI_COMM_WORLD_RANK": "0"})
    res = sync.map_rank(rd, {})
    call = res["calls"].to_pandas().iloc[0]
    assert call["kind"] == "memcpy_pageable" and call["waited_ns"] == 1190 * MS
    found = sync.reduce([{**res, "rank": 0, "offset_ns": 0}], {})["findings"].set_index("finding")
    assert "blocked the host for 0.01 ms of their own copying" in found.loc["pageable memcpy", "evidence"]
    assert "waited 1190.00 ms for earlier GPU work" in found.loc["pageable memcpy", "evidence"]
    waited = found.loc["copies that waited for earlier GPU work"]
    assert "outside every NVTX range, 1190.00 of its 1190.01 ms" in waited["evidence"]
    assert "CUDA-aware MPI" in waited["suggestion"] and "DataLoader" not in found.loc["pageable memcpy", "suggestion"]
