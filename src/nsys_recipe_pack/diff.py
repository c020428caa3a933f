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
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from . import inputs, recipes, runner
from .errors import one_line
from .escape import terminal_text
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
    for said in dict.fromkeys(f"{r.file}: {r.read_note}" for r in ranks if r.read_note):
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
              nsys_path: str | None = None):
    from .notebook import render_report

    out = Path(output) if output else runner.default_output("diff")
    runner.check_output(out, force)
    table = compare(run_metrics(load_run(base, nsys_path)), run_metrics(load_run(new, nsys_path)), tolerance)
    with staged_output(out, force) as staged:
        table.to_parquet(staged / "diff.parquet", index=False)
        (staged / "analysis.json").write_text(json.dumps({
            "recipe": "diff", "base": base, "new": new, "tolerance_pct": tolerance,
            "verdicts": table["verdict"].value_counts().to_dict(), "gating": int(table["gates"].sum()),
        }, indent=1))
        render_report("diff", staged)
    return out, table


def _metric_flag(metric: pd.Series, attribute: str) -> pd.Series:
    """A Metric attribute (share, always_tracked) for each row; False for a metric no recipe declares."""
    flags = {m.name: bool(getattr(m, attribute)) for m in metrics().values()}
    return metric.map(lambda name: flags.get(name, False)).astype(bool)


def compare(base: pd.DataFrame, new: pd.DataFrame, tolerance_pct: float = 5.0) -> pd.DataFrame:
    m = base.merge(new, on=["metric", "key"], how="outer", suffixes=("_base", "_new"))
    m = m.rename(columns={"value_base": "base", "value_new": "new"})
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
    verdict = np.where(worse > tolerance_pct, "regressed", np.where(worse < -tolerance_pct, "improved", "unchanged"))
    verdict = np.where(m["base"].isna(), "added", np.where(m["new"].isna(), "removed", verdict))
    m["verdict"] = verdict
    totals = m.groupby("metric")[["base", "new"]].transform("sum")
    small = (m["base"].fillna(0) < MIN_SHARE * totals["base"]) & (m["new"].fillna(0) < MIN_SHARE * totals["new"])
    tracked = _metric_flag(m["metric"], "always_tracked") | ~small
    m["gates"] = (m["verdict"] == "regressed") & tracked
    m["reason"] = _reasons(m, tracked, tolerance_pct)
    order = {"regressed": 0, "improved": 1, "added": 2, "removed": 3, "unchanged": 4}
    m = m.assign(_o=m["verdict"].map(order), _a=-m["change_pct"].abs().fillna(0))
    return m.sort_values(["metric", "_o", "_a"]).drop(columns=["_o", "_a"]).reset_index(drop=True)[
        ["metric", "key", "base", "new", "change_pct", "verdict", "gates", "reason"]]


def _reasons(m: pd.DataFrame, tracked: pd.Series, tolerance_pct: float) -> pd.Series:
    """Why each row does or does not decide the exit status, in words."""
    words = {m.name: m.words for m in metrics().values()}
    what = m["metric"].map(lambda name: words.get(name, name))
    is_share = _metric_flag(m["metric"], "share")
    moved = np.where(is_share, "moved the wrong way by more than", "grew by more than")
    unit = np.where(is_share, " points", " %")
    gates = "gates: " + moved + f" {tolerance_pct:g}" + unit
    small = f"not tracked: under {MIN_SHARE:.0%} of the run's " + what + " in both runs"
    within = f"tracked: within the tolerance ({tolerance_pct:g}" + unit + ")"
    return pd.Series(np.select(
        [m["verdict"].isin(["added", "removed"]), ~tracked, m["gates"], m["verdict"] == "improved"],
        ["not tracked: in one run only", small, gates, "tracked: better by more than the tolerance"],
        default=within), index=m.index)


def by_time_moved(rows: pd.DataFrame, top: int) -> pd.DataFrame:
    """The `top` rows whose value moved most, in ns rather than percent (tiny keys swing wildly)."""
    return rows.reindex((rows["new"] - rows["base"]).abs().sort_values(ascending=False).index).head(top)


def most_moved(d: pd.DataFrame, verdict: str, top: int = 8) -> pd.DataFrame:
    """The time rows of one verdict that moved most."""
    return by_time_moved(d[(d["verdict"] == verdict) & ~_metric_flag(d["metric"], "share")], top)
