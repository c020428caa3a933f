"""gpu_memory on real exports of the H100 job with memory events planted by SQL (tests/export_variants.py): weights
held from the start, activations allocated and freed in every step, one rank leaking in some steps, one rank with a
larger step; every figure against the plan and against SQL over the export."""

import dataclasses
import json
import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest
from export_variants import H100, MIB, plant_memory

from nsys_recipe_pack import recipes, runner
from nsys_recipe_pack.inputs import load_file
from nsys_recipe_pack.recipes.gpu_memory import MemoryFold, events_of, thin

LEAKER, BIG = 1, 2


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("memjob")
    plans = {}
    for r in range(4):
        path = d / f"rank{r}.sqlite"
        shutil.copyfile(H100 / f"rank{r}.sqlite", path)
        leaks = range(10, 20) if r == LEAKER else range(0)
        plans[r] = plant_memory(path, activation=(2048 if r == BIG else 512) * MIB, leak=64 * MIB if r == LEAKER else 0,
                                leak_steps=leaks)
    return d, plans


@pytest.fixture(scope="module")
def out(job, tmp_path_factory):
    return runner.run("gpu_memory", [str(job[0])], str(tmp_path_factory.mktemp("o") / "mem"), engine="pack",
                      mode="none")


def sql_levels(path) -> tuple[np.ndarray, np.ndarray]:
    """(start, device memory in use after each event) by SQL, from the capture's own zero."""
    con = sqlite3.connect(path)
    rows = con.execute("SELECT start, sum(CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END) OVER "
                       "(ORDER BY start, rowid) FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 2").fetchall()
    con.close()
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])


def test_peaks_leaks_and_headroom_as_planted(job, out):
    d, plans = job
    ranks = pd.read_parquet(out / "ranks.parquet")
    device = ranks[ranks["kind"] == "Device"].set_index("rank")
    for r, plan in plans.items():
        leaked = plan["leak"] * len(plan["leak_steps"])
        # what was held before the capture is freed at its start: the line starts there, then holds the weights
        assert device.loc[r, "held_before_bytes"] == plan["before"]
        assert device.loc[r, "peak_bytes"] == plan["weights"] + plan["activation"] + leaked
        assert device.loc[r, "leaked_bytes"] == leaked and device.loc[r, "leak"] == (r == LEAKER)
        assert device.loc[r, "held_at_end_bytes"] == plan["weights"] + leaked
        t, level = sql_levels(d / f"rank{r}.sqlite")
        assert device.loc[r, "held_before_bytes"] == -level.min()
        assert device.loc[r, "peak_bytes"] == level.max() - level.min()
        assert device.loc[r, "total_bytes"] == 85017493504  # the H100's, from TARGET_INFO_GPU
        assert device.loc[r, "headroom_pct"] == pytest.approx(100 * (1 - device.loc[r, "peak_bytes"] / 85017493504))
    # the first peak: the first step's activation, or for the leaking rank its last leak in step 19
    assert device.loc[0, "peak_iteration"] == 0 and device.loc[LEAKER, "peak_iteration"] == 19
    assert device.loc[0, "peak_range"] == "forward" and device.loc[LEAKER, "peak_range"] == "backward"
    assert device.loc[BIG, "peak_bytes"] == device["peak_bytes"].max()


def test_iterations_and_timeline_equal_sql(job, out):
    d, plans = job
    it = pd.read_parquet(out / "iterations.parquet")
    timeline = pd.read_parquet(out / "timeline.parquet")
    for r, plan in plans.items():
        mine = it[it["rank"] == r].set_index("iteration")
        assert len(mine) == plan["steps"] == 60
        leaks = np.isin(mine.index, plan["leak_steps"])
        assert (mine["alloc_bytes"] == plan["activation"] + np.where(leaks, plan["leak"], 0)).all()
        assert (mine["free_bytes"] == plan["activation"]).all()
        assert (mine["allocs"] == 1 + leaks).all() and (mine["frees"] == 1).all()
        held = plan["weights"] + plan["leak"] * np.cumsum(leaks)
        assert (mine["end_bytes"] == held).all()
        assert (mine["peak_bytes"] == held + plan["activation"]).all()
        assert (mine["start_bytes"] == np.r_[plan["weights"], held[:-1]]).all()
        t, level = sql_levels(d / f"rank{r}.sqlite")
        line = timeline[(timeline["rank"] == r) & (timeline["kind"] == "Device")]
        assert np.array_equal(line["time_ns"], t) and np.array_equal(line["bytes_in_use"], level - level.min())
        assert (line["bytes_in_use"] >= 0).all()


def test_by_range_and_findings(out):
    by_range = pd.read_parquet(out / "by_range.parquet")
    mine = by_range[by_range["rank"] == LEAKER].set_index("range")
    assert mine.loc["forward", "alloc_bytes"] == 60 * 512 * MIB and mine.loc["forward", "free_bytes"] == 0
    assert mine.loc["optimizer", "free_bytes"] == 60 * 512 * MIB
    assert mine.loc["backward", "net_bytes"] == 10 * 64 * MIB
    findings = pd.read_parquet(out / "findings.parquet")["finding"].tolist()
    assert findings[0] == f"rank {BIG} peaks at 4.0 GiB of 79.2 GiB (95 % left) in iteration 0, inside forward"
    assert (f"rank {LEAKER} leaks 640.0 MiB in 10 iteration(s), 64.0 MiB each: 10 allocation(s) made inside "
            "iterations and never freed") in findings
    assert any(f.startswith(f"rank {BIG} holds ") for f in findings)
    assert json.loads((out / "analysis.json").read_text())["leak_rule"].startswith("a rank leaks")


def test_the_fold_gives_the_same_tables_in_chunks_of_a_few_events(job):
    rank = load_file(job[0] / f"rank{LEAKER}.sqlite", set(recipes.get("gpu_memory").needs))[0]
    events = {**events_of(rank.frame("memory")), "range": np.full(len(rank.frame("memory")), "step", object)}
    from nsys_recipe_pack.iteration_scan import find_iterations

    it = find_iterations(rank)
    whole = MemoryFold(it.start_ns, it.end_ns)
    whole.add(events)
    cut = MemoryFold(it.start_ns, it.end_ns)
    for lo in range(0, len(events["start_ns"]), 7):
        cut.add({k: v[lo:lo + 7] for k, v in events.items()})
    a, b = whole.result()["series"], cut.result()["series"]
    assert len(a) == len(b) == 1
    for key in a[0]:
        if isinstance(a[0][key], dict):  # iterations, ranges
            for c in a[0][key]:
                assert np.array_equal(a[0][key][c], b[0][key][c]), (key, c)
        elif isinstance(a[0][key], np.ndarray):
            assert np.array_equal(a[0][key], b[0][key]), key
        else:
            assert a[0][key] == b[0][key], key


def test_thinning_keeps_each_buckets_extremes_and_the_peak():
    rng = np.random.default_rng(3)
    level = np.cumsum(rng.integers(-5, 6, 100_000))
    t = np.arange(len(level)) * 10
    kept_t, kept = thin(t, level, 1000)
    assert len(kept) <= 1002 and kept.max() == level.max() and kept.min() == level.min()
    assert np.array_equal(level[kept_t // 10], kept) and kept_t[0] == 0 and kept_t[-1] == t[-1]


def test_a_report_without_memory_events_is_one_line_and_exit_3(tmp_path):
    from nsys_recipe_pack import cli

    code = cli.main(["run", "--name", "gpu_memory", "--output", str(tmp_path / "o"),
                     str(H100 / "rank0.sqlite")])
    assert code == 3 and not (tmp_path / "o").exists()


@pytest.mark.parametrize(("fmt", "spans"), [("parquetdir", False), ("sqlite", False), ("parquetdir", True)])
def test_synthetic_memory_truth(tmp_path, monkeypatch, fmt, spans):
    """The generator's memory plan (a leaking rank, a rank with twice the activation, weights, memory held from
    before the capture) found exactly, also read as a long capture; SYNTHETIC data, labelled so in its truth.json."""
    from nsys_recipe_pack.inputs import rank_data, readers
    from nsys_recipe_pack.synth import MemoryPlan, write_synthetic

    if spans:
        monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
        monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 64)
    plan = MemoryPlan(leak_rank=1, leak_first=10, leak_last=19, big_rank=2)
    d = write_synthetic(tmp_path / "syn", ranks=4, iterations=40, fmt=fmt, memory=plan)
    truth = json.loads((d / "truth.json").read_text())
    assert truth["synthetic"] is True
    out = runner.run("gpu_memory", [str(d)], str(tmp_path / "o"), engine="pack", mode="none")
    ranks = pd.read_parquet(out / "ranks.parquet").set_index("rank")
    it = pd.read_parquet(out / "iterations.parquet")
    for want in truth["memory"]["ranks"]:
        got = ranks.loc[want["rank"]]
        for c in ("peak_bytes", "peak_iteration", "held_before_bytes", "held_at_end_bytes", "leaked_bytes"):
            assert got[c] == want[c], (want["rank"], c)
        assert got["leak"] == (want["rank"] == plan.leak_rank)
        assert got["peak_range"] == ("backward" if want["rank"] == plan.leak_rank else "forward")
        mine = it[it["rank"] == want["rank"]].sort_values("iteration")
        assert mine["alloc_bytes"].tolist() == want["alloc_bytes_per_iteration"]
    assert json.loads((out / "analysis.json").read_text())["synthetic"] is True


def test_stream_ordered_pools_reserved_apart_from_what_is_allocated(tmp_path):
    """Two pools on one GPU (cudaMallocAsync): what they hold (localMemoryPoolSize, kept after frees until trimmed)
    is a series of its own, the pools' sizes added up."""
    path = tmp_path / "rank0.sqlite"
    shutil.copyfile(H100 / "rank0.sqlite", path)
    plant_memory(path)
    con = sqlite3.connect(path)
    pid, t0 = con.execute("SELECT globalPid, min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    pool_p, pool_q = 0xA000_0000, 0xB000_0000
    planted = [  # (time, address, bytes, op, pool, pool size after the event)
        (t0 + 1000, 0x1, 100 * MIB, 0, pool_p, 256 * MIB), (t0 + 2000, 0x2, 200 * MIB, 0, pool_p, 512 * MIB),
        (t0 + 2500, 0x3, 50 * MIB, 0, pool_q, 64 * MIB), (t0 + 3000, 0x1, 100 * MIB, 1, pool_p, 512 * MIB),
        (t0 + 4000, 0x2, 200 * MIB, 1, pool_p, 128 * MIB)]
    con.executemany("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, "
                    "bytes, memKind, memoryOperationType, correlationId, localMemoryPoolAddress, localMemoryPoolSize) "
                    "VALUES (?, ?, 0, 1, ?, 0, ?, 2, ?, 0, ?, ?)",
                    [(t, pid, a, b, o, p, z) for t, a, b, o, p, z in planted])
    con.commit()
    con.close()
    out = runner.run("gpu_memory", [str(path)], str(tmp_path / "o"), engine="pack", mode="none")
    ranks = pd.read_parquet(out / "ranks.parquet").set_index("kind")
    reserved = ranks.loc["Device pool reserved"]
    assert reserved["peak_bytes"] == (512 + 64) * MIB and reserved["held_at_end_bytes"] == (128 + 64) * MIB
    line = pd.read_parquet(out / "timeline.parquet")
    line = line[line["kind"] == "Device pool reserved"]
    assert (line["bytes_in_use"] // MIB).tolist() == [256, 512, 576, 576, 192]


def test_per_op_range_names_are_one_row_per_op(tmp_path):
    """With PyTorch's emit_nvtx every op instance has its own name: by_range adds an op's instances up."""
    from export_variants import nvtx_names

    path = tmp_path / "rank0.sqlite"
    shutil.copyfile(H100 / "rank0.sqlite", path)
    plan = plant_memory(path)
    nvtx_names(path, "unique", keep="step")  # "forward, op_id = 123", ...
    out = runner.run("gpu_memory", [str(path)], str(tmp_path / "o"), engine="pack", mode="none")
    by_range = pd.read_parquet(out / "by_range.parquet").set_index("range")
    assert set(by_range.index) == {"forward", "optimizer"}
    assert by_range.loc["forward", "alloc_bytes"] == plan["steps"] * plan["activation"]
    assert by_range.loc["optimizer", "frees"] == plan["steps"]
    peak = pd.read_parquet(out / "ranks.parquet").set_index("kind").loc["Device", "peak_range"]
    assert peak.startswith("forward, op_id = ")  # the range as recorded


@pytest.mark.parametrize("batch_rows", [50, 100_000])
def test_a_long_capture_gives_the_whole_reads_tables(job, tmp_path, monkeypatch, batch_rows):
    """Read as a long capture (the kernels and calls a batch at a time, the NVTX ranges span by span: its STREAM),
    every table is the whole read's; the spans went through the stream (its fold saw the ranges)."""
    from nsys_recipe_pack.inputs import rank_data, readers
    from nsys_recipe_pack.recipes import gpu_memory

    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    folded = []
    fold = gpu_memory.STREAM.fold
    counted = dataclasses.replace(
        gpu_memory.STREAM, fold=lambda state, *span: folded.append(span[2]["nvtx"].num_rows) or fold(state, *span))
    monkeypatch.setitem(recipes._REGISTRY, "gpu_memory", dataclasses.replace(recipes.get("gpu_memory"), stream=counted))
    outs = []
    for spans in (False, True):
        monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0 if spans else 1 << 62)
        outs.append(runner.run("gpu_memory", [str(job[0])], str(tmp_path / f"o{spans}"), engine="pack", mode="none"))
    assert sum(folded) > 100  # every rank's ranges, span by span
    for table in ("ranks", "timeline", "iterations", "by_range", "findings", "files"):
        pd.testing.assert_frame_equal(pd.read_parquet(outs[1] / f"{table}.parquet"),
                                      pd.read_parquet(outs[0] / f"{table}.parquet"), check_like=False)
