"""gpu_memory: what each rank holds on its GPU over time, where it peaks, whether it leaks, and which rank is closest
to running out of memory.

From `nsys profile --cuda-memory-usage=true` (CUDA_GPU_MEMORY_USAGE_EVENTS): an allocation adds its bytes to its
device and memory kind, a free takes them away. The analysis is written once: the range around each event
(`Around`, which takes calls and ranges a part at a time) and one fold over the events in time order (`MemoryFold`),
which a long capture goes through batch by batch (`STREAM`) and a rank read whole as one batch (`map_rank`). Any cut
of the events into time-ordered chunks gives the same tables (tests/test_gpu_memory.py), but for the timeline of a
capture of more than 2 x TIMELINE_ROWS changes, thinned as it goes: its points then depend on the cut, each
stretch's lowest and highest kept exactly either way (both reads cut every FOLD_EVENTS events).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..driver import fold_rank
from ..gpu import call_key
from ..inputs import arrow_of, numpy_of
from ..inputs.chunks import Stream
from ..inputs.events import read_memory
from ..inputs.frames import column_codes
from ..iteration_scan import iterations_ahead
from ..iterations import closed_range_view
from ..lazy import pd
from ..nvtx import innermost_of, op_name
from ..spill import RankedRows, output_schema
from . import Metric, Recipe, indented, iteration_options

NEEDS = {"memory", "nvtx", "kernel", "runtime"}
DEVICE = "Device"  # the memory kind cudaMalloc gives: what a GPU runs out of
POOL_RESERVED = "Device pool reserved"  # what stream-ordered pools hold of the GPU, used or not (localMemoryPoolSize)
LEAK_SHARE = 0.05  # a rank leaks when what it allocated in iterations and never freed exceeds this share of its peak
FOLD_EVENTS = 1 << 20  # memory events folded at a time
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


def events_of(memory) -> dict:
    """A rank's memory events (its `memory` frame) in time order, each with the launch key of the runtime call that
    made it (gpu.call_key; -1 where it has no correlation id)."""
    order = np.argsort(memory.values("start_ns"), kind="stable")
    codes, words = memory.codes("kind")
    key = np.where(memory.values("correlation_id") > 0, call_key(memory), -1)
    return {"start_ns": memory.values("start_ns")[order], "device": memory.values("device")[order],
            "kind": np.where(codes < 0, "Unknown", np.asarray(words, object)[codes])[order].astype(object),
            "op": memory.values("op")[order], "bytes": memory.values("bytes")[order],
            "address": memory.values("address")[order], "pool": memory.values("pool")[order],
            "pool_size": memory.values("pool_size")[order], "key": key[order]}


class Around:
    """The innermost NVTX range around each memory event: on the thread of the runtime call that made it, at that
    call's start, else, of those open at the event on any thread, the one started last. The calls and the closed
    ranges come a part at a time (a rank read whole is one part; a long capture's come batch by batch): of nested
    ranges, the innermost around an instant is the one around it that started last, so parts in time order give what
    one part gives."""

    def __init__(self, events: dict):
        n = len(events["start_ns"])
        self.t, self.key = events["start_ns"], events["key"]
        self.call_tid, self.call_start = np.full(n, -1, np.int64), np.zeros(n, np.int64)
        # the start and name of the innermost range found so far: on the call's thread, and on any thread
        self.on_call = (np.full(n, INT64_MIN), np.full(n, None, object))
        self.on_any = (np.full(n, INT64_MIN), np.full(n, None, object))

    def add_calls(self, runtime) -> None:
        """Runtime calls: each event's own (the first with its launch key) gives its thread and start."""
        if runtime is None or not len(runtime):
            return
        keys = call_key(runtime)
        by_key = np.argsort(keys, kind="stable")
        at = np.minimum(np.searchsorted(keys[by_key], self.key), len(keys) - 1)
        hit = np.flatnonzero((self.call_tid < 0) & (self.key >= 0) & (keys[by_key][at] == self.key))
        call = by_key[at[hit]]
        self.call_tid[hit], self.call_start[hit] = runtime.values("tid")[call], runtime.values("start_ns")[call]

    def add_ranges(self, tid: np.ndarray, start: np.ndarray, end: np.ndarray, name: np.ndarray) -> None:
        """Closed ranges (name: each one's, None for none)."""
        if not len(tid):
            return
        called = np.flatnonzero(self.call_tid >= 0)
        at_call = self.call_start[called]
        self._keep(self.on_call, called, innermost_of(tid, start, end, self.call_tid[called], at_call, at_call),
                   start, name)
        every = np.arange(len(self.t))
        for thread in np.unique(tid):  # threads with ranges: few
            self._keep(self.on_any, every, innermost_of(tid, start, end, np.full(len(self.t), thread), self.t, self.t),
                       start, name)

    @staticmethod
    def _keep(best: tuple, at: np.ndarray, pos: np.ndarray, start: np.ndarray, name: np.ndarray) -> None:
        found = np.flatnonzero(pos >= 0)
        later = found[start[pos[found]] > best[0][at[found]]]
        best[0][at[later]], best[1][at[later]] = start[pos[later]], name[pos[later]]

    def names(self) -> np.ndarray:
        return np.where(self.on_call[0] > INT64_MIN, self.on_call[1], self.on_any[1])


def fold_events(events: dict, ranges: np.ndarray, it_start: np.ndarray, it_end: np.ndarray) -> dict:
    """MemoryFold over the events, FOLD_EVENTS at a time (however the rank was read)."""
    fold = MemoryFold(it_start, it_end)
    events = {**events, "range": ranges}
    for low in range(0, len(ranges), FOLD_EVENTS):
        fold.add({k: v[low:low + FOLD_EVENTS] for k, v in events.items()})
    return fold.result()


def map_rank(rank_data, options: dict) -> dict:
    """The rank's memory events, calls and ranges through the fold a long capture goes through a part at a time
    (`STREAM`), as one part each."""
    if rank_data.streamed is None:  # a long capture's memory events were read ahead, whole, and not kept
        rank_data.require("memory", "gpu_memory")
    return {**fold_rank(STREAM, rank_data, options), "gpu_bytes": _gpu_bytes(rank_data)}


_NO_ITERATIONS = (np.zeros(0, np.int64), np.zeros(0, np.int64),
                  {"kind": "none", "name": None, "domain": None, "source": "no repeating NVTX range or kernel"})


def _gpu_bytes(rank_data) -> dict:
    gpus = rank_data.frame("gpus")
    return dict(zip(gpus.values("device").tolist(), gpus.values("total_bytes").tolist(), strict=True)) \
        if gpus is not None else {}


def _calls(runtime, out: dict | None = None) -> dict:
    """How many allocating and freeing runtime calls the rank made and the time spent in them (they synchronize),
    added to `out`."""
    out = out or {"alloc_calls": 0, "alloc_call_ns": 0, "free_calls": 0, "free_call_ns": 0}
    if runtime is None or not len(runtime):
        return out
    codes, words = runtime.codes("name")
    took = runtime.values("end_ns") - runtime.values("start_ns")
    for kind, pattern in (("alloc", ALLOC_API), ("free", FREE_API)):
        hit = np.array([w is not None and bool(pattern.match(str(w))) for w in words], bool)[codes]
        out[f"{kind}_calls"] += int(hit.sum())
        out[f"{kind}_call_ns"] += int(took[hit].sum())
    return out


# A long capture (inputs.chunks): the kernels read once ahead for the rank's processes and GPUs, the iterations found
# ahead (iteration_scan.py), the memory events read whole (short beside the kernels and calls), the runtime calls a
# batch at a time, then the closed NVTX ranges span by span; every part goes through the same Around and fold_events.
KERNEL_EXTENT_COLUMNS = ["start", "end", "globalPid", "deviceId"]
RUNTIME_COLUMNS = ["start", "end", "globalTid", "correlationId", "nameId"]


def _prepare(ahead, options: dict) -> dict:
    for _ in ahead.spans("kernel", _start_view, KERNEL_EXTENT_COLUMNS):
        pass
    windows, _, _ = iterations_ahead(ahead, options)
    memory = ahead.whole("memory", read_memory)
    pid = memory.values("pid")
    state = {}
    for p in np.unique(pid).tolist():  # a few processes
        events = events_of(memory.filter(pid == p))
        state[p] = {"events": events, "around": Around(events), "calls": _calls(None),
                    "iterations": _iterations_ahead(windows.get(p), options)}
    for frame in ahead.frames("runtime", RUNTIME_COLUMNS):
        calls_pid = frame.values("pid")
        for p, mine in state.items():
            calls = frame.filter(calls_pid == p)  # each batch's calls sorted by key once, a process's apart
            mine["around"].add_calls(calls)
            _calls(calls, mine["calls"])
    return state


def _iterations_ahead(found, options: dict) -> tuple | str:
    """A process's iterations from iteration_scan.iterations_ahead, as map_rank takes them from find_iterations: none
    where nothing repeats, the error where the options named a delimiter that is not there."""
    if found is None or isinstance(found, str):
        if options.get("iteration") or options.get("iteration_kernel"):
            return found or "no iterations"
        return _NO_ITERATIONS
    return found.start_ns, found.end_ns, found.delimiter.as_dict()


def _start_view(need: str, frame) -> pa.Table:
    return pa.table({"start_ns": arrow_of(frame.values("start_ns"))})


def _fold(state: dict, span_start: int, span_end: int, chunk: dict) -> None:
    ranges = chunk.get("nvtx")
    if ranges is None or not ranges.num_rows:
        return
    pid = numpy_of(ranges.column("pid"))
    codes, words = column_codes(ranges.column("name"))
    columns = [numpy_of(ranges.column(c)) for c in ("tid", "start_ns", "end_ns")]
    for p, mine in state.items():
        on = pid == p
        mine["around"].add_ranges(*(c[on] for c in columns), words[codes[on]])


def _finish(state: dict, names: list) -> dict:
    out = {}
    for p, mine in state.items():
        if isinstance(mine["iterations"], str):
            out[p] = {"error": mine["iterations"]}
            continue
        it_start, it_end, delimiter = mine["iterations"]
        out[p] = {**fold_events(mine["events"], mine["around"].names(), it_start, it_end), "calls": mine["calls"],
                  "delimiter": delimiter, "start_ns": it_start}
    return out


STREAM = Stream(needs={"nvtx": None}, view=closed_range_view, fold=_fold, finish=_finish, prepare=_prepare,
                ahead=("kernel", "runtime", "memory"))


RANK_COLUMNS = ["rank", "device", "kind", "peak_bytes", "peak_time_ns", "peak_iteration", "peak_range", "total_bytes",
                "headroom_pct", "held_before_bytes", "held_at_end_bytes", "leaked_bytes", "leaked_allocs",
                "leaked_iterations", "leak",
                "alloc_calls", "alloc_call_ns", "free_calls", "free_call_ns"]


ITERATION_COLUMNS = ["iteration", "start_bytes", "end_bytes", "peak_bytes", *ITERATION_SUMS]
RANGE_COLUMNS = ["alloc_bytes", "free_bytes", "net_bytes", "allocs", "frees", "peak_bytes"]


def reduce(per_rank: list[dict], options: dict) -> dict:
    """ranks.parquet and what findings need (each rank's allocations per iteration, as medians) from every rank
    first; the per-event and per-iteration tables then made a rank at a time as they are written."""
    ranks, churn = [], []
    for r in per_rank:
        for s in r["series"]:
            ranks.append({"rank": r["rank"], "device": s["device"], "kind": s["kind"],
                          **{c: s[c] for c in ("peak_bytes", "peak_time_ns", "peak_iteration", "peak_range",
                                               "held_before_bytes", "held_at_end_bytes", "leaked_bytes",
                                               "leaked_allocs", "leaked_iterations")},
                          "total_bytes": int(r["gpu_bytes"].get(s["device"], 0)), **r["calls"]})
        steps = _device_iterations(r)
        if steps:
            allocs, alloc_bytes = (np.concatenate([s["iterations"][c] for s in steps])
                                   for c in ("allocs", "alloc_bytes"))
            churn.append({"rank": r["rank"], "allocs": np.median(allocs), "alloc_bytes": np.median(alloc_bytes),
                          "iterations": len(allocs)})
    ranks = pd.DataFrame(ranks, columns=[c for c in RANK_COLUMNS if c not in ("headroom_pct", "leak")])
    ranks["peak_iteration"] = ranks["peak_iteration"].astype("Int64")
    total = ranks["total_bytes"].where(ranks["total_bytes"] > 0)
    ranks["headroom_pct"] = 100.0 * (total - ranks["peak_bytes"]) / total
    ranks["leak"] = (ranks["kind"] == DEVICE) & (ranks["leaked_bytes"] > LEAK_SHARE * ranks["peak_bytes"])
    ranks = ranks[RANK_COLUMNS].sort_values(["kind", "rank", "device"], key=_device_first).reset_index(drop=True)
    churn = pd.DataFrame(churn, columns=["rank", "allocs", "alloc_bytes", "iterations"]).set_index("rank").sort_index()
    by_rank = sorted(per_rank, key=lambda r: r["rank"])
    return {"ranks": ranks,
            "timeline": RankedRows(output_schema({"rank": "int64", "device": "int64", "kind": "str", "time_ns": "int64",
                                                  "time_aligned_ns": "int64", "bytes_in_use": "int64"}),
                                   [(r["rank"], r) for r in per_rank if r["series"]], _timeline),
            "iterations": RankedRows(output_schema({"rank": "int64", "device": "int64",
                                                    **dict.fromkeys(ITERATION_COLUMNS, "int64")}),
                                     [(r["rank"], r) for r in per_rank if _device_iterations(r)], _iterations),
            "by_range": RankedRows(output_schema({"rank": "int64", "device": "int64", "range": "str",
                                                  **dict.fromkeys(RANGE_COLUMNS, "int64")}),
                                   [(r["rank"], r) for r in by_rank if _device_ranges(r)], _by_range),
            "findings": findings(ranks, churn),
            "settings": {"leak_rule": f"a rank leaks when the device memory it allocated inside iterations and never "
                                      f"freed before the capture ends is above {LEAK_SHARE:.0%} of its peak"}}


def _device_iterations(r: dict) -> list[dict]:
    return [s for s in r["series"] if s["kind"] == DEVICE and "iterations" in s]


def _device_ranges(r: dict) -> list[dict]:
    return [s for s in r["series"] if s["kind"] == DEVICE and len(s["ranges"]["name"])]


def _repeated(series: list[dict], key: str, counts: list[int]) -> np.ndarray:
    return np.repeat(np.array([s[key] for s in series]), counts)


def _timeline(rank: int, r: dict) -> pa.Table:
    """A rank's memory in use after each event, each device and kind."""
    series, counts = r["series"], [len(s["time_ns"]) for s in r["series"]]
    time = np.concatenate([s["time_ns"] for s in series]).astype(np.int64)
    return pa.table({"device": _repeated(series, "device", counts).astype(np.int64),
                     "kind": pa.array(_repeated(series, "kind", counts), pa.large_string()), "time_ns": time,
                     "time_aligned_ns": time + np.int64(r["offset_ns"]),
                     "bytes_in_use": np.concatenate([s["bytes_in_use"] for s in series]).astype(np.int64)})


def _iterations(rank: int, r: dict) -> pa.Table:
    series = _device_iterations(r)
    counts = [len(s["iterations"]["iteration"]) for s in series]
    return pa.table({"device": _repeated(series, "device", counts).astype(np.int64),
                     **{c: np.concatenate([s["iterations"][c] for s in series]).astype(np.int64)
                        for c in ITERATION_COLUMNS}})


def _by_range(rank: int, r: dict) -> pa.Table:
    """A rank's device memory per NVTX range, most allocated first on each device."""
    series = _device_ranges(r)
    rows = pd.concat([pd.DataFrame({"device": s["device"],
                                    "range": op_name(pd.Series(s["ranges"]["name"], dtype=object)),
                                    **{c: s["ranges"][c] for c in (*RANGE_SUMS, "peak_bytes")}}) for s in series],
                     ignore_index=True)
    # PyTorch's emit_nvtx numbers every op instance: an op's instances as one row (nvtx.op_name)
    rows = rows.groupby(["device", "range"], as_index=False, sort=False).agg(
        {**dict.fromkeys(RANGE_SUMS, "sum"), "peak_bytes": "max"})
    rows["net_bytes"] = rows["alloc_bytes"] - rows["free_bytes"]
    rows = rows.sort_values(["device", "alloc_bytes"], ascending=[True, False], kind="stable")
    return pa.Table.from_pandas(rows, preserve_index=False)


def _device_first(column: pd.Series) -> pd.Series:
    return column.map(lambda v: (v != DEVICE, v)) if column.name == "kind" else column


def gib(n) -> str:
    """Bytes in words: GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n)} B"


def findings(ranks: pd.DataFrame, churn: pd.DataFrame) -> pd.DataFrame:
    """One sentence each, the answer first: the rank closest to running out, the leaking ranks, allocation churn
    inside steps (churn: per rank, its median allocations and bytes per iteration, and its iterations), and how
    unevenly the ranks hold memory."""
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
    from ..runner import analysed

    tables = analysed("gpu_memory", ranks)
    if tables is None:  # no memory events: no such metric
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
    stream=STREAM,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.gpu_memory",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("peak_bytes", "peak device memory", always_tracked=True),
             Metric("leaked_bytes", "leaked device memory", always_tracked=True, new_is_bad=True)),
)
