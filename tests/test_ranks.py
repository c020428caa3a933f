import pandas as pd

from nsys_recipe_pack.ranks import assign_ranks


def ids(cands):
    return pd.DataFrame({"file": [f"f{i}" for i in range(len(cands))], "pid": [1] * len(cands),
                         "candidates": cands})


def test_environment_wins_when_unique():
    out = assign_ranks(ids([{"env": (5, "RANK"), "filename": (0, "file name")},
                            {"env": (1, "RANK"), "filename": (1, "file name")}]))
    assert out["rank"].tolist() == [5, 1]
    assert out["rank_source"].tolist() == ["env:RANK", "env:RANK"]


def test_duplicate_environment_ranks_fall_through_to_nvtx():
    # every report says SLURM_PROCID=0 (mpirun inside one srun task): NVTX "MPI Rank N" decides
    out = assign_ranks(ids([{"env": (0, "SLURM_PROCID"), "nvtx": (3, "NVTX")},
                            {"env": (0, "SLURM_PROCID"), "nvtx": (7, "NVTX")}]))
    assert out["rank"].tolist() == [3, 7] and set(out["rank_source"]) == {"nvtx"}


def test_report_numbers_are_not_ranks_position_is_last_resort():
    out = assign_ranks(ids([{}, {}, {}]))
    assert out["rank"].tolist() == [0, 1, 2] and set(out["rank_source"]) == {"position"}


def test_incomplete_source_is_not_used():
    out = assign_ranks(ids([{"nvtx": (4, "NVTX"), "filename": (0, "file name")},
                            {"filename": (1, "file name")}]))
    assert out["rank"].tolist() == [0, 1] and set(out["rank_source"]) == {"filename"}
