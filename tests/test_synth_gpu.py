"""The GPU recipes on SYNTHETIC exports whose every copy, memset, sync, graph and overlap is known exactly."""

import numpy as np
import pandas as pd
import pytest

from nsys_recipe_pack import runner
from nsys_recipe_pack.synth import write_synthetic

RANKS, ITERS = 2, 6
US, MS = 1_000, 1_000_000


@pytest.fixture(scope="module", params=["parquetdir", "sqlite"])
def data(request, tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("sg") / "in", ranks=RANKS, iterations=ITERS, fmt=request.param,
                           seed=5)


def run(recipe, data, tmp_path, **options):
    return runner.run(recipe, [str(data)], str(tmp_path / recipe), mode="none", options=options)


def test_share_by_hand(data, tmp_path):
    share = pd.read_parquet(run("compute_memory_share", data, tmp_path) / "share.parquet")
    s = share[share["rank"] == 0].set_index("category")
    # per iteration: pinned 200 us + pageable 150 us host-to-device, 10 us of .item(), 100 us on-device, 80 us peer
    assert s.loc["memcpy_htod", "sum_ns"] == ITERS * 350 * US and s.loc["memcpy_htod", "ops"] == 2 * ITERS
    assert s.loc["memcpy_htod", "pageable_ops"] == ITERS
    assert s.loc["memcpy_dtoh", "sum_ns"] == ITERS * 10 * US and s.loc["memcpy_dtoh", "pageable_ops"] == ITERS
    assert s.loc["memcpy_dtod", "sum_ns"] == ITERS * 100 * US
    assert s.loc["memcpy_peer", "sum_ns"] == ITERS * 80 * US
    assert s.loc["memset", "sum_ns"] == ITERS * 50 * US and s.loc["memset", "ops"] == ITERS
    assert s.loc["memcpy_htod", "bytes"] == ITERS * ((4 << 20) + (1 << 20))
    # copies never overlap other work: exclusive time equals summed time
    for cat in ("memcpy_htod", "memcpy_dtoh", "memcpy_dtod", "memcpy_peer", "memset"):
        assert s.loc[cat, "union_ns"] == s.loc[cat, "sum_ns"]
    # bucket_reduce runs 1 ms per iteration on stream 9 entirely inside a backward kernel on stream 7
    assert s.loc["compute", "sum_ns"] - s.loc["compute", "union_ns"] == ITERS * 1 * MS
    assert s.loc["communication", "ops"] == ITERS
    assert s.loc["memcpy_htod", "bandwidth_gbps"] == pytest.approx(ITERS * 5 * 2**20 / (ITERS * 350 * US))
    assert share.groupby("rank")["pct_union"].sum().round(6).eq(100).all()


def test_projection_by_hand(data, tmp_path):
    out = run("nvtx_gpu_proj", data, tmp_path)
    r = pd.read_parquet(out / "ranges.parquet")
    r0 = r[r["rank"] == 0]
    dl = r0[r0["name"] == "dataloader"].iloc[0]
    assert dl["gpu_ops"] == 3 and dl["gpu_busy_ns"] == 400 * US
    assert dl["gpu_start_ns"] - dl["cpu_start_ns"] == 100 * US and dl["gpu_end_ns"] - dl["cpu_start_ns"] == 650 * US
    opt = r0[r0["name"] == "optimizer"].iloc[0]
    # dtod, peer, three graph kernels (one cudaGraphLaunch), the .item() copy
    assert opt["gpu_ops"] == 6 and opt["gpu_busy_ns"] == (100 + 80 + 300 + 10) * US
    assert opt["gpu_end_ns"] - opt["cpu_start_ns"] == 960 * US
    step = r0[r0["name"] == "step"].iloc[0]
    children = r0[(r0["parent_id"] == step["range_id"])]
    assert sorted(children["name"]) == sorted(["dataloader", "forward", "backward", "allreduce", "optimizer"])
    assert step["gpu_ops"] == children["gpu_ops"].sum()
    # the worker thread's nested ranges: levels 0 and 1, no GPU work
    worker = r0[r0["name"].isin(["prefetch", "decode"])]
    assert worker.groupby("name")["stack_level"].unique().map(list).to_dict() == {"decode": [1], "prefetch": [0]}
    assert (worker["gpu_ops"] == 0).all() and worker["gpu_busy_ns"].isna().all()
    assert (worker["tid"] != step["tid"]).all()


def test_sync_by_hand(data, tmp_path):
    out = run("sync_summary", data, tmp_path)
    calls = pd.read_parquet(out / "sync_calls.parquet")
    c = calls[calls["rank"] == 0]
    assert c.groupby("kind").size().to_dict() == {"memcpy_pageable": ITERS, "memcpy_sync": ITERS, "stream": ITERS}
    assert set(c.loc[c["kind"] == "memcpy_pageable", "nvtx_range"]) == {"dataloader"}
    assert set(c.loc[c["kind"] != "memcpy_pageable", "nvtx_range"]) == {"optimizer"}
    stream = c[c["kind"] == "stream"]
    assert (stream["duration_ns"] == 200 * US).all() and (stream["gpu_idle_ns"] == 200 * US).all()
    pageable = c[c["kind"] == "memcpy_pageable"]
    # the call starts 20 us before its 150 us copy and returns 10 us after it
    assert (pageable["duration_ns"] == 180 * US).all() and (pageable["gpu_idle_ns"] == 30 * US).all()
    findings = pd.read_parquet(out / "findings.parquet")
    f0 = findings[findings["rank"] == 0]["finding"].tolist()
    assert "pageable memcpy" in f0 and "frequent short syncs in 'optimizer'" in f0


def test_pace_without_kernel_uses_gpu_work_in_each_step(data, tmp_path):
    out = run("kernel_pace", data, tmp_path, kernel="graph_scale")
    pace = pd.read_parquet(out / "pace.parquet")
    assert (pace["duration_ns"] == 100 * US).all() and len(pace) == RANKS * ITERS
    out = runner.run("kernel_pace", [str(data)], str(tmp_path / "kp2"), mode="none", options={})
    pace = pd.read_parquet(out / "pace.parquet")
    r = pd.read_parquet(run("nvtx_gpu_proj", data, tmp_path / "x") / "ranges.parquet")
    steps = r[r["name"] == "step"].sort_values(["rank", "cpu_start_ns"])
    assert np.array_equal(pace["start_ns"].to_numpy(), steps["gpu_start_ns"].to_numpy(np.int64))
    assert np.array_equal(pace["end_ns"].to_numpy(), steps["gpu_end_ns"].to_numpy(np.int64))
