"""pipeline_bubbles: on SYNTHETIC Megatron-style 1F1B and interleaved jobs against hand walks through small
schedules and the schedule's own bubble, (p - 1) / (v m + p - 1); the schedule read from hand-built pass orders;
the real pipeline job against the micro-batches and stages published with it; a job with no pipeline told in one
line."""

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


def test_an_interleaved_two_stage_step_by_hand(tmp_path):
    """Two stages of two model chunks each, two micro-batches, in Megatron's interleaved order: stage 0 runs F0.0 F0.1
    F1.0 F1.1 B1.0 B1.1 B0.0 B0.1 (chunk.micro-batch), stage 1 F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 B0.0 B0.1; a chunk's
    forward takes 3 ms, its backward 6 ms. By hand: stage 0 F0.0 0-3, F0.1 3-6, F1.0 6-9 (after stage 1's F0.0 at
    3-6), F1.1 9-12, waits, B1.0 18-24 (after stage 1's 12-18), B1.1 27-33, B0.0 33-39, B0.1 39-45; stage 1 runs
    without a pause from 3 to 39. Each stage computes 36 ms of the 45 ms phase: 9 ms of bubble, 20 %, the
    schedule's own (p - 1) / (v m + p - 1) = 1 / 5 (1F1B's would be 1 / 3); stage 1 fills for 3 ms and drains for
    6. Each exchange a pass waits for adds its transfer (0.25 ms) and launches: up to 3 ms on this phase."""
    write_megatron(tmp_path / "job", parallel.Layout(tp=1, pp=2, dp=1), steps=8, microbatches=2, fmt="sqlite",
                   virtual=2)
    res = run_recipe("pipeline_bubbles", [str(tmp_path / "job")], str(tmp_path / "pb"), mode="none")
    b = _steady(res)
    assert len(b) >= 10 and set(b["schedule"]) == {"interleaved 1F1B"} and set(b["virtual_stages"]) == {2}
    assert set(b["microbatches"]) == {2} and b["ideal_pct"].to_numpy() == pytest.approx(20.0)
    assert res.analysis["virtual_stages"] == 2 and res.analysis["ideal_pct"] == pytest.approx(20.0)
    assert ((b["window_ns"] > 45 * MS) & (b["window_ns"] < 48 * MS)).all()
    assert b["busy_ns"].to_numpy() == pytest.approx(36 * MS, rel=0.03)
    assert ((b["bubble_pct"] > 20.0) & (b["bubble_pct"] < 25.0)).all()
    first, second = b[b["pp_stage"] == 0], b[b["pp_stage"] == 1]
    assert (first["warmup_ns"] == 0).all() and (first["cooldown_ns"] == 0).all()
    assert second["warmup_ns"].to_numpy() == pytest.approx(3 * MS, abs=0.6 * MS)
    assert second["cooldown_ns"].to_numpy() == pytest.approx(6 * MS, abs=0.6 * MS)


def test_an_interleaved_pipeline_against_its_truth(tmp_path):
    """pp=4, 8 micro-batches, 2 model chunks per stage (truth.json says so): the schedule read from the passes; its
    bubble, 3 / 19 = 15.8 % by itself, with twice 1F1B's exchanges on the path, below 1F1B's 27.3 %; a last stage
    computing 1.5 times as long is 50 % above the median stage."""
    write_megatron(tmp_path / "job", parallel.Layout(tp=1, pp=4, dp=1), steps=6, microbatches=8, fmt="parquetdir",
                   virtual=2)
    truth = json.loads((tmp_path / "job" / "truth.json").read_text())
    res = run_recipe("pipeline_bubbles", [str(tmp_path / "job")], str(tmp_path / "pb"), mode="none")
    b = _steady(res)
    assert res.analysis["schedule"] == truth["schedule"] == "interleaved 1F1B"
    assert res.analysis["virtual_stages"] == truth["virtual_stages"] == 2
    assert res.analysis["microbatches"] == truth["microbatches"] and set(b["microbatches"]) == {8}
    assert res.analysis["ideal_pct"] == pytest.approx(100 * 3 / 19)
    assert ((b["bubble_pct"] > 100 * 3 / 19) & (b["bubble_pct"] < 100 * 3 / 11)).all()
    assert res.tables["findings"].empty  # below the 20 % worth changing, and within 5 points of its own
    write_megatron(tmp_path / "heavy", parallel.Layout(tp=1, pp=4, dp=1), steps=6, microbatches=8, fmt="parquetdir",
                   virtual=2, heavy_last_stage=1.5)
    truth = json.loads((tmp_path / "heavy" / "truth.json").read_text())
    res = run_recipe("pipeline_bubbles", [str(tmp_path / "heavy")], str(tmp_path / "pb-heavy"), mode="none")
    stages = res.tables["stages"].set_index("pp_stage")
    assert res.analysis["schedule"] == "interleaved 1F1B"
    assert stages["busy_vs_median_pct"].idxmax() == truth["heavy_stage"] == 3
    assert stages.at[3, "busy_vs_median_pct"] == pytest.approx(50.0, abs=3.0)
    assert "stage_imbalance" in res.tables["findings"]["kind"].tolist()


def _passes(orders: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, cells = [], []
    for (rank, stage), order in orders.items():
        rows += [{"rank": rank, "iteration": 0, "kind": int(k == "B"), "start_ns": i} for i, k in enumerate(order)]
        cells.append({"rank": rank, "iteration": 0, "pp_stage": stage, "microbatches": order.count("F")})
    return pd.DataFrame(rows), pd.DataFrame(cells)


def test_the_schedule_is_read_from_the_order_of_the_passes():
    """Four stages, four micro-batches, each rank a pipeline of its own: 1F1B runs p - stage forwards before its first
    backward (stage 1: three), then takes turns; GPipe runs every forward first; anything else is neither. Two
    stages of two model chunks, two micro-batches, interleaved: the last stage runs (v - 1) p + 1 = 3 forwards
    first, the first stage 2 (p - 1) + (v - 1) p = 4, all it has, which fits any schedule; the pipeline is
    interleaved. The same first stage beside a last stage of 1F1B is a GPipe-like start but no schedule."""
    passes, cells = _passes({(0, 1): "FFFBFBBB", (1, 3): "FBFBFBFB", (2, 1): "FFFFBBBB", (3, 0): "FFFBBFBB"})
    schedule, chunks = pipeline_bubbles._schedules(passes, cells, 4)
    assert schedule.tolist() == ["1F1B", "1F1B", "GPipe", "other"] and chunks.tolist() == [1, 1, 1, pd.NA]
    passes, cells = _passes({(0, 0): "FFFFBBBB", (1, 1): "FFFBFBBB"})
    schedule, chunks = pipeline_bubbles._schedules(passes, cells.assign(pipeline=0), 2)
    assert schedule.tolist() == ["interleaved 1F1B"] * 2 and chunks.tolist() == [2, 2]
    passes, cells = _passes({(0, 0): "FFFFBBBB", (1, 1): "FBFBFBFB"})
    schedule, _ = pipeline_bubbles._schedules(passes, cells.assign(pipeline=0), 2)
    assert schedule.tolist() == ["other"] * 2


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
