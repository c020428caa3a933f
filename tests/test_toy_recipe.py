"""A recipe from one file and its notebook (tests/toy_recipe/) gets every command without touching the pack:
`list`, `run` with its own option, `report`, `diff` and its notebook. Values checked by SQL on the exports."""

import importlib.util
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from nsys_recipe_pack import recipes
from nsys_recipe_pack.cli import main
from nsys_recipe_pack.synth import write_synthetic

TOY = Path(__file__).resolve().parent / "toy_recipe" / "launch_count.py"


@pytest.fixture()
def toy():
    spec = importlib.util.spec_from_file_location("launch_count", TOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers it
    yield module.RECIPE
    recipes.unregister("launch_count")


def _kernels(export: Path, min_ns: float = 0) -> tuple[int, int]:
    with sqlite3.connect(export) as db:
        count, total = db.execute("SELECT COUNT(*), COALESCE(SUM(end - start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                  "WHERE end - start >= ?", (min_ns,)).fetchone()
    return count, total


def test_a_toy_recipe_from_one_file_gets_every_command(toy, tmp_path, capsys):
    base = write_synthetic(tmp_path / "base", ranks=2, iterations=6, fmt="sqlite")
    new = write_synthetic(tmp_path / "new", ranks=2, iterations=9, fmt="sqlite")

    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "launch_count" in listed and "--min-duration-us" in listed

    out = tmp_path / "run"
    assert main(["run", "--name", "launch_count", "--mode", "none", "--report", "--min-duration-us", "50",
                 "--output", str(out), str(base)]) == 0
    printed = capsys.readouterr().out
    assert "kernel launches by rank:" in printed
    launches = pd.read_parquet(out / "launches.parquet")
    files = pd.read_parquet(out / "files.parquet").set_index("rank")["file"]
    for row in launches.itertuples():
        assert (row.launches, row.kernel_ns) == _kernels(Path(files[row.rank]), 50_000)
    assert (out / "report.html").exists() and (out / "launch_count.ipynb").exists()
    assert "kernel launches" in (out / "report.html").read_text()

    # its flag is its own: another recipe refuses it and names the recipe that takes it
    assert main(["run", "--name", "kernel_pace", "--min-duration-us", "5", str(base)]) == 2
    assert "it is an option of launch_count" in capsys.readouterr().err

    report = tmp_path / "report"
    assert main(["report", "--output", str(report), str(base)]) == 0
    index = pd.read_parquet(report / "index.parquet").set_index("recipe")
    total = sum(_kernels(p)[0] for p in sorted(base.glob("*.sqlite")))
    assert index.loc["launch_count", "status"] == "done"
    assert index.loc["launch_count", "headline"] == f"{total} kernel launches on 2 ranks"
    assert (report / "base" / "launch_count" / "report.html").exists()
    overview = (report / "base" / "overview.html").read_text()  # its section: its headline, a link to its page
    assert f"{total} kernel launches on 2 ranks" in overview and "launch_count/report.html" in overview

    diff = tmp_path / "diff"
    # 9 iterations against 6: half as many launches again, a regression of the toy's metric (and of others)
    assert main(["diff", str(base), str(new), "--output", str(diff)]) == 1
    row = pd.read_parquet(diff / "diff.parquet").set_index("metric").loc["kernel_launches"]
    assert (row["base"], row["new"]) == (total, sum(_kernels(p)[0] for p in sorted(new.glob("*.sqlite"))))
    assert row["verdict"] == "regressed" and row["gates"] and row["reason"] == "gates: grew by more than 5 %"




def test_the_toy_reads_a_long_capture_span_by_span(toy, tmp_path, monkeypatch):
    """Its map is a fold over time written against inputs.chunks.Stream alone: a capture read span by span (every
    table a long one here, read 40 rows a batch) gives each rank's count and time of the kernels that ran 50 us or
    more, as SQL over the export counts them, through many spans; the same rank read whole, through one."""
    import dataclasses

    from conftest import folded

    from nsys_recipe_pack.inputs import load_file, readers

    toy_module = toy.map_rank.__globals__
    base = write_synthetic(tmp_path / "base", ranks=2, iterations=6, fmt="sqlite")
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 40)
    spans, stream = [], toy.stream

    def fold(state, low, high, chunk):
        spans.append((low, high))
        return stream.fold(state, low, high, chunk)

    options = {"min_duration_us": 50.0}
    monkeypatch.setitem(toy_module, "STREAM", dataclasses.replace(stream, fold=fold))
    for export in sorted(base.glob("*.sqlite")):
        spans.clear()
        (rank, result), = folded(toy, export, options, stream=toy_module["STREAM"])
        assert result is not None and len(spans) > 2
        assert (result["launches"], result["kernel_ns"]) == _kernels(export, 50_000)
        assert toy.map_rank(rank, options) == result  # the rank's map is its stream's result
        spans.clear()
        whole, = load_file(export, {"kernel"})
        assert toy.map_rank(whole, options) == result and len(spans) == 1
