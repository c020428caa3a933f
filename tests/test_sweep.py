"""Every recipe, `report` and `diff` over every real export the pack ships and over damaged or unusual variants of
them (tests/export_variants.py): each ends with an answer (exit 0) or one line naming the file and what to do
(exit 3), never an internal error; `report` goes on past a recipe that cannot run."""

import contextlib
import dataclasses
import io
import json

import pandas as pd
import pytest
from export_variants import build

from nsys_recipe_pack import cli, diff, recipes


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return build(tmp_path_factory.mktemp("variants"))


def run_cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_every_recipe_answers_or_says_why_in_one_line(cases, tmp_path):
    outcomes = []
    for case, files in cases.items():
        for name in recipes.all_recipes():
            out = tmp_path / f"{len(outcomes)}"
            code, _, err = run_cli("run", "--name", name, "--mode", "none", "--output", out, *files)
            outcomes.append((case, name, code))
            said = [ln for ln in err.splitlines() if ln.startswith("nsys-recipe: error:")]
            assert "internal error" not in err and "Traceback" not in err, (case, name, err[-2000:])
            assert code in (0, 3), (case, name, err[-2000:])
            if code == 3:
                assert len(said) == 1 and not out.exists(), (case, name, err[-2000:])
            else:
                assert (out / "files.parquet").exists(), (case, name)
    assert len(outcomes) == len(cases) * len(recipes.all_recipes())
    # the variants damage a part of the data, not all of it: most still give answers
    answered = {case for case, _, code in outcomes if code == 0}
    assert answered >= set(cases) - {"every event table empty"}, set(cases) - answered
    assert ("memory events on one rank of two", "gpu_memory", 0) in outcomes


def test_diff_metrics_of_every_case(cases, capsys):
    for case, files in cases.items():
        ranks = [r for f in files for r in diff.load_run(str(f), None)]
        table = diff.run_metrics(ranks)
        assert list(table.columns) == ["metric", "key", "value"], case
    assert "internal error" not in capsys.readouterr().err


def test_diff_and_report_on_unusual_runs(cases, tmp_path):
    merged = cases["two ranks in one file, per-op NVTX names"][0]
    odd = cases["names with invalid UTF-8"][0].parent
    code, out, err = run_cli("diff", merged, odd, "--output", tmp_path / "d")
    assert code in (0, 1) and "verdict:" in out and "internal error" not in err, err[-2000:]
    assert (tmp_path / "d" / "report.html").exists()

    code, _, err = run_cli("report", merged, odd, "--output", tmp_path / "r")
    assert "internal error" not in err, err[-2000:]
    index = pd.read_parquet(tmp_path / "r" / "index.parquet")
    assert set(index["status"]) <= {"done", "not applicable", "failed"}
    assert code == (1 if (index["status"] == "failed").any() else 0)
    # the H100 job's collectives are gloo's on the host: comm_overlap has nothing to say, and says why
    comm = index[index["recipe"] == "comm_overlap"]
    assert (comm["status"] == "not applicable").all() and comm["headline"].str.contains("NCCL").all()
    assert (index["status"] == "done").sum() >= 8


def test_report_goes_on_past_a_failing_recipe(monkeypatch, tmp_path, cases):
    from nsys_recipe_pack.recipes import kernel_pace

    def broken(per_rank, options):
        raise IndexError("index 0 is out of bounds for axis 0 with size 0")

    spec = recipes.get("kernel_pace")
    monkeypatch.setitem(recipes._REGISTRY, "kernel_pace", dataclasses.replace(spec, reduce=broken))
    assert kernel_pace.RECIPE is spec  # the module's own is untouched
    run = cases["every NVTX name unique"][0].parent
    code, out, err = run_cli("report", run, "--output", tmp_path / "r")
    assert code == 1, err
    assert "kernel_pace failed: internal error: IndexError: index 0 is out of bounds" in out
    index = pd.read_parquet(tmp_path / "r" / "index.parquet").set_index("recipe")
    assert index.loc["kernel_pace", "status"] == "failed"
    assert index.loc["kernel_pace", "headline"].startswith("internal error: IndexError")
    assert (index.drop(index="kernel_pace")["status"] != "failed").all()
    html = (tmp_path / "r" / "index.html").read_text()
    assert "failed: internal error: IndexError" in html
    for recipe in index[index["status"] == "done"].index:
        assert (tmp_path / "r" / run.name / recipe / "report.html").exists()
    assert (tmp_path / "r" / run.name / "overview.html").exists()
    overview = (tmp_path / "r" / run.name / "overview.html").read_text()
    assert "Failed: internal error: IndexError" in overview

    # a run of several recipes goes on the same way, and says which failed
    code, out, err = run_cli("run", "--name", "kernel_pace,sync_summary", "--mode", "none", "--output",
                             tmp_path / "two", run)
    assert code == 1 and "kernel_pace: internal error: IndexError" in err
    assert (tmp_path / "two" / "sync_summary" / "summary.parquet").exists()
    assert not (tmp_path / "two" / "kernel_pace").exists()
    analysis = json.loads((tmp_path / "two" / "sync_summary" / "analysis.json").read_text())
    assert analysis["recipe"] == "sync_summary"
