"""compute_memory_share: how GPU time splits between compute, communication, copies by kind and memset.

Two ways of counting, both kept: `sum_ns` adds op durations as `nsys stats` does (overlapping ops on
several streams count twice), `union_ns` is the wall-clock time each category alone explains, with
overlaps given to the higher-priority category (compute > communication > memcpy > memset).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import BadInputError, MissingTraceError
from ..gpu import MEMCPY_CATEGORY, PAGEABLE, PRIORITY, gpu_frames
from ..groups import SortedGroups
from ..inputs import Frame, arrow_of, dictionary_column, sorted_place
from ..intervals import outermost, split_into_windows, union_lengths
from ..iterations import NCCL_KERNEL_RE, matching, range_arrays
from ..lazy import pd
from . import Metric, Recipe, indented, ms_cell

NEEDS = {"nvtx", "kernel", "memcpy", "memset"}
CATEGORIES = [*PRIORITY, "idle"]


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


LEVEL = {c: i for i, c in enumerate(PRIORITY)}  # a category's place in PRIORITY


def _ops(rank_data) -> dict:
    """The rank's kernels, then copies, then memsets as arrays: times, device, priority level, bytes and
    whether a copy touched pageable memory."""
    parts = []
    k = rank_data.frame("kernels")
    if k is not None and len(k):
        codes, words = k.codes("name")  # the regex on the few distinct names, spread by code
        nccl = matching(words, NCCL_KERNEL_RE)[codes]
        parts.append((k, np.where(nccl, LEVEL["communication"], LEVEL["compute"]), None, None))
    m = rank_data.frame("memcpy")
    if m is not None and len(m):
        kind = m.values("copy_kind", fill=0)
        level = np.full(len(m), LEVEL["memcpy_other"])
        for copy_kind, category in MEMCPY_CATEGORY.items():
            level[kind == copy_kind] = LEVEL[category]
        pageable = (m.values("src_kind", fill=-1) == PAGEABLE) | (m.values("dst_kind", fill=-1) == PAGEABLE)
        parts.append((m, level, "bytes", pageable))
    s = rank_data.frame("memset")
    if s is not None and len(s):
        parts.append((s, np.full(len(s), LEVEL["memset"]), "bytes" if "bytes" in s else None, None))

    def column(frame, col, fill, dtype=np.int64):
        return frame.values(col, fill=fill) if col in frame else np.full(len(frame), fill, dtype)

    def known(frame, col):
        return ~frame.is_null(col) if col in frame else np.zeros(len(frame), bool)

    return {
        "start": np.concatenate([f.values("start_ns") for f, *_ in parts]),
        "end": np.concatenate([f.values("end_ns") for f, *_ in parts]),
        "device": np.concatenate([column(f, "device", 0) for f, *_ in parts]),
        "has_device": np.concatenate([known(f, "device") for f, *_ in parts]),
        "level": np.concatenate([level for _, level, _, _ in parts]).astype(np.int64),
        "bytes": np.concatenate([column(f, b, 0) if b else np.zeros(len(f), np.int64) for f, _, b, _ in parts]),
        "has_bytes": np.concatenate([known(f, b) if b else np.zeros(len(f), bool) for f, _, b, _ in parts]),
        "pageable": np.concatenate([np.zeros(len(f), bool) if p is None else p for f, _, _, p in parts]),
    }


def _split(ops: dict, group: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, dict]:
    """Per window (group 0..len(lo)-1) and category: ops, sum, union, bytes and pageable copies, and idle: the
    rest of the window. Rows by category (PRIORITY order, then idle), then window; a category's row is kept
    when it has ops or union time. Returns each row's window and the columns."""
    n, c = len(lo), len(PRIORITY)
    cell = group * c + ops["level"]
    ops_n = np.bincount(cell, minlength=n * c)
    sum_ns = _sum_by(cell, ops["end"] - ops["start"], n * c)
    has_bytes = ops["has_bytes"]
    bytes_n = np.bincount(cell[has_bytes], minlength=n * c)
    bytes_sum = _sum_by(cell[has_bytes], ops["bytes"][has_bytes], n * c)
    pageable = np.bincount(cell[ops["pageable"]], minlength=n * c)
    covered = np.zeros((c + 1, n), np.int64)  # covered[i]: union of the first i categories, per window
    present = np.bincount(ops["level"], minlength=c) > 0
    for i in range(c):  # a pass per category present, each vectorised over all ops
        covered[i + 1] = covered[i]
        if present[i]:
            sel = ops["level"] <= i
            groups, lengths = union_lengths(group[sel], ops["start"][sel], ops["end"][sel])
            covered[i + 1][groups] = lengths
    union = np.concatenate([(covered[1:] - covered[:-1]).ravel(), hi - lo - covered[c]])
    window = np.tile(np.arange(n), c + 1)
    category = np.repeat(np.arange(c + 1), n)  # c: idle
    at = np.where(category < c, window * c + np.minimum(category, c - 1), 0)
    real = category < c
    count = np.where(real, ops_n[at], 0)
    keep = (union > 0) | (count > 0) | ~real
    at, real, count = at[keep], real[keep], count[keep]
    with_bytes = real & (bytes_n[at] > 0)
    return window[keep], {
        "category": category[keep],  # codes into CATEGORIES
        "union_ns": union[keep],
        "ops": count,
        "sum_ns": np.where(real, sum_ns[at], 0),
        "bytes": np.where(with_bytes, bytes_sum[at], 0),
        "has_bytes": with_bytes,
        "pageable_ops": np.where(real, pageable[at], 0),
    }


def _sum_by(cell: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Exact integer sums of values per cell (np.bincount's weights would go through float)."""
    out = np.zeros(size, np.int64)
    np.add.at(out, cell, values.astype(np.int64, copy=False))
    return out


def _table(columns: dict, words: dict) -> pa.Table:
    """A split's columns (`bytes` null where `has_bytes` is false; string columns as codes into `words`)
    as an Arrow table."""
    arrays = {}
    for name, values in columns.items():
        if name in words:
            arrays[name] = dictionary_column(values, words[name])
        elif name != "has_bytes":
            valid = columns["has_bytes"] if name == "bytes" else None
            arrays[name] = arrow_of(np.asarray(values, np.int64), valid=valid)
    return pa.Table.from_arrays(list(arrays.values()), names=list(arrays))


SHARE_DTYPES = {"device": "Int64", "category": "str", "union_ns": "int64", "ops": "int64", "sum_ns": "int64",
                "bytes": "Int64", "pageable_ops": "int64"}
BY_RANGE_DTYPES = {"range_name": "str", "category": "str", "instances": "int64", "ops": "int64", "sum_ns": "int64",
                   "union_ns": "int64", "bytes": "Int64", "pageable_ops": "int64"}


def map_rank(rank_data, options: dict) -> dict:
    rank_data.require("gpu", "compute_memory_share")
    if not gpu_frames(rank_data):
        return {"share": None, "by_range": None}
    ops = _ops(rank_data)
    # per device: windows from each device's first op start to its last op end (ops with no device: none)
    on = ops["has_device"]
    devices, group = np.unique(ops["device"][on], return_inverse=True)
    dev_ops = {k: v[on] for k, v in ops.items()}
    lo = np.full(len(devices), np.iinfo(np.int64).max)
    hi = np.full(len(devices), np.iinfo(np.int64).min)
    np.minimum.at(lo, group, dev_ops["start"])
    np.maximum.at(hi, group, dev_ops["end"])
    window, cols = _split(dev_ops, group.astype(np.int64), lo, hi)
    share = _table({"device": devices[window], **cols}, {"category": CATEGORIES})
    by_range = None
    r = range_arrays(rank_data.frame("nvtx"))
    if len(r):
        top = _top_level(r.tid, r.start_ns, r.end_ns)
        top_start, top_end = r.start_ns[top], r.end_ns[top]
        ev, win, cs, ce = split_into_windows(ops["start"], ops["end"], top_start, top_end)
        clipped = {**{k: v[ev] for k, v in ops.items()}, "start": cs, "end": ce}
        window, cols = _split(clipped, win, top_start, top_end)
        by_range = _by_name(r.name[top][window], r.names, cols)
    return {"share": share, "by_range": by_range}


def _by_name(names: np.ndarray, words: np.ndarray, cols: dict) -> pa.Table:
    """The windows' rows summed per (range name, category), both in sorted order; instances: how many
    windows of that name had the category (a window has one row per category). names: codes into words."""
    groups = SortedGroups(sorted_place(words[:-1])[names] * len(CATEGORIES)
                          + sorted_place(CATEGORIES)[cols["category"]])

    def total(values):
        return groups.sum(np.asarray(values, np.int64))

    lead = groups.lead
    return _table({"range_name": names[lead], "category": cols["category"][lead],
                   "instances": groups.size, "ops": total(cols["ops"]),
                   "sum_ns": total(cols["sum_ns"]), "union_ns": total(cols["union_ns"]), "bytes": total(cols["bytes"]),
                   "has_bytes": total(cols["has_bytes"]) > 0, "pageable_ops": total(cols["pageable_ops"])},
                  {"range_name": words[:-1], "category": CATEGORIES})


def _top_level(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Positions of the ranges not enclosed by another range on the same thread, in time order, made
    non-overlapping across threads by keeping the earliest of any overlap (so each GPU op is counted once)."""
    top = outermost(tid, start, end)
    top = top[np.argsort(start[top], kind="stable")]
    s, e = start[top], end[top]
    return top[np.r_[True, s[1:] >= np.maximum.accumulate(e)[:-1]]] if len(top) else top


def reduce(per_rank: list[dict], options: dict) -> dict:
    parts = [r for r in per_rank if r["share"] is not None]
    if not parts:
        raise BadInputError("no GPU work in any input: compute_memory_share needs CUDA kernels, memcpy or "
                            "memset; profile with `nsys profile -t cuda,nvtx`")
    share = _percentages(_ranked_frame(parts, "share", SHARE_DTYPES), ["rank", "device"])
    share = share[["rank", "device", "category", "ops", "sum_ns", "union_ns", "pct_sum", "pct_union", "bytes",
                   "bandwidth_gbps", "pageable_ops"]]
    tables = {"share": share}
    ranges = [r for r in per_rank if r["by_range"] is not None]
    if ranges:
        by_range = _percentages(_ranked_frame(ranges, "by_range", BY_RANGE_DTYPES), ["rank", "range_name"])
        tables["by_range"] = by_range[["rank", "range_name", "category", "instances", "ops", "sum_ns", "union_ns",
                                       "pct_sum", "pct_union", "bytes", "bandwidth_gbps", "pageable_ops"]]
    return tables


def _ranked_frame(per_rank: list[dict], key: str, dtypes: dict) -> pd.DataFrame:
    """The ranks' Arrow tables `key` as one pandas frame, with a trailing rank column."""
    df = Frame(pa.concat_tables([r[key] for r in per_rank]), dtypes).to_pandas()
    df["rank"] = np.repeat(np.array([r["rank"] for r in per_rank], np.int64), [r[key].num_rows for r in per_rank])
    return df


def summary(out) -> list[str]:
    share = pd.read_parquet(out / "share.parquet")
    t = share.groupby("category")[["sum_ns", "union_ns"]].sum()
    total = t["union_ns"].sum()
    t = t.assign(**{"sum ms": t["sum_ns"].map(ms_cell), "wall ms": t["union_ns"].map(ms_cell),
                    "wall %": (100 * t["union_ns"] / total).map(lambda v: f"{v:.1f}")})
    return indented("GPU time by category, all ranks:", t[["sum ms", "wall ms", "wall %"]].to_string())


def headline(out) -> str:
    s = pd.read_parquet(out / "share.parquet").groupby("category")["union_ns"].sum()
    pct = 100 * s / s.sum()
    copies = pct[pct.index.str.startswith("memcpy")].sum()
    return (f"compute {pct.get('compute', 0):.1f} %, communication {pct.get('communication', 0):.1f} %, "
            f"copies {copies:.1f} %, idle {pct.get('idle', 0):.1f} %")


def diff_metrics(ranks) -> pd.DataFrame | None:
    """Kernel time by kernel name, and each category's share of the run's GPU wall time."""
    rows = []
    kernels = [rank_data.kernels for rank_data in ranks if rank_data.kernels is not None and len(rank_data.kernels)]
    if kernels:
        k = pd.concat(kernels, ignore_index=True)
        t = (k["end_ns"] - k["start_ns"]).groupby(k["name"]).sum()
        rows.append(pd.DataFrame({"metric": "kernel_total_ns", "key": t.index, "value": t.to_numpy(np.float64)}))
    parts = []
    for rank_data in ranks:
        try:
            table = map_rank(rank_data, {})["share"]
        except MissingTraceError:  # a rank without GPU work has no shares
            continue
        if table is not None:
            parts.append(Frame(table, SHARE_DTYPES).to_pandas())
    if parts:
        s = pd.concat(parts, ignore_index=True).groupby("category")["union_ns"].sum()
        rows.append(pd.DataFrame({"metric": "share_pct", "key": s.index, "value": (100.0 * s / s.sum()).to_numpy()}))
    return pd.concat(rows, ignore_index=True) if rows else None


RECIPE = Recipe(
    name="compute_memory_share",
    display_name="Compute vs memory share",
    description="How GPU time splits between compute, communication, copies by kind, memset and idle "
                "(plain sums and exclusive wall time).",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    bytes_per_row=260,  # 1.56 GB over 7.3 M rows
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.compute_memory_share",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("kernel_total_ns", "kernel time"),
             Metric("share_pct", "GPU time share", share=True, good_keys=("compute",), always_tracked=True)),
)
