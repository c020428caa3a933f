"""NVTX nesting without loops: stack levels of ranges, and the innermost range around given instants.

On one thread push/pop ranges nest properly, so the depth at an instant is (ranges started) minus
(ranges ended), and the range enclosing an instant at depth d is the latest range of level d that
started before it. Both are a sort, a cumulative sum and an as-of join.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def stack_levels(ranges: pd.DataFrame) -> pd.Series:
    """Level of each range on its thread (0 = outermost), index aligned with `ranges`."""
    n = len(ranges)
    if n == 0:
        return pd.Series(dtype="int64")
    ev = pd.DataFrame({
        "tid": np.concatenate([ranges["tid"].to_numpy(), ranges["tid"].to_numpy()]),
        "t": np.concatenate([ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()]),
        # at equal times an end comes before a start; a longer range starts before a shorter one
        "order": np.concatenate([np.ones(n, np.int64), np.zeros(n, np.int64)]),
        "neg_len": np.concatenate([-(ranges["end_ns"] - ranges["start_ns"]).to_numpy(), np.zeros(n, np.int64)]),
        "delta": np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)]),
        "row": np.concatenate([np.arange(n), np.full(n, -1)]),
    }).sort_values(["tid", "t", "order", "neg_len"], kind="mergesort")
    depth = ev.groupby("tid", sort=False)["delta"].cumsum()
    starts = ev["row"].to_numpy() >= 0
    level = np.empty(n, np.int64)
    level[ev["row"].to_numpy()[starts]] = depth.to_numpy()[starts] - 1
    return pd.Series(level, index=ranges.index)


def innermost(ranges: pd.DataFrame, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Position (into `ranges`) of the innermost range on the same thread enclosing [start, end], or -1."""
    m = len(tid)
    if m == 0 or len(ranges) == 0:
        return np.full(m, -1, np.int64)
    r = ranges.reset_index(drop=True)
    lvl = stack_levels(r).to_numpy()
    n = len(r)
    ev = pd.DataFrame({
        "tid": np.concatenate([r["tid"].to_numpy(), r["tid"].to_numpy(), np.asarray(tid, np.int64)]),
        "t": np.concatenate([r["start_ns"].to_numpy(), r["end_ns"].to_numpy(), np.asarray(start, np.int64)]),
        "order": np.concatenate([np.zeros(n, np.int64), np.zeros(n, np.int64) - 1, np.ones(m, np.int64)]),
        "delta": np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64), np.zeros(m, np.int64)]),
        "q": np.concatenate([np.full(2 * n, -1), np.arange(m)]),
    }).sort_values(["tid", "t", "order"], kind="mergesort")
    depth = ev.groupby("tid", sort=False)["delta"].cumsum().to_numpy()
    is_q = ev["q"].to_numpy() >= 0
    q_depth = np.empty(m, np.int64)
    q_depth[ev["q"].to_numpy()[is_q]] = depth[is_q]
    queries = pd.DataFrame({"q": np.arange(m), "tid": np.asarray(tid, np.int64), "t": np.asarray(start, np.int64),
                            "level": q_depth - 1}).sort_values("t", kind="mergesort")
    cands = pd.DataFrame({"pos": np.arange(n), "tid": r["tid"].to_numpy(np.int64), "t": r["start_ns"].to_numpy(np.int64),
                          "level": lvl}).sort_values("t", kind="mergesort")
    hit = pd.merge_asof(queries, cands, on="t", by=["tid", "level"], direction="backward")
    out = np.full(m, -1, np.int64)
    ok = hit["pos"].notna().to_numpy()
    pos = hit["pos"].to_numpy()[ok].astype(np.int64)
    q = hit["q"].to_numpy()[ok]
    contains = r["end_ns"].to_numpy()[pos] >= np.asarray(end, np.int64)[q]
    out[q[contains]] = pos[contains]
    return out


def parents(ranges: pd.DataFrame, levels: np.ndarray) -> np.ndarray:
    """Position of each range's parent (the enclosing range one level up on the same thread), or -1."""
    n = len(ranges)
    if n == 0:
        return np.zeros(0, np.int64)
    q = pd.DataFrame({"q": np.arange(n), "tid": ranges["tid"].to_numpy(np.int64),
                      "t": ranges["start_ns"].to_numpy(np.int64), "level": levels - 1}).sort_values("t", kind="mergesort")
    c = pd.DataFrame({"pos": np.arange(n), "tid": ranges["tid"].to_numpy(np.int64),
                      "t": ranges["start_ns"].to_numpy(np.int64), "level": levels}).sort_values("t", kind="mergesort")
    hit = pd.merge_asof(q, c, on="t", by=["tid", "level"], direction="backward")
    out = np.full(n, -1, np.int64)
    ok = hit["pos"].notna().to_numpy()
    out[hit["q"].to_numpy()[ok]] = hit["pos"].to_numpy()[ok].astype(np.int64)
    return out
