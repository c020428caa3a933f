"""Warm-up iterations: found by the stated rule, marked, left out of steadiness statistics and straggler flags by
default, counted with --keep-warmup. Checked by hand on a small case and on the real H100 job against an
independent reading of its NVTX step ranges."""

import json
import sqlite3

import numpy as np
import pandas as pd
import pytest
from conftest import SAMPLES

from nsys_recipe_pack import runner
from nsys_recipe_pack.iterations import WARMUP_FACTOR, warmup

H100 = SAMPLES / "h100_gloo_8rank"


def test_warmup_rule_by_hand():
    # run median 10 ms: warm-up is a rank's leading run of iterations longer than 20 ms
    rank = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3])
    iteration = np.array([0, 1, 2, 3, 0, 1, 2, 3, 1, 0, 0, 1, 2, 3])  # rank 2's rows out of order
    duration = np.array([700, 30, 10, 500, 10, 90, 10, 10, 10, 40, 10, 10, 10, 10]) * 1_000_000
    assert warmup(rank, iteration, duration).tolist() == [True, True, False, False,  # a late hiccup is no warm-up
                                                          False, False, False, False,  # nor is one after a steady step
                                                          False, True, False, False, False, False]
    assert not warmup(np.zeros(0, int), np.zeros(0, int), np.zeros(0, int)).any()


def step_durations() -> pd.DataFrame:
    """Each rank's NVTX `step` ranges straight from its export (SQL), in time order."""
    rows = []
    for rank in range(8):
        con = sqlite3.connect(H100 / f"rank{rank}.sqlite")
        ns = [r[0] for r in con.execute(
            "SELECT n.end - n.start FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
            "WHERE coalesce(n.text, s.value) = 'step' ORDER BY n.start")]
        con.close()
        rows += [(rank, i, d) for i, d in enumerate(ns)]
    return pd.DataFrame(rows, columns=["rank", "iteration", "step_ns"])


@pytest.fixture(scope="module")
def pace_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pace")
    return (runner.run("kernel_pace", [str(H100)], str(d / "default"), engine="pack"),
            runner.run("kernel_pace", [str(H100)], str(d / "kept"), engine="pack", options={"keep_warmup": True}))


def test_kernel_pace_leaves_the_first_step_out_on_the_h100_job(pace_runs):
    default, kept = pace_runs
    steps = step_durations()
    # by hand over the steps: the first step of every rank is many times the median step, the second is not
    median = steps["step_ns"].median()
    first = steps[steps["iteration"] == 0]["step_ns"]
    second = steps[steps["iteration"] == 1]["step_ns"]
    assert (first > 10 * median).all() and (second < WARMUP_FACTOR * median).all()

    pace = pd.read_parquet(default / "pace.parquet")
    assert pace.loc[pace["is_warmup"], "iteration"].tolist() == [0] * 8
    stats = pd.read_parquet(default / "stats.parquet").set_index("rank")
    assert (stats.drop(index=-1)["warmup_iterations"] == 1).all() and stats.loc[-1, "warmup_iterations"] == 8
    steady = pace.loc[~pace["is_warmup"], "duration_ns"].to_numpy()
    assert stats.loc[-1, "count"] == len(steady) == 8 * 59
    assert stats.loc[-1, "median_ns"] == np.median(steady)
    assert stats.loc[-1, "cv"] == pytest.approx(steady.std(ddof=1) / steady.mean())
    assert stats.loc[-1, "cv"] < 0.5  # the steps are steady once start-up is left out
    for rank, rows in pace[~pace["is_warmup"]].groupby("rank"):
        assert stats.loc[rank, "p95_ns"] == np.quantile(rows["duration_ns"].to_numpy(), 0.95)

    everything = pd.read_parquet(kept / "stats.parquet").set_index("rank")
    all_rows = pd.read_parquet(kept / "pace.parquet")["duration_ns"].to_numpy()
    assert everything.loc[-1, "count"] == 480 and everything.loc[-1, "cv"] > 1.5  # start-up dominates the spread
    assert everything.loc[-1, "cv"] == pytest.approx(all_rows.std(ddof=1) / all_rows.mean())

    from nsys_recipe_pack.recipes.kernel_pace import headline, summary

    assert headline(default).endswith("(8 warm-up iteration(s) left out)")
    assert f"cv {stats.loc[-1, 'cv']:.2f}" in headline(default)
    assert "warm-up: 8 iteration(s), 1 on each rank, left out of these statistics" in "\n".join(summary(default))
    assert headline(kept).endswith("(8 warm-up iteration(s) counted)")
    assert json.loads((default / "analysis.json").read_text())["warmup"]["left_out"] is True


def test_progress_chart_keeps_the_warmup_off_its_axis(pace_runs):
    from nsys_recipe_pack.plots.kernel_pace import consistency, progress

    pace = pd.read_parquet(pace_runs[0] / "pace.parquet")
    fig = progress(pace)
    top = fig.layout.yaxis.range[1]
    steady_max = pace.loc[~pace["is_warmup"], "duration_ns"].max() / 1e6
    assert top == pytest.approx(1.1 * steady_max)
    assert "warm-up iteration(s) 0 above the axis" in fig.layout.annotations[0].text
    assert all(max(b.y) <= steady_max for b in consistency(pace).data)


def test_straggler_heatmap_marks_warmup_and_compares_the_rest(tmp_path):
    out = runner.run("straggler_heatmap", [str(H100)], str(tmp_path / "o"), engine="pack")
    it = pd.read_parquet(out / "iterations.parquet")
    assert sorted(it.loc[it["is_warmup"], "iteration"].unique()) == [0]
    assert not it.loc[it["is_warmup"], "is_straggler"].any()
    truth = json.loads((H100 / "truth.json").read_text())
    for s in truth["stragglers"]:
        flagged = it[(it["rank"] == s["rank"]) & it["is_straggler"]]["iteration"].tolist()
        assert flagged == s["iterations"]
    assert json.loads((out / "analysis.json").read_text())["warmup"]["iterations"] == [0]
