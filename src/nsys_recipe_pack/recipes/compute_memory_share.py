"""compute_memory_share: how GPU time splits between compute, communication, copies by kind and memset.

Two ways of counting, both kept: `sum_ns` adds op durations as `nsys stats` does (overlapping ops on
several streams count twice), `union_ns` is the wall-clock time each category alone explains, with
overlaps given to the higher-priority category (compute > communication > memcpy > memset).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .. import collective_match, waiting
from ..driver import fold_rank
from ..errors import BadInputError, MissingTraceError
from ..gpu import MEMCPY_CATEGORY, PAGEABLE, PRIORITY
from ..groups import SortedGroups, factorize
from ..inputs import Frame, NameIds, arrow_of, dictionary_column, numpy_of, sorted_place
from ..inputs.chunks import END_OF_TIME, Stream
from ..intervals import outermost, prefix_union_lengths, split_into_windows
from ..iterations import NCCL_KERNEL_RE, closed_range_view, matching
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


GPU_NEEDS = [("kernel", "kernels"), ("memcpy", "memcpy"), ("memset", "memset")]


def _op_columns(need: str, frame) -> dict | None:
    """One GPU table's ops as `_ops` gives them (None when it has none)."""
    if frame is None or not len(frame):
        return None
    n = len(frame)
    bytes_col, pageable = None, np.zeros(n, bool)
    if need == "kernel":
        codes, words = frame.codes("name")  # the regex on the few distinct names, spread by code
        level = np.where(matching(words, NCCL_KERNEL_RE)[codes], LEVEL["communication"], LEVEL["compute"])
    elif need == "memcpy":
        kind = frame.values("copy_kind", fill=0)
        level = np.full(n, LEVEL["memcpy_other"])
        for copy_kind, category in MEMCPY_CATEGORY.items():
            level[kind == copy_kind] = LEVEL[category]
        pageable = (frame.values("src_kind", fill=-1) == PAGEABLE) | (frame.values("dst_kind", fill=-1) == PAGEABLE)
        bytes_col = "bytes"
    else:
        level = np.full(n, LEVEL["memset"])
        bytes_col = "bytes" if "bytes" in frame else None

    def column(col, fill):
        return frame.values(col, fill=fill) if col in frame else np.full(n, fill, np.int64)

    def known(col):
        return ~frame.is_null(col) if col in frame else np.zeros(n, bool)

    return {"start": frame.values("start_ns"), "end": frame.values("end_ns"), "device": column("device", 0),
            "has_device": known("device"), "level": level.astype(np.int64),
            "bytes": column(bytes_col, 0) if bytes_col else np.zeros(n, np.int64),
            "has_bytes": known(bytes_col) if bytes_col else np.zeros(n, bool), "pageable": pageable}


def _cells(ops: dict, group: np.ndarray, n: int, counted: np.ndarray | None = None,
           duration: np.ndarray | None = None) -> dict:
    """What `_rows` needs per (group, category), as sums over the ops, so that the cells of spans of time add up:
    ops, bytes and pageable copies over the `counted` ops (default all), the sum of `duration` (default
    end - start) and `covered[i]`, the union of the ops of the first i categories, over all of them."""
    c = len(PRIORITY)
    cell = group * c + ops["level"]
    counted = np.ones(len(cell), bool) if counted is None else counted
    duration = ops["end"] - ops["start"] if duration is None else duration
    has_bytes = ops["has_bytes"] & counted
    covered = prefix_union_lengths(group, ops["start"], ops["end"], ops["level"], c, n)
    return {"ops": np.bincount(cell[counted], minlength=n * c), "sum": _sum_by(cell, duration, n * c),
            "bytes_n": np.bincount(cell[has_bytes], minlength=n * c),
            "bytes": _sum_by(cell[has_bytes], ops["bytes"][has_bytes], n * c),
            "pageable": np.bincount(cell[ops["pageable"] & counted], minlength=n * c), "covered": covered}


def _rows(cells: dict, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, dict]:
    """Per window (0..len(lo)-1) and category: ops, sum, union, bytes and pageable copies, and idle: the rest of the
    window, from the cells of its windows. Rows by category (PRIORITY order, then idle), then window; a category's
    row is kept when it has ops or union time. Returns each row's window and the columns."""
    n, c = len(lo), len(PRIORITY)
    covered = cells["covered"]
    union = np.concatenate([(covered[1:] - covered[:-1]).ravel(), hi - lo - covered[c]])
    window = np.tile(np.arange(n), c + 1)
    category = np.repeat(np.arange(c + 1), n)  # c: idle
    at = np.where(category < c, window * c + np.minimum(category, c - 1), 0)
    real = category < c
    count = np.where(real, cells["ops"][at], 0)
    keep = (union > 0) | (count > 0) | ~real
    at, real, count = at[keep], real[keep], count[keep]
    with_bytes = real & (cells["bytes_n"][at] > 0)
    return window[keep], {
        "category": category[keep],  # codes into CATEGORIES
        "union_ns": union[keep],
        "ops": count,
        "sum_ns": np.where(real, cells["sum"][at], 0),
        "bytes": np.where(with_bytes, cells["bytes"][at], 0),
        "has_bytes": with_bytes,
        "pageable_ops": np.where(real, cells["pageable"][at], 0),
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
    """The rank's tables as one span of time through the fold below, which a long capture goes through span by
    span (`STREAM`); its NCCL kernels, which the fold keeps, for its communication's waiting (waiting.py)."""
    rank_data.require("gpu", "compute_memory_share")
    out = dict(fold_rank(STREAM, rank_data) or {"share": None, "by_range": None})
    return {**out, **collective_match.kernel_tables(out.pop("nccl", []))}


def _by_name(names: np.ndarray, words: np.ndarray, cols: dict) -> pa.Table:
    """The windows' rows summed per (range name, category), both in sorted order; instances: how many
    windows of that name had the category (a window has one row per category; rows that are sums of windows
    already carry their `instances`). names: codes into words."""
    groups = SortedGroups(sorted_place(words[:-1])[names] * len(CATEGORIES)
                          + sorted_place(CATEGORIES)[cols["category"]])

    def total(values):
        return groups.sum(np.asarray(values, np.int64))

    lead = groups.lead
    return _table({"range_name": names[lead], "category": cols["category"][lead],
                   "instances": total(cols["instances"]) if "instances" in cols else groups.size,
                   "ops": total(cols["ops"]),
                   "sum_ns": total(cols["sum_ns"]), "union_ns": total(cols["union_ns"]), "bytes": total(cols["bytes"]),
                   "has_bytes": total(cols["has_bytes"]) > 0, "pageable_ops": total(cols["pageable_ops"])},
                  {"range_name": words[:-1], "category": CATEGORIES})


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
    split = waiting.split(collective_match.match(per_rank, options), in_iterations=False)
    if split is not None:  # NCCL kernels matched across ranks: how much of them was waiting, and for whom
        tables["communication"] = split.ranks
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
    waited = waiting.summary_lines(pd.read_parquet(out / "communication.parquet")) \
        if (out / "communication.parquet").exists() else []
    return indented("GPU time by category, all ranks:", t[["sum ms", "wall ms", "wall %"]].to_string()) + waited


def headline(out) -> str:
    s = pd.read_parquet(out / "share.parquet").groupby("category")["union_ns"].sum()
    pct = 100 * s / s.sum()
    copies = pct[pct.index.str.startswith("memcpy")].sum()
    waited = waiting.phrase(pd.read_parquet(out / "communication.parquet")) \
        if (out / "communication.parquet").exists() else ""
    return (f"compute {pct.get('compute', 0):.1f} %, communication {pct.get('communication', 0):.1f} %"
            + (f" ({waited})" if waited else "") + f", copies {copies:.1f} %, idle {pct.get('idle', 0):.1f} %")


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


# The analysis, a span of time at a time (a rank read whole is one span; a long capture many, inputs.chunks): per
# process, each span's cells are added up, the ops still running at its end carried into the next span, and the
# top-level NVTX ranges (not enclosed by another on their thread, the earliest of any overlap across threads, so that
# each GPU op is counted once) found as they start.

OP_COLUMNS = ["start", "end", "device", "has_device", "level", "bytes", "has_bytes", "pageable"]
INT64_MIN = np.iinfo(np.int64).min


def _view(need: str, frame) -> pa.Table:
    """The columns a span's rows carry: an op's `_op_columns`, or `iterations.closed_range_view`."""
    if need == "nvtx":
        return closed_range_view(need, frame)
    ops = _op_columns(need, frame) or {c: np.zeros(0, bool if c in ("has_device", "has_bytes", "pageable")
                                                     else np.int64) for c in OP_COLUMNS}
    n = len(ops["start"])
    nccl = {"op": np.full(n, -1, np.int64), "stream": np.full(n, -1, np.int64)}  # a kernel's collective, its stream
    if need == "kernel" and n:
        nccl["op"], nccl["stream"] = collective_match.collective_kinds(frame), frame.values("stream", fill=-1)
    return pa.table({"start_ns": arrow_of(ops["start"]), **{c: arrow_of(ops[c]) for c in OP_COLUMNS[1:]},
                     **{c: arrow_of(v) for c, v in nccl.items()}, "pid": arrow_of(frame.values("pid"))})


class _Tops:
    """The top-level NVTX ranges of one process found so far, by the spans' prefold (`_by_process`)."""

    def __init__(self):
        self.thread_reach: dict[int, int] = {}
        self.reach = INT64_MIN  # of the top-level candidates across threads
        self.ranges = 0  # closed ranges seen
        self.names = NameIds()  # the windows' names, which `_Process.windows` and `by_name` hold as ids (-1: none)


class _Process:
    """What one process's spans add up to so far."""

    def __init__(self):
        self.devices: dict[int, dict] = {}  # device -> its cells, first start and last end
        self.carry = {c: np.zeros(0, np.int64) for c in (*OP_COLUMNS, "first_start")}
        self.tops = _Tops()  # the prefold's, once a span had rows of the process
        self.windows = {"start": np.zeros(0, np.int64), "end": np.zeros(0, np.int64), "name": np.zeros(0, np.int64)}
        self.window_cells: dict | None = None  # of the windows still open
        self.by_name: dict | None = None  # the closed windows' rows summed per (name, category)
        self.nccl: list[dict] = []  # each span's NCCL kernels: start, end, op, stream


def _by_process(state: dict, carried: dict, span_start: int, span_end: int, chunk: dict) -> dict:
    """A span's ops per process, and the top-level windows its ranges open: what needs only the span's rows and the
    ranges before it, found a span ahead of the fold (AheadRequests.prefold). carried: pid -> its `_Tops`."""
    ops = [chunk.get(need) for need, _ in GPU_NEEDS]
    ops = [t for t in ops if t is not None and t.num_rows]
    ops = pa.concat_tables(ops) if ops else None
    ranges = chunk.get("nvtx")
    pids = set()
    for t in (ops, ranges):
        if t is not None and t.num_rows:
            pids.update(factorize(numpy_of(t.column("pid")))[0].tolist())
    out = {}
    for pid in pids:
        tops = carried.setdefault(pid, _Tops())
        new = _rows_of(ops, pid, ["start_ns", *OP_COLUMNS[1:], "op", "stream"])
        new["start"] = new.pop("start_ns")
        op, stream = new.pop("op"), new.pop("stream")
        nccl = op >= 0
        out[pid] = {"ops": new, "tops": tops, "nccl": {"op": op[nccl], "stream": stream[nccl],
                                                       "start_ns": new["start"][nccl], "end_ns": new["end"][nccl]},
                    "windows": _top_level_windows(tops, _rows_of(ranges, pid, ["start_ns", "end_ns", "tid", "name"]))}
    return out


def _fold(state: dict, span_start: int, span_end: int, span: dict) -> None:
    pids = set(span) | {p for p, proc in state.items() if len(proc.carry["start"])}
    for pid in sorted(pids):
        proc = state.setdefault(pid, _Process())
        mine = span.get(pid)
        if mine is None:
            new = {c: np.zeros(0, np.int64) for c in OP_COLUMNS}
        else:
            proc.tops, new = mine["tops"], mine["ops"]
            proc.nccl.append(mine["nccl"])
            _open_windows(proc, mine["windows"])
        _fold_ops(proc, new, span_start, span_end)
        _close_windows(proc, span_end)


def _rows_of(table: pa.Table | None, pid: int, columns: list[str]) -> dict:
    """One process's rows of a span's table as arrays; names stay Arrow, made strings only for new windows."""
    if table is None or not table.num_rows:
        return {c: pa.nulls(0, pa.dictionary(pa.int32(), pa.string())) if c == "name" else np.zeros(0, np.int64)
                for c in columns}
    pids = numpy_of(table.column("pid"))
    on = slice(None) if pids[0] == pids[-1] and (pids == pid).all() else np.flatnonzero(pids == pid)
    return {c: (table.column(c) if isinstance(on, slice) else table.column(c).take(arrow_of(on))) if c == "name"
            else numpy_of(table.column(c))[on] for c in columns}


def _fold_ops(proc: _Process, new: dict, span_start: int, span_end: int) -> None:
    """A span's ops of one process (and those carried into it) into its devices' and windows' cells."""
    n_new = len(new["start"])
    pieces = {c: np.concatenate([new[c].astype(proc.carry[c].dtype), proc.carry[c]]) for c in OP_COLUMNS}
    pieces["first_start"] = np.concatenate([new["start"], proc.carry["first_start"]])
    counted = np.arange(len(pieces["start"])) < n_new  # an op's own row, not a part carried from a span before
    for c in ("has_device", "has_bytes", "pageable"):
        pieces[c] = pieces[c].astype(bool)
    later = pieces["end"] > span_end
    proc.carry = {c: v[later] for c, v in pieces.items()}
    proc.carry["start"] = np.full(int(later.sum()), span_end, np.int64)
    clipped = {**pieces, "end": np.minimum(pieces["end"], span_end)}
    # devices: an op's count, time and bytes where it starts, its union span by span
    on = clipped["has_device"]
    devices, group = factorize(clipped["device"][on])
    duration = np.zeros(len(counted), np.int64)
    duration[:n_new] = new["end"] - new["start"]
    dev_ops = {c: v[on] for c, v in clipped.items()}
    cells = _cells(dev_ops, group.reshape(-1).astype(np.int64), len(devices), counted[on], duration[on])
    c = len(PRIORITY)
    for i, device in enumerate(devices.tolist()):
        mine = group.reshape(-1) == i
        first = counted[on] & mine  # the device's first start and last end, from its ops' own rows
        d = proc.devices.setdefault(device, {"cells": None, "lo": np.iinfo(np.int64).max, "hi": INT64_MIN})
        if first.any():
            d["lo"] = min(d["lo"], int(dev_ops["start"][first].min()))
            d["hi"] = max(d["hi"], int(pieces["end"][on][first].max()))
        one = {k: (v[:, i:i + 1] if k == "covered" else v[i * c:(i + 1) * c]) for k, v in cells.items()}
        d["cells"] = one if d["cells"] is None else {k: d["cells"][k] + one[k] for k in one}
    # windows: an op's count and bytes in the span holding its first moment in the window, time span by span
    w = proc.windows
    open_at = np.flatnonzero(w["end"] > span_start) if len(w["end"]) else np.zeros(0, np.int64)
    if not len(open_at) or not len(clipped["start"]):
        return
    ws, we = w["start"][open_at], w["end"][open_at]
    ev, win, cs, ce = split_into_windows(clipped["start"], clipped["end"], ws, we)
    if not len(ev):
        return
    first = cs == np.maximum(pieces["first_start"][ev], ws[win])
    parts = {**{k: v[ev] for k, v in clipped.items()}, "start": cs, "end": ce}
    span_cells = _cells(parts, win, len(ws), first, ce - cs)
    cells = proc.window_cells
    cells["covered"][:, open_at] += span_cells["covered"]
    at = (open_at[:, None] * c + np.arange(c)).ravel()
    for k in ("ops", "sum", "bytes_n", "bytes", "pageable"):
        cells[k][at] += span_cells[k]


def _top_level_windows(tops: _Tops, ranges: dict) -> dict | None:
    """The top-level ranges among those starting in a span, each thread's reach and the reach across threads carried
    from the spans before: the new windows in time order (start, end, name id), None without ranges."""
    n = len(ranges["start_ns"])
    if not n:
        return None
    tops.ranges += n
    start, end, tid = ranges["start_ns"], ranges["end_ns"], ranges["tid"]
    threads = factorize(tid)[0]  # a few, sorted
    carried = np.array([t for t in threads.tolist() if t in tops.thread_reach], np.int64)
    reach = np.array([tops.thread_reach[t] for t in carried.tolist()], np.int64)
    k = len(carried)
    top = outermost(np.r_[carried, tid], np.r_[np.full(k, INT64_MIN), start], np.r_[reach, end])
    top = top[top >= k] - k
    for t, high in zip(*_max_by(tid, end), strict=True):
        tops.thread_reach[t] = max(tops.thread_reach.get(t, INT64_MIN), high)
    top = top[np.argsort(start[top], kind="stable")]
    s, e = start[top], end[top]
    before = np.maximum.accumulate(np.r_[tops.reach, e])[:-1]
    tops.reach = max(tops.reach, int(e.max())) if len(e) else tops.reach
    new = top[s >= before]
    return {"start": start[new], "end": end[new], "name": tops.names.ids_in(ranges["name"].take(arrow_of(new)))}


def _open_windows(proc: _Process, new: dict | None) -> None:
    """Appends a span's new windows (`_top_level_windows`), with empty cells."""
    if new is None:
        return
    proc.windows = {k: np.concatenate([v, new[k]]) for k, v in proc.windows.items()}
    n, c = len(new["start"]), len(PRIORITY)
    grown = {"ops": c, "sum": c, "bytes_n": c, "bytes": c, "pageable": c}
    cells = proc.window_cells or {**{k: np.zeros(0, np.int64) for k in grown},
                                  "covered": np.zeros((c + 1, 0), np.int64)}
    proc.window_cells = {**{k: np.r_[cells[k], np.zeros(n * c, np.int64)] for k in grown},
                         "covered": np.concatenate([cells["covered"], np.zeros((c + 1, n), np.int64)], axis=1)}


def _close_windows(proc: _Process, until: int) -> None:
    """Adds the windows ending by `until` into their names' totals and lets go of them: every op of a later span
    starts at `until` or after, so none can land in them (memory then holds the windows still open, not the
    capture's)."""
    w = proc.windows
    done = w["end"] <= until
    if not done.any():
        return
    c = len(PRIORITY)
    cells = proc.window_cells

    def part(keep):
        return {k: v[:, keep] if k == "covered" else v[np.repeat(keep, c)] for k, v in cells.items()}

    window, cols = _rows(part(done), w["start"][done], w["end"][done])
    rows = {"name": w["name"][done][window], "instances": np.ones(len(window), np.int64), **cols}
    if proc.by_name is not None:
        rows = {k: np.concatenate([proc.by_name[k], v]) for k, v in rows.items()}
    # names as ids, not strings: sorting thousands of strings a span took most of a fold with many windows
    groups = SortedGroups(rows["name"] * len(CATEGORIES) + rows["category"])
    proc.by_name = {k: v[groups.lead] if k in ("name", "category") else groups.sum(np.asarray(v, np.int64))
                    for k, v in rows.items()}
    open_ = ~done
    proc.windows = {k: v[open_] for k, v in w.items()}
    proc.window_cells = part(open_)


def _max_by(keys: np.ndarray, values: np.ndarray) -> tuple[list, list]:
    groups = SortedGroups(keys)
    return groups.keys.tolist(), groups.max(values).tolist()


def _finish(state: dict, names: list) -> dict:
    """Each process's map result, as `map_rank` gives it from a whole read."""
    words = np.array([*names, None], object)
    place = {w: i for i, w in enumerate(names)}
    out = {}
    for pid, proc in state.items():
        share = None
        if proc.devices:
            devices = sorted(proc.devices)
            cells = {k: (np.concatenate([proc.devices[d]["cells"][k] for d in devices], axis=1) if k == "covered"
                         else np.concatenate([proc.devices[d]["cells"][k] for d in devices]))
                     for k in proc.devices[devices[0]]["cells"]}
            lo = np.array([proc.devices[d]["lo"] for d in devices], np.int64)
            hi = np.array([proc.devices[d]["hi"] for d in devices], np.int64)
            window, cols = _rows(cells, lo, hi)
            share = _table({"device": np.array(devices, np.int64)[window], **cols}, {"category": CATEGORIES})
        by_range = None
        if proc.tops.ranges:
            _close_windows(proc, END_OF_TIME)
            totals = proc.by_name
            words_of = [*proc.tops.names.words, None]  # -1: none
            codes = np.array([place[words_of[i]] for i in totals["name"].tolist()], np.int64)
            by_range = _by_name(codes, words, {k: v for k, v in totals.items() if k != "name"})
        out[pid] = {"share": share, "by_range": by_range, "nccl": proc.nccl}
    return out


def _prepare(ahead, options: dict) -> dict:
    """Nothing read ahead; each span's ranges nested a span ahead of the fold."""
    ahead.prefold(_by_process)
    return {}


STREAM = Stream(needs=dict.fromkeys(("kernel", "memcpy", "memset", "nvtx")), view=_view, fold=_fold, finish=_finish,
                prepare=_prepare)


RECIPE = Recipe(
    name="compute_memory_share",
    display_name="Compute vs memory share",
    description="How GPU time splits between compute, communication, copies by kind, memset and idle "
                "(plain sums and exclusive wall time).",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    bytes_per_row=260,  # 1.56 GB over 7.3 M rows, when its tables are read whole
    stream=STREAM,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.compute_memory_share",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("kernel_total_ns", "kernel time"),
             Metric("share_pct", "GPU time share", share=True, good_keys=("compute",), always_tracked=True)),
)
