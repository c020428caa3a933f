"""`nsys-recipe diff`: verdicts by hand, and the ai_profiler_a100 optimisation measured both ways."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import AI_SET

from nsys_recipe_pack.diff import compare


def test_compare_by_hand():
    base = pd.DataFrame({"metric": ["kernel_total_ns"] * 4 + ["share_pct"] * 2,
                         "key": ["a", "b", "c", "gone", "compute", "idle"],
                         "value": [100.0, 100.0, 100.0, 50.0, 60.0, 40.0]})
    new = pd.DataFrame({"metric": ["kernel_total_ns"] * 4 + ["share_pct"] * 2,
                        "key": ["a", "b", "c", "fresh", "compute", "idle"],
                        "value": [104.0, 120.0, 80.0, 10.0, 50.0, 50.0]})
    d = compare(base, new, tolerance_pct=5).set_index(["metric", "key"])
    assert d.loc[("kernel_total_ns", "a"), "verdict"] == "unchanged"
    assert d.loc[("kernel_total_ns", "b"), "verdict"] == "regressed" and d.loc[("kernel_total_ns", "b"), "gates"]
    assert d.loc[("kernel_total_ns", "b"), "change_pct"] == pytest.approx(20.0)
    assert d.loc[("kernel_total_ns", "c"), "verdict"] == "improved"
    assert d.loc[("kernel_total_ns", "gone"), "verdict"] == "removed"
    assert d.loc[("kernel_total_ns", "fresh"), "verdict"] == "added"
    # shares move in percentage points: less compute and more idle are both regressions
    assert d.loc[("share_pct", "compute"), "verdict"] == "regressed"
    assert d.loc[("share_pct", "idle"), "verdict"] == "regressed"


def run_diff(base, new, out):
    exe = Path(sys.executable).with_name("nsys-recipe")
    return subprocess.run([str(exe), "diff", str(base), str(new), "--output", str(out)], capture_output=True, text=True)


def test_ai_profiler_optimisation_improves_and_the_reverse_fails(tmp_path, nsys):
    base, new = AI_SET / "baseline_nvtx.nsys-rep", AI_SET / "thirdOptimization.nsys-rep"
    res = run_diff(base, new, tmp_path / "fwd")
    assert res.returncode == 0, res.stdout + res.stderr
    d = pd.read_parquet(tmp_path / "fwd" / "diff.parquet")
    assert list(d.columns[:6]) == ["metric", "key", "base", "new", "change_pct", "verdict"]
    nvtx = d[d["metric"] == "nvtx_total_ns"].set_index("key")
    assert nvtx.loc["Epoch 2", "change_pct"] == pytest.approx(-35, abs=3)
    assert nvtx.loc["Copy to device", "change_pct"] == pytest.approx(-65, abs=3)
    assert nvtx.loc["Epoch 2", "verdict"] == "improved"
    # the totals are the plain sums of the ranges, as `nsys stats -r nvtx_sum` reports them
    assert nvtx.loc["Epoch 2", "base"] == 15313364812
    res = run_diff(new, base, tmp_path / "rev")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "regressed" in res.stdout
    assert set(d["metric"]) == {"nvtx_total_ns", "kernel_total_ns", "share_pct", "median_iteration_ns"}
    html = (tmp_path / "fwd" / "report.html").read_text()
    assert html.count('class="plotly-graph-div"') == 3 and "No tracked metric regressed" in html
    assert "tracked metric(s) regressed" in (tmp_path / "rev" / "report.html").read_text()


def test_each_row_says_whether_it_gates_and_per_op_ranges_are_compared_per_op():
    from nsys_recipe_pack.diff import most_moved
    from nsys_recipe_pack.nvtx import op_name

    base = pd.DataFrame({"metric": ["nvtx_total_ns"] * 3 + ["median_iteration_ns"],
                         "key": ["step", "forward", "tiny", "all ranks"], "value": [1000.0, 400.0, 3.0, 100.0]})
    new = pd.DataFrame({"metric": ["nvtx_total_ns"] * 3 + ["median_iteration_ns"],
                        "key": ["step", "forward", "tiny", "all ranks"], "value": [1300.0, 380.0, 60.0, 104.0]})
    d = compare(base, new, tolerance_pct=5).set_index("key")
    assert d.loc["step", "gates"] and d.loc["step", "reason"] == "gates: grew by more than 5 %"
    # +1,900 % but 60 ns of 1,740: under 5 % of the NVTX time in both runs, so it cannot fail the job
    assert d.loc["tiny", "verdict"] == "regressed" and not d.loc["tiny", "gates"]
    assert d.loc["tiny", "reason"] == "not tracked: under 5% of the run's NVTX time in both runs"
    assert d.loc["all ranks", "reason"] == "tracked: within the tolerance (5 %)"
    assert d.loc["forward", "reason"] == "tracked: within the tolerance (5 %)"  # -5 %: not more than 5
    assert most_moved(d.reset_index(), "regressed")["key"].tolist() == ["step", "tiny"]  # by ns moved, not %
    names = pd.Series(["aten::mm, seq = 65, op_id = 7", "aten::mm, seq = 66", "forward", "aten::add_, sizes = [[2]]"])
    assert op_name(names).tolist() == ["aten::mm", "aten::mm", "forward", "aten::add_"]


def test_a_straggler_that_appears_is_a_regression_of_recoverable_time(tmp_path):
    from nsys_recipe_pack import runner
    from nsys_recipe_pack.synth import Straggler, write_synthetic

    base = write_synthetic(tmp_path / "base", ranks=4, iterations=20)
    new = write_synthetic(tmp_path / "new", ranks=4, iterations=20, stragglers=[Straggler(2, 5, 14, "dataloader", 2.0)])
    res = run_diff(base, new, tmp_path / "d")
    assert res.returncode == 1, res.stdout + res.stderr
    row = pd.read_parquet(tmp_path / "d" / "diff.parquet").set_index("metric").loc["recoverable_ns"]
    ranks = pd.read_parquet(runner.run("straggler_heatmap", [str(new)], str(tmp_path / "s"), mode="none",
                                       options={}) / "ranks.parquet")
    assert row["new"] == ranks["recoverable_ns"].sum() > 0 and row["base"] == 0
    assert row["verdict"] == "regressed" and row["gates"] and row["change_pct"] == float("inf")
    assert "recoverable_ns" in res.stdout
