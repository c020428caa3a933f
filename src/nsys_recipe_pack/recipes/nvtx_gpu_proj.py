"""nvtx_gpu_proj: what each NVTX range costs on the GPU.

A GPU op (kernel, memcpy, memset) belongs to a range when the CUDA runtime call that launched it (joined
on correlationId and process) lies inside the range on the same thread; it then belongs to every
enclosing range too. By default (`--attribution process`) an op launched by a thread that has no NVTX
range open at the launch belongs to the ranges open on the other threads of its process then: PyTorch
launches backward kernels from its autograd thread, data loaders copy from pin-memory threads, and
without this `backward` would show almost no GPU time. `--attribution thread` keeps the launching
thread only, as Nsight Systems' `nvtx_gpu_proj_trace` does. A range's projection spans its ops' first
start to last end; `gpu_busy_ns` is the union of its ops, so kernels overlapping on two streams are not
counted twice. The projection is one fold over time (`STREAM`, below): a rank read whole is one span, a long capture
is projected span by span as it is read, each range handed over to be written once finished, so that neither its
tables nor its ranges are ever held whole.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..driver import fold_rank
from ..gpu import GPU_NEEDS, call_key, key_places, launch_keys, pair_launches
from ..groups import add_counts, distinct, factorize, one_of, picked, stable_order, sums_by_key
from ..inputs import NameIds, arrow_of, dictionary_column, numpy_of, ranked_tables, strings_of
from ..inputs.batches import RANGE_EVENTS
from ..inputs.chunks import END_OF_TIME, NotSorted, ReadWhole, Stream
from ..intervals import consecutive_union_lengths, union_lengths
from ..iterations import MIN_REPEATS, closed_range_mask, closed_ranges
from ..lazy import pd
from ..nvtx import (
    in_start_order,
    innermost_nested,
    innermost_of,
    nesting,
    op_name,
    start_order,
)
from ..spill import RankedRows, SpillWriter, output_schema, table_of
from . import Metric, Recipe, indented, ms, ms_cell

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime"}
ATTRIBUTIONS = ("process", "thread")
# the per-range table's columns and their pandas dtypes (nullable where a range may have no parent or no GPU op)
RANGE_DTYPES = {"name": "str", "domain": "str", "pid": "int64", "tid": "int64", "range_id": "int64",
                "parent_id": "Int64", "stack_level": "int64", "cpu_start_ns": "int64", "cpu_end_ns": "int64",
                "gpu_start_ns": "Int64", "gpu_end_ns": "Int64", "gpu_busy_ns": "Int64", "gpu_ops": "int64"}
# a rank's sums over its ranges of one name and domain, added across ranks (and pieces of a rank) into the summary
SUM_COLUMNS = ["count", "cpu_total_ns", "gpu_proj_total_ns", "gpu_busy_total_ns", "gpu_ops", "outermost_count"]
ID_BITS = 32  # a range's name and domain ids (each plus one) as one key: the name's above these bits


def launch_ranges(r_tid, r_pid, r_start, r_end, tid, pid, call_start, call_end, attribution: str = "process",
                  r_parent=None):
    """(launch, range) pairs: the innermost range around each launching call on its own thread; with
    attribution "process", for a call that no range of its own thread encloses, the innermost range
    enclosing it on each other thread of its process. Positions into the given arrays. `r_parent`: the ranges'
    parents, where they are known to nest properly and come in range order (nvtx.innermost_nested)."""
    def around(tid, start, end):
        if r_parent is None:
            return innermost_of(r_tid, r_start, r_end, tid, start, end)
        return innermost_nested(r_tid, r_start, r_end, r_parent, tid, start, end)

    pos = around(tid, call_start, call_end)
    launch = [np.flatnonzero(pos >= 0)]
    rng = [pos[launch[0]]]
    orphan = np.flatnonzero(pos < 0) if attribution == "process" else ()
    if len(orphan):
        threads, first = np.unique(r_tid, return_index=True)
        for thread, thread_pid in zip(threads, np.asarray(r_pid)[first], strict=True):  # threads with ranges: few
            q = orphan[(pid[orphan] == thread_pid) & (tid[orphan] != thread)]
            if len(q):
                hit = around(np.full(len(q), thread), call_start[q], call_end[q])
                launch.append(q[hit >= 0])
                rng.append(hit[hit >= 0])
    return np.concatenate(launch), np.concatenate(rng)


def map_rank(rank_data, options: dict) -> dict:
    """The projection a long capture goes through span by span (`STREAM`), over the rank's tables as one span."""
    rank_data.require("nvtx", "nvtx_gpu_proj")
    rank_data.require("runtime", "nvtx_gpu_proj")
    result = fold_rank(STREAM, rank_data, options, processes=True)  # calls pair with their own process's work
    if result["ranges"] is None:  # no range closed
        result["ranges"] = _rows_schema().empty_table()
    return result


def ranges_table(name: pa.Array, domain: pa.Array, columns: dict) -> pa.Table:
    """The per-range table from its columns as arrays (parent -1: none; GPU columns null where no op)."""
    has_op, parent = columns["gpu_ops"] > 0, columns["parent_id"]
    arrays = {"name": name, "domain": domain, **{c: arrow_of(columns[c]) for c in RANGE_DTYPES if c in columns},
              "parent_id": arrow_of(np.maximum(parent, 0), valid=parent >= 0),
              **{c: arrow_of(columns[c], valid=has_op) for c in ("gpu_start_ns", "gpu_end_ns", "gpu_busy_ns")}}
    return pa.table({c: arrays[c] for c in RANGE_DTYPES})


def range_sums(name: np.ndarray, domain: np.ndarray, columns: dict) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per name and domain of some ranges (ids, -1 none: one key a pair), how many, and the sums of their CPU time, GPU
    projection, GPU busy time and GPU ops, and how many are inside no other range (the summary's columns, before
    they are added across ranks)."""
    domains, domain_at = factorize(domain)  # a few: keys within a narrow span, counted rather than sorted
    has_op = columns["gpu_ops"] > 0
    keys, count, sums = sums_by_key(name * len(domains) + domain_at, [
        columns["cpu_end_ns"] - columns["cpu_start_ns"],
        np.where(has_op, columns["gpu_end_ns"] - columns["gpu_start_ns"], 0),
        np.where(has_op, columns["gpu_busy_ns"], 0), columns["gpu_ops"],
        (columns["stack_level"] == 0).astype(np.int64)])
    name, domain = np.divmod(keys, max(len(domains), 1))
    return ((name + 1) << ID_BITS) | (domains[domain] + 1), [count, *sums]


def _added(parts: list[tuple]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The sums of pieces (`range_sums`) added per name and domain."""
    if not parts:
        return np.zeros(0, np.int64), [np.zeros(0, np.int64) for _ in SUM_COLUMNS]
    keys, _, added = sums_by_key(np.concatenate([k for k, _ in parts]),
                                 [np.concatenate([s[i] for _, s in parts]) for i in range(len(SUM_COLUMNS))])
    return keys, added


def _sums_table(keys: np.ndarray, sums: list[np.ndarray], words: pa.Array) -> pa.Table:
    """Added sums as the map's result gives them, names and domains among `words`."""
    return pa.table({"name": dictionary_column((keys >> ID_BITS) - 1, words),
                     "domain": dictionary_column((keys & ((1 << ID_BITS) - 1)) - 1, words),
                     **dict(zip(SUM_COLUMNS, map(arrow_of, sums), strict=True))})


def _ranges_schema() -> pa.Schema:
    return output_schema({"rank": "int64", **RANGE_DTYPES})


def reduce(per_rank: list[dict], options: dict) -> dict:
    ranges = RankedRows(_ranges_schema(), [(r["rank"], r["ranges"]) for r in per_rank])
    sums_schema = output_schema({"name": "str", "domain": "str", **dict.fromkeys(SUM_COLUMNS, "int64")})
    sums = ranked_tables([{"rank": r["rank"], "sums": table_of(r["sums"]).cast(sums_schema)} for r in per_rank], "sums")
    sums = sums.to_pandas()
    summary = sums.groupby(["rank", "name", "domain"], as_index=False)[SUM_COLUMNS].sum()
    summary = summary.astype({"gpu_proj_total_ns": "Int64", "gpu_busy_total_ns": "Int64"})
    busy = summary["gpu_busy_total_ns"].astype("float64")
    summary["launch_ratio"] = np.where(busy > 0, summary["cpu_total_ns"] / busy.where(busy > 0, 1), np.nan)
    summary = summary.sort_values(["rank", "gpu_busy_total_ns"], ascending=[True, False]).reset_index(drop=True)
    return {"ranges": ranges, "summary": summary,
            "settings": {"unlinked_gpu_ops": int(sum(r["unlinked_ops"] for r in per_rank)),
                         "attribution": options.get("attribution") or "process"}}


def add_options(add, framework: bool = False) -> None:
    add("--attribution", choices=ATTRIBUTIONS, default="process",
        help="process (default): GPU work launched by a thread with no NVTX range open counts for the ranges open "
             "on the other threads of its process (PyTorch's autograd thread); thread: the launching thread "
             "only, as Nsight Systems' nvtx_gpu_proj_trace")


def summary(out, top: int = 8) -> list[str]:
    s = pd.read_parquet(out / "summary.parquet")
    t = s.groupby("name")[["count", "cpu_total_ns", "gpu_busy_total_ns"]].sum()
    t = t.sort_values("gpu_busy_total_ns", ascending=False).head(top)
    table = pd.DataFrame({"count": t["count"], "cpu ms": t["cpu_total_ns"].map(ms_cell),
                          "gpu busy ms": t["gpu_busy_total_ns"].map(ms_cell),
                          "cpu/gpu": (t["cpu_total_ns"] / t["gpu_busy_total_ns"].where(t["gpu_busy_total_ns"] > 0))
                          .map(lambda v: "" if pd.isna(v) else f"{v:.2f}")})
    table.index = [str(i)[:40] for i in table.index]
    return indented("ranges with the most GPU time, all ranks:", table.to_string())


def headline(out) -> str:
    """The range with the most GPU time; below the iteration's own range (one inside no other, repeating), which
    holds every step's GPU time and so says nothing."""
    s = pd.read_parquet(out / "summary.parquet")
    columns = [c for c in ("gpu_busy_total_ns", "count", "outermost_count") if c in s]  # earlier outputs lack one
    t = s.groupby("name")[columns].sum().sort_values("gpu_busy_total_ns", ascending=False)
    t = t[t["gpu_busy_total_ns"] > 0]
    if not len(t):
        return "no GPU work inside NVTX ranges"
    top = t.index[0]
    if "outermost_count" in t and t.at[top, "outermost_count"] == t.at[top, "count"] >= MIN_REPEATS:
        nested = t[t["outermost_count"] < t["count"]]
        if len(nested):
            return f"most GPU time below {top!s}: {nested.index[0]!s} ({ms(nested['gpu_busy_total_ns'].iloc[0])})"
    return f"most GPU time: {top!s} ({ms(t.at[top, 'gpu_busy_total_ns'])})"


def diff_metrics(ranks) -> pd.DataFrame | None:
    """Time inside NVTX ranges by name over a run, per op for PyTorch's per-instance names (nvtx.op_name)."""
    ranges = pd.concat([closed_ranges(rank_data.nvtx) for rank_data in ranks], ignore_index=True)
    if not len(ranges):
        return None
    t = (ranges["end_ns"] - ranges["start_ns"]).groupby(op_name(ranges["name"])).sum()
    return pd.DataFrame({"metric": "nvtx_total_ns", "key": t.index, "value": t.to_numpy(np.float64)})


# ---------------------------------------------------------------------------------------------------
# a long capture, span by span of time (inputs.chunks): the ranges handed to the driver as they are finished, which
# writes them (spill.py)

# a range not yet written: parent_at is its parent's place in `live` while that is there (else -1); name and domain
# are ids into the names met so far (`_Projection.words`; -1: none); pending counts the pairs still to come in it
# and in the ranges inside it; reach: its ops' latest end so far
LIVE = {"id": np.int64, "tid": np.int64, "pid": np.int64, "name": np.int64, "domain": np.int64, "start": np.int64,
        "end": np.int64, "level": np.int64, "parent": np.int64, "parent_at": np.int64, "gpu_start": np.int64,
        "gpu_end": np.int64, "busy": np.int64, "reach": np.int64, "ops": np.int64, "pending": np.int64, "late": bool}
NAMES = pa.dictionary(pa.int32(), pa.large_string())  # names as the ranges table gives them while it is made
HOLD_ROWS = 1 << 20  # finished ranges held back behind unfinished ones (to be written in order) before those go late
SUMS_ROWS = 1 << 20  # rows of sums by name and domain, piece by piece, before they are added up


class _Projection:
    """What a span-by-span projection carries: every GPU op's launch key with the ops still to come, the ranges not
    yet written (`live`, in range order), and the (key, range) pairs of the launching calls whose ops are still to
    come, each with the innermost range it counts for (`pending`, in order; a key by its place in `keys`, a range by
    its place in `live`): an op's figures are added to that range and passed up to the ranges around it."""

    def __init__(self, keys: np.ndarray, remaining: np.ndarray, options: dict):
        self.keys, self.remaining, self.attribution = keys, remaining, options.get("attribution") or "process"
        self.called = np.zeros(len(keys), bool)  # a call with this key was read
        self.arrived = np.zeros(len(keys), bool)  # an op with this key was read
        self.live = {c: np.zeros(0, t) for c, t in LIVE.items()}
        self.words = strings_of([], large=True)  # names and domains of NVTX ranges by the ids `live` holds
        self.pending_place, self.pending_at = np.zeros(0, np.int64), np.zeros(0, np.int64)
        # the pairs this span's calls made, not yet counted in `live`'s pending: most of them end within the span (their
        # ops come soon after their calls), and adding them up only to take them away again cost a tenth of a fold
        self.pending_fresh = np.zeros(0, bool)
        self.unlinked, self.pids = 0, set()
        self.late: list[pa.Table] = []
        self.sums: list[tuple] = []  # range_sums of the ranges taken out of `live`


def _prepare(ahead, options: dict) -> _Projection:
    """Every GPU op's launch key read ahead: a call that launches nothing is then dropped as it is read, and one
    whose ops have all come is let go. Each span's ranges are nested a span ahead of the fold; the per-range table
    is the reading's output, written as the spans finish its rows."""
    ahead.prefold(_nest)
    ahead.output("ranges", _ranges_writer)
    return _Projection(*launch_keys(ahead), options)


def _view(need: str, frame) -> pa.Table:
    """A span's rows: a range's times, thread, names (end null: never closed); a call's or op's times and key."""
    if need == "nvtx":
        ranges = picked(one_of(frame.values("event_type"), RANGE_EVENTS))
        closed = closed_range_mask(frame)[ranges]
        names = {}
        for col in ("name", "domain"):
            codes, words = frame.codes(col)
            names[col] = dictionary_column(codes[ranges], words[:-1])
        return pa.table({"start_ns": arrow_of(frame.values("start_ns")[ranges]),
                         "end_ns": arrow_of(frame.values("end_ns")[ranges], valid=closed),
                         "tid": arrow_of(frame.values("tid")[ranges]), "pid": arrow_of(frame.values("pid")[ranges]),
                         **names})
    columns = {"start_ns": arrow_of(frame.values("start_ns")), "end_ns": arrow_of(frame.values("end_ns")),
               "pid": arrow_of(frame.values("pid")), "key": arrow_of(call_key(frame))}
    if need == "runtime":
        columns["tid"] = arrow_of(frame.values("tid"))
    return pa.table(columns)


def _nest(state: _Projection, carried: dict, span_start: int, span_end: int, chunk: dict) -> dict:
    """What of a span needs only its rows, what `_prepare` made and what the spans before it left in `carried`, worked
    out a span ahead of the fold (AheadRequests.prefold): its closed NVTX ranges in range order with their ids, levels,
    parents and names, its launching calls with the ranges they count for, its GPU ops, each with its key's place,
    and the processes of its rows."""
    names = carried.setdefault("names", NameIds())  # names and domains of NVTX ranges met so far, by id
    pids = set()
    for rows in chunk.values():
        if rows is not None and rows.num_rows:
            pids.update(factorize(numpy_of(rows.column("pid")))[0].tolist())
    ranges, around = _ranges_of(carried, names, chunk.get("nvtx"), span_end)
    ops = [chunk[need] for need in GPU_NEEDS if chunk.get(need) is not None and chunk[need].num_rows]
    return {"nvtx": ranges, "calls": _calls_of(state, around, chunk.get("runtime")),
            "ops": _ops_of(state.keys, pa.concat_tables(ops)) if ops else None, "pids": pids, "words": names.arrow()}


def _calls_of(state: _Projection, around: dict, rows: pa.Table | None) -> dict | None:
    """A span's runtime calls that launch GPU ops (their keys' places), and each (call, range) pair of such a call
    and the innermost range it counts for, among the ranges open at the span's start or since (`around`)."""
    if rows is None or not rows.num_rows:
        return None
    at, called = key_places(state.keys, numpy_of(rows.column("key")))
    calls = np.flatnonzero(called)
    times = {c: numpy_of(rows.column(c))[calls] for c in ("tid", "pid", "start_ns", "end_ns")}
    launch, pos = launch_ranges(around["tid"], around["pid"], around["start"], around["end"], times["tid"],
                                times["pid"], times["start_ns"], times["end_ns"], state.attribution,
                                around["parent_at"] if around["nested"] else None)
    return {"at": at[calls], "launch": launch, "range": around["id"][pos]}


def _ops_of(keys: np.ndarray, rows: pa.Table) -> dict:
    """A span's GPU ops by start, with their keys' places."""
    key, start, end = (numpy_of(rows.column(c)) for c in ("key", "start_ns", "end_ns"))
    by_start = np.argsort(start, kind="stable")  # kernels, then copies, then sets: each in order of start already
    at, known = key_places(keys, key[by_start])
    if not len(keys) or not known.all():
        raise NotSorted("GPU ops the first read did not give")  # the export changed under the read
    return {"at": at, "start": start[by_start], "end": end[by_start]}


OPEN = ("id", "tid", "pid", "start", "end", "parent")  # what `_ranges_of` carries of a range that may still be open


def _ranges_of(carried: dict, names: NameIds, rows: pa.Table | None, span_end: int) -> tuple[dict | None, dict]:
    """A span's closed ranges (`_nest`), and the ranges open at its start or since, as `live` holds them then (in
    range order, each with its parent's place among them: `parent_at`). `carried` keeps the next id and the ranges
    that may still be open after the span (ends at or after its end: so all open at the next one's start)."""
    opened = carried.get("open") or {c: np.zeros(0, np.int64) for c in OPEN}
    if rows is not None and rows.num_rows:
        ranges, around = _closed_ranges(carried, names, rows, opened, span_end)
    else:  # a parent is open while the range is: among them, which come in order of id
        ranges, around = None, {**opened, "parent_at": np.where(opened["parent"] >= 0,
                                                                np.searchsorted(opened["id"], opened["parent"]), -1),
                                "nested": True}
    still = around["end"] >= span_end
    carried["open"] = {c: around[c][still] for c in OPEN}
    return ranges, around


def _closed_ranges(carried: dict, names: NameIds, rows: pa.Table, opened: dict, span_end: int) -> tuple[dict, dict]:
    """A span's closed ranges in range order, with their ids (following `carried`'s next), levels, parents (ids) and
    names (ids), from its rows and the ranges open at its start (`opened`); and those ranges after the open ones, as
    `_ranges_of` gives them (`nested`: whether none of them cross)."""
    closed = ~numpy_of(rows.column("end_ns").is_null(), True)
    start, end = numpy_of(rows.column("start_ns")), numpy_of(rows.column("end_ns"))
    take = None  # the closed ranges in range order: the rows as they come (a span's usually are), else one take
    if not closed.all() or not in_start_order(start, end):
        take = np.flatnonzero(closed)
        take = take[start_order(start[take], end[take])]

    def ordered(values: np.ndarray) -> np.ndarray:
        return values if take is None else values[take]

    start, end = ordered(start), ordered(end)
    tid, pid = (ordered(numpy_of(rows.column(c))) for c in ("tid", "pid"))
    name, domain = (ordered(names.ids_in(rows.column(c))) for c in ("name", "domain"))
    next_id = carried.get("next_id", 0)
    ids = next_id + np.arange(len(start), dtype=np.int64)
    carried["next_id"] = next_id + len(start)
    # a range's level counts the ranges open at its start, and its parent is one of them: the earlier ones still
    # open then were open at the span's start (in range order, before these)
    around = {c: np.r_[opened[c], v] for c, v in (("id", ids), ("tid", tid), ("pid", pid), ("start", start),
                                                  ("end", end))}
    c_levels, c_parents = nesting(around["tid"], around["start"], around["end"])
    new = slice(len(opened["id"]), None)
    at, levels = c_parents[new], c_levels[new]
    # a parent (there is one above level 0) starts first and ends last, unless the two cross: the ranges open at an
    # instant are then no chain, which the ranges carried to the next span must be (the last span carries none)
    nested = not np.any((at >= 0) & (around["end"][np.maximum(at, 0)] < end))
    if not nested and span_end < END_OF_TIME:
        raise NotSorted("NVTX ranges that cross on one thread")
    around["nested"] = nested
    # the open ones are the chains of ranges around the span's start, each one's parent the one before it
    around["parent"] = np.where(c_parents >= 0, around["id"][np.maximum(c_parents, 0)], -1)
    around["parent_at"] = c_parents
    return {"id": ids, "tid": tid, "pid": pid, "name": name, "domain": domain, "start": start, "end": end,
            "level": levels, "parent": around["parent"][new]}, around


def _rows_schema() -> pa.Schema:
    """The ranges as the folds give them."""
    return pa.schema([("name", NAMES), ("domain", NAMES), *((c, pa.int64()) for c in list(RANGE_DTYPES)[2:])])


def _ranges_writer(folder: str | None) -> SpillWriter:
    """What the driver writes the ranges with as the fold finishes them: the output's Parquet file (spill.py)."""
    return SpillWriter(_rows_schema(), "range_id", folder, output=_ranges_schema())


def _fold(state: _Projection, span_start: int, span_end: int, chunk: dict) -> pa.Table | None:
    """A span into the projection; the ranges it finished, in range order (the driver writes them)."""
    state.pids |= chunk["pids"]
    state.words = chunk["words"]
    _add_ranges(state, chunk["nvtx"])
    _add_calls(state, chunk["calls"])
    if chunk["ops"] is not None:
        _add_ops(state, chunk["ops"])
    _add_up(state.live, state.pending_at[state.pending_fresh], 1)  # the span's pairs still waiting for ops
    state.pending_fresh[:] = False
    return _take_finished(state, span_end)


def _add_ranges(state: _Projection, new: dict | None) -> None:
    """A span's closed ranges (`_nest`) into `live`, each with its parent's place there."""
    if new is None or not len(new["id"]):
        return
    live = state.live
    parent, first = new["parent"], new["id"][0]
    # a parent among these ranges, or still open so not yet written: in `live`, which holds ranges in range order
    before = (parent >= 0) & (parent < first)
    parent_at = np.where(parent >= 0, len(live["id"]) + parent - first, -1)
    parent_at[before] = np.searchsorted(live["id"], parent[before])
    n = len(parent)
    for c, t in LIVE.items():
        value = new.get(c, {"parent_at": parent_at, "gpu_start": np.iinfo(np.int64).max,
                            "gpu_end": np.iinfo(np.int64).min, "reach": np.iinfo(np.int64).min}.get(c, 0))
        live[c] = np.concatenate([live[c], np.broadcast_to(np.asarray(value, t), n)])


def _add_calls(state: _Projection, calls: dict | None) -> None:
    """A span's launching calls (`_calls_of`): each (key, range) pair of a call and the innermost range it counts
    for, kept until the key's ops have all come; each range counts the pairs in it and below it (`pending`), the new
    ones once the span's ops are in (`_Projection.pending_fresh`)."""
    if calls is None or not len(calls["at"]):
        return
    at = calls["at"]
    if state.arrived[at].any():
        raise NotSorted("a GPU op that starts before the call that launched it")
    state.called[at] = True
    if not len(calls["launch"]):
        return
    live = state.live
    # the pairs as one sortable integer each: (key's place, range's place)
    size = len(live["id"]) + 1
    if len(state.keys) * size >= 1 << 62:
        raise ReadWhole("too many GPU ops and open ranges to pair in spans")
    new = at[calls["launch"]] * size + np.searchsorted(live["id"], calls["range"])  # each range still there
    pairs = np.r_[state.pending_place * size + state.pending_at, new]
    if (np.diff(new) > 0).all() and (not len(state.pending_place) or new[0] > pairs[len(state.pending_place) - 1]):
        known = np.arange(len(pairs)) < len(state.pending_place)  # pairs of new keys, in order: the usual case
    else:
        order = np.argsort(pairs, kind="stable")
        pairs, fresh = pairs[order], order >= len(state.pending_place)
        first = np.r_[True, pairs[1:] != pairs[:-1]]
        known = np.zeros(int(first.sum()), bool)  # a pair an earlier call made already: it counts once
        known[(np.cumsum(first) - 1)[~fresh]] = True
        pairs = pairs[first]
    state.pending_place, state.pending_at = np.divmod(pairs, size)
    state.pending_fresh = ~known


def _add_up(live: dict, ranges: np.ndarray, step: int) -> None:
    """Add `step` to the pending pairs of these ranges (repeats counting) and of every range around them: up each
    one's chain, where `_rolled_up` takes every live range (a span's few such ranges among many live ones)."""
    while len(ranges):
        add_counts(live["pending"], ranges, step)
        ranges = live["parent_at"][ranges]
        ranges = ranges[ranges >= 0]


def _add_ops(state: _Projection, gpu_ops: dict) -> None:
    """A span's GPU ops (`_ops_of`) into the ranges their calls count for; the pairs of keys whose ops have all come
    go."""
    at, start, end = gpu_ops["at"], gpu_ops["start"], gpu_ops["end"]
    state.arrived[at] = True
    state.unlinked += int(np.count_nonzero(~state.called[at]))
    op, pair = pair_launches(at, state.pending_place)
    live = state.live
    where = state.pending_at[pair]  # each op's innermost ranges
    if len(op):
        # the ops of each thread's ranges together, in order of start: the ranges of two threads launching at once
        # take turns among all ops, and come one after another among their own thread's (consecutive_union_lengths)
        _, thread = factorize(live["tid"][where])
        order = stable_order(thread)
        place = np.empty(len(op), np.int64)
        place[order] = np.arange(len(op))
        ops = op[order]
        ranges, figures = _rolled_up(live, where, {"first": (place, np.minimum, len(op)),
                                                   "last": (place, np.maximum, -1),
                                                   "count": (np.ones(len(op), np.int64), np.add, 0),
                                                   "reach": (end[op], np.maximum, np.iinfo(np.int64).min)})
        live["gpu_start"][ranges] = np.minimum(live["gpu_start"][ranges], start[ops[figures["first"]]])
        live["gpu_end"][ranges] = np.maximum(live["gpu_end"][ranges], figures["reach"])
        live["ops"][ranges] += figures["count"]
        _take_back_repeats(live, where, op)
        floor = live["reach"][ranges]
        busy, right = consecutive_union_lengths(figures["first"], figures["last"], figures["count"], floor,
                                                start[ops], end[ops], thread[order])
        if not right.all():
            busy[~right] = _union_beyond_reach(live, ranges[~right], where, op, start, end)
        live["busy"][ranges] += busy
        live["reach"][ranges] = np.maximum(live["reach"][ranges], figures["reach"])
    add_counts(state.remaining, at, -1)
    done = state.remaining[state.pending_place] == 0
    if done.any():
        _add_up(live, state.pending_at[done & ~state.pending_fresh], -1)
        state.pending_place, state.pending_at = state.pending_place[~done], state.pending_at[~done]
        state.pending_fresh = state.pending_fresh[~done]


def _take_back_repeats(live: dict, where: np.ndarray, op: np.ndarray) -> None:
    """Take back from the live ranges' op counts each op the roll-up counted again: an op whose key several calls hold
    (pairs of one op: together, `pair_launches`) counts once in each range around any of them, also in the ranges
    around two of them. The times need nothing of the kind: a union, a least start and a greatest end take an op
    once however often they are given it."""
    repeated = np.r_[op[1:] == op[:-1], False]
    if not repeated.any():  # one call an op, as usual
        return
    several = repeated | np.r_[False, repeated[:-1]]
    ranges, ops = _chain_pairs(live, where[several], op[several])
    width = int(op.max()) + 1
    pairs = distinct(ranges * width + ops)  # each (range, op) once
    add_counts(live["ops"], ranges, -1)
    add_counts(live["ops"], pairs // width, 1)


def _chain_pairs(live: dict, where: np.ndarray, op: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(range, op) of each op with each range around its innermost ones (`where`), the innermost included, an op as
    often as it is given."""
    pair_range, pair_op = [], []
    while len(where):
        pair_range.append(where)
        pair_op.append(op)
        parent = live["parent_at"][where]
        where, op = parent[parent >= 0], op[parent >= 0]
    if not pair_range:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(pair_range), np.concatenate(pair_op)


def _rolled_up(live: dict, where: np.ndarray, values: dict) -> tuple[np.ndarray, dict]:
    """The ranges with an op of the span in them or below them (in range order), and each one's figures over those
    ops, from each op's innermost ranges (`where`) and the ops' own figures (name: values, ufunc, none)."""
    n = len(live["id"])
    figures = {}
    for name, (v, ufunc, empty) in values.items():
        figures[name] = np.full(n, empty, np.int64)
        ufunc.at(figures[name], where, v)
    held = np.zeros(n, bool)
    held[where] = True
    up = np.flatnonzero(held)  # from each innermost range once, however many ops it has
    while len(up):  # every range around the ops' innermost ones
        up = live["parent_at"][up]
        up = up[up >= 0]
        up = up[~held[up]]
        held[up] = True
    ranges = np.flatnonzero(held)
    level = live["level"][ranges]
    order = stable_order(level)  # a slice per level, where a mask per level took every range again
    by_level = ranges[order]
    bounds = np.searchsorted(level[order], np.arange(int(level.max(initial=0)) + 2))
    for depth in range(len(bounds) - 2, 0, -1):  # the deepest first: each gives its figures to its parent
        inner = by_level[bounds[depth]:bounds[depth + 1]]
        parent = live["parent_at"][inner]
        inner, parent = inner[parent >= 0], parent[parent >= 0]
        for name, (_, ufunc, _) in values.items():
            ufunc.at(figures[name], parent, figures[name][inner])
    return ranges, {name: f[ranges] for name, f in figures.items()}


def _union_beyond_reach(live: dict, ranges: np.ndarray, where: np.ndarray, op: np.ndarray, start: np.ndarray,
                        end: np.ndarray) -> np.ndarray:
    """What a span's ops add to these ranges' GPU busy time (the union of theirs beyond each one's reach so far), each
    op paired with every range around its innermost ones, and sorted: for the ranges whose ops are not one after
    another."""
    wanted = np.zeros(len(live["id"]), bool)
    wanted[ranges] = True
    g, i = _chain_pairs(live, where, op)
    g, i = g[wanted[g]], i[wanted[g]]
    s, e = np.maximum(start[i], live["reach"][g]), end[i]
    beyond = e > s
    lengths = np.zeros(len(ranges), np.int64)
    slow_ranges, slow_lengths = union_lengths(g[beyond], s[beyond], e[beyond])
    lengths[np.searchsorted(ranges, slow_ranges)] = slow_lengths
    return lengths


def _take_finished(state: _Projection, span_end: int) -> pa.Table | None:
    """The ranges that are finished (closed before the span's end, no op of theirs to come), in range order, taken out
    of `live`. Finished ranges behind an unfinished one wait, up to HOLD_ROWS of them; past that the oldest unfinished
    go `late`: kept aside when finished, merged back into their places when the output is written."""
    live = state.live
    finished = (live["end"] < span_end) & (live["pending"] == 0)
    if np.count_nonzero(~live["late"]) > HOLD_ROWS:
        live["late"] |= (np.arange(len(finished)) < len(finished) - HOLD_ROWS // 2) & ~finished
    if not live["late"].any():  # as usual: the finished ranges before the first unfinished one, a prefix
        return _take_prefix(state, int(np.argmin(finished)) if not finished.all() else len(finished))
    blocking = np.flatnonzero(~finished & ~live["late"])
    in_order = finished & ~live["late"] & (np.arange(len(finished)) < (blocking[0] if len(blocking) else len(finished)))
    late = finished & live["late"]
    taken = _rows_of(state, in_order) if in_order.any() else None
    if late.any():
        state.late.append(_rows_of(state, late))
    gone = in_order | late
    if gone.any():
        place = np.where(gone, -1, np.cumsum(~gone) - 1)  # each range's place once the written ones are gone
        live["parent_at"] = np.where(live["parent_at"] >= 0, place[np.maximum(live["parent_at"], 0)], -1)
        state.pending_at = place[state.pending_at]  # a range a pair names is not finished, so still there
        state.live = {c: v[~gone] for c, v in live.items()}
    return taken


def _take_prefix(state: _Projection, count: int) -> pa.Table | None:
    """The first `count` live ranges (finished, none late), the rest kept: slices, where a mask takes copies of every
    column."""
    if not count:
        return None
    taken = _rows_of(state, slice(0, count))
    live = state.live
    live["parent_at"] = np.where(live["parent_at"] >= count, live["parent_at"] - count, -1)
    state.pending_at = state.pending_at - count  # a range a pair names is not finished, so still there
    state.live = {c: v[count:] for c, v in live.items()}
    return taken


def _rows_of(state: _Projection, chosen: np.ndarray | slice) -> pa.Table:
    """Some live ranges as the per-range table; their sums are added to the rank's."""
    live = state.live
    columns = {"pid": live["pid"][chosen], "tid": live["tid"][chosen], "range_id": live["id"][chosen],
               "parent_id": live["parent"][chosen], "stack_level": live["level"][chosen],
               "cpu_start_ns": live["start"][chosen], "cpu_end_ns": live["end"][chosen],
               "gpu_start_ns": live["gpu_start"][chosen], "gpu_end_ns": live["gpu_end"][chosen],
               "gpu_busy_ns": live["busy"][chosen], "gpu_ops": live["ops"][chosen]}
    words = state.words
    name, domain = live["name"][chosen], live["domain"][chosen]
    state.sums.append(range_sums(name, domain, columns))
    if sum(len(keys) for keys, _ in state.sums) > SUMS_ROWS:
        state.sums = [_added(state.sums)]
    return ranges_table(dictionary_column(name, words), dictionary_column(domain, words), columns)


def _finish(state: _Projection, names: list) -> dict:
    """The map's result as `map_rank` gives it from a whole read, but for the ranges the folds gave: only those
    finished late (the driver puts them back in their places, spill.SpilledRows)."""
    late = pa.concat_tables(state.late) if state.late else None
    result = {"ranges": late, "sums": _sums_table(*_added(state.sums), state.words), "unlinked_ops": state.unlinked}
    # one process's work: its rank's. Several: no process's alone, which rank_data reads again whole
    return {next(iter(state.pids)) if len(state.pids) == 1 else None: result}


STREAM = Stream(needs=dict.fromkeys(("nvtx", "runtime", *GPU_NEEDS)), view=_view, fold=_fold, finish=_finish,
                prepare=_prepare, ahead=GPU_NEEDS)


RECIPE = Recipe(
    name="nvtx_gpu_proj",
    display_name="NVTX GPU projection",
    description="What each NVTX range costs on the GPU: its GPU ops projected onto it (start, end, busy "
                "union), and whether the GPU or the CPU launch path bounds it.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=add_options,
    lazy_tables=True,  # its ranges, a row per NVTX range of every rank, read a rank at a time as they are written
    bytes_per_row=450,  # 3.82 GB over 10.1 M rows, when its tables are read whole
    stream=STREAM,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.nvtx_gpu_proj",
    diff_metrics=diff_metrics,
    diff_needs=frozenset({"nvtx"}),
    metrics=(Metric("nvtx_total_ns", "NVTX time"),),
)
