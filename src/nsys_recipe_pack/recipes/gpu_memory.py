"""gpu_memory: what each rank holds on its GPU over time, where it peaks, whether it leaks, and which rank is closest
to running out of memory.

From `nsys profile --cuda-memory-usage=true` (CUDA_GPU_MEMORY_USAGE_EVENTS): an allocation adds its bytes to its
device and memory kind, a free takes them away. The analysis is one fold over a rank's events in time order
(`MemoryFold.add`): a report read whole is one chunk, and any cut of the events into time-ordered chunks gives the
same tables (tests/test_gpu_memory.py), but for the timeline of a capture of more than 2 x TIMELINE_ROWS changes,
thinned as it goes: its points then depend on the cut, each stretch's lowest and highest kept exactly either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import MissingTraceError
from ..iterations import find_iterations, range_arrays
from ..lazy import pd
from ..nvtx import innermost_of, op_name
from . import Metric, Recipe, indented, iteration_options

NEEDS = {"memory", "nvtx", "kernel", "runtime"}
DEVICE = "Device"  # the memory kind cudaMalloc gives: what a GPU runs out of
POOL_RESERVED = "Device pool reserved"  # what stream-ordered pools hold of the GPU, used or not (localMemoryPoolSize)
LEAK_SHARE = 0.05  # a rank leaks when what it allocated in iterations and never freed exceeds this share of its peak
TIMELINE_ROWS = 20_000  # timeline rows kept per rank, device and kind; beyond, each bucket keeps its lowest and highest
ALLOC_API = re.compile(r"^cu(da)?(Malloc|MemAlloc|MemCreate|ArrayCreate|Array3DCreate)")
FREE_API = re.compile(r"^cu(da)?(Free|MemFree|MemRelease|ArrayDestroy)")
INT64_MIN = np.iinfo(np.int64).min
ITERATION_SUMS = ("alloc_bytes", "free_bytes", "allocs", "frees")
RANGE_SUMS = ITERATION_SUMS


@dataclass
class _Series:
    """One device and memory kind of a rank, as far as the fold has gone. Levels are raw: allocations minus frees
    since the capture began, which frees of memory allocated before it take below zero (`low`)."""
    level: int = 0
    low: int = 0
    peak: int = INT64_MIN
    peak_time: int = -1
    peak_range: str | None = None
    times: list = field(default_factory=list)
    levels: list = field(default_factory=list)
    held: int = 0  # timeline points held in times/levels
    ranges: list = field(default_factory=list)  # per NVTX range name: its RANGE_SUMS, a part per chunk (_ranges_of)


class MemoryFold:
    """The fold over one rank's memory events, given its iterations (start_ns, end_ns; empty arrays for none).

    Per device and memory kind it keeps the running level, its lowest and highest points, the timeline (thinned to
    about TIMELINE_ROWS points, keeping each bucket's extremes) and the sums per NVTX range; per iteration the level
    at its start and end, its highest level, and the bytes and counts allocated and freed inside it; and per (device,
    address) the allocations not freed yet, which are the leaks once the capture ends."""

    def __init__(self, it_start: np.ndarray, it_end: np.ndarray):
        self.it_start, self.it_end = np.asarray(it_start, np.int64), np.asarray(it_end, np.int64)
        self.series: dict[tuple[int, str], _Series] = {}
        self.per_iteration: dict[tuple[int, str], dict[str, np.ndarray]] = {}
        self.open = {c: np.zeros(0, np.int64) for c in ("device", "address", "bytes", "iteration")}
        self.open["kind"] = np.zeros(0, object)
        self.pool_size: dict[tuple[int, int], int] = {}  # (device, pool address) -> its size at the last event

    def add(self, chunk: dict) -> None:
        """Fold in the next events, in time order: start_ns, device, kind (names), op (0 allocates, 1 frees), bytes,
        address, range (the innermost NVTX range around each, None for none), and pool and pool_size (a stream-ordered
        pool's address and size after the event, 0 for memory from no pool)."""
        if not len(chunk["start_ns"]):
            return
        iteration = self._iteration_of(chunk["start_ns"])
        self._carry_open(chunk, iteration)
        kinds, kind_at = np.unique(chunk["kind"].astype(str), return_inverse=True)
        key = chunk["device"].astype(np.int64) * len(kinds) + kind_at.reshape(-1)
        for code in np.unique(key):
            rows = np.flatnonzero(key == code)
            self._fold_series((int(code // len(kinds)), str(kinds[code % len(kinds)])), chunk, rows, iteration[rows])
        self._fold_pools(chunk, iteration)

    def _fold_pools(self, chunk: dict, iteration: np.ndarray) -> None:
        """What the stream-ordered pools of each device hold, as a series of its own: each event of a pool changes
        the total by what the pool's size changed since its last event."""
        rows = np.flatnonzero(chunk["pool"] != 0)
        if not len(rows):
            return
        device, pool, size = chunk["device"][rows], chunk["pool"][rows], chunk["pool_size"][rows]
        order = np.lexsort((np.arange(len(rows)), pool, device))  # each pool's events together, in time order
        first = np.r_[True, (device[order][1:] != device[order][:-1]) | (pool[order][1:] != pool[order][:-1])]
        before = np.r_[0, size[order][:-1]]
        carried = np.array([self.pool_size.get((int(d), int(p)), 0) for d, p in zip(device[order][first],
                                                                                  pool[order][first], strict=True)])
        before[first] = carried
        change = np.empty(len(rows), np.int64)
        change[order] = size[order] - before
        last = np.r_[first[1:], True]
        for d, p, v in zip(device[order][last], pool[order][last], size[order][last], strict=True):
            self.pool_size[(int(d), int(p))] = int(v)
        reserved = {**{k: chunk[k][rows] for k in ("start_ns", "device", "range")},
                    "op": np.where(change >= 0, 0, 1), "bytes": np.abs(change)}
        for d in np.unique(device):
            on = np.flatnonzero(device == d)
            self._fold_series((int(d), POOL_RESERVED), reserved, on, iteration[rows][on])

    def _iteration_of(self, t: np.ndarray) -> np.ndarray:
        """The iteration each instant lies in (its start to its end, both in), -1 for none."""
        at = np.searchsorted(self.it_start, t, side="right") - 1
        inside = at >= 0
        inside[inside] = t[inside] <= self.it_end[at[inside]]
        return np.where(inside, at, -1)

    def _fold_series(self, key, chunk, rows: np.ndarray, iteration: np.ndarray) -> None:
        s = self.series.setdefault(key, _Series())
        t, size, alloc = chunk["start_ns"][rows], chunk["bytes"][rows], chunk["op"][rows] == 0
        before = s.level
        level = before + np.cumsum(np.where(alloc, size, -size))
        s.level, s.low = int(level[-1]), min(s.low, int(level.min()))
        top = int(np.argmax(level))
        if level[top] > s.peak:
            s.peak, s.peak_time, s.peak_range = int(level[top]), int(t[top]), chunk["range"][rows][top]
        s.times.append(t)
        s.levels.append(level)
        s.held += len(t)
        if s.held > 2 * TIMELINE_ROWS:  # thinned as it goes: bounded however long the capture
            kept_t, kept_l = thin(np.concatenate(s.times), np.concatenate(s.levels), TIMELINE_ROWS)
            s.times, s.levels, s.held = [kept_t], [kept_l], len(kept_t)
        self._by_range(s, chunk["range"][rows], alloc, size, level)
        if len(self.it_start):
            self._fold_iterations(key, t, level, before, alloc, size, iteration)

    @staticmethod
    def _by_range(s: _Series, ranges: np.ndarray, alloc: np.ndarray, size: np.ndarray, level: np.ndarray) -> None:
        named = np.flatnonzero(np.not_equal(ranges, None))
        if not len(named):
            return
        s.ranges.append({"name": ranges[named].astype(str), **_sums(alloc[named], size[named]),
                         "peak_bytes": level[named]})
        if sum(len(p["name"]) for p in s.ranges) > 4 * TIMELINE_ROWS:  # added up as it goes: bounded by the names
            s.ranges = [_ranges_of(s.ranges)]

    def _fold_iterations(self, key, t, level, before: int, alloc, size, iteration) -> None:
        n = len(self.it_start)
        it = self.per_iteration.setdefault(key, {
            **{c: np.zeros(n, np.int64) for c in ITERATION_SUMS}, "peak": np.full(n, INT64_MIN),
            "start": np.zeros(n, np.int64), "start_known": np.zeros(n, bool),
            "end": np.zeros(n, np.int64), "end_known": np.zeros(n, bool)})
        # the level just before an iteration starts is known once an event at or after its start has come, the level
        # at its end once an event after its end has: later chunks leave both as they are
        for bound, side, value, known in ((self.it_start, "left", "start", "start_known"),
                                          (self.it_end, "right", "end", "end_known")):
            decided = ~it[known] & ((bound <= t[-1]) if side == "left" else (bound < t[-1]))
            pos = np.searchsorted(t, bound[decided], side=side) - 1
            it[value][decided] = np.where(pos >= 0, level[np.maximum(pos, 0)], before)
            it[known] |= decided
        ok = iteration >= 0
        idx = iteration[ok]
        np.maximum.at(it["peak"], idx, level[ok])
        for c, v in _sums(alloc[ok], size[ok]).items():
            np.add.at(it[c], idx, v)

    def _carry_open(self, chunk: dict, iteration: np.ndarray) -> None:
        """The allocations still open after this chunk (no free of their device and address after them)."""
        new = {"device": chunk["device"], "address": chunk["address"], "bytes": chunk["bytes"],
               "iteration": iteration, "kind": chunk["kind"].astype(object)}
        both = {c: np.concatenate([self.open[c], new[c]]) for c in self.open}
        is_alloc = np.r_[np.ones(len(self.open["device"]), bool), chunk["op"] == 0]
        order = np.lexsort((np.arange(len(is_alloc)), both["address"], both["device"]))
        same = (both["device"][order][1:] == both["device"][order][:-1]) & \
            (both["address"][order][1:] == both["address"][order][:-1])
        freed_next = np.r_[same & ~is_alloc[order][1:], False]
        still = np.sort(order[is_alloc[order] & ~freed_next])
        self.open = {c: v[still] for c, v in both.items()}

    def result(self) -> dict:
        """Per device and kind: the figures of the series, its timeline, its iterations and its ranges."""
        out = []
        for key, s in sorted(self.series.items()):
            held_before = -s.low  # frees of memory the capture never saw allocated: held from its start
            t, level = thin(np.concatenate(s.times), np.concatenate(s.levels), TIMELINE_ROWS)
            leaked = (self.open["device"] == key[0]) & (self.open["kind"] == key[1]) & (self.open["iteration"] >= 0)
            peak_iteration = int(self._iteration_of(np.array([s.peak_time], np.int64))[0])
            row = {"device": key[0], "kind": key[1], "peak_bytes": s.peak + held_before, "peak_time_ns": s.peak_time,
                   "peak_iteration": peak_iteration if peak_iteration >= 0 else None,
                   "peak_range": s.peak_range, "held_before_bytes": held_before,
                   "held_at_end_bytes": s.level + held_before, "leaked_bytes": int(self.open["bytes"][leaked].sum()),
                   "leaked_allocs": int(leaked.sum()),
                   "leaked_iterations": int(len(np.unique(self.open["iteration"][leaked]))),
                   "time_ns": t, "bytes_in_use": level + held_before,
                   "ranges": {**(summed := _ranges_of(s.ranges)), "peak_bytes": summed["peak_bytes"] + held_before}}
            it = self.per_iteration.get(key)
            if it is not None:
                start = np.where(it["start_known"], it["start"], s.level) + held_before
                end = np.where(it["end_known"], it["end"], s.level) + held_before
                peak = np.maximum(np.where(it["peak"] > INT64_MIN, it["peak"] + held_before, start), start)
                row["iterations"] = {"iteration": np.arange(len(start)), "start_bytes": start, "end_bytes": end,
                                     "peak_bytes": peak, **{c: it[c] for c in ITERATION_SUMS}}
            out.append(row)
        return {"series": out}


def _sums(alloc: np.ndarray, size: np.ndarray) -> dict[str, np.ndarray]:
    """Each event's share of ITERATION_SUMS (RANGE_SUMS): its bytes as allocated or freed, and one of either."""
    return {"alloc_bytes": np.where(alloc, size, 0), "free_bytes": np.where(alloc, 0, size),
            "allocs": alloc.astype(np.int64), "frees": (~alloc).astype(np.int64)}


def _ranges_of(parts: list[dict]) -> dict:
    """Parts of per-event (or per-name) range rows added up per name: sums, and the highest level for the peak."""
    if not parts:
        return {"name": np.zeros(0, object), **{c: np.zeros(0, np.int64) for c in RANGE_SUMS}, "peak_bytes":
                np.zeros(0, np.int64)}
    names, at = np.unique(np.concatenate([p["name"] for p in parts]), return_inverse=True)
    at = at.reshape(-1)
    out = {"name": names.astype(object)}
    for c in RANGE_SUMS:
        out[c] = np.bincount(at, np.concatenate([p[c] for p in parts]), len(names)).astype(np.int64)
    out["peak_bytes"] = np.full(len(names), INT64_MIN)
    np.maximum.at(out["peak_bytes"], at, np.concatenate([p["peak_bytes"] for p in parts]))
    return out


def thin(t: np.ndarray, level: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """At most about `rows` points of a step line: cut into rows / 2 buckets of consecutive points, of which each
    keeps its lowest and highest point (the first of equals) exactly; the first and last points always stay."""
    n = len(t)
    if n <= rows:
        return t, level
    bucket = np.arange(n) * max(1, rows // 2) // n
    order = np.lexsort((np.arange(n), level, bucket))  # by bucket, then level, then position
    edge = np.r_[True, bucket[order][1:] != bucket[order][:-1]]
    keep = np.zeros(n, bool)
    keep[order[edge]] = True  # each bucket's lowest
    keep[order[np.r_[edge[1:], True]]] = True  # and highest
    keep[[0, n - 1]] = True
    return t[keep], level[keep]


def events_of(rank_data) -> dict:
    """The rank's memory events in time order, each with the innermost NVTX range around it: on the thread whose
    runtime call (joined on correlationId) made it, else the one started last among those open in the process then."""
    m = rank_data.frame("memory")
    order = np.argsort(m.values("start_ns"), kind="stable")
    codes, words = m.codes("kind")
    events = {"start_ns": m.values("start_ns")[order], "device": m.values("device")[order],
              "kind": np.where(codes < 0, "Unknown", np.asarray(words, object)[codes])[order].astype(object),
              "op": m.values("op")[order], "bytes": m.values("bytes")[order], "address": m.values("address")[order],
              "pool": m.values("pool")[order], "pool_size": m.values("pool_size")[order]}
    corr = m.values("correlation_id")[order]
    r = range_arrays(rank_data.frame("nvtx"))
    where = np.full(len(corr), -1, np.int64)
    runtime = rank_data.frame("runtime")
    if len(r) and len(corr) and runtime is not None and len(runtime):
        calls = runtime.values("correlation_id")
        by_corr = np.argsort(calls, kind="stable")
        at = np.minimum(np.searchsorted(calls[by_corr], corr), len(by_corr) - 1)
        hit = np.flatnonzero((calls[by_corr][at] == corr) & (corr > 0))
        call = by_corr[at[hit]]
        c_start = runtime.values("start_ns")[call]
        where[hit] = innermost_of(r.tid, r.start_ns, r.end_ns, runtime.values("tid")[call], c_start, c_start)
    lost = np.flatnonzero(where < 0)
    if len(r) and len(lost):  # the innermost range around the instant on any thread: the one started last
        t = events["start_ns"][lost]
        best = np.full(len(lost), -1, np.int64)
        for thread in np.unique(r.tid):  # threads with ranges: few
            pos = innermost_of(r.tid, r.start_ns, r.end_ns, np.full(len(lost), thread), t, t)
            later = (pos >= 0) & ((best < 0) | (r.start_ns[np.maximum(pos, 0)] > r.start_ns[np.maximum(best, 0)]))
            best[later] = pos[later]
        where[lost] = best
    names = np.asarray(r.names, object)
    events["range"] = np.where(where >= 0, names[r.name[np.maximum(where, 0)]] if len(r) else None, None)
    return events


def map_rank(rank_data, options: dict) -> dict:
    rank_data.require("memory", "gpu_memory")
    try:
        it = find_iterations(rank_data, options.get("iteration"), options.get("iteration_kernel"))
        it_start, it_end, delimiter = it.start_ns, it.end_ns, it.delimiter.as_dict()
    except MissingTraceError:  # nothing repeats: the capture as a whole
        it_start = it_end = np.zeros(0, np.int64)
        delimiter = {"kind": "none", "name": None, "domain": None, "source": "no repeating NVTX range or kernel"}
    fold = MemoryFold(it_start, it_end)
    fold.add(events_of(rank_data))
    gpus = rank_data.frame("gpus")
    total = dict(zip(gpus.values("device").tolist(), gpus.values("total_bytes").tolist(), strict=True)) \
        if gpus is not None else {}
    return {**fold.result(), "gpu_bytes": total, "calls": _calls(rank_data), "delimiter": delimiter,
            "start_ns": it_start}


def _calls(rank_data) -> dict:
    """How many allocating and freeing runtime calls the rank made and the time spent in them (they synchronize)."""
    runtime = rank_data.frame("runtime")
    out = {"alloc_calls": 0, "alloc_call_ns": 0, "free_calls": 0, "free_call_ns": 0}
    if runtime is None or not len(runtime):
        return out
    codes, words = runtime.codes("name")
    took = runtime.values("end_ns") - runtime.values("start_ns")
    for kind, pattern in (("alloc", ALLOC_API), ("free", FREE_API)):
        hit = np.array([w is not None and bool(pattern.match(str(w))) for w in words], bool)[codes]
        out[f"{kind}_calls"], out[f"{kind}_call_ns"] = int(hit.sum()), int(took[hit].sum())
    return out


RANK_COLUMNS = ["rank", "device", "kind", "peak_bytes", "peak_time_ns", "peak_iteration", "peak_range", "total_bytes",
                "headroom_pct", "held_before_bytes", "held_at_end_bytes", "leaked_bytes", "leaked_allocs",
                "leaked_iterations", "leak",
                "alloc_calls", "alloc_call_ns", "free_calls", "free_call_ns"]


def reduce(per_rank: list[dict], options: dict) -> dict:
    ranks, timeline, iterations, by_range = [], [], [], []
    for r in per_rank:
        for s in r["series"]:
            ranks.append({"rank": r["rank"], "device": s["device"], "kind": s["kind"],
                          **{c: s[c] for c in ("peak_bytes", "peak_time_ns", "peak_iteration", "peak_range",
                                               "held_before_bytes", "held_at_end_bytes", "leaked_bytes",
                                               "leaked_allocs", "leaked_iterations")},
                          "total_bytes": int(r["gpu_bytes"].get(s["device"], 0)), **r["calls"]})
            timeline.append(pd.DataFrame({"rank": r["rank"], "device": s["device"], "kind": s["kind"],
                                          "time_ns": s["time_ns"], "time_aligned_ns": s["time_ns"] + r["offset_ns"],
                                          "bytes_in_use": s["bytes_in_use"]}))
            if s["kind"] == DEVICE and "iterations" in s:
                iterations.append(pd.DataFrame({"rank": r["rank"], "device": s["device"], **s["iterations"]}))
            if s["kind"] == DEVICE and len(s["ranges"]["name"]):
                by_range.append(pd.DataFrame({"rank": r["rank"], "device": s["device"],
                                              "range": op_name(pd.Series(s["ranges"]["name"], dtype=object)),
                                              **{c: s["ranges"][c] for c in (*RANGE_SUMS, "peak_bytes")}}))
    ranks = pd.DataFrame(ranks, columns=[c for c in RANK_COLUMNS if c not in ("headroom_pct", "leak")])
    ranks["peak_iteration"] = ranks["peak_iteration"].astype("Int64")
    total = ranks["total_bytes"].where(ranks["total_bytes"] > 0)
    ranks["headroom_pct"] = 100.0 * (total - ranks["peak_bytes"]) / total
    ranks["leak"] = (ranks["kind"] == DEVICE) & (ranks["leaked_bytes"] > LEAK_SHARE * ranks["peak_bytes"])
    ranks = ranks[RANK_COLUMNS].sort_values(["kind", "rank", "device"], key=_device_first).reset_index(drop=True)
    timeline = (pd.concat(timeline, ignore_index=True) if timeline else
                pd.DataFrame(columns=["rank", "device", "kind", "time_ns", "time_aligned_ns", "bytes_in_use"]))
    iterations = (pd.concat(iterations, ignore_index=True) if iterations else
                  pd.DataFrame(columns=["rank", "device", "iteration", "start_bytes", "end_bytes", "peak_bytes",
                                        *ITERATION_SUMS]))
    iterations = iterations.astype("int64")
    by_range = (pd.concat(by_range, ignore_index=True) if by_range else
                pd.DataFrame(columns=["rank", "device", "range", *RANGE_SUMS, "peak_bytes"]))
    # PyTorch's emit_nvtx numbers every op instance: an op's instances as one row (nvtx.op_name)
    by_range = by_range.groupby(["rank", "device", "range"], as_index=False, sort=False).agg(
        {**dict.fromkeys(RANGE_SUMS, "sum"), "peak_bytes": "max"})
    by_range.insert(5, "net_bytes", by_range["alloc_bytes"] - by_range["free_bytes"])
    by_range = by_range.sort_values(["rank", "device", "alloc_bytes"], ascending=[True, True, False],
                                    kind="stable").reset_index(drop=True)
    for c in ("rank", "device", "alloc_bytes", "free_bytes", "net_bytes", "allocs", "frees", "peak_bytes"):
        by_range[c] = by_range[c].astype("int64")
    return {"ranks": ranks, "timeline": timeline, "iterations": iterations, "by_range": by_range,
            "findings": findings(ranks, iterations),
            "settings": {"leak_rule": f"a rank leaks when the device memory it allocated inside iterations and never "
                                      f"freed before the capture ends is above {LEAK_SHARE:.0%} of its peak"}}


def _device_first(column: pd.Series) -> pd.Series:
    return column.map(lambda v: (v != DEVICE, v)) if column.name == "kind" else column


def gib(n) -> str:
    """Bytes in words: GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n)} B"


def findings(ranks: pd.DataFrame, iterations: pd.DataFrame) -> pd.DataFrame:
    """One sentence each, the answer first: the rank closest to running out, the leaking ranks, allocation churn
    inside steps, and how unevenly the ranks hold memory."""
    rows = []
    device = ranks[ranks["kind"] == DEVICE]
    if not len(device):
        return pd.DataFrame(columns=["rank", "finding", "evidence"])
    with_total = device[device["total_bytes"] > 0]
    tight = (with_total.sort_values("headroom_pct").iloc[0] if len(with_total)
             else device.sort_values("peak_bytes", ascending=False).iloc[0])
    where = (f" in iteration {int(tight['peak_iteration'])}" if pd.notna(tight["peak_iteration"]) else "") + \
        (f", inside {tight['peak_range']}" if tight["peak_range"] else "")
    of = f" of {gib(tight['total_bytes'])} ({tight['headroom_pct']:.0f} % left)" if tight["total_bytes"] else ""
    rows.append((int(tight["rank"]), f"rank {int(tight['rank'])} peaks at {gib(tight['peak_bytes'])}{of}{where}",
                 f"device {int(tight['device'])}, at {int(tight['peak_time_ns'])} ns"))
    for r in device[device["leak"]].itertuples():
        rows.append((int(r.rank), f"rank {r.rank} leaks {gib(r.leaked_bytes)} in {r.leaked_iterations} iteration(s), "
                                  f"{gib(r.leaked_bytes / max(r.leaked_iterations, 1))} each: {r.leaked_allocs} "
                                  "allocation(s) made inside iterations and never freed",
                     f"{r.leaked_bytes / max(r.peak_bytes, 1):.0%} of its peak"))
    churn = iterations.groupby("rank").agg(allocs=("allocs", "median"), alloc_bytes=("alloc_bytes", "median"),
                                           iterations=("iteration", "size"))
    churn = churn[churn["allocs"] > 0].sort_values("alloc_bytes", ascending=False)
    if len(churn):
        rank, c = int(churn.index[0]), churn.iloc[0]
        calls = device[device["rank"] == rank].iloc[0]
        spent = (calls["alloc_call_ns"] + calls["free_call_ns"]) / c["iterations"] / 1e6
        others = f"; {len(churn) - 1} other rank(s) too" if len(churn) > 1 else ""
        rows.append((rank, f"rank {rank} allocates {gib(c['alloc_bytes'])} in {c['allocs']:.0f} allocation(s) inside "
                           f"each iteration (median): allocation churn{others}",
                     f"{spent:.2f} ms per iteration in allocating and freeing calls, which synchronize"))
    peaks = device.groupby("rank")["peak_bytes"].max()
    if len(peaks) > 1 and peaks.median() > 0:
        ratio = peaks.max() / peaks.median()
        rows.append((int(peaks.idxmax()), f"rank {int(peaks.idxmax())} holds {ratio:.2f}x the median rank's peak"
                     + (" (uneven: a pipeline's first stage, or an uneven shard)" if ratio > 1.2 else ""),
                     f"peaks from {gib(peaks.min())} to {gib(peaks.max())}"))
    return pd.DataFrame(rows, columns=["rank", "finding", "evidence"])


def summary(out) -> list[str]:
    ranks = pd.read_parquet(out / "ranks.parquet")
    device = ranks[ranks["kind"] == DEVICE]
    table = pd.DataFrame({"rank": device["rank"], "device": device["device"],
                          "peak": device["peak_bytes"].map(gib),
                          "headroom %": device["headroom_pct"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}"),
                          "leaked": device["leaked_bytes"].map(gib), "leak": device["leak"]})
    lines = indented("device memory per rank:", table.to_string(index=False)) if len(device) else [
        "no device memory allocated in the capture"]
    return lines + pd.read_parquet(out / "findings.parquet")["finding"].tolist()


def headline(out) -> str:
    said = pd.read_parquet(out / "findings.parquet")["finding"].tolist()
    return said[0] if said else "no device memory allocated in the capture"


def diff_metrics(ranks) -> pd.DataFrame | None:
    """The highest device memory peak of any rank, and the device memory leaked, over a run."""
    from ..errors import PackError
    from ..runner import analyse

    try:
        tables, _ = analyse("gpu_memory", ranks)
    except PackError:  # no memory events: no such metric
        return None
    device = tables["ranks"][tables["ranks"]["kind"] == DEVICE]
    if not len(device):
        return None
    return pd.DataFrame({"metric": ["peak_bytes", "leaked_bytes"], "key": "all ranks",
                         "value": [float(device["peak_bytes"].max()), float(device["leaked_bytes"].sum())]})


def add_options(add, framework: bool = False) -> None:
    iteration_options(add)


RECIPE = Recipe(
    name="gpu_memory",
    display_name="GPU memory",
    description="What each rank holds on its GPU over time, its peak and headroom, leaks, and the rank closest to "
                "running out of memory.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=add_options,
    per_iteration=True,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.gpu_memory",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("peak_bytes", "peak device memory", always_tracked=True),
             Metric("leaked_bytes", "leaked device memory", always_tracked=True, new_is_bad=True)),
)
