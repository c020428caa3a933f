"""A real modern GPU job: h100_gloo_8rank (8 ranks, Nsight Systems 2025.3.1 exports) with a host-bound and a
GPU-bound straggler injected, and PyTorch launching backward kernels from its autograd thread."""

import json
import sqlite3

import pandas as pd
import pytest
from conftest import SAMPLES

from nsys_recipe_pack import runner
from nsys_recipe_pack.recipes.straggler_heatmap import verdicts

H100 = SAMPLES / "h100_gloo_8rank"
EXPORTS = sorted(str(p) for p in H100.glob("rank*.sqlite"))
TRUTH = json.loads((H100 / "truth.json").read_text())


@pytest.fixture(scope="module")
def stragglers(tmp_path_factory):
    out = runner.run("straggler_heatmap", EXPORTS, str(tmp_path_factory.mktemp("sh") / "o"), engine="pack")
    return {t: pd.read_parquet(out / f"{t}.parquet") for t in ("iterations", "ranks", "stragglers", "files")}


def test_both_injected_stragglers_are_flagged_with_their_cause_and_nothing_else(stragglers):
    flagged = stragglers["stragglers"]
    assert len(EXPORTS) == 8 and stragglers["iterations"].groupby("rank").size().eq(60).all()
    injected = set()
    for s in TRUTH["stragglers"]:
        cells = flagged[(flagged["rank"] == s["rank"]) & flagged["iteration"].isin(s["iterations"])]
        assert len(cells) >= 9, (s, flagged)
        assert (cells["cause"] == s["cause"]).mean() >= 0.8 and (cells["cause_side"] == s["side"]).mean() >= 0.8
        injected |= {(s["rank"], i) for i in s["iterations"]}
        # the ranks that waited for it in those iterations are victims, not stragglers
        waited = flagged[flagged["iteration"].isin(s["iterations"]) & (flagged["rank"] != s["rank"])]
        assert waited.empty, waited
    others = [c for c in zip(flagged["rank"], flagged["iteration"], strict=True) if c not in injected]
    assert len(others) <= 3, others
    ranks = stragglers["ranks"].set_index("rank")
    assert ranks.loc[3, "top_cause"] == "optimizer" and ranks.loc[3, "top_cause_side"] == "host"
    assert ranks.loc[5, "top_cause"] == "backward" and ranks.loc[5, "top_cause_side"] == "gpu"
    said = verdicts(stragglers["ranks"], flagged)
    assert any(line.startswith("rank 5 holds the others back in 10 of 60 iterations (15–24, persistent)") and
               "; GPU work launched in backward, +" in line for line in said), said
    assert any(line.startswith("rank 3 holds the others back in 10 of 60 iterations (40–49, persistent)") and
               "; host time in optimizer, +" in line for line in said), said


def test_recoverable_time_is_what_the_injected_steps_cost_the_job(stragglers):
    """Each injected straggler's recoverable time against the steps' own durations: the median step time across
    ranks in its steps minus the median of the clean steps, summed; clean ranks recover nothing."""
    it, ranks = stragglers["iterations"], stragglers["ranks"].set_index("rank")
    step = it.groupby("iteration")["duration_ns"].median()
    injected = [i for s in TRUTH["stragglers"] for i in s["iterations"]]
    clean = step.drop(injected).median()
    for s in TRUTH["stragglers"]:
        cost = float((step.loc[s["iterations"]] - clean).sum())
        assert ranks.loc[s["rank"], "recoverable_ns"] == pytest.approx(cost, rel=0.15), s
        assert ranks.loc[s["rank"], "recurrence"] == "persistent" and ranks.loc[s["rank"], "episodes"] == 1
    others = ranks.drop([s["rank"] for s in TRUTH["stragglers"]])
    assert (others["recoverable_ns"] == 0).all() and others["recurrence"].isna().all()
    run = step.sum()
    assert ranks.loc[3, "recoverable_pct"] == pytest.approx(100 * ranks.loc[3, "recoverable_ns"] / run, rel=1e-3)


def test_the_gpu_bound_straggler_waits_least_where_its_peers_wait_for_it(stragglers):
    it = stragglers["iterations"]
    slow = it[it["iteration"].between(15, 24)]
    wait = slow.pivot(index="iteration", columns="rank", values="wait_ns")
    assert (wait[5] < wait.drop(columns=5).min(axis=1)).all()  # everyone else waits longer than rank 5


LAUNCHED_IN = """
with r as (select n.start s, n.end e, n.globalTid tid from NVTX_EVENTS n left join StringIds t on t.id = n.textId
           where coalesce(n.text, t.value) = ? and n.eventType in (59, 60) and n.end is not null),
ops as (select start, end, correlationId c, globalPid >> 24 & 16777215 pid from CUPTI_ACTIVITY_KIND_KERNEL
        union all select start, end, correlationId, globalPid >> 24 & 16777215 from CUPTI_ACTIVITY_KIND_MEMCPY
        union all select start, end, correlationId, globalPid >> 24 & 16777215 from CUPTI_ACTIVITY_KIND_MEMSET)
select coalesce(sum(o.end - o.start), 0), count(*) from ops o
join CUPTI_ACTIVITY_KIND_RUNTIME k on k.correlationId = o.c and (k.globalTid >> 24 & 16777215) = o.pid
join r on k.start >= r.s and k.end <= r.e and (r.tid >> 24 & 16777215) = o.pid {same_thread}
"""


@pytest.mark.parametrize("attribution", ["process", "thread"])
def test_backward_gets_the_gpu_work_launched_in_it(tmp_path, attribution):
    """`backward`'s GPU time is the kernel and copy time launched while it was open: by any thread of the
    process (the default), or by its own thread only (Nsight Systems' semantics); from SQL over the exports.
    The job's other threads open no NVTX range, and its ops on one stream do not overlap: sum = union."""
    out = runner.run("nvtx_gpu_proj", EXPORTS, str(tmp_path / "o"), engine="pack",
                     options={"attribution": attribution})
    ranges = pd.read_parquet(out / "ranges.parquet")
    files = pd.read_parquet(out / "files.parquet").set_index("rank")["file"]
    sql = LAUNCHED_IN.format(same_thread="and k.globalTid = r.tid" if attribution == "thread" else "")
    ops_per_rank = []
    for rank, file in files.items():
        with sqlite3.connect(file) as con:
            want_ns, want_ops = con.execute(sql, ("backward",)).fetchone()
        mine = ranges[(ranges["rank"] == rank) & (ranges["name"] == "backward")]
        assert (int(mine["gpu_busy_ns"].fillna(0).sum()), int(mine["gpu_ops"].sum())) == (want_ns, want_ops)
        ops_per_rank.append(want_ops)
    assert min(ops_per_rank) > 0
    if attribution == "process":  # 24 launches per step by the autograd thread; its own thread: 1 (rank 5: 2)
        assert min(ops_per_rank) >= 24 * 60


def test_the_folder_as_shipped_reads_each_rank_once_from_its_export(tmp_path, stragglers):
    """Reports made by 2025.3.1 (newer than the nsys the pack fetches) with their exports beside: each rank is
    read once, from its .sqlite, with the same answer as the exports alone."""
    out = runner.run("straggler_heatmap", [str(H100)], str(tmp_path / "o"), engine="pack")
    files = pd.read_parquet(out / "files.parquet")
    assert sorted(files["rank"]) == list(range(8))
    read_from = [p.rsplit("/", 1)[-1] for p in files.sort_values("rank")["read_from"]]
    assert read_from == [f"rank{r}.sqlite" for r in range(8)]
    pd.testing.assert_frame_equal(pd.read_parquet(out / "stragglers.parquet"), stragglers["stragglers"])
