"""Reports newer than the nsys found: their version read from the file, and the export beside them read instead.

The always-running cases use the shipped reports (sample_reports/, and tests/data/newer_nsys_format/, made by
Nsight Systems 2025.5.1, which the nsys the pack fetches cannot read), and the real 8-rank H100 set
(2025.3.1 reports with their .sqlite exports beside).
"""

import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pandas.testing as pdt
import pytest
from conftest import CPU_SET, ROOT, SAMPLES

from nsys_recipe_pack import inputs, versions
from nsys_recipe_pack.synth import Straggler, write_synthetic

NEWER = ROOT / "tests/data/newer_nsys_format/pdl_2p2c.nsys-rep"
SHARED = ROOT.parent / "shared" / "data"
H100 = SAMPLES / "h100_gloo_8rank"
# the release each shipped folder was captured with, as its README and ../shared/data/README.md say
MADE_WITH = {"cpu_ddp": "2023.4.4", "ai_profiler_a100": "2022.2.1", "gpubootcamp_mpi_jacobi_v100": "2020.5.1",
             "gpubootcamp_jacobi_memcpy": "2020.5.1", "newer_nsys_format": "2025.5.1", "h100_gloo_8rank": "2025.3.1"}
SHIPPED = sorted([*SAMPLES.glob("*/*.nsys-rep"), *SAMPLES.glob("*/*.qdrep"), NEWER])
SHARED_REPORTS = sorted([*SHARED.glob("*/*.nsys-rep"), *SHARED.glob("*/*.qdrep")]) if SHARED.is_dir() else []


def cli(*args, cwd=None):
    exe = Path(sys.executable).with_name("nsys-recipe")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, cwd=cwd)


def error_lines(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("nsys-recipe: error:")]


def newer_than_file(export: Path, report: Path) -> None:
    """Give an export a modification time after its report's, as `nsys export` run after `nsys profile` does."""
    t = report.stat().st_mtime_ns + 1_000_000_000
    os.utime(export, ns=(t, t))


# ---------------------------------------------------------------------------------------------------
# the version inside the file


def _check_version(report: Path) -> None:
    got = versions.report_version(report)
    assert got is not None, report
    assert got.startswith(MADE_WITH[report.parent.name] + "."), (report, got)
    assert re.fullmatch(r"\d{4}\.\d+\.\d+\.\d+", got), got
    assert got.encode() in report.read_bytes()  # the very string the file holds, not a guess


@pytest.mark.parametrize("report", SHIPPED, ids=[f"{p.parent.name}/{p.name}" for p in SHIPPED])
def test_version_read_from_each_shipped_report(report):
    _check_version(report)


@pytest.mark.skipif(not SHARED_REPORTS, reason=f"{SHARED} is not here (the project's shared data folder)")
def test_version_read_from_each_report_in_the_shared_data():
    seen = set()
    for report in SHARED_REPORTS:
        _check_version(report)
        seen.add(versions.report_version(report).rsplit(".", 1)[0])
    assert {"2020.5.1", "2022.2.1", "2025.3.1", "2025.5.1"} <= seen


def test_the_version_costs_a_few_small_reads(monkeypatch):
    read = []

    class Counting:
        def __init__(self, path, mode):
            self.fh = open(path, mode)  # noqa: SIM115 - closed by __exit__

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def seek(self, *a):
            return self.fh.seek(*a)

        def read(self, n=-1):
            assert n >= 0, "never the whole file"
            data = self.fh.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(versions, "open", Counting, raising=False)
    for report in SHIPPED:
        read.clear()
        assert versions.report_version(report) is not None
        assert sum(read) < 4096 and len(read) <= 4, (report, read)


def test_damaged_and_foreign_files_give_none_never_an_error(tmp_path):
    rng = random.Random(7)
    for report in [CPU_SET / "rank0.nsys-rep", SAMPLES / "gpubootcamp_mpi_jacobi_v100/report1.qdrep", NEWER]:
        data = report.read_bytes()
        cuts = [len(data) - k for k in (1, 8, 16, 17, 100, 400, 700)] + [rng.randrange(len(data)) for _ in range(20)]
        for i, cut in enumerate(cuts):
            (tmp_path / f"cut{i}").write_bytes(data[:cut])
            got = versions.report_version(tmp_path / f"cut{i}")
            # without the trailer only the header can tell, and only 2023.x and later reports write it there
            assert got == ("2023.4.4.54" if report.parent.name == "cpu_ddp" else
                           "2025.5.1.121" if report == NEWER else None), (report, cut, got)
        for _ in range(200):  # bytes of the trailer, section table and info section changed at random
            damaged = bytearray(data)
            for _flip in range(rng.randint(1, 4)):
                damaged[len(data) - rng.randint(1, 800)] = rng.randrange(256)
            (tmp_path / "flip").write_bytes(bytes(damaged))
            got = versions.report_version(tmp_path / "flip")
            assert got is None or re.fullmatch(r"\d{4}\.\d+\.\d+(\.\d+)?", got), got
    (tmp_path / "random.nsys-rep").write_bytes(rng.randbytes(5000) + b"\xff" * 8 + b"U3w[END]")
    (tmp_path / "empty.nsys-rep").write_bytes(b"")
    (tmp_path / "text.nsys-rep").write_text("NVIDIA Tegra Profiler Report 9999@1@1@1 and then nothing\n")
    for name in ("random.nsys-rep", "empty.nsys-rep", "missing.nsys-rep", "."):
        assert versions.report_version(tmp_path / name) is None
    assert versions.report_version(tmp_path / "text.nsys-rep") == "9999.1.1.1"  # the header, as a last resort


def test_newer_compares_releases_not_builds():
    assert versions.newer_than("2025.3.1.0", "2023.4.4.54")
    assert versions.newer_than("2024.1.1.59", "2023.4.4.54")
    assert not versions.newer_than("2023.4.4.54", "2023.4.4.54")
    assert not versions.newer_than("2023.4.4.60", "2023.4.4.54")  # another build of the same release
    assert not versions.newer_than("2020.5.1.85", "2024.2.3.38")
    assert not versions.newer_than(None, "2023.4.4.54") and not versions.newer_than("2025.5.1.121", None)
    assert versions.version_key("2025.5.1.121-255136380782v0") == (2025, 5, 1)


# ---------------------------------------------------------------------------------------------------
# which export beside a report is read


def synthetic_export(tmp_path: Path, name: str, fmt: str = "sqlite", seed: int = 0, stragglers=()) -> Path:
    """One rank's SYNTHETIC export, as a file or folder of its own."""
    made = write_synthetic(tmp_path / f".synth-{name}-{fmt}-{seed}", ranks=1, iterations=12, fmt=fmt, seed=seed,
                           stragglers=stragglers)
    return made / ("rank0.sqlite" if fmt == "sqlite" else "rank0_pqtdir")


def test_which_export_beside_a_report_is_read(tmp_path):
    report = tmp_path / "r.nsys-rep"
    shutil.copy2(NEWER, report)
    needs = {"nvtx", "kernel"}
    assert inputs.export_beside(report, needs) == (None, "")
    sq = tmp_path / "r.sqlite"
    shutil.move(synthetic_export(tmp_path, "a"), sq)
    newer_than_file(sq, report)
    assert inputs.export_beside(report, needs) == (sq, "")
    # a Parquet folder is preferred (it reads fastest), whichever of the two names nsys or the user gave it
    for dirname in ("r_pqtdir", "r.parquetdir"):
        pqt = tmp_path / dirname
        shutil.move(synthetic_export(tmp_path, dirname, "parquetdir"), pqt)
        newer_than_file(pqt / "StringIds.parquet", report)
        assert inputs.export_beside(report, needs) == (pqt, "")
        # as `nsys recipe` or `nsys export --tables` leave it: no META_DATA_EXPORT, only some tables
        (pqt / "META_DATA_EXPORT.parquet").unlink()
        assert inputs.export_beside(report, needs) == (pqt, "")  # still has what these needs read
        (pqt / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").unlink()
        got, why = inputs.export_beside(report, needs)
        assert got == sq and why == ""
        assert inputs.export_beside(report, {"nvtx"}) == (pqt, "")
        shutil.rmtree(pqt)
    # a stale export: the report was made again after it
    os.utime(sq, ns=(report.stat().st_mtime_ns - 1, report.stat().st_mtime_ns - 1))
    assert inputs.export_beside(report, needs) == (None, "r.sqlite beside it is older than the report")
    # files that are not exports, even when new enough
    sq.write_text("not a database\n")
    newer_than_file(sq, report)
    assert inputs.export_beside(report, needs) == (None, "r.sqlite beside it is not a readable export")
    sq.unlink()
    con = sqlite3.connect(sq)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    newer_than_file(sq, report)
    assert inputs.export_beside(report, needs) == (None, "r.sqlite beside it is not an Nsight Systems export")


def test_a_report_and_its_exports_count_once(tmp_path):
    (tmp_path / "a.nsys-rep").write_bytes(b"x")
    (tmp_path / "a.sqlite").write_bytes(b"x")
    for d in ("a_pqtdir", "a.parquetdir", "b.parquetdir"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "StringIds.parquet").write_bytes(b"x")
    assert [p.name for p in inputs.expand_inputs([str(tmp_path)])] == ["a.nsys-rep", "b.parquetdir"]
    assert [p.name for p in inputs.expand_inputs([str(tmp_path / "a*")])] == ["a.nsys-rep"]


# ---------------------------------------------------------------------------------------------------
# end to end: the 2025.5.1 report shipped in tests/data


def test_a_report_too_new_for_the_nsys_found_is_one_line_and_exit_3(nsys, tmp_path):
    report = tmp_path / "pdl_2p2c.nsys-rep"
    shutil.copy2(NEWER, report)
    for engine in ("auto", "nsys", "pack"):
        out = tmp_path / f"out-{engine}"
        res = cli("run", "--name", "kernel_pace", "--engine", engine, report, "--output", out)
        assert res.returncode == 3, res.stderr
        (line,) = error_lines(res)
        assert "2025.5.1" in line and nsys.version in line and str(report) in line
        assert f"nsys export --type sqlite {report}" in line and "--nsys PATH" in line
        assert "corrupt" not in res.stderr and "Traceback" not in res.stderr
        assert not out.exists()
    # several such reports: still one line, the reason said once for all of them
    shutil.copy2(NEWER, tmp_path / "second.nsys-rep")
    res = cli("run", "--name", "kernel_pace", report, tmp_path / "second.nsys-rep", "--output", tmp_path / "o")
    assert res.returncode == 3
    (line,) = error_lines(res)
    assert line.count("2025.5.1.121, newer than") == 1 and "nsys export --type sqlite REPORT" in line
    assert str(report) in line and str(tmp_path / "second.nsys-rep") in line
    (tmp_path / "second.nsys-rep").unlink()
    # an export older than the report is all that can be read: it is read, and a line says which and why
    stale = tmp_path / "pdl_2p2c.sqlite"
    shutil.move(synthetic_export(tmp_path, "stale"), stale)
    os.utime(stale, ns=(report.stat().st_mtime_ns - 10**9,) * 2)
    res = cli("run", "--name", "kernel_pace", report, "--output", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    assert (f"note: {report}: read pdl_2p2c.sqlite beside it, 1 s older than the report: the nsys found "
            f"({nsys.version}) cannot read a report made by Nsight Systems 2025.5.1") in res.stderr
    # one that cannot stand for the report (here: not an export at all) is named in the error
    stale.write_text("not a database")
    res = cli("run", "--name", "kernel_pace", report, "--output", tmp_path / "o2")
    assert res.returncode == 3
    (line,) = error_lines(res)
    assert "2025.5.1" in line and "pdl_2p2c.sqlite beside it is not a readable export" in line


@pytest.mark.parametrize("engine", ["auto", "nsys", "pack"])
def test_the_export_beside_a_too_new_report_is_read(tmp_path, engine, request):
    if engine == "nsys":
        request.getfixturevalue("nsys")  # --engine nsys needs one; the other two run without any
    run = tmp_path / "run"
    run.mkdir()
    report = run / "pdl_2p2c.nsys-rep"
    shutil.copy2(NEWER, report)
    export = synthetic_export(tmp_path, "e", stragglers=[Straggler(0, 3, 5, "dataloader", 2.0)])
    shutil.copy2(export, run / "pdl_2p2c.sqlite")
    newer_than_file(run / "pdl_2p2c.sqlite", report)
    res = cli("run", "--name", "straggler_heatmap", "--engine", engine, run, "--output", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    files = pd.read_parquet(tmp_path / "o" / "files.parquet")
    assert files[["rank", "file", "read_from", "status"]].to_dict("records") == [
        {"rank": 0, "file": str(report), "read_from": str(run / "pdl_2p2c.sqlite"), "status": "used"}]
    # the same tables as a run on the export itself
    res = cli("run", "--name", "straggler_heatmap", export, "--output", tmp_path / "direct")
    assert res.returncode == 0, res.stderr
    for table in ("iterations", "ranks", "stragglers"):
        pdt.assert_frame_equal(pd.read_parquet(tmp_path / "o" / f"{table}.parquet"),
                               pd.read_parquet(tmp_path / "direct" / f"{table}.parquet"), obj=table)
    notes = json.loads((tmp_path / "o" / "analysis.json").read_text())["notes"]
    assert any("2025.5.1" in n and "export beside each" in n for n in notes) == (engine != "pack")


def test_diff_on_two_folders_of_reports_and_exports(tmp_path):
    runs = {}
    for name, stragglers in (("base", ()), ("new", [Straggler(0, 0, -1, "compute", 1.5)])):
        folder = runs[name] = tmp_path / name
        folder.mkdir()
        shutil.copy2(NEWER, folder / "pdl_2p2c.nsys-rep")
        shutil.copy2(synthetic_export(tmp_path, name, stragglers=stragglers), folder / "pdl_2p2c.sqlite")
        newer_than_file(folder / "pdl_2p2c.sqlite", folder / "pdl_2p2c.nsys-rep")
    res = cli("diff", runs["base"], runs["new"], "--output", tmp_path / "d")
    assert res.returncode == 1, res.stdout + res.stderr  # every iteration of the one rank 1.5x slower
    d = pd.read_parquet(tmp_path / "d" / "diff.parquet").set_index(["metric", "key"])
    for name, column in (("base", "base"), ("new", "new")):
        expected = nvtx_totals(runs[name] / "pdl_2p2c.sqlite")
        got = d.xs("nvtx_total_ns")[column].dropna()
        assert got.to_dict() == {k: float(v) for k, v in expected.items()}
    assert d.loc[("median_iteration_ns", "all ranks"), "verdict"] == "regressed"


def nvtx_totals(*exports: Path) -> dict:
    """Total duration per NVTX range name over the exports, straight from SQL."""
    totals: dict = {}
    for export in exports:
        con = sqlite3.connect(export)
        for name, total in con.execute(
                "SELECT coalesce(n.text, s.value) AS name, sum(n.end - n.start) FROM NVTX_EVENTS n "
                "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL "
                "GROUP BY name"):
            totals[name] = totals.get(name, 0) + total
        con.close()
    return totals


# ---------------------------------------------------------------------------------------------------
# a folder of reports with exports beside some of them, read by the nsys found


def test_exports_beside_readable_reports_are_read_and_named(nsys, tmp_path):
    run = tmp_path / "cpu"
    shutil.copytree(CPU_SET, run)
    for rank in (0, 1):
        subprocess.run([str(nsys.path), "export", "-q", "true", "--type", "sqlite", "-o",
                        str(run / f"rank{rank}.sqlite"), str(run / f"rank{rank}.nsys-rep")],
                       check=True, capture_output=True)
    # rank 2: an export of two tables only, as `nsys export --tables` leaves it: too little for the recipe
    subprocess.run([str(nsys.path), "export", "-q", "true", "--type", "parquetdir", "--tables",
                    "^StringIds$,^NVTX_EVENTS$", "-o", str(run / "rank2_pqtdir"), str(run / "rank2.nsys-rep")],
                   check=True, capture_output=True)
    res = cli("run", "--name", "straggler_heatmap", "--engine", "pack", run, "--output", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    files = pd.read_parquet(tmp_path / "o" / "files.parquet")
    assert files["rank"].tolist() == [0, 1, 2, 3]  # four ranks, each once
    assert files["file"].tolist() == [str(run / f"rank{r}.nsys-rep") for r in range(4)]
    assert files["read_from"].tolist() == [str(run / "rank0.sqlite"), str(run / "rank1.sqlite"),
                                           str(run / "rank2.nsys-rep"), str(run / "rank3.nsys-rep")]
    assert files.columns.tolist()[:7] == ["rank", "file", "rank_source", "host", "local_rank", "gpu", "pid"]
    # the same answers as from the reports alone
    res = cli("run", "--name", "straggler_heatmap", "--engine", "pack", CPU_SET, "--output", tmp_path / "ref")
    assert res.returncode == 0, res.stderr
    for table in ("iterations", "ranks"):
        pdt.assert_frame_equal(pd.read_parquet(tmp_path / "o" / f"{table}.parquet"),
                               pd.read_parquet(tmp_path / "ref" / f"{table}.parquet"), obj=table)


# ---------------------------------------------------------------------------------------------------
# the real H100 set: 2025.3.1 reports, which the nsys found reads as a protobuf parse error


@pytest.fixture()
def h100(tmp_path):
    return tmp_path


def h100_copy(dest: Path, ranks, with_export: bool = True) -> Path:
    dest.mkdir(parents=True)
    for r in ranks:
        shutil.copy2(H100 / f"rank{r}.nsys-rep", dest)
        if with_export:
            shutil.copy2(H100 / f"rank{r}.sqlite", dest)
    return dest


def test_h100_reports_with_their_exports_beside_run(h100, nsys):
    run = h100_copy(h100 / "run", (0, 3))
    res = cli("run", "--name", "kernel_pace", run / "rank0.nsys-rep", run / "rank3.nsys-rep", "--output", h100 / "o")
    assert res.returncode == 0, res.stderr
    files = pd.read_parquet(h100 / "o" / "files.parquet")
    assert files[["rank", "rank_source"]].values.tolist() == [[0, "env:RANK"], [3, "env:RANK"]]
    assert [Path(p).name for p in files["read_from"]] == ["rank0.sqlite", "rank3.sqlite"]
    pace = pd.read_parquet(h100 / "o" / "pace.parquet")
    assert pace.groupby("rank")["iteration"].nunique().to_dict() == {0: 60, 3: 60}  # 60 steps, as made
    # the report alone: one line naming its version and the way out, never "corrupt"
    alone = h100_copy(h100 / "alone", (0,), with_export=False)
    res = cli("run", "--name", "kernel_pace", alone / "rank0.nsys-rep", "--output", h100 / "o2")
    assert res.returncode == 3
    (line,) = error_lines(res)
    assert "2025.3.1" in line and nsys.version in line and "nsys export --type sqlite" in line
    assert "corrupt" not in res.stderr and not (h100 / "o2").exists()


def test_h100_diff_of_two_folders(h100):
    base, new = h100_copy(h100 / "base", (0, 1)), h100_copy(h100 / "new", (2, 3))
    res = cli("diff", base, new, "--output", h100 / "d")
    assert res.returncode in (0, 1), res.stdout + res.stderr
    d = pd.read_parquet(h100 / "d" / "diff.parquet").set_index(["metric", "key"])
    for folder, column in ((base, "base"), (new, "new")):
        expected = nvtx_totals(*sorted(folder.glob("*.sqlite")))
        assert d.xs("nvtx_total_ns")[column].dropna().to_dict() == {k: float(v) for k, v in expected.items()}
    # rank 3 stalls 30 ms in `optimizer` in steps 40-49, so the new run spends more there
    assert d.loc[("nvtx_total_ns", "optimizer"), "change_pct"] > 50
