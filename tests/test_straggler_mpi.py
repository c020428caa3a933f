"""straggler_heatmap on the real multi-rank MPI GPU reports."""

import numpy as np
import pandas as pd
import pytest
from conftest import MPI_SET

from nsys_recipe_pack import inputs, runner


@pytest.fixture(scope="module")
def out(tmp_path_factory, nsys):
    return runner.run("straggler_heatmap", [str(MPI_SET)], str(tmp_path_factory.mktemp("mpi") / "o"), engine="pack",
                      options={"iteration_kernel": "jacobi_kernel"})


def reference_union(starts, ends):
    """Plain sort-and-sweep union length, written independently of the pack's vectorised version."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(zip(starts, ends, strict=True)):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def test_ranks_from_the_reports_and_gpu_busy(out):
    files = pd.read_parquet(out / "files.parquet")
    names = dict(zip(files["file"].map(lambda p: p.rsplit("/", 1)[-1]), files["rank"], strict=True))
    assert names == {"report1.qdrep": 3, "report2.qdrep": 7, "report3.qdrep": 4, "report4.qdrep": 2,
                     "report6.qdrep": 6}
    assert files["gpu"].tolist() == files["rank"].tolist()  # deviceId = rank in this job
    it = pd.read_parquet(out / "iterations.parquet")
    assert sorted(it["rank"].unique()) == [2, 3, 4, 6, 7]
    assert (it.groupby("rank").size() == 2000).all()
    assert it["gpu_busy_ns"].notna().all()
    assert (it["gpu_busy_ns"] <= it["duration_ns"]).all() and (it["gpu_busy_ns"] > 0).all()


def test_gpu_busy_equals_an_independent_union(out):
    it = pd.read_parquet(out / "iterations.parquet")
    (rd,) = inputs.load_file(MPI_SET / "report4.qdrep", {"kernel", "memcpy", "memset"})
    mine = it[it["rank"] == 2].sort_values("iteration")
    ops = pd.concat([rd.kernels, rd.memcpy, rd.memset])[["start_ns", "end_ns"]]
    for i in (0, 500, 1999):
        row = mine.iloc[i]
        lo, hi = row["start_ns"], row["start_ns"] + row["duration_ns"]
        s = np.clip(ops["start_ns"].to_numpy(), lo, hi)
        e = np.clip(ops["end_ns"].to_numpy(), lo, hi)
        keep = e > s
        assert row["gpu_busy_ns"] == reference_union(s[keep].tolist(), e[keep].tolist())
