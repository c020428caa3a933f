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


def _retitled(src, dst, program: str, later_ns: int):
    """A SYNTHETIC export copied with its process renamed and its session started `later_ns` later (SQL)."""
    import shutil
    import sqlite3

    shutil.copy(src, dst)
    with sqlite3.connect(dst) as db:
        db.execute("UPDATE PROCESSES SET name = ?", (program,))
        db.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", (later_ns,))


def test_reports_of_different_programs_started_apart_are_refused(tmp_path):
    """Two reports of different programs an hour apart in one folder are two runs, not two ranks: refused with both
    programs named (exit 3 on the command line, a bad input); started together they are one job of two executables,
    a note."""
    import subprocess
    import sys
    from pathlib import Path

    from nsys_recipe_pack import run_recipe
    from nsys_recipe_pack.errors import BadInputError
    from nsys_recipe_pack.synth import write_synthetic

    made = write_synthetic(tmp_path / "made", 2, 8, "sqlite")
    apart, together = tmp_path / "apart", tmp_path / "together"
    for folder, later in ((apart, 3600 * 10**9), (together, 0)):
        folder.mkdir()
        _retitled(made / "rank0.sqlite", folder / "rank0.sqlite", "saxpy", 0)
        _retitled(made / "rank1.sqlite", folder / "rank1.sqlite", "clover_leaf", later)
    try:
        run_recipe("kernel_pace", [str(apart)], str(tmp_path / "out"), mode="none")
        raise AssertionError("not refused")
    except BadInputError as exc:
        said = str(exc)
    assert "different programs started apart" in said and "saxpy (1 rank(s)" in said and "clover_leaf" in said
    exe = Path(sys.executable).with_name("nsys-recipe")
    res = subprocess.run([str(exe), "run", "--name", "kernel_pace", "--output", str(tmp_path / "cli"), str(apart)],
                         capture_output=True, text=True)
    assert res.returncode == 3 and "different programs" in res.stderr  # a bad input
    res = run_recipe("kernel_pace", [str(together)], str(tmp_path / "together_out"), mode="none")
    assert any("different programs, started together" in n for n in res.analysis["notes"])
