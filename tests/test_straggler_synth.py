"""straggler_heatmap on SYNTHETIC exports whose injected stragglers are known (truth.json)."""

import json

import pandas as pd
import pytest

from nsys_recipe_pack import runner
from nsys_recipe_pack.synth import Straggler, write_synthetic

RANKS, ITERS = 8, 40
CASES = {
    "dataloader_stall": [Straggler(rank=3, first=10, last=19, cause="dataloader", slowdown=1.5)],
    "compute_slowdown": [Straggler(rank=5, first=25, last=34, cause="compute", slowdown=1.4)],
    "always_slow": [Straggler(rank=6, first=0, last=ITERS - 1, cause="compute", slowdown=1.3)],
    "none": [],
}


def truth_cells(out_dir):
    truth = json.loads((out_dir / "truth.json").read_text())
    cells = {}
    for c in truth["cells"]:
        cells[(int(c["rank"]), int(c["iteration"]))] = set(c["acceptable_causes"])
    return cells


@pytest.mark.parametrize("fmt", ["parquetdir", "sqlite"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_injected_stragglers_are_found(tmp_path, case, fmt):
    data = write_synthetic(tmp_path / "in", ranks=RANKS, iterations=ITERS, fmt=fmt, stragglers=CASES[case],
                           seed=sorted(CASES).index(case))
    expected = truth_cells(data)
    out = runner.run("straggler_heatmap", [str(data)], str(tmp_path / "out"), mode="none",
                     options={"iteration": "step"})
    it = pd.read_parquet(out / "iterations.parquet")
    flagged = it[it["is_straggler"]]
    found = set(zip(flagged["rank"], flagged["iteration"], strict=True))
    hits = found & set(expected)
    if expected:
        recall = len(hits) / len(expected)
        assert recall >= 0.9, (case, recall)
        right_cause = sum(1 for _, row in flagged.iterrows()
                          if (row["rank"], row["iteration"]) in expected
                          and row["cause"] in expected[(row["rank"], row["iteration"])])
        assert right_cause >= 0.9 * len(hits)
    clean_cells = RANKS * ITERS - len(expected)
    false_pos = len(found - set(expected)) / clean_cells
    assert false_pos <= 0.01, (case, false_pos)
    files = pd.read_parquet(out / "files.parquet")
    assert sorted(files["rank"]) == list(range(RANKS))
    assert set(files["rank_source"]) == {"env:RANK"}
    # the NCCL wait is counted as wait, not busy: on the straggler it is the shortest
    if expected:
        r, i = next(iter(expected))
        row = it[(it["iteration"] == i)].set_index("rank")
        assert row.loc[r, "wait_ns"] == row["wait_ns"].min()
        assert row.loc[r, "arrival_skew_ns"] == row["arrival_skew_ns"].max()
        assert row["gpu_busy_ns"].notna().all()


def test_auto_delimiter_finds_step(tmp_path):
    data = write_synthetic(tmp_path / "in", ranks=4, iterations=12, fmt="parquetdir", stragglers=[], seed=1)
    out = runner.run("straggler_heatmap", [str(data)], str(tmp_path / "out"), mode="none", options={})
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["delimiter"]["name"] == "step" and analysis["delimiter"]["source"] == "auto"
