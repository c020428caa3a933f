"""pipeline_bubbles: on SYNTHETIC Megatron-style 1F1B jobs against a hand walk through a small schedule and the
schedule's own bubble, (p - 1) / (m + p - 1); the schedule read from hand-built pass orders; the real pipeline job
against the micro-batches and stages published with it; a job with no pipeline told in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from nsys_recipe_pack import parallel, run_recipe
from nsys_recipe_pack.recipes import pipeline_bubbles
from nsys_recipe_pack.synth_megatron import write_megatron

SAMPLES = Path(__file__).resolve().parents[1] / "sample_reports"
MS = 1_000_000


def _steady(res) -> pd.DataFrame:
    b = res.tables["bubbles"]
    return b[~b["is_warmup"]]


def test_a_two_stage_step_by_hand(tmp_path):
    """Two stages, four micro-batches, forward 6 ms and backward 12 ms, in 1F1B order. By hand: stage 0 runs F0 F1,
    waits for B0 from 12 to 24 ms, then B0 F2, waits for B1 until 42... and ends with B3 at 90 ms; stage 1 starts F0
    at 6 ms and ends B3 at 78 ms. Each stage computes 4 x 18 = 72 ms of the 90 ms phase: 18 ms of bubble (20 %, the
    schedule's own), stage 1's 6 ms of it before its first pass and 12 ms after its last, and all of stage 0's spent
    waiting in its exchanges. The transfers (0.25 ms an exchange) come on top."""
    write_megatron(tmp_path / "job", parallel.Layout(tp=1, pp=2, dp=1), steps=8, microbatches=4, fmt="sqlite")
    res = run_recipe("pipeline_bubbles", [str(tmp_path / "job")], str(tmp_path / "pb"), mode="none")
    b = _steady(res)
    assert len(b) >= 10 and set(b["schedule"]) == {"1F1B"} and set(b["microbatches"]) == {4}
    assert b["ideal_pct"].to_numpy() == pytest.approx(20.0)
    assert b["window_ns"].to_numpy() == pytest.approx(90 * MS, rel=0.03)
    assert b["busy_ns"].to_numpy() == pytest.approx(72 * MS, rel=0.03)
    assert b["bubble_pct"].to_numpy() == pytest.approx(20.0, abs=2.0)
    first, second = b[b["pp_stage"] == 0], b[b["pp_stage"] == 1]
    assert (first["warmup_ns"] == 0).all() and (first["cooldown_ns"] == 0).all()
    assert second["warmup_ns"].to_numpy() == pytest.approx(6 * MS, abs=0.6 * MS)
    assert second["cooldown_ns"].to_numpy() == pytest.approx(12 * MS, abs=0.6 * MS)
    assert first["p2p_wait_ns"].to_numpy() == pytest.approx(18 * MS, abs=1.5 * MS)


def test_a_balanced_pipeline_has_the_bubble_of_its_schedule(tmp_path):
    """pp=4, dp=2, 8 micro-batches, every stage alike: the steady steps' bubble is 3 / 11 = 27.3 % within 3 points."""
    write_megatron(tmp_path / "job", parallel.Layout(tp=1, pp=4, dp=2), steps=8, microbatches=8, fmt="parquetdir")
    res = run_recipe("pipeline_bubbles", [str(tmp_path / "job")], str(tmp_path / "pb"), mode="none")
    b = _steady(res)
    assert set(b["schedule"]) == {"1F1B"} and res.analysis["ideal_pct"] == pytest.approx(100 * 3 / 11)
    assert b["bubble_pct"].to_numpy() == pytest.approx(100 * 3 / 11, abs=3.0)
    assert res.tables["stages"]["busy_vs_median_pct"].abs().max() < 2.0
    # 3 / 11 is a bubble worth shrinking by itself; nothing else is uneven
    assert res.tables["findings"]["kind"].tolist() == ["high_schedule_bubble"]


def _passes(orders: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, cells = [], []
    for (rank, stage), order in orders.items():
        rows += [{"rank": rank, "iteration": 0, "kind": int(k == "B"), "start_ns": i} for i, k in enumerate(order)]
        cells.append({"rank": rank, "iteration": 0, "pp_stage": stage, "microbatches": order.count("F")})
    return pd.DataFrame(rows), pd.DataFrame(cells)


def test_the_schedule_is_read_from_the_order_of_the_passes():
    """Four stages, four micro-batches: 1F1B runs p - stage forwards before its first backward (stage 1: three), then
    takes turns; GPipe runs every forward first; anything else is neither."""
    passes, cells = _passes({(0, 1): "FFFBFBBB", (1, 3): "FBFBFBFB", (2, 1): "FFFFBBBB", (3, 0): "FFFBBFBB"})
    assert pipeline_bubbles._schedules(passes, cells, 4).tolist() == ["1F1B", "1F1B", "GPipe", "other"]


def test_the_real_pipeline_job(tmp_path):
    """The What-if paper's job: its four stages and four micro-batches per step, 1F1B, the long last stage the busiest
    by far and so idling least, the others idling well above the schedule's own 3 / 7."""
    truth = json.loads((SAMPLES / "whatif_pp4_dp2_long_last_stage" / "truth.json").read_text())
    res = run_recipe("pipeline_bubbles", [str(SAMPLES / "whatif_pp4_dp2_long_last_stage")], str(tmp_path / "pb"),
                     mode="none")
    assert res.analysis["stages"] == truth["parallel"]["pp"] and res.analysis["schedule"] == "1F1B"
    assert res.analysis["microbatches"] == truth["microbatches_per_step"]
    stages = res.tables["stages"].set_index("pp_stage")
    assert stages["busy_ns"].idxmax() == 3 and stages.at[3, "busy_vs_median_pct"] > 30
    assert stages["bubble_pct"].idxmin() == 3 and (stages.loc[[0, 1, 2], "bubble_pct"] > 100 * 3 / 7).all()
    found = res.tables["findings"]
    assert found["kind"].tolist() == ["high_schedule_bubble", "bubble_above_schedule", "stage_imbalance"]
    assert found.at[2, "evidence"].startswith("stage 3 computes")


def test_a_job_without_a_pipeline_is_told_in_one_line(tmp_path):
    exe = Path(sys.executable).with_name("nsys-recipe")
    res = subprocess.run([str(exe), "run", "--name", "pipeline_bubbles", "--output", str(tmp_path / "pb"),
                          str(SAMPLES / "h100_gloo_8rank")], capture_output=True, text=True)
    said = [line for line in res.stderr.splitlines() if line.startswith("nsys-recipe: error:")]
    assert res.returncode == 3 and len(said) == 1 and "form no pipeline" in said[0]
    assert not (tmp_path / "pb").exists()


def test_diff_tracks_the_bubble(tmp_path):
    """A last stage made 1.5 times as long leaves the other stages idle longer: the median bubble grows by more than
    the tolerance's 5 points and fails the comparison; the steps' critical path grows too."""
    for name, heavy in (("base", 1.0), ("new", 1.5)):
        write_megatron(tmp_path / name, parallel.Layout(tp=1, pp=4, dp=1), steps=6, microbatches=4, fmt="parquetdir",
                       heavy_last_stage=heavy)
    exe = Path(sys.executable).with_name("nsys-recipe")
    res = subprocess.run([str(exe), "diff", str(tmp_path / "base"), str(tmp_path / "new"), "--output",
                          str(tmp_path / "diff")], capture_output=True, text=True)
    assert res.returncode == 1, res.stderr[-2000:]
    d = pd.read_parquet(tmp_path / "diff" / "diff.parquet").set_index("metric")
    row = d.loc["bubble_pct"]
    assert row["verdict"] == "regressed" and row["gates"] and row["new"] - row["base"] > 5
    longer = d.loc["critical_path_ns"]  # the steps' critical path grows with the last stage's work
    assert longer["verdict"] == "regressed" and longer["new"] > 1.1 * longer["base"]
