"""An export beside a report that is older than it (a folder unpacked or copied without keeping times): read when
nothing else can read the report, skipped otherwise, and in both cases named, with why and what to do, in one line
and in files.parquet."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
from conftest import CPU_SET, SAMPLES

H100 = SAMPLES / "h100_gloo_8rank"
EXE = Path(sys.executable).with_name("nsys-recipe")


def older(export: Path, report: Path, ns: int) -> None:
    st = report.stat()
    os.utime(export, ns=(st.st_atime_ns, st.st_mtime_ns - ns))


def h100_job(d: Path) -> Path:
    """rank0 as its 2025.3 report with its export 4 ms older beside it, ranks 1-3 as exports."""
    job = d / "job"
    job.mkdir()
    shutil.copy2(H100 / "rank0.nsys-rep", job)
    for r in range(4):
        shutil.copyfile(H100 / f"rank{r}.sqlite", job / f"rank{r}.sqlite")
    older(job / "rank0.sqlite", job / "rank0.nsys-rep", 4_000_000)
    return job


def cli(*args, env=None):
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True, env=env)


def test_nsys_too_old_for_the_report_reads_the_older_export_and_says_so(tmp_path, nsys):
    job = h100_job(tmp_path)
    res = cli("run", "--name", "straggler_heatmap", "--mode", "none", "--output", tmp_path / "o", job)
    assert res.returncode == 0, res.stderr
    note = next(ln for ln in res.stderr.splitlines() if ln.startswith("note:"))
    assert "rank0.nsys-rep: read rank0.sqlite beside it, 4 ms older than the report" in note
    assert f"the nsys found ({nsys.version}) cannot read a report made by Nsight Systems 2025.3" in note
    assert "`touch` it" in note and "cp -a" in note
    files = pd.read_parquet(tmp_path / "o" / "files.parquet").set_index("rank")
    assert Path(files.loc[0, "read_from"]).name == "rank0.sqlite" and "4 ms older" in files.loc[0, "read_note"]
    assert files.drop(index=0)["read_note"].isna().all()

    res = cli("diff", job, job, "--output", tmp_path / "d")
    assert res.returncode == 0, res.stderr
    assert "read rank0.sqlite beside it, 4 ms older than the report" in res.stderr


def test_no_nsys_at_all_reads_the_older_export(tmp_path):
    job = h100_job(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "NSYS"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "empty-cache"), PATH=f"{EXE.parent}:/usr/bin:/bin")
    res = cli("run", "--name", "kernel_pace", "--mode", "none", "--output", tmp_path / "o", job / "rank0.nsys-rep",
              env=env)
    assert res.returncode == 0, res.stderr
    assert "read rank0.sqlite beside it, 4 ms older than the report: no nsys was found" in res.stderr

    (job / "rank0.sqlite").write_text("not a database")  # nothing beside it can be read: say what was found
    res = cli("run", "--name", "kernel_pace", "--output", tmp_path / "o2", job / "rank0.nsys-rep", env=env)
    assert res.returncode == 4
    assert "no Nsight Systems `nsys` found" in res.stderr and "rank0.sqlite beside it is not a readable export" \
        in res.stderr


def test_nsys_that_reads_the_report_exports_it_again_and_names_the_skipped_export(tmp_path, nsys):
    job = tmp_path / "cpu"
    job.mkdir()
    report = job / "rank0.nsys-rep"
    shutil.copy2(CPU_SET / "rank0.nsys-rep", report)
    subprocess.run([str(nsys.path), "export", "--type", "sqlite", "--output", str(job / "rank0.sqlite"), str(report)],
                   check=True, capture_output=True)
    older(job / "rank0.sqlite", report, 2_000_000_000)
    res = cli("run", "--name", "straggler_heatmap", "--mode", "none", "--output", tmp_path / "o", report)
    assert res.returncode == 0, res.stderr
    assert "rank0.sqlite beside it is 2 s older than the report, so the report was exported again" in res.stderr
    files = pd.read_parquet(tmp_path / "o" / "files.parquet")
    assert files.loc[0, "read_from"] == str(report) and "exported again" in files.loc[0, "read_note"]

    os.utime(job / "rank0.sqlite")  # touched: now the export is read, and nothing needs saying
    res = cli("run", "--name", "straggler_heatmap", "--mode", "none", "--output", tmp_path / "o2", report)
    assert res.returncode == 0 and "note:" not in res.stderr, res.stderr
    files = pd.read_parquet(tmp_path / "o2" / "files.parquet")
    assert Path(files.loc[0, "read_from"]).name == "rank0.sqlite" and files["read_note"].isna().all()
