"""`nsys-recipe diff`: what got slower, what got faster between two runs, with a verdict a CI job can gate on.

The metrics come from the recipes (each declares its own in the registry, `recipes.Recipe.metrics`).
Times: a key regresses when it grows by more than the tolerance (percent of its base value), improves when it
shrinks by more. Keys too small to matter (under `MIN_SHARE`, 5 %, of their metric's total in both runs) are
compared but never gate: a 3 us range that became 300 us is +10,000 % and still not worth failing a job for.
Shares (compute_memory_share's categories of GPU time): more compute is an improvement, more idle,
communication, copies or memset a regression, when the share moves by more than the tolerance in percentage
points.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd

from . import inputs, recipes, runner
from .errors import UsageError, one_line
from .escape import markdown_code, markdown_text, terminal_text, xml_text
from .staging import staged_output

MIN_SHARE = 0.05


def metrics() -> dict:
    """Every metric the recipes give, by name."""
    return {m.name: m for r in recipes.all_recipes().values() for m in r.metrics}


def load_run(spec: str, nsys_path: str | None, log=lambda m: print(m, file=sys.stderr)) -> list:
    needs = set().union(*(r.diff_needs for r in recipes.all_recipes().values() if r.diff_metrics))
    ranks = []
    for f in inputs.expand_inputs([spec]):
        ranks.extend(inputs.load_file(f, needs, nsys_path))
    for said in runner.read_notes(pd.DataFrame({"file": [r.file for r in ranks],
                                                "read_note": [r.read_note for r in ranks]})):
        log(terminal_text(f"nsys-recipe: note: {said}"))
    return ranks


def run_metrics(ranks, log=lambda m: print(m, file=sys.stderr)) -> pd.DataFrame:
    """Columns metric, key, value for one run (a list of RankData). A recipe whose metrics cannot be had on this run
    is left out and said so, not the end of the comparison."""
    rows = []
    for recipe in recipes.all_recipes().values():
        if recipe.diff_metrics:
            try:
                rows.append(recipe.diff_metrics(ranks))
            except Exception as exc:
                log(terminal_text(f"nsys-recipe: note: {recipe.name}'s metrics left out: {one_line(exc)}"))
    rows = [t for t in rows if t is not None and len(t)]
    if not rows:
        return pd.DataFrame(columns=["metric", "key", "value"])
    return pd.concat(rows, ignore_index=True)


def diff_runs(base: str, new: str, output: str | None, tolerance: float = 5.0, force: bool = False,
              nsys_path: str | None = None, gates: dict[str, float | None] | None = None):
    """Compare two runs into an output folder: (folder, the comparison, recipes whose metrics the base run has and
    the new run lacks)."""
    from .notebook import render_report

    out = Path(output) if output else runner.default_output("diff")
    runner.check_output(out, force)
    before, after = run_metrics(load_run(base, nsys_path)), run_metrics(load_run(new, nsys_path))
    table = compare(before, after, tolerance, gates)
    missing = missing_recipes(before, after)
    with staged_output(out, force) as staged:
        table.to_parquet(staged / "diff.parquet", index=False)
        (staged / "analysis.json").write_text(json.dumps({
            "recipe": "diff", "base": base, "new": new, "tolerance_pct": tolerance, "gates": gates or {},
            "missing": missing, "verdicts": table["verdict"].value_counts().to_dict(),
            "gating": int(table["gates"].sum()),
        }, indent=1))
        render_report("diff", staged)
    return out, table, missing


def parse_gates(given: list[str]) -> dict[str, float | None]:
    """`--gate METRIC=PCT` or `--gate METRIC=off`, each metric by the name `diff` gives it."""
    known = metrics()
    gates: dict[str, float | None] = {}
    for text in given:
        name, sep, value = text.partition("=")
        name, value = name.strip(), value.strip().lower()
        if not sep or name not in known:
            raise UsageError(f"--gate {text!r}: give METRIC=PCT or METRIC=off, METRIC one of "
                             f"{', '.join(sorted(known))}")
        try:
            gates[name] = None if value == "off" else float(value)
        except ValueError:
            raise UsageError(f"--gate {text!r}: the tolerance is a number of percent (points for shares) or off") \
                from None
        if gates[name] is not None and not (gates[name] >= 0 and np.isfinite(gates[name])):
            raise UsageError(f"--gate {text!r}: the tolerance must be 0 or more")
    return gates


def missing_recipes(before: pd.DataFrame, after: pd.DataFrame) -> list[str]:
    """The recipes that gave metrics on the base run and none on the new one (they could not run there)."""
    owner = {m.name: r.name for r in recipes.all_recipes().values() for m in r.metrics}
    had = {owner.get(m, m) for m in before["metric"]}
    has = {owner.get(m, m) for m in after["metric"]}
    return sorted(had - has)


def exit_code(table: pd.DataFrame, missing: list[str], fail_on_missing: bool) -> int:
    return 1 if table["gates"].any() or (fail_on_missing and missing) else 0


EXIT_CODES = "0 no regression, 1 regression, 2 usage error, 3 bad or unusable input, 4 missing tool"


def junit_xml(table: pd.DataFrame, missing: list[str], fail_on_missing: bool, error: str | None = None) -> str:
    """A JUnit report CI systems read natively: one test case per tracked metric and key, failed when it gates, its
    message the reason, its figures in system-out; a recipe missing from the new run is a failed case with
    --fail-on-missing, else a skipped one; a comparison that could not be made is one errored case."""
    suite = ET.Element("testsuite", name="nsys-recipe diff")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}

    def case(classname: str, name: str, outcome: str | None = None, message: str = "", out: str = "") -> None:
        el = ET.SubElement(suite, "testcase", classname=xml_text(classname), name=xml_text(name), time="0")
        counts["tests"] += 1
        if outcome is not None:
            counts[{"failure": "failures", "error": "errors", "skipped": "skipped"}[outcome]] += 1
            ET.SubElement(el, outcome, message=xml_text(message), type=outcome)
        if out:
            ET.SubElement(el, "system-out").text = xml_text(out)

    if error is not None:
        case("nsys-recipe.diff", "comparison", "error", error)
    tracked = table[table["reason"].str.startswith(("gates", "tracked", "not gating"))]
    for r in tracked.itertuples():
        outcome = "failure" if r.gates else "skipped" if r.reason.startswith("not gating") else None
        case(f"nsys-recipe.{r.metric}", str(r.key), outcome, r.reason,
             f"base {_figure(r.metric, r.base)}, new {_figure(r.metric, r.new)}, change {_change(r.change_pct)}, "
             f"{r.verdict}")
    for name in missing:
        case("nsys-recipe.missing", name, "failure" if fail_on_missing else "skipped",
             f"{name} ran on the base run and could not run on the new one")
    for key, value in counts.items():
        suite.set(key, str(value))
    suites = ET.Element("testsuites", name="nsys-recipe diff", **{k: str(v) for k, v in counts.items()})
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def summary_markdown(table: pd.DataFrame, missing: list[str], fail_on_missing: bool, base: str, new: str,
                     tolerance: float, gates: dict, report: Path | None, error: str | None = None,
                     code: int | None = None, top: int = 8) -> str:
    """The verdict first, then what moved most both ways, then where the report is: for a CI job's page."""
    code = exit_code(table, missing, fail_on_missing) if code is None else code
    gating = table[table["gates"]]
    if error is not None:
        verdict = f"could not compare the runs: {markdown_text(error)}"
    elif len(gating):
        verdict = f"{len(gating)} tracked metric(s) regressed: " + ", ".join(
            f"{markdown_text(r.key)} ({_what(r.metric)}, {_change(r.change_pct)})"
            for r in by_time_moved(gating, 5).itertuples())
    else:
        verdict = "no tracked metric regressed by more than its tolerance"
    if fail_on_missing and missing:
        verdict += "; missing from the new run: " + ", ".join(missing)
    lines = [f"## nsys-recipe diff: {'❌' if code else '✅'} {verdict} (exit {code})", "",
             f"Base {markdown_code(base)} → new {markdown_code(new)}; tolerance {tolerance:g} %"
             + (" (" + ", ".join(f"{k}: {'off' if v is None else f'{v:g} %'}" for k, v in gates.items()) + ")"
                if gates else "") + "."]
    if missing and not fail_on_missing:
        lines += ["", "Ran on the base run only (not gating without --fail-on-missing): " + ", ".join(missing) + "."]
    within = table["reason"].str.startswith("tracked: within")  # a green run's tracked metrics: base and new too
    for rows, title in ((table[(table["verdict"] == "regressed") & table["change_pct"].notna()], "Slower or larger"),
                        (table[(table["verdict"] == "improved") & table["change_pct"].notna()], "Faster or smaller"),
                        (table[within & ~table["verdict"].isin(["regressed", "improved"])],
                         "Tracked, within the tolerance")):
        rows = by_time_moved(rows, top)
        if len(rows):
            lines += ["", f"### {title}", "", "| gates | metric | key | base | new | change |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {'❌' if r.gates else ''} | {r.metric} | {markdown_text(str(r.key)[:80])} | "
                      f"{_figure(r.metric, r.base)} | {_figure(r.metric, r.new)} | {_change(r.change_pct)} |"
                      for r in rows.itertuples()]
    if report is not None:
        lines += ["", f"Report: {markdown_code(report)}"]
    lines += ["", f"Exit codes: {EXIT_CODES}."]
    return "\n".join(lines) + "\n"


def _what(metric: str) -> str:
    found = metrics().get(metric)
    return found.words if found else metric


def _figure(metric: str, value) -> str:
    """A metric's value with its unit: times in ms, bytes in MiB, shares in percent."""
    if pd.isna(value):
        return "—"
    if metric.endswith("_ns"):
        return f"{value / 1e6:,.2f} ms"
    if metric.endswith("_bytes"):
        return f"{value / (1 << 20):,.1f} MiB"
    return f"{value:,.2f} %" if metric.endswith("_pct") else f"{value:,.3f}"


def _change(pct) -> str:
    if pd.isna(pct):
        return "—"
    return "new" if np.isinf(pct) else f"{pct:+.1f} %"


def write_text(path: Path, text: str, append: bool = False) -> None:
    """A file a CI job reads, written whole (or appended to, as $GITHUB_STEP_SUMMARY is)."""
    path = Path(path)
    if append:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _metric_flag(metric: pd.Series, attribute: str) -> pd.Series:
    """A Metric attribute (share, always_tracked) for each row; False for a metric no recipe declares."""
    flags = {m.name: bool(getattr(m, attribute)) for m in metrics().values()}
    return metric.map(lambda name: flags.get(name, False)).astype(bool)


def compare(base: pd.DataFrame, new: pd.DataFrame, tolerance_pct: float = 5.0,
            gates: dict[str, float | None] | None = None) -> pd.DataFrame:
    """One row per metric and key of either run, with its verdict and whether it decides the exit status. `gates`:
    metric -> its own tolerance in percent (points for shares), or None for a metric that never gates."""
    gates = gates or {}
    m = base.merge(new, on=["metric", "key"], how="outer", suffixes=("_base", "_new"))
    m = m.rename(columns={"value_base": "base", "value_new": "new"})
    tolerance = m["metric"].map(lambda name: gates.get(name, tolerance_pct)).astype(float)  # NaN: gate off
    off = tolerance.isna().to_numpy()
    tolerance = tolerance.fillna(tolerance_pct).to_numpy()
    # from nothing to something (no recoverable time before, some now) is an infinite change, not none
    grew = np.where(m["new"] > m["base"], np.inf, np.nan)
    m["change_pct"] = np.where(m["base"].abs() > 0, 100.0 * (m["new"] - m["base"]) / m["base"].abs().where(
        m["base"].abs() > 0, 1), grew)
    is_share = _metric_flag(m["metric"], "share")
    good = np.zeros(len(m), bool)
    for name, metric in metrics().items():
        good |= (m["metric"] == name).to_numpy() & m["key"].isin(metric.good_keys).to_numpy()
    delta = np.where(is_share, m["new"] - m["base"], m["change_pct"])
    worse = np.where(is_share & good, -delta, delta)
    verdict = np.where(worse > tolerance, "regressed", np.where(worse < -tolerance, "improved", "unchanged"))
    verdict = np.where(m["base"].isna(), "added", np.where(m["new"].isna(), "removed", verdict))
    m["verdict"] = verdict
    totals = m.groupby("metric")[["base", "new"]].transform("sum")
    small = (m["base"].fillna(0) < MIN_SHARE * totals["base"]) & (m["new"].fillna(0) < MIN_SHARE * totals["new"])
    tracked = _metric_flag(m["metric"], "always_tracked") | ~small
    # a straggler or a leak where the base run had none at all fails the job too
    appeared = (m["verdict"] == "added") & _metric_flag(m["metric"], "new_is_bad") & (m["new"] > 0)
    m["gates"] = (((m["verdict"] == "regressed") & tracked) | appeared) & ~off
    m["reason"] = _reasons(m, tracked, appeared, off, tolerance)
    order = {"regressed": 0, "improved": 1, "added": 2, "removed": 3, "unchanged": 4}
    m = m.assign(_o=m["verdict"].map(order), _a=-m["change_pct"].abs().fillna(0))
    return m.sort_values(["metric", "_o", "_a"]).drop(columns=["_o", "_a"]).reset_index(drop=True)[
        ["metric", "key", "base", "new", "change_pct", "verdict", "gates", "reason"]]


def _reasons(m: pd.DataFrame, tracked: pd.Series, appeared: pd.Series, off: np.ndarray,
             tolerance: np.ndarray) -> pd.Series:
    """Why each row does or does not decide the exit status, in words."""
    words = {m.name: m.words for m in metrics().values()}
    what = m["metric"].map(lambda name: words.get(name, name))
    is_share = _metric_flag(m["metric"], "share").to_numpy()
    moved = np.where(is_share, "moved the wrong way by more than", "grew by more than")
    unit = np.where(is_share, " points", " %")
    limit = pd.Series(tolerance, index=m.index).map(lambda v: f"{v:g}")
    gates = "gates: " + moved + " " + limit + unit
    small = f"not tracked: under {MIN_SHARE:.0%} of the run's " + what + " in both runs"
    within = "tracked: within the tolerance (" + limit + unit + ")"
    return pd.Series(np.select(
        [off, appeared, m["verdict"].isin(["added", "removed"]), ~tracked, m["gates"], m["verdict"] == "improved"],
        ["not gating: --gate " + m["metric"] + "=off", "gates: " + what + " appeared (none in the base run)",
         "not tracked: in one run only", small, gates, "tracked: better by more than the tolerance"],
        default=within), index=m.index)


def by_time_moved(rows: pd.DataFrame, top: int) -> pd.DataFrame:
    """The `top` rows whose value moved most, in ns rather than percent (tiny keys swing wildly)."""
    return rows.reindex((rows["new"] - rows["base"]).abs().sort_values(ascending=False).index).head(top)


def most_moved(d: pd.DataFrame, verdict: str, top: int = 8) -> pd.DataFrame:
    """The time rows of one verdict that moved most."""
    return by_time_moved(d[(d["verdict"] == verdict) & ~_metric_flag(d["metric"], "share")], top)
