"""Run-vs-run comparison: what got slower, what got faster, with a verdict a CI job can gate on.

Times: a key regresses when it grows by more than the tolerance (percent of its base value), improves when it
shrinks by more. Keys too small to matter (under `MIN_SHARE`, 5 %, of their metric's total in both runs) are
compared but never gate: a 3 us range that became 300 us is +10,000 % and still not worth failing a job for.
Shares of GPU time (compute_memory_share categories): more compute is an improvement, more idle,
communication, copies or memset a regression, when the share moves by more than the tolerance in percentage
points. Per-op NVTX ranges (PyTorch's emit_nvtx names every op instance `aten::mm, seq = 65, ...`) are
compared per op, so that thousands of instances do not flood the comparison.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..errors import MissingTraceError
from ..iterations import closed_ranges, find_iterations
from ..loader import Frame
from . import share

NEEDS = {"nvtx", "kernel", "memcpy", "memset"}
MIN_SHARE = 0.05
GOOD_SHARES = {"compute"}
OP_INSTANCE_RE = re.compile(r",\s*(?:seq|op_id|sizes|input_op_ids)\s*=.*$", re.DOTALL)
METRIC_WORDS = {"nvtx_total_ns": "NVTX time", "kernel_total_ns": "kernel time", "share_pct": "GPU time share",
                "median_iteration_ns": "median iteration"}


def op_name(names: pd.Series) -> pd.Series:
    """A range name without what numbers one instance of an op (`aten::mm, seq = 65, op_id = 7` -> `aten::mm`)."""
    return names.astype(str).str.replace(OP_INSTANCE_RE, "", regex=True)


def run_metrics(ranks) -> pd.DataFrame:
    """Columns metric, key, value for one run (a list of RankData)."""
    rows = []
    ranges = pd.concat([closed_ranges(rd.nvtx) for rd in ranks], ignore_index=True)
    if len(ranges):
        t = (ranges["end_ns"] - ranges["start_ns"]).groupby(op_name(ranges["name"])).sum()
        rows.append(pd.DataFrame({"metric": "nvtx_total_ns", "key": t.index, "value": t.to_numpy(np.float64)}))
    kernels = [rd.kernels for rd in ranks if rd.kernels is not None and len(rd.kernels)]
    if kernels:
        k = pd.concat(kernels, ignore_index=True)
        t = (k["end_ns"] - k["start_ns"]).groupby(k["name"]).sum()
        rows.append(pd.DataFrame({"metric": "kernel_total_ns", "key": t.index, "value": t.to_numpy(np.float64)}))
    parts = []
    for rd in ranks:
        try:
            table = share.map_rank(rd, {})["share"]
        except MissingTraceError:  # a rank without GPU work has no shares
            continue
        if table is not None:
            parts.append(Frame(table, share.SHARE_DTYPES).to_pandas())
    if parts:
        s = pd.concat(parts, ignore_index=True).groupby("category")["union_ns"].sum()
        rows.append(pd.DataFrame({"metric": "share_pct", "key": s.index, "value": (100.0 * s / s.sum()).to_numpy()}))
    durations = []
    for rd in ranks:
        try:
            it = find_iterations(rd)
        except Exception:  # noqa: BLE001 - a run without iterations simply has no such metric
            continue
        durations.append(it.end_ns - it.start_ns)
    if durations:
        rows.append(pd.DataFrame({"metric": "median_iteration_ns", "key": "all ranks",
                                  "value": [float(np.median(np.concatenate(durations)))]}))
    if not rows:
        return pd.DataFrame(columns=["metric", "key", "value"])
    return pd.concat(rows, ignore_index=True)


def compare(base: pd.DataFrame, new: pd.DataFrame, tolerance_pct: float = 5.0) -> pd.DataFrame:
    m = base.merge(new, on=["metric", "key"], how="outer", suffixes=("_base", "_new"))
    m = m.rename(columns={"value_base": "base", "value_new": "new"})
    m["change_pct"] = np.where(m["base"].abs() > 0, 100.0 * (m["new"] - m["base"]) / m["base"].abs(), np.nan)
    is_share = m["metric"] == "share_pct"
    delta = np.where(is_share, m["new"] - m["base"], m["change_pct"])
    worse = np.where(is_share & m["key"].isin(GOOD_SHARES), -delta, delta)
    verdict = np.where(worse > tolerance_pct, "regressed", np.where(worse < -tolerance_pct, "improved", "unchanged"))
    verdict = np.where(m["base"].isna(), "added", np.where(m["new"].isna(), "removed", verdict))
    m["verdict"] = verdict
    totals = m.groupby("metric")[["base", "new"]].transform("sum")
    small = (m["base"].fillna(0) < MIN_SHARE * totals["base"]) & (m["new"].fillna(0) < MIN_SHARE * totals["new"])
    tracked = is_share | (m["metric"] == "median_iteration_ns") | ~small
    m["gates"] = (m["verdict"] == "regressed") & tracked
    m["reason"] = _reasons(m, tracked, tolerance_pct)
    order = {"regressed": 0, "improved": 1, "added": 2, "removed": 3, "unchanged": 4}
    m = m.assign(_o=m["verdict"].map(order), _a=-m["change_pct"].abs().fillna(0))
    return m.sort_values(["metric", "_o", "_a"]).drop(columns=["_o", "_a"]).reset_index(drop=True)[
        ["metric", "key", "base", "new", "change_pct", "verdict", "gates", "reason"]]


def _reasons(m: pd.DataFrame, tracked: pd.Series, tolerance_pct: float) -> pd.Series:
    """Why each row does or does not decide the exit status, in words."""
    what = m["metric"].map(METRIC_WORDS).fillna(m["metric"])
    moved = np.where(m["metric"] == "share_pct", "moved the wrong way by more than", "grew by more than")
    unit = np.where(m["metric"] == "share_pct", " points", " %")
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
    return by_time_moved(d[(d["verdict"] == verdict) & (d["metric"] != "share_pct")], top)
