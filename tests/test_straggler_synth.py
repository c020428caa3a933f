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
    # the GPU is slow and the host is not: only the NCCL kernel's late start on that GPU shows it
    "gpu_bound": [Straggler(rank=2, first=5, last=14, cause="gpu", slowdown=1.5)],
    "gpu_and_host": [Straggler(rank=1, first=3, last=9, cause="gpu", slowdown=1.4),
                     Straggler(rank=7, first=20, last=27, cause="dataloader", slowdown=1.4)],
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
    # the ranks that waited for a straggler are not flagged in its iterations
    victims = {(r, i) for r, i in found for s in CASES[case] if r != s.rank and s.first <= i <= s.last}
    assert not victims, (case, victims)
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


def test_mpi_job_without_nvtx_finds_the_rank_whose_kernels_run_slower(tmp_path):
    """No NVTX and no NCCL: iterations are launches of the job's kernel, ranks meet in a device sync then
    MPI_Allreduce; rank 4's kernel runs twice as long in iterations 12-20."""
    data = write_synthetic(tmp_path / "in", ranks=6, iterations=40, fmt="sqlite", job="mpi", seed=5,
                           stragglers=[Straggler(rank=4, first=12, last=20, cause="gpu", slowdown=2.0)])
    expected = truth_cells(data)
    out = runner.run("straggler_heatmap", [str(data)], str(tmp_path / "out"), mode="none", options={})
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["delimiter"] == {"kind": "kernel", "name": "jacobi_kernel", "domain": None, "source": "auto"}
    assert set(analysis["sync_points"]) == {"MPI call", "CUDA sync call"}
    it = pd.read_parquet(out / "iterations.parquet")
    flagged = it[it["is_straggler"]]
    found = set(zip(flagged["rank"], flagged["iteration"], strict=True))
    assert len(found & set(expected)) >= 0.9 * len(expected) and found <= set(expected), found ^ set(expected)
    assert set(flagged["cause"]) == {"gpu_compute"}
    files = pd.read_parquet(out / "files.parquet")
    assert set(files["rank_source"]) == {"env:OMPI_COMM_WORLD_RANK"}
    # busy is the kernel's time (the device sync waits for the rank's own kernel); MPI_Allreduce is wait
    kernel_ms = json.loads((data / "truth.json").read_text())["nominal_ms"]["jacobi_kernel"]
    clean = it[~it["rank"].isin([4])]
    assert clean["busy_ns"].median() == pytest.approx(kernel_ms * 1e6, rel=0.05)


def test_recurrence_tells_a_persistent_straggler_from_a_rotating_culprit(tmp_path):
    persistent = [Straggler(rank=3, first=10, last=21, cause="dataloader", slowdown=1.5)]
    rotating = [Straggler(rank=(i // 2) % RANKS, first=i, last=i, cause="dataloader", slowdown=1.5)
                for i in range(4, 36, 2)]  # 16 single iterations, 8 ranks two each
    for name, spec in (("persistent", persistent), ("rotating", rotating)):
        data = write_synthetic(tmp_path / name, ranks=RANKS, iterations=ITERS, fmt="parquetdir", stragglers=spec,
                               seed=11)
        out = runner.run("straggler_heatmap", [str(data)], str(tmp_path / f"out-{name}"), mode="none", options={})
        ranks = pd.read_parquet(out / "ranks.parquet").set_index("rank")
        said = json.loads((out / "analysis.json").read_text())["pattern"]
        if name == "persistent":
            assert said.startswith("one rank dominates: rank 3")
            assert ranks.loc[3, "recurrence"] == "persistent" and ranks.loc[3, "episodes"] == 1
            assert ranks.loc[3, "longest_run"] == 12
        else:
            assert said.startswith("the culprit moves: 8 ranks"), said
            flagged = ranks[ranks["straggler_iterations"] > 0]
            assert len(flagged) == RANKS and (flagged["recurrence"] == "intermittent").all()
            assert (flagged["longest_run"] == 1).all()
            assert (flagged["episodes"] == flagged["straggler_iterations"]).all()
