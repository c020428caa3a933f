"""Every bad input gets one clear line and the exit code the README lists, leaves nothing behind, and is documented.

The README's "What happens with bad input" table is generated from these cases:
NSYS_RECIPE_UPDATE_README=1 pytest tests/test_bad_inputs.py rewrites it; otherwise a stale table fails.
"""

import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
from conftest import CPU_SET, MPI_SET, ROOT

NEWER = ROOT / "tests/data/newer_nsys_format/pdl_2p2c.nsys-rep"
BEGIN, END = "<!-- bad-input-table:begin -->", "<!-- bad-input-table:end -->"


def cli(*args, cwd):
    exe = Path(sys.executable).with_name("nsys-recipe")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd)


def make_cases(d: Path):
    """(case, argv, expected exit, a fragment the message must hold)"""
    (d / "trunc.nsys-rep").write_bytes((CPU_SET / "rank0.nsys-rep").read_bytes()[:100_000])
    (d / "random.nsys-rep").write_bytes(random.Random(0).randbytes(50_000))  # fixed, so the message is too
    (d / "empty.nsys-rep").write_bytes(b"")
    (d / "notes.nsys-rep").write_text("not a report\n")
    (d / "notes.qdrep").write_text("not a report\n")
    (d / "notes.sqlite").write_text("not a database\n")
    con = sqlite3.connect(d / "other.sqlite")
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    (d / "nothing").mkdir()
    (d / "nothing" / "readme.txt").write_text("x")
    shutil.copy2(NEWER, d / "newer.nsys-rep")
    mixed = d / "mixed"
    shutil.copytree(CPU_SET, mixed)
    shutil.copy2(d / "random.nsys-rep", mixed / "rank9.nsys-rep")
    (mixed / "rank8.nsys-rep").write_bytes(b"")
    sh = ["run", "--name", "straggler_heatmap", "--engine", "pack"]
    return [
        ("truncated report", [*sh, "trunc.nsys-rep"], 3, "truncated or corrupt"),
        ("corrupt report (random bytes)", [*sh, "random.nsys-rep"], 3, "truncated or corrupt"),
        ("empty report", [*sh, "empty.nsys-rep"], 3, "empty file"),
        ("text file named .nsys-rep", [*sh, "notes.nsys-rep"], 3, "truncated or corrupt"),
        ("text file named .qdrep", [*sh, "notes.qdrep"], 3, "truncated or corrupt"),
        ("text file named .sqlite", [*sh, "notes.sqlite"], 3, "not an SQLite file"),
        (".sqlite that is not an nsys export", [*sh, "other.sqlite"], 3, "not an Nsight Systems export"),
        ("report newer than the nsys found", [*sh, "newer.nsys-rep"], 3, "newer than the nsys found"),
        ("CPU-only report for a GPU recipe", ["run", "--name", "compute_memory_share", "--engine", "pack",
                                              str(CPU_SET)], 3, "-t cuda"),
        ("kernel name that matches nothing", ["run", "--name", "kernel_pace", "--engine", "pack", "--kernel",
                                              "jacobi_kernal", str(MPI_SET)], 3, "5 of 5 inputs cannot be used: "),
        ("NVTX name that matches nothing", [*sh, "--iteration", "stpe", str(CPU_SET)], 3, "closest names: 'step'"),
        ("folder with no reports", [*sh, "nothing"], 3, "holds no reports"),
        ("no inputs", ["run", "--name", "straggler_heatmap"], 2, "no inputs given"),
        ("unknown recipe", ["run", "--name", "stragler_heatmap", str(CPU_SET)], 2, "unknown recipe"),
        ("good and bad ranks mixed", [*sh, "mixed"], 3, "2 of 6 inputs cannot be used"),
    ]


def normalise(msg: str, d: Path) -> str:
    msg = msg.replace(str(d) + "/", "").replace(str(ROOT) + "/", "")
    msg = re.sub(r"\(\d{4}\.\d+\.\d+\.\d+ at [^)]*\)", "(NSYS_VERSION at NSYS_PATH)", msg)
    return msg.replace("nsys-recipe: error: ", "")


def test_bad_inputs_one_line_exit_code_nothing_left(tmp_path, nsys):
    rows = []
    for case, argv, code, fragment in make_cases(tmp_path):
        out = tmp_path / "out"
        res = cli(*argv, "--output", str(out), cwd=tmp_path)
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("nsys-recipe: error:")]
        assert res.returncode == code, (case, res.stderr)
        assert "Traceback" not in res.stderr, case
        assert len(errors) == 1 and fragment in errors[0], (case, res.stderr)
        assert not out.exists() and not list(tmp_path.glob(".out.*")), case
        rows.append((case, code, normalise(errors[0], tmp_path)))
    table = "\n".join(["| case | exit | message |", "|---|---|---|"]
                      + [f"| {c} | {x} | {m.replace('|', '&#124;')} |" for c, x, m in rows])
    readme = (ROOT / "README.md").read_text()
    block = f"{BEGIN}\n{table}\n{END}"
    current = readme[readme.index(BEGIN): readme.index(END) + len(END)] if BEGIN in readme else None
    if os.environ.get("NSYS_RECIPE_UPDATE_README"):
        (ROOT / "README.md").write_text(readme.replace(current, block) if current else readme + "\n" + block + "\n")
    else:
        assert current == block, "README's bad-input table is stale: rerun with NSYS_RECIPE_UPDATE_README=1"


def test_skip_bad_goes_on_and_records_each_skipped_file(tmp_path, nsys):
    make_cases(tmp_path)
    out = tmp_path / "o"
    res = cli("run", "--name", "straggler_heatmap", "--engine", "pack", "--skip-bad", "--output", str(out), "mixed",
              cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    files = pd.read_parquet(out / "files.parquet")
    skipped = files[files["status"] == "skipped"]
    assert sorted(Path(f).name for f in skipped["file"]) == ["rank8.nsys-rep", "rank9.nsys-rep"]
    assert skipped["reason"].str.contains("empty file").any() and skipped["reason"].str.contains("corrupt").any()
    assert sorted(files.loc[files["status"] == "used", "rank"]) == [0, 1, 2, 3]
    it = pd.read_parquet(out / "iterations.parquet")
    assert sorted(it["rank"].unique()) == [0, 1, 2, 3]
