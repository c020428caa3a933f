"""sync_summary: where the host blocks on the GPU, inside which NVTX range, and what it costs.

Host-blocking calls are classified from the CUDA runtime API name and, for copies and memsets, from the
memory they touched (joined on correlationId and process). The rules for synchronous copies and memsets
follow Nsight Systems' own expert rules so that counts can be compared: a cudaMemcpy of at most 64 kB
host-to-device or within one device returns before the copy ends, and a cudaMemset blocks only on
pinned or managed memory.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pyarrow as pa

from ..driver import fold_rank
from ..gpu import GPU_NEEDS, PAGEABLE
from ..gpu import call_key as _call_key
from ..groups import SortedGroups, Vocabulary, distinct, factorize, one_of, picked
from ..inputs import NameIds, arrow_of, dictionary_column, numpy_of, sorted_place
from ..inputs.chunks import END_OF_TIME, Stream
from ..intervals import covered_length, touching, union_segments
from ..iterations import closed_range_view
from ..lazy import pd
from ..nvtx import innermost_of
from ..spill import RankedRows
from . import Recipe, indented, ms, ms_cell

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime"}
SMALL_HTOD_BYTES = 64000
HOST_MEMSET_KINDS = (1, 4)  # pinned, managed
SHORT_SYNC_NS = 1_000_000
MANY_SYNCS = 10
IDLE_SYNC_NS = 1_000_000
SUGGESTIONS = {
    "memcpy_pageable": "copy from pinned host memory (cudaMallocHost or cudaHostRegister) so the copy is truly "
                       "asynchronous",
    "memcpy_pageable/torch": "copy from pinned host memory (DataLoader(pin_memory=True), tensor.pin_memory(), then "
                             ".to(device, non_blocking=True)) so the copy is truly asynchronous",
    "waited": "the time belongs to the GPU work queued before these calls (nvtx_gpu_proj shows which ranges "
              "launched it): issue them after the work they do not need, or on a stream of their own",
    "waited/torch": "the time belongs to the kernels queued before these copies (nvtx_gpu_proj shows which ranges "
                    "launched them): read GPU values (.item(), .cpu(), .tolist()) less often or after the step's "
                    "work is queued",
    "waited/mpi": "the time belongs to the kernels queued before these copies (nvtx_gpu_proj shows which ranges "
                  "launched them): hand device buffers to a CUDA-aware MPI instead of staging through the host, or "
                  "copy on a stream of its own and overlap the copy with computation",
    "short_syncs": "look for host reads of GPU values in this range (loss.item(), .cpu(), print of a tensor, "
                   "Python control flow on a GPU value) and move them out of the loop or batch them",
    "idle_sync": "the host waited while the GPU had nothing to do: launch the next work before synchronizing, "
                 "or remove the synchronization",
}


SYNC_API_KINDS = [(r"^(cudaDeviceSynchronize|cudaThreadSynchronize|cuCtxSynchronize)", "device"),
                  (r"^(cudaStreamSynchronize|cuStreamSynchronize)", "stream"),
                  (r"^(cudaEventSynchronize|cuEventSynchronize)", "event"),
                  (r"^(cudaStreamWaitEvent|cuStreamWaitEvent)", "stream_wait")]


KINDS = ["device", "stream", "event", "stream_wait", "memcpy_sync", "memcpy_pageable", "memset_sync"]
_KIND = {k: i for i, k in enumerate(KINDS)}
_HOST_SYNCS = [_KIND[k] for k in ("device", "stream", "event", "memcpy_sync")]
_SYNC_CALLS = [_KIND[k] for k in ("device", "stream", "event")]  # wait for earlier GPU work, all of them
_OWN_OP_CALLS = [_KIND[k] for k in ("memcpy_sync", "memcpy_pageable", "memset_sync")]  # also run an operation


def _column(frame, col: str, fill) -> np.ndarray:
    """A nullable numeric column of an inputs.Frame with nulls (and a missing column) as `fill`."""
    if col not in frame:
        return np.full(len(frame), fill)
    return frame.values(col, dtype=type(fill), fill=fill)


def _copy_rows(need: str, frame) -> pa.Table:
    """What `_classify` and `_waited` read of each copy or memset: its launch key and start, and for a copy whether
    it lets the call return before it ends (at most SMALL_HTOD_BYTES host to device, or within one device) and
    whether it touched pageable memory, for a memset whether it set host (pinned or managed) memory."""
    n = len(frame)
    early, pageable, host = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    if need == "memcpy":
        small_htod = (_column(frame, "bytes", 0.0) <= SMALL_HTOD_BYTES) & (_column(frame, "copy_kind", -1) == 1)
        src, dst = _column(frame, "src_device", -1), _column(frame, "dst_device", -1)
        early = small_htod | (src >= 0) & (src == dst)
        pageable = (_column(frame, "src_kind", -1) == PAGEABLE) | (_column(frame, "dst_kind", -1) == PAGEABLE)
    else:
        host = one_of(_column(frame, "mem_kind", -1), HOST_MEMSET_KINDS)
    return pa.table({"start_ns": arrow_of(frame.values("start_ns")), "key": arrow_of(_call_key(frame)),
                     "memcpy": arrow_of(np.full(n, need == "memcpy")), "early": arrow_of(early),
                     "pageable": arrow_of(pageable), "host": arrow_of(host)})


FLAGS = ("memcpy", "early", "pageable", "host")  # what `_copy_rows` tells of each copy or memset, as bits


class _Copies:
    """What the copies and memsets of each launch key show, gathered a batch at a time and added up per key when a
    table is done (`done`); `of` gives it for calls: whether a call launched a copy, whether any of them lets it
    return early or touched pageable memory, whether any memset of it set host memory, and when the first of them
    started. Kept by the ops' keys, not the calls': the calls can then be read after them a batch at a time, and
    only the blocking ones kept."""

    NEVER = np.iinfo(np.int64).max

    def __init__(self):
        self.batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (key, start, flag bits) not yet done
        self.tables: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (distinct keys, first start, bits)

    def add(self, rows: pa.Table) -> None:
        """rows: `_copy_rows` of some copies or memsets."""
        bits = np.zeros(rows.num_rows, np.uint8)
        for i, col in enumerate(FLAGS):
            bits |= numpy_of(rows.column(col)).astype(np.uint8) << i
        self.batches.append((numpy_of(rows.column("key")), numpy_of(rows.column("start_ns")), bits))

    def done(self) -> None:
        """Add up the batches of one table per key (a table's keys mostly come in order, each once: no sort then)."""
        if not self.batches:
            return
        key, start, bits = (np.concatenate(part) for part in zip(*self.batches, strict=True))
        self.batches = []
        if len(key) > 1 and not (key[1:] > key[:-1]).all():
            groups = SortedGroups(key)
            key, start = groups.keys, groups.min(start)
            bits = np.bitwise_or.reduceat(bits[groups.order], groups.first)
        if len(key):
            self.tables.append((key, start, bits))

    def of(self, call_keys: np.ndarray) -> dict:
        """Per call: "memcpy", "early", "pageable", "host" (bools) and "first_start" (NEVER: no copy or memset)."""
        bits, first_start = np.zeros(len(call_keys), np.uint8), np.full(len(call_keys), self.NEVER)
        for key, start, flags in self.tables:
            at = np.minimum(np.searchsorted(key, call_keys), len(key) - 1)
            found = np.flatnonzero(key[at] == call_keys)
            bits[found] |= flags[at[found]]
            first_start[found] = np.minimum(first_start[found], start[at[found]])
        out = {col: (bits >> i) & 1 == 1 for i, col in enumerate(FLAGS)}
        out["first_start"] = first_start
        return out


def _classify(api_codes: np.ndarray, api_words, copies: dict) -> np.ndarray:
    """Kind of each runtime call as an index into KINDS, -1 when it is not a host-blocking call (copies: what
    `_Copies.of` gives of the calls)."""
    # string tests on the few distinct API names, then spread to every call by its name's code
    traits = _traits_of(api_words)
    kind = traits[:, 0][api_codes]
    # copies and memsets block depending on the memory they touched
    copy_call = np.flatnonzero((traits[:, 1] | traits[:, 3])[api_codes] == 1)
    is_memcpy, is_async, is_memset = (traits[api_codes[copy_call], 1:] == 1).T
    launched = (copies["memcpy"] & ~copies["early"])[copy_call]
    kind[copy_call[is_memcpy & ~is_async & launched]] = _KIND["memcpy_sync"]
    kind[copy_call[is_memcpy & is_async & copies["pageable"][copy_call]]] = _KIND["memcpy_pageable"]
    kind[copy_call[is_memset & ~is_async & copies["host"][copy_call]]] = _KIND["memset_sync"]
    return kind


def _traits_of(words) -> np.ndarray:
    """`_api_traits` of each API name (a null name: none), a row each."""
    return np.array([_api_traits("" if w is None else str(w)) for w in words], np.int64).reshape(-1, 4)


def _may_block(frame) -> np.ndarray:
    """Which runtime calls `_classify` may find blocking, from their API names alone (an asynchronous memset never
    blocks)."""
    codes, words = frame.codes("name")
    sync, memcpy, asynchronous, memset = _traits_of(words).T
    return ((sync >= 0) | (memcpy == 1) | ((memset == 1) & (asynchronous == 0)))[codes]


@functools.lru_cache(maxsize=4096)
def _api_traits(name: str) -> tuple[int, int, int, int]:
    """Sync kind (-1: none), and whether the API is a memcpy, is asynchronous, is a memset."""
    kind = next((_KIND[k] for pattern, k in SYNC_API_KINDS if re.match(pattern, name)), -1)
    return kind, int(name.startswith("cudaMemcpy")), int("async" in name.lower()), int(name.startswith("cudaMemset"))


def map_rank(rank_data, options: dict) -> dict:
    """The rank read whole through the analysis a long capture goes through span by span (`STREAM`), as one span."""
    rank_data.require("runtime", "sync_summary")
    folded = fold_rank(STREAM, rank_data, options)
    if folded is None:
        return _map_result(np.zeros(0, np.int64), [], np.zeros(0, np.int64), [], _no_calls(), 0)
    return _complete(rank_data, folded, options)


def _no_calls() -> dict:
    return {c: np.zeros(0, np.int64) for c in ("pid", "tid", "start_ns", "end_ns", "gpu_idle_ns", "kind")}


def _waited(cols: dict, first_op_start: np.ndarray) -> np.ndarray:
    """How long each blocking call waited for GPU work queued before it: a sync, all of it; a copy or
    memset, until its own operation started on the GPU (the rest is the copy's own cost)."""
    duration = cols["end_ns"] - cols["start_ns"]
    waited = np.where(one_of(cols["kind"], _SYNC_CALLS), duration, 0)
    own_op = np.flatnonzero(one_of(cols["kind"], _OWN_OP_CALLS) & (first_op_start < _Copies.NEVER))
    waited[own_op] = np.clip(first_op_start[own_op] - cols["start_ns"][own_op], 0, duration[own_op])
    return waited


def _around_calls(tid: np.ndarray, start: np.ndarray, end: np.ndarray, during: tuple | None = None):
    """A test of which ranges (thread, start, end) touch one of these calls on their thread: the only ranges that
    can be around one. during: the calls' `union_segments`, where made already (the one thread's, where all the calls
    are on one)."""
    threads = distinct(tid).tolist()  # a few
    if len(threads) == 1:
        on_thread = {threads[0]: during if during is not None else union_segments(start, end)}
    else:
        on_thread = {t: union_segments(start[tid == t], end[tid == t]) for t in threads}

    def around(range_tid: np.ndarray, range_start: np.ndarray, range_end: np.ndarray) -> np.ndarray:
        out = np.zeros(len(range_tid), bool)
        for t, segments in on_thread.items():
            on = np.flatnonzero(range_tid == t)
            out[on] = touching(*segments, range_start[on], range_end[on])
        return out
    return around


# Of copies and memsets only their times, launch keys and what `_classify` reads: each column read from SQLite goes
# through ADBC's conversion (bench/RESULTS.md, huge reports).
COPY_COLUMNS = {"memcpy": ["start", "end", "correlationId", "globalPid", "bytes", "copyKind", "srcKind", "dstKind",
                           "srcDeviceId", "dstDeviceId"],
                "memset": ["start", "end", "correlationId", "globalPid", "memKind"]}


# A long capture, span by span (inputs.chunks): the copies and memsets, then the calls that may block are read ahead
# of the spans, and give the blocking calls, the rows of the output. The GPU work and the NVTX
# ranges then pass span by span, adding to each call the GPU time inside it and finding the range around it, so
# neither is held: a selection holds every row touching a call, on a capture that syncs every step most of them.
# As with a selection, ranges that ended before a call are not among those around it: only start/end ranges that
# cross on one thread can then give another innermost range.
RUNTIME_COLUMNS = ["start", "end", "globalTid", "correlationId", "nameId"]
CALL_COLUMNS = ("start_ns", "end_ns", "tid", "pid")


def _span_view(need: str, frame) -> pa.Table:
    """A span's GPU work (times and process), or its closed NVTX ranges."""
    if need == "nvtx":
        return closed_range_view(need, frame)
    return pa.table({c: arrow_of(frame.values(c)) for c in ("start_ns", "end_ns", "pid")})


def _prepare(ahead, options: dict) -> dict:
    """The blocking calls in time order, with what each waited for its own copy; their GPU time and range are
    left to the spans. The copies and memsets are read first: each batch of calls then keeps its blocking ones only."""
    copies = _Copies()
    for need in ("memcpy", "memset"):
        for frame in ahead.frames(need, COPY_COLUMNS[need]):
            copies.add(_copy_rows(need, frame))
        copies.done()
    api = Vocabulary()  # API names by id across the batches
    parts = []
    for frame in ahead.frames("runtime", RUNTIME_COLUMNS):
        may_block = np.flatnonzero(_may_block(frame))
        codes, words = frame.codes("name")
        api_ids = np.r_[api.ids(words[:-1]), -1][codes[may_block]]
        launched = copies.of(_call_key(frame)[may_block])
        kind = _classify(api_ids, [*api.words, None], launched)
        blocking = np.flatnonzero(kind >= 0)
        parts.append({**{c: frame.values(c)[may_block[blocking]] for c in CALL_COLUMNS}, "kind": kind[blocking],
                      "api": api_ids[blocking], "first_start": launched["first_start"][blocking]})
    del copies
    # a column at a time, each let go of as soon as it is made: no moment holds every column twice
    calls = {c: np.concatenate([part.pop(c) for part in parts] or [np.zeros(0, np.int64)])
             for c in (*CALL_COLUMNS, "kind", "api", "first_start")}
    if np.any(np.diff(calls["start_ns"]) < 0):  # in time order, as `map_rank` puts them (usually exported so)
        order = np.argsort(calls["start_ns"], kind="stable")
        for c in calls:
            calls[c] = calls[c][order]
    calls["waited_ns"] = _waited(calls, calls.pop("first_start"))
    n = len(calls["start_ns"])
    # only GPU work and ranges that touch a call can add to one: the rest is let go as soon as it is read
    during = union_segments(calls["start_ns"], calls["end_ns"])
    return {"calls": calls, "api_words": api.words, "busy": np.zeros(n, np.int64), "range": np.full(n, -1),
            "during": during, "around": _around_calls(calls["tid"], calls["start_ns"], calls["end_ns"], during),
            "names": NameIds(), "live": {c: np.zeros(0, np.int64) for c in ("tid", "start_ns", "end_ns", "name")},
            "asked": 0, "gpu": {}, "pids": ahead.extents.pids("runtime")}


class _GpuTime:
    """One process's GPU work so far: the union segment still open, and its calls (positions `at`, by start) that
    a segment still to close may overlap, from `passed` on."""

    def __init__(self, at: np.ndarray, start: np.ndarray, end: np.ndarray):
        self.at, self.start, self.end = at, start, end
        self.passed = 0
        self.open: tuple[int, int] | None = None

    def add(self, start: np.ndarray, end: np.ndarray, span_end: int, busy: np.ndarray) -> None:
        """A span's ops into the union; the segments it closes into `busy` of the calls they overlap."""
        if self.open is not None:
            start, end = np.r_[self.open[0], start], np.r_[self.open[1], end]
        seg_start, seg_end = union_segments(start, end)
        self.open = None
        if span_end < END_OF_TIME and len(seg_start) and seg_end[-1] >= span_end:  # a later op may extend it
            self.open = int(seg_start[-1]), int(seg_end[-1])
            seg_start, seg_end = seg_start[:-1], seg_end[:-1]
        if not len(seg_start):
            return
        upto = int(np.searchsorted(self.start, seg_end[-1], side="left"))  # calls starting before the last end
        near = slice(self.passed, upto)
        busy[self.at[near]] += covered_length(seg_start, seg_end, self.start[near], self.end[near])
        frontier = self.open[0] if self.open is not None else span_end  # where segments still to close start
        later = np.flatnonzero(self.end[near] > frontier)
        self.passed = (self.passed + int(later[0])) if len(later) else max(self.passed, upto)


def _fold(state: dict, span_start: int, span_end: int, chunk: dict) -> None:
    ops = [chunk[need] for need in GPU_NEEDS if chunk.get(need) is not None and chunk[need].num_rows]
    ops = pa.concat_tables(ops) if ops else None
    calls = state["calls"]
    if ops is not None or state["gpu"]:
        pid, start, end = ((numpy_of(ops.column(c)) for c in ("pid", "start_ns", "end_ns")) if ops is not None
                           else (np.zeros(0, np.int64),) * 3)
        touch = np.flatnonzero(touching(*state["during"], start, end))
        pid, start, end = pid[touch], start[touch], end[touch]
        for p in sorted(set(factorize(pid)[0].tolist()) | {p for p, g in state["gpu"].items() if g.open}):
            if p not in state["gpu"]:
                at = _calls_of(calls, p)
                state["gpu"][p] = _GpuTime(np.arange(len(calls["pid"]))[at], calls["start_ns"][at],
                                           calls["end_ns"][at])
            on = pid == p
            state["gpu"][p].add(start[on], end[on], span_end, state["busy"])
    _add_ranges(state, span_end, chunk.get("nvtx"))


def _add_ranges(state: dict, span_end: int, ranges: pa.Table | None) -> None:
    """The innermost range around each call starting in the span: every range around it has started by then. Kept
    after it: the ranges that may still be around a later call."""
    live = state["live"]
    if ranges is not None and ranges.num_rows:
        new = {c: numpy_of(ranges.column(c)) for c in ("tid", "start_ns", "end_ns")}
        new["name"] = state["names"].ids_in(ranges.column("name"))
        around = np.flatnonzero(state["around"](new["tid"], new["start_ns"], new["end_ns"]))
        live = {c: np.concatenate([live[c], new[c][around]]) for c in live}
    calls, first = state["calls"], state["asked"]
    upto = len(calls["start_ns"]) if span_end == END_OF_TIME else \
        int(np.searchsorted(calls["start_ns"], span_end, side="left"))
    if upto > first and len(live["tid"]):
        asked = slice(first, upto)
        pos = innermost_of(live["tid"], live["start_ns"], live["end_ns"], calls["tid"][asked],
                           calls["start_ns"][asked], calls["end_ns"][asked])
        state["range"][asked] = np.where(pos >= 0, live["name"][np.maximum(pos, 0)], -1)
    state["asked"] = upto
    still = live["end_ns"] >= span_end
    state["live"] = live if still.all() else {c: v[still] for c, v in live.items()}


def _calls_of(calls: dict, pid: int) -> np.ndarray | slice:
    """Where a process's calls are: all of them, as usual, a slice, so that its columns are views, not copies."""
    return picked(calls["pid"] == pid)


def _finish(state: dict, names: list) -> dict:
    """Each process's calls, as `map_rank` makes them from a whole read."""
    calls = state["calls"]
    out = {}
    for p in sorted(set(state["pids"]) | set(state["gpu"])):
        on = _calls_of(calls, p)
        cols = {c: calls[c][on] for c in (*CALL_COLUMNS, "kind", "waited_ns")}
        cols["gpu_idle_ns"] = cols["end_ns"] - cols["start_ns"] - state["busy"][on]
        out[p] = {"api": (calls["api"][on], state["api_words"]), "range": (state["range"][on], state["names"].words),
                  "cols": cols}
    return out


def _complete(rank_data, folded: dict, options: dict) -> dict:
    """A process's calls as `_finish` gives them, over the span of all the rank's calls."""
    _, first_start, last_end = rank_data.extent("runtime")
    return _map_result(*folded["api"], *folded["range"], folded["cols"], last_end - first_start,
                       flavour(rank_data.env))


# its spans read times and processes (and the kernels' devices, which give the rank's GPU)
STREAM = Stream(needs={**dict.fromkeys(GPU_NEEDS, ["start", "end", "globalPid", "deviceId"]), "nvtx": None},
                view=_span_view, fold=_fold, finish=_finish, prepare=_prepare, ahead=("runtime",))


MPI_ENV = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "MPI_LOCALRANKID")
TORCH_ENV = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "LOCAL_WORLD_SIZE")


def flavour(env: dict) -> str:
    """Which advice fits the job: an MPI code, a PyTorch job, or any other (from its recorded environment)."""
    if any(k in env for k in MPI_ENV):
        return "mpi"
    return "torch" if any(k in env for k in TORCH_ENV) else ""


def _suggestion(topic: str, flavour: str) -> str:
    return SUGGESTIONS.get(f"{topic}/{flavour}", SUGGESTIONS[topic])


def _map_result(api_codes, api_words, range_codes, range_words, cols: dict, wall_ns: int, flavour: str = "") -> dict:
    """The rank's blocking calls as an Arrow table, its per-(kind, API) summary and its findings."""
    duration = cols["end_ns"] - cols["start_ns"]
    calls = pa.Table.from_arrays([
        arrow_of(cols["pid"]), arrow_of(cols["tid"]), dictionary_column(api_codes, api_words),
        dictionary_column(cols["kind"], KINDS), arrow_of(cols["start_ns"]), arrow_of(cols["end_ns"]),
        arrow_of(duration), dictionary_column(range_codes, range_words), arrow_of(cols["gpu_idle_ns"]),
        arrow_of(cols["waited_ns"]),
    ], names=map_columns())
    c = {"kind": cols["kind"], "duration": duration, "idle": cols["gpu_idle_ns"], "start": cols["start_ns"],
         "waited": cols["waited_ns"], "api": api_codes, "api_words": api_words, "range": range_codes,
         "range_words": range_words}
    return {"calls": calls, "wall_ns": wall_ns, "summary": _summary(c), "findings": _findings(c, wall_ns, flavour)}


def map_columns() -> list[str]:
    return ["pid", "tid", "api", "kind", "start_ns", "end_ns", "duration_ns", "nvtx_range", "gpu_idle_ns",
            "waited_ns"]


SUMMARY_COLUMNS = ["kind", "api", "count", "total_ns", "mean_ns", "max_ns"]
# sync_calls.parquet: the map's columns after the rank, its names kept as the map's Arrow dictionaries
CALLS_SCHEMA = pa.schema([("rank", pa.int64()), *((c, pa.dictionary(pa.int32(), pa.large_string()) if c in (
    "api", "kind", "nvtx_range") else pa.int64()) for c in map_columns())])


def _sort_pairs(key: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key, value) pairs sorted by key, then value: one sort of the pairs packed in one integer when they
    fit in 62 bits (a few range names and durations usually do), else a lexsort."""
    low = int(values.min())
    span = int(values.max()) - low + 1
    if (int(key.max()) + 1) * span < 1 << 62:
        packed = np.sort(key * span + (values - low))
        return packed // span, packed % span + low
    order = np.lexsort((values, key))
    return key[order], values[order]


def _summary(c: dict) -> dict:
    """count, total, mean and max duration per (kind, API), sorted by kind then API name."""
    if not len(c["kind"]):
        return {"kind": np.zeros(0, object), "api": np.zeros(0, object), "count": np.zeros(0, np.int64),
                "total_ns": np.zeros(0, np.int64), "mean_ns": np.zeros(0), "max_ns": np.zeros(0, np.int64)}
    api = sorted_place(c["api_words"])[c["api"]]  # a few small codes: one integer key, so one sort
    groups = SortedGroups(sorted_place(KINDS)[c["kind"]] * (int(api.max()) + 1) + api)
    total = groups.sum(c["duration"])
    lead = groups.lead
    return {"kind": np.array(KINDS, object)[c["kind"][lead]], "api": np.array(c["api_words"], object)[c["api"][lead]],
            "count": groups.size, "total_ns": total, "mean_ns": total / groups.size,
            "max_ns": groups.max(c["duration"])}


def _descending(values: np.ndarray) -> np.ndarray:
    """The order pandas' sort_values(ascending=False) gives, ties included (its reversed quicksort)."""
    idx = np.arange(len(values))[::-1]
    return idx[values[::-1].argsort(kind="quicksort")][::-1]


FINDING_COLUMNS = ["severity", "finding", "suggestion", "evidence"]


def _findings(c: dict, wall_ns: int, flavour: str = "") -> list[tuple]:
    """One rank's findings from its blocking calls (computed in the map step, where the rank's calls are)."""
    rows = []
    w = max(int(wall_ns), 1)
    kind, dur, idle_ns = c["kind"], c["duration"], c["idle"]
    waited = c["waited"]
    pg = kind == _KIND["memcpy_pageable"]
    if pg.any():
        own = int((dur[pg] - waited[pg]).sum())
        share = own / w
        queued = int(waited[pg].sum())
        rows.append(("high" if share > 0.01 else "medium", "pageable memcpy", _suggestion("memcpy_pageable", flavour),
                     f"{int(pg.sum())} async copies touched pageable host memory and blocked the host for "
                     f"{own / 1e6:.2f} ms of their own copying ({100 * share:.2f} % of the CUDA wall time)"
                     + (f"; before that they waited {queued / 1e6:.2f} ms for earlier GPU work, which is not the "
                        "copies' cost" if queued else "")))
    copies = one_of(kind, _OWN_OP_CALLS) & (waited > 0)
    if copies.any() and waited[copies].sum() > 0.01 * w:
        at = np.flatnonzero(copies)
        worst = at[np.argmax(waited[at])]
        where = (f"in {c['range_words'][c['range'][worst]]!r}" if c["range"][worst] >= 0
                 else "outside every NVTX range")
        rows.append(("high" if waited[copies].sum() > 0.05 * w else "medium",
                     "copies that waited for earlier GPU work", _suggestion("waited", flavour),
                     f"{int(copies.sum())} blocking copies and memsets waited {waited[copies].sum() / 1e6:.2f} ms "
                     f"in all for GPU work queued before them; worst: {c['api_words'][c['api'][worst]]} {where}, "
                     f"{waited[worst] / 1e6:.2f} of its {dur[worst] / 1e6:.2f} ms"))
    host = np.flatnonzero(one_of(kind, _HOST_SYNCS) & (c["range"] >= 0))
    if len(host):
        names = np.array(c["range_words"], object)
        group, d = _sort_pairs(sorted_place(c["range_words"])[c["range"][host]], dur[host])
        first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        size = np.diff(np.r_[first, len(d)])
        median = (d[first + (size - 1) // 2] + d[first + size // 2]) / 2
        total = np.add.reduceat(d, first)
        rng = names[np.argsort(names, kind="stable")][group[first]]  # group: the name's place in sorted order
        frequent = np.flatnonzero((size >= MANY_SYNCS) & (median < SHORT_SYNC_NS))
        for i in frequent[_descending(size[frequent])][:5]:  # at most 5 rows
            rows.append(("medium", f"frequent short syncs in {rng[i]!r}", SUGGESTIONS["short_syncs"],
                         f"{int(size[i])} host syncs inside {rng[i]!r}, median {median[i] / 1e3:.1f} us, "
                         f"total {total[i] / 1e6:.2f} ms"))
    idle = (kind != _KIND["stream_wait"]) & (dur >= IDLE_SYNC_NS) & (idle_ns > 0.5 * dur)
    if idle.any():
        at = np.flatnonzero(idle)
        worst = at[np.argmax(idle_ns[at])]
        where = (f"in {c['range_words'][c['range'][worst]]!r}" if c["range"][worst] >= 0
                 else "outside every NVTX range")
        rows.append(("high" if idle_ns[idle].sum() > 0.01 * w else "low",
                     "sync that leaves the GPU idle", SUGGESTIONS["idle_sync"],
                     f"{int(idle.sum())} syncs of at least {IDLE_SYNC_NS / 1e6:g} ms with the GPU idle for most of "
                     f"them, {idle_ns[idle].sum() / 1e6:.2f} ms idle in all; worst: {c['api_words'][c['api'][worst]]} "
                     f"at {int(c['start'][worst])} ns {where}, "
                     f"{idle_ns[worst] / 1e6:.2f} of {dur[worst] / 1e6:.2f} ms idle"))
    return rows


def reduce(per_rank: list[dict], options: dict) -> dict:
    per_rank = sorted(per_rank, key=lambda r: r["rank"])
    calls = RankedRows(CALLS_SCHEMA, [(r["rank"], r["calls"]) for r in per_rank])  # written a rank at a time
    wall = pd.Series({r["rank"]: r["wall_ns"] for r in per_rank})
    summary = pd.DataFrame({
        "rank": np.concatenate([np.full(len(r["summary"]["kind"]), r["rank"], np.int64) for r in per_rank]),
        **{c: np.concatenate([r["summary"][c] for r in per_rank]) for c in SUMMARY_COLUMNS}})
    summary["pct_of_wall"] = 100.0 * summary["total_ns"] / summary["rank"].map(wall).clip(lower=1)
    summary = summary.sort_values(["rank", "total_ns"], ascending=[True, False]).reset_index(drop=True)
    findings = pd.DataFrame([(r["rank"], *row) for r in per_rank for row in r["findings"]],
                            columns=["rank", *FINDING_COLUMNS])
    findings["rank"] = findings["rank"].astype("int64")
    return {"sync_calls": calls, "summary": summary, "findings": findings}


def summary(out, top: int = 5) -> list[str]:
    by_api = pd.read_parquet(out / "summary.parquet")
    findings = pd.read_parquet(out / "findings.parquet")
    t = by_api.groupby("kind").agg(count=("count", "sum"), total_ns=("total_ns", "sum"))
    lines = indented("blocking calls by kind, all ranks:",
                     t.assign(total_ms=t["total_ns"].map(ms_cell))[["count", "total_ms"]].to_string())
    lines.append(f"{len(findings)} finding(s)" + (":" if len(findings) else ""))
    lines += [f"  rank {r.rank} [{r.severity}] {r.finding}: {r.evidence}" for r in findings.head(top).itertuples()]
    return lines


def headline(out) -> str:
    s = pd.read_parquet(out / "summary.parquet")
    f = pd.read_parquet(out / "findings.parquet")
    return f"{int(s['count'].sum())} blocking calls, {ms(s['total_ns'].sum())}; {len(f)} finding(s)"


RECIPE = Recipe(
    name="sync_summary",
    display_name="Sync summary",
    description="Where the host blocks on the GPU (device, stream, event syncs, synchronous and pageable "
                "copies, memsets), inside which NVTX range, with findings.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    stream=STREAM,
    lazy_tables=True,  # its calls, a row per blocking call of every rank: read a rank at a time as they are written
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.sync_summary",
)
