"""compute_memory_share: how GPU time splits between compute, communication, copies by kind and memset.

Two ways of counting, both kept: `sum_ns` adds op durations as `nsys stats` does (overlapping ops on
several streams count twice), `union_ns` is the wall-clock time each category alone explains, with
overlaps given to the higher-priority category (compute > communication > memcpy > memset).
"""

from __future__ import annotations

import numpy as np

from ..errors import BadInputError
from ..gpu import PRIORITY, gpu_ops
from ..intervals import split_into_windows, union_length
from ..iterations import closed_ranges
from ..lazy import pd

NEEDS = {"nvtx", "kernel", "memcpy", "memset"}
CATEGORIES = [*PRIORITY, "idle"]


def _split(ops: pd.DataFrame, keys: list[str], windows: pd.DataFrame | None = None) -> pd.DataFrame:
    """ops, sum, union, bytes and pageable copies per keys + category, and idle: the rest of each window.

    `windows` (keys + lo_ns + hi_ns) defaults to each group's active span, first op start to last op end.
    """
    ops = ops.assign(dur=ops["end_ns"] - ops["start_ns"])
    if windows is None:
        windows = ops.groupby(keys, as_index=False).agg(lo_ns=("start_ns", "min"), hi_ns=("end_ns", "max"))
    windows = windows.reset_index(drop=True)
    plain = ops.groupby([*keys, "category"]).agg(
        ops=("dur", "size"), sum_ns=("dur", "sum"), bytes=("bytes", lambda b: b.sum(min_count=1)),
        pageable_ops=("pageable", "sum")).reset_index()
    group = ops[keys].merge(windows[keys].reset_index(), on=keys, how="left")["index"].to_numpy()
    level = ops["category"].map({c: i for i, c in enumerate(PRIORITY)}).to_numpy()
    covered_before = pd.Series(0, index=windows.index, dtype="int64")
    rows = []
    for i, cat in enumerate(PRIORITY):  # a pass per category, each vectorised over all ops
        sel = level <= i
        u = union_length(group[sel], ops["start_ns"].to_numpy()[sel], ops["end_ns"].to_numpy()[sel])
        u = u.reindex(windows.index, fill_value=0)
        rows.append(windows[keys].assign(category=cat, union_ns=(u - covered_before).to_numpy()))
        covered_before = u
    rows.append(windows[keys].assign(category="idle",
                                     union_ns=(windows["hi_ns"] - windows["lo_ns"] - covered_before).to_numpy()))
    out = pd.concat(rows, ignore_index=True).merge(plain, on=[*keys, "category"], how="left")
    out = out[(out["union_ns"] > 0) | out["ops"].notna() | (out["category"] == "idle")].copy()
    out["ops"] = out["ops"].fillna(0).astype("int64")
    out["sum_ns"] = out["sum_ns"].fillna(0).astype("int64")
    out["pageable_ops"] = out["pageable_ops"].fillna(0).astype("int64")
    out["bytes"] = out["bytes"].astype("Int64")
    out["union_ns"] = out["union_ns"].astype("int64")
    return out.reset_index(drop=True)


def _percentages(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    busy = df["category"] != "idle"
    total_sum = df["sum_ns"].where(busy, 0).groupby([df[k] for k in keys]).transform("sum")
    total_union = df.groupby(keys)["union_ns"].transform("sum")
    df["pct_sum"] = np.where(busy & (total_sum > 0), 100.0 * df["sum_ns"] / total_sum.where(total_sum > 0, 1), np.nan)
    df["pct_union"] = 100.0 * df["union_ns"] / total_union.where(total_union > 0, 1)
    is_copy = df["category"].str.startswith("memcpy")
    df["bandwidth_gbps"] = np.where(is_copy & (df["sum_ns"] > 0),
                                    df["bytes"].astype("float64") / df["sum_ns"].where(df["sum_ns"] > 0, 1), np.nan)
    df.loc[~is_copy, "pageable_ops"] = pd.NA
    df["pageable_ops"] = df["pageable_ops"].astype("Int64")
    order = {c: i for i, c in enumerate(CATEGORIES)}
    return df.sort_values([*keys, "category"], key=lambda s: s.map(order) if s.name == "category" else s,
                          kind="mergesort").reset_index(drop=True)


def map_rank(rd, options: dict) -> dict:
    rd.require("gpu", "compute_memory_share")
    ops = gpu_ops(rd)
    share = _split(ops, ["device"]) if len(ops) else None
    by_range = None
    ranges = closed_ranges(rd.nvtx)
    if len(ranges) and len(ops):
        top = _top_level(ranges)
        ev, win, cs, ce = split_into_windows(ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy(),
                                             top["start_ns"].to_numpy(), top["end_ns"].to_numpy())
        clipped = ops.iloc[ev].assign(start_ns=cs, end_ns=ce, range_index=win).reset_index(drop=True)
        windows = pd.DataFrame({"range_index": np.arange(len(top)), "lo_ns": top["start_ns"].to_numpy(),
                                "hi_ns": top["end_ns"].to_numpy()})
        inst = _split(clipped, ["range_index"], windows)
        inst["range_name"] = top["name"].to_numpy()[inst["range_index"].to_numpy()]
        by_range = inst.groupby(["range_name", "category"], as_index=False).agg(
            instances=("range_index", "nunique"), ops=("ops", "sum"), sum_ns=("sum_ns", "sum"),
            union_ns=("union_ns", "sum"), bytes=("bytes", lambda b: b.sum(min_count=1)),
            pageable_ops=("pageable_ops", "sum"))
    return {"share": share, "by_range": by_range}


def _top_level(ranges: pd.DataFrame) -> pd.DataFrame:
    """Ranges not enclosed by another range on the same thread, in time order, made non-overlapping
    across threads by keeping the earliest of any overlap (so each GPU op is counted once)."""
    r = ranges.sort_values(["tid", "start_ns", "end_ns"], ascending=[True, True, False], kind="mergesort")
    reach = r.groupby("tid", sort=False)["end_ns"].cummax()
    prev = reach.groupby(r["tid"], sort=False).shift(1)
    top = r[prev.isna() | (r["start_ns"] >= prev)].sort_values("start_ns", kind="mergesort")
    prev_all = top["end_ns"].cummax().shift(1)
    return top[prev_all.isna() | (top["start_ns"] >= prev_all)].reset_index(drop=True)


def reduce(per_rank: list[dict], options: dict) -> dict:
    parts = [r["share"].assign(rank=r["rank"]) for r in per_rank if r["share"] is not None]
    if not parts:
        raise BadInputError("no GPU work in any input: compute_memory_share needs CUDA kernels, memcpy or "
                            "memset; profile with `nsys profile -t cuda,nvtx`")
    share = pd.concat(parts, ignore_index=True)
    share = _percentages(share, ["rank", "device"])
    share = share[["rank", "device", "category", "ops", "sum_ns", "union_ns", "pct_sum", "pct_union", "bytes",
                   "bandwidth_gbps", "pageable_ops"]]
    tables = {"share": share}
    ranges = [r["by_range"].assign(rank=r["rank"]) for r in per_rank if r["by_range"] is not None]
    if ranges:
        by_range = _percentages(pd.concat(ranges, ignore_index=True), ["rank", "range_name"])
        tables["by_range"] = by_range[["rank", "range_name", "category", "instances", "ops", "sum_ns", "union_ns",
                                       "pct_sum", "pct_union", "bytes", "bandwidth_gbps", "pageable_ops"]]
    return tables
