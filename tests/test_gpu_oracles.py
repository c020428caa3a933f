"""kernel_pace and compute_memory_share against Nsight Systems' own tools on the shipped GPU reports."""

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import AI_SET, MEMCPY_SET, MPI_SET

from nsys_recipe_pack import runner

MEM_OPS = {"[CUDA memcpy Host-to-Device]": "memcpy_htod", "[CUDA memcpy Device-to-Host]": "memcpy_dtoh",
           "[CUDA memcpy Device-to-Device]": "memcpy_dtod", "[CUDA memcpy Peer-to-Peer]": "memcpy_peer",
           "[CUDA memset]": "memset"}
REPORTS = sorted(AI_SET.glob("*.nsys-rep")) + sorted(MEMCPY_SET.glob("*.qdrep"))


def stats_csv(nsys, report: Path, name: str) -> pd.DataFrame:
    res = subprocess.run([str(nsys.path), "stats", "-q", "--report", name, "--format", "csv", "--output", "-",
                          str(report)], capture_output=True, text=True, check=True)
    if "Time (%)" not in res.stdout:
        return pd.DataFrame(columns=["Total Time (ns)", "Instances", "Count", "Operation"])
    return pd.read_csv(io.StringIO(res.stdout[res.stdout.index("Time (%)"):]))


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """Private copies: `nsys stats` and `nsys recipe` write exports beside the reports they read."""
    d = tmp_path_factory.mktemp("gpu")
    for r in REPORTS:
        shutil.copy2(r, d / r.name)
    mpi = d / "mpi"
    shutil.copytree(MPI_SET, mpi)
    return d


@pytest.mark.parametrize("name", [r.name for r in REPORTS])
def test_share_sums_equal_nsys_stats(nsys, copies, tmp_path, name):
    report = copies / name
    out = runner.run("compute_memory_share", [str(report)], str(tmp_path / "o"), engine="pack", mode="none")
    share = pd.read_parquet(out / "share.parquet")
    kern = stats_csv(nsys, report, "cuda_gpu_kern_sum")
    kernels = share[share["category"].isin(["compute", "communication"])]
    assert kernels["sum_ns"].sum() == kern["Total Time (ns)"].sum()
    assert kernels["ops"].sum() == kern["Instances"].sum()
    mem = stats_csv(nsys, report, "cuda_gpu_mem_time_sum")
    mem["category"] = mem["Operation"].map(MEM_OPS)
    assert mem["category"].notna().all(), mem["Operation"].tolist()
    theirs = mem.groupby("category")[["Total Time (ns)", "Count"]].sum()
    mine = share[share["category"].isin(MEM_OPS.values())].groupby("category")[["sum_ns", "ops"]].sum()
    assert mine["sum_ns"].to_dict() == theirs["Total Time (ns)"].to_dict()
    assert mine["ops"].to_dict() == theirs["Count"].to_dict()
    # what the wall clock saw: never more than the plain sum, and the union shares cover the window
    busy = share[share["category"] != "idle"]
    assert (busy["union_ns"] <= busy["sum_ns"]).all()
    assert np.allclose(share.groupby("device")["pct_union"].sum(), 100.0)
    if (out / "by_range.parquet").exists():
        by_range = pd.read_parquet(out / "by_range.parquet")
        assert (by_range["union_ns"] >= 0).all()


def test_kernel_pace_durations_equal_cuda_gpu_kern_pace(nsys, copies, tmp_path):
    mpi = copies / "mpi"
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    ref = tmp_path / "ref"
    subprocess.run([str(nsys.path), "recipe", "cuda_gpu_kern_pace", "--name", "jacobi_kernel", "--input", str(mpi),
                    "--output", str(ref)], check=True, capture_output=True, env=env)
    theirs = pd.read_parquet(ref / "pace_duration.parquet")
    their_files = pd.read_parquet(ref / "files.parquet")["File"].tolist()
    out = runner.run("kernel_pace", [str(mpi)], str(tmp_path / "o"), engine="pack",
                     options={"kernel": "jacobi_kernel"})
    pace = pd.read_parquet(out / "pace.parquet")
    files = pd.read_parquet(out / "files.parquet")
    rank_of = {Path(f).name.split(".")[0]: r for f, r in zip(files["file"], files["rank"], strict=True)}
    for col, stem in enumerate(their_files):
        mine = pace[pace["rank"] == rank_of[stem]].sort_values("iteration")["duration_ns"].to_numpy()
        assert np.array_equal(mine, theirs[str(col)].to_numpy()), stem
    stats = pd.read_parquet(out / "stats.parquet").set_index("rank")
    allrows = pace["duration_ns"].to_numpy()
    assert stats.loc[-1, "count"] == len(allrows) == 10000
    assert stats.loc[-1, "p95_ns"] == np.quantile(allrows, 0.95)
    assert stats.loc[-1, "median_ns"] == np.median(allrows)
    # lag is measured on aligned clocks: the earliest rank of each iteration has lag 0
    assert (pace.groupby("iteration")["lag_ns"].min() == 0).all()


def test_ranks_with_another_delimiter_are_left_out_and_said(copies, tmp_path):
    # `baseline` has no NVTX, so its automatic delimiter is a kernel; the four NVTX reports agree on a range
    out = runner.run("kernel_pace", [str(copies / f"{n}.nsys-rep") for n in
                                     ("baseline", "baseline_nvtx", "firstOptimization", "secondOptimization")],
                     str(tmp_path / "o"), engine="pack")
    import json

    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["delimiter"]["kind"] == "nvtx" and analysis["ranks"] == 3
    note = next(n for n in analysis["notes"] if "left out" in n)
    assert "vectorized_elementwise_kernel" in note and "--iteration 'Data loading'" in note
    assert sorted(pd.read_parquet(out / "pace.parquet")["rank"].unique()) == [1, 2, 3]
