"""`nsys-recipe diff` as a CI verdict: JUnit read by a real JUnit reader, the Markdown summary, per-metric gates, a
recipe missing from the new run, and the GitHub action's own steps run from action.yml on the shipped AI-profiler
pair (the optimised run against the baseline passes, the reverse fails)."""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml
from conftest import AI_SET, ROOT
from junitparser import Error, Failure, JUnitXml, Skipped

from nsys_recipe_pack.diff import compare

EXE = Path(sys.executable).with_name("nsys-recipe")
BASE, OPTIMISED = AI_SET / "baseline_nvtx.nsys-rep", AI_SET / "thirdOptimization.nsys-rep"


def diff(tmp_path, base, new, *more, name="d", env=None):
    out = tmp_path / name
    res = subprocess.run([str(EXE), "diff", str(base), str(new), "--output", str(out), "--junit",
                          str(tmp_path / f"{name}.xml"), "--summary", str(tmp_path / f"{name}.md"), *more],
                         capture_output=True, text=True, env=env)
    return res, out


def junit_counts(path: Path) -> dict:
    suites = JUnitXml.fromfile(str(path))
    cases = [c for suite in suites for c in suite]
    kinds = [type(r).__name__ for c in cases for r in c.result]
    return {"tests": len(cases), "failures": kinds.count("Failure"), "errors": kinds.count("Error"),
            "skipped": kinds.count("Skipped"), "cases": cases}


def test_the_optimisation_passes_the_reverse_fails_in_junit_and_the_summary(tmp_path, nsys):
    good, _ = diff(tmp_path, BASE, OPTIMISED, name="fwd")
    assert good.returncode == 0, good.stderr
    counts = junit_counts(tmp_path / "fwd.xml")
    assert counts["tests"] > 5 and counts["failures"] == counts["errors"] == 0
    bad, out = diff(tmp_path, OPTIMISED, BASE, name="rev")
    assert bad.returncode == 1, bad.stderr
    counts = junit_counts(tmp_path / "rev.xml")
    table = pd.read_parquet(out / "diff.parquet")
    assert counts["failures"] == int(table["gates"].sum()) > 0  # a failed case per gating row, none else
    failed = {(c.classname, c.name) for c in counts["cases"] if any(isinstance(r, Failure) for r in c.result)}
    assert ("nsys-recipe.nvtx_total_ns", "Epoch 2") in failed
    assert ("nsys-recipe.median_iteration_ns", "all ranks") in failed
    epoch = next(c for c in counts["cases"] if c.name == "Epoch 2")
    assert epoch.result[0].message == "gates: grew by more than 5 %" and "change +54.3 %" in epoch.system_out
    summary = (tmp_path / "rev.md").read_text()
    first = summary.splitlines()[0]
    assert first.startswith("## nsys-recipe diff: ❌") and first.endswith("(exit 1)") and "Epoch 2" in first
    assert "Copy to device" in summary and "### Faster or smaller" in summary
    assert "Exit codes: 0 no regression, 1 regression" in summary
    assert f"Report: <code>{out / 'report.html'}</code>" in html.unescape(summary)  # names escaped, read as written
    assert (tmp_path / "fwd.md").read_text().startswith("## nsys-recipe diff: ✅")


def test_a_gate_per_metric_turns_a_failing_pair_into_a_passing_one_and_back(tmp_path, nsys):
    loose = ["--gate", "nvtx_total_ns=200", "--gate", "kernel_total_ns=off", "--gate", "median_iteration_ns=30",
             "--gate", "share_pct=off"]
    res, out = diff(tmp_path, OPTIMISED, BASE, *loose, name="loose")
    assert res.returncode == 0, res.stdout + res.stderr
    table = pd.read_parquet(out / "diff.parquet").set_index(["metric", "key"])
    assert table.loc[("median_iteration_ns", "all ranks"), "reason"] == "tracked: within the tolerance (30 %)"
    assert table.loc[("kernel_total_ns", "Kernel"), "reason"] == "not gating: --gate kernel_total_ns=off"
    green = (tmp_path / "loose.md").read_text()  # a passing run still shows its tracked metrics, base and new
    assert green.startswith("## nsys-recipe diff: ✅") and "### Tracked, within the tolerance" in green
    row = table.loc[("median_iteration_ns", "all ranks")]
    assert f"| median_iteration_ns | all ranks | {row['base'] / 1e6:,.2f} ms | {row['new'] / 1e6:,.2f} ms |" in green
    counts = junit_counts(tmp_path / "loose.xml")
    assert counts["failures"] == 0 and counts["skipped"] == int(table["reason"].str.startswith("not gating").sum())
    res, _ = diff(tmp_path, OPTIMISED, BASE, *loose, "--gate", "median_iteration_ns=20", name="tight")
    assert res.returncode == 1  # the median iteration grew 23.4 %
    assert "all ranks (+23.4 %)" in res.stdout
    bad = subprocess.run([str(EXE), "diff", str(BASE), str(OPTIMISED), "--gate", "epoch_time=3"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "METRIC one of" in bad.stderr and "recoverable_ns" in bad.stderr


def test_gates_and_metrics_that_appear_by_hand():
    base = pd.DataFrame({"metric": ["median_iteration_ns", "kernel_total_ns"], "key": ["all ranks", "k"],
                         "value": [100.0, 50.0]})
    new = pd.DataFrame({"metric": ["median_iteration_ns", "kernel_total_ns", "leaked_bytes", "peak_bytes"],
                        "key": ["all ranks", "k", "all ranks", "all ranks"], "value": [108.0, 60.0, 1e6, 2e9]})
    d = compare(base, new, 5.0).set_index("metric")
    # a leak where the base run had no memory figures at all fails; a peak that merely appears does not
    assert d.loc["leaked_bytes", "gates"] and d.loc["leaked_bytes", "reason"].startswith("gates: leaked device")
    assert d.loc["peak_bytes", "verdict"] == "added" and not d.loc["peak_bytes", "gates"]
    assert d.loc["median_iteration_ns", "gates"] and d.loc["kernel_total_ns", "gates"]
    d = compare(base, new, 5.0, {"median_iteration_ns": 10.0, "kernel_total_ns": None}).set_index("metric")
    assert not d.loc["median_iteration_ns", "gates"] and not d.loc["kernel_total_ns", "gates"]
    assert d.loc["kernel_total_ns", "verdict"] == "regressed"  # still said, only not gating


def test_a_recipe_missing_from_the_new_run_and_a_run_that_cannot_be_compared(tmp_path):
    from nsys_recipe_pack.synth import write_synthetic

    base = write_synthetic(tmp_path / "base", ranks=2, iterations=12)
    new = write_synthetic(tmp_path / "new", ranks=2, iterations=12)
    for export in new.glob("rank*_pqtdir"):  # the new run's kernels are gone: the GPU recipes cannot run
        (export / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").unlink()
    res, _ = diff(tmp_path, base, new, name="miss")
    assert "ran on the base run only: comm_overlap\n" in res.stdout  # copies and memsets still feed the shares
    plain = res.returncode
    res, _ = diff(tmp_path, base, new, "--fail-on-missing", name="strict")
    assert res.returncode == 1 and "(fails the comparison: --fail-on-missing)" in res.stdout
    counts = junit_counts(tmp_path / "strict.xml")
    missing = [c for c in counts["cases"] if c.classname == "nsys-recipe.missing"]
    assert [c.name for c in missing] == ["comm_overlap"]
    assert all(isinstance(c.result[0], Failure) for c in missing)
    assert all(isinstance(c.result[0], Skipped) for c in junit_counts(tmp_path / "miss.xml")["cases"]
               if c.classname == "nsys-recipe.missing")
    assert plain == (1 if any(isinstance(r, Failure) for c in junit_counts(tmp_path / "miss.xml")["cases"]
                              for r in c.result) else 0)
    # no comparison at all: one errored case, the summary says why, and the exit code is the documented one
    (tmp_path / "empty").mkdir()
    res, out = diff(tmp_path, tmp_path / "empty", new, name="none")
    assert res.returncode == 3 and not out.exists()
    counts = junit_counts(tmp_path / "none.xml")
    assert counts["tests"] == counts["errors"] == 1 and isinstance(counts["cases"][0].result[0], Error)
    assert (tmp_path / "none.md").read_text().startswith("## nsys-recipe diff: ❌ could not compare the runs:")
    assert "(exit 3)" in (tmp_path / "none.md").read_text().splitlines()[0]


def action_steps():
    return yaml.safe_load((ROOT / "action.yml").read_text())


def run_action(tmp_path: Path, base: Path, new: Path, gates: str = "") -> tuple[int, dict, Path]:
    """The action's `run` steps from action.yml, as a composite action runs them (bash -eo pipefail, its inputs
    through `${{ }}`), but for the install step (the pack is installed here already) and the `uses` steps
    (setup-python, upload-artifact: the network); the exit code of its last step."""
    action = action_steps()
    inputs = {k: v.get("default", "") for k, v in action["inputs"].items()}
    inputs.update(base=str(base), new=str(new), gates=gates, output=str(tmp_path / "cmp"))
    outputs_file, summary_file = tmp_path / "github_output", tmp_path / "step_summary"
    outputs_file.write_text("")
    summary_file.write_text("")
    step_outputs: dict = {}

    def expand(text: str) -> str:
        def value(m):
            expr = m.group(1).strip()
            if expr.startswith("inputs."):
                return inputs[expr.split(".", 1)[1]]
            if expr == "github.action_path":
                return str(ROOT)
            if expr.startswith("steps."):
                _, step, _, name = expr.split(".")
                return step_outputs.get(step, {}).get(name, "")
            raise AssertionError(expr)
        return re.sub(r"\$\{\{(.*?)\}\}", value, str(text))

    code = None
    for step in action["runs"]["steps"]:
        if "run" not in step or step.get("id") == "install":
            continue
        env = {**os.environ, "PATH": f"{EXE.parent}:{os.environ['PATH']}", "GITHUB_OUTPUT": str(outputs_file),
               "GITHUB_STEP_SUMMARY": str(summary_file),
               **{k: expand(v) for k, v in step.get("env", {}).items()}}
        res = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", expand(step["run"])],
                             env=env, cwd=tmp_path, capture_output=True, text=True)
        code = res.returncode
        if step.get("id"):
            step_outputs[step["id"]] = dict(line.split("=", 1) for line in outputs_file.read_text().splitlines())
            outputs_file.write_text("")
        assert code == 0 or step is action["runs"]["steps"][-1], (step.get("name"), res.stderr)
    return code, step_outputs, summary_file


def test_the_github_action_runs_its_own_steps(tmp_path, nsys):
    action = action_steps()
    assert action["runs"]["using"] == "composite" and set(action["inputs"]) >= {"base", "new", "gates", "tolerance"}
    uses = [s["uses"] for s in action["runs"]["steps"] if "uses" in s]
    assert any(u.startswith("actions/upload-artifact") for u in uses)
    (tmp_path / "fwd").mkdir()
    code, outputs, summary = run_action(tmp_path / "fwd", BASE, OPTIMISED)
    assert code == 0 and outputs["diff"]["exit-code"] == "0"
    assert summary.read_text().startswith("## nsys-recipe diff: ✅")
    assert (tmp_path / "fwd" / "cmp" / "report.html").exists()
    assert junit_counts(tmp_path / "fwd" / "cmp-junit.xml")["failures"] == 0
    (tmp_path / "rev").mkdir()
    code, outputs, summary = run_action(tmp_path / "rev", OPTIMISED, BASE)
    assert code == 1 and outputs["diff"]["exit-code"] == "1"
    assert "Epoch 2" in summary.read_text().splitlines()[0]
    assert junit_counts(tmp_path / "rev" / "cmp-junit.xml")["failures"] > 0
    (tmp_path / "gated").mkdir()
    code, _, _ = run_action(tmp_path / "gated", OPTIMISED, BASE, gates="nvtx_total_ns=200\nkernel_total_ns=off "
                                                                      "median_iteration_ns=30 share_pct=off")
    assert code == 0


def test_the_readme_shows_the_action_and_a_gitlab_job():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## In CI"):]
    gitlab = yaml.safe_load(section[section.index("```yaml\n", section.index("On GitLab")) + 8:].split("```")[0])
    job = next(iter(gitlab.values()))
    assert "nsys-recipe diff" in " ".join(job["script"]) and job["artifacts"]["reports"]["junit"]
    github = yaml.safe_load(section[section.index("```yaml\n") + 8:].split("```")[0])
    step = next(s for s in github["jobs"]["profile"]["steps"] if "nsys-recipe-pack" in str(s.get("uses", "")))
    assert set(step["with"]) <= set(action_steps()["inputs"])
