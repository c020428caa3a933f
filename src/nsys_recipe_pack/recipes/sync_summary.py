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

from ..gpu import PAGEABLE, gpu_intervals, key_places, pair_launches
from ..gpu import call_key as _call_key
from ..groups import SortedGroups, distinct
from ..inputs import arrow_of, dictionary_column, ranked_tables, sorted_place
from ..inputs.selection import Selection
from ..intervals import covered_length, touching, union_segments
from ..iterations import range_arrays
from ..lazy import pd
from ..nvtx import innermost_of
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


def _classify(runtime, mem, mset) -> np.ndarray:
    """Kind of each runtime call as an index into KINDS, -1 when it is not a host-blocking call."""
    # string tests on the few distinct API names, then spread to every call by its name's code
    codes, words = runtime.codes("name")
    traits = np.array([_api_traits("" if w is None else str(w)) for w in words], np.int64).reshape(-1, 4)
    kind = traits[:, 0][codes]
    # copies and memsets block depending on the memory they touched: only those calls are joined with it
    copy_call = np.flatnonzero((traits[:, 1] | traits[:, 3])[codes] == 1)
    if not len(copy_call):
        return kind
    is_memcpy, is_async, is_memset = (traits[codes[copy_call], 1:] == 1).T
    key = _call_key(runtime)[copy_call]
    # "any copy of this call has the property" = the call's key is among the keys of copies that have it
    if mem is not None and len(mem):
        mkey = _call_key(mem)
        small_htod = (_column(mem, "bytes", 0.0) <= SMALL_HTOD_BYTES) & (_column(mem, "copy_kind", -1) == 1)
        src, dst = _column(mem, "src_device", -1), _column(mem, "dst_device", -1)
        same_device = (src >= 0) & (src == dst)
        pageable = (_column(mem, "src_kind", -1) == PAGEABLE) | (_column(mem, "dst_kind", -1) == PAGEABLE)
        has_copy, returns_early, touched_pageable = _any_row(key, mkey, small_htod | same_device, pageable)
        kind[copy_call[is_memcpy & ~is_async & has_copy & ~returns_early]] = _KIND["memcpy_sync"]
        kind[copy_call[is_memcpy & is_async & touched_pageable]] = _KIND["memcpy_pageable"]
    if mset is not None and len(mset):
        host = np.isin(_column(mset, "mem_kind", -1), HOST_MEMSET_KINDS)
        kind[copy_call[is_memset & ~is_async & np.isin(key, _call_key(mset)[host])]] = _KIND["memset_sync"]
    return kind


def _any_row(key: np.ndarray, row_key: np.ndarray, *traits: np.ndarray) -> list[np.ndarray]:
    """For each key: whether any row has it, and for each trait whether any row with that key has the
    trait (one sort of the rows, not one np.isin per trait)."""
    order = np.argsort(row_key, kind="stable")
    sorted_key = row_key[order]
    low, high = np.searchsorted(sorted_key, key, "left"), np.searchsorted(sorted_key, key, "right")
    counts = [np.r_[0, np.cumsum(t[order])] for t in traits]
    return [high > low, *(c[high] - c[low] > 0 for c in counts)]


@functools.lru_cache(maxsize=4096)
def _api_traits(name: str) -> tuple[int, int, int, int]:
    """Sync kind (-1: none), and whether the API is a memcpy, is asynchronous, is a memset."""
    kind = next((_KIND[k] for pattern, k in SYNC_API_KINDS if re.match(pattern, name)), -1)
    return kind, int(name.startswith("cudaMemcpy")), int("async" in name.lower()), int(name.startswith("cudaMemset"))


def _innermost_ranges(rank_data, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, list]:
    """Code of the innermost closed NVTX range around each call on its thread (-1: none), and the names."""
    nvtx_events = rank_data.frame("nvtx")
    if nvtx_events is None or not len(nvtx_events) or not len(tid):
        return np.full(len(tid), -1, np.int64), []
    r = range_arrays(nvtx_events)
    pos = innermost_of(r.tid, r.start_ns, r.end_ns, tid, start, end)
    range_codes = np.where(pos >= 0, r.name[np.maximum(pos, 0)] if len(r) else -1, -1)
    return range_codes, list(r.names[:-1])


def _gpu_busy(rank_data, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Union of GPU work inside each call."""
    return covered_length(*union_segments(*gpu_intervals(rank_data)), start, end)


def map_rank(rank_data, options: dict) -> dict:
    rank_data.require("runtime", "sync_summary")
    runtime = rank_data.frame("runtime")
    calls, first_start, last_end = rank_data.extent("runtime")
    if runtime is None or not calls:
        return _map_result(np.zeros(0, np.int64), [], np.zeros(0, np.int64), [], {c: np.zeros(0, np.int64) for c in
                                                                              ("pid", "tid", "start_ns", "end_ns",
                                                                               "gpu_idle_ns", "kind")}, 0)
    kind = _classify(runtime, rank_data.frame("memcpy"), rank_data.frame("memset"))
    start_all, end_all = runtime.values("start_ns"), runtime.values("end_ns")
    blocking = np.flatnonzero(kind >= 0)
    sel = blocking
    if np.any(np.diff(start_all[blocking]) < 0):  # the rank's calls in time order (usually exported so)
        sel = blocking[np.argsort(start_all[blocking], kind="stable")]
    cols = {"pid": runtime.values("pid")[sel], "tid": runtime.values("tid")[sel], "start_ns": start_all[sel],
            "end_ns": end_all[sel], "kind": kind[sel]}
    api_codes, api_words = runtime.codes("name")
    range_codes, range_words = _innermost_ranges(rank_data, cols["tid"], cols["start_ns"], cols["end_ns"])
    # GPU time left idle while the host was blocked: the call's duration minus the union of GPU work in it
    busy = _gpu_busy(rank_data, cols["start_ns"], cols["end_ns"])
    cols["gpu_idle_ns"] = cols["end_ns"] - cols["start_ns"] - busy
    cols["waited_ns"] = _waited(rank_data, runtime, sel, cols)
    wall = last_end - first_start  # of all the rank's calls, also where only the blocking ones were read
    return _map_result(api_codes[sel], list(api_words[:-1]), range_codes, range_words, cols, wall,
                       _flavour(rank_data.env))


def _waited(rank_data, runtime, sel: np.ndarray, cols: dict) -> np.ndarray:
    """How long each blocking call waited for GPU work queued before it: a sync, all of it; a copy or
    memset, until its own operation started on the GPU (the rest is the copy's own cost)."""
    duration = cols["end_ns"] - cols["start_ns"]
    waited = np.where(np.isin(cols["kind"], _SYNC_CALLS), duration, 0)
    ops = [f for f in (rank_data.frame("memcpy"), rank_data.frame("memset")) if f is not None and len(f)]
    own_op = np.flatnonzero(np.isin(cols["kind"], _OWN_OP_CALLS))
    if ops and len(own_op):
        op_start = np.concatenate([f.values("start_ns") for f in ops])
        op, call = pair_launches(np.concatenate([_call_key(f) for f in ops]), _call_key(runtime)[sel][own_op])
        never = np.iinfo(np.int64).max
        started = np.full(len(own_op), never)
        np.minimum.at(started, call, op_start[op])  # a call's earliest operation
        hit = started < never
        waited[own_op[hit]] = np.clip(started[hit] - cols["start_ns"][own_op[hit]], 0, duration[own_op[hit]])
    return waited


def _select(need: str, kept: dict):
    """The rows the map uses (see `SELECTION`): the calls that may block; the copies and memsets they made;
    the GPU work during them; the NVTX ranges around them on their threads."""
    if need == "runtime":
        def blocking_api(batch):
            codes, words = batch.codes("name")
            traits = np.array([_api_traits("" if w is None else str(w)) for w in words], np.int64).reshape(-1, 4)
            sync, memcpy, asynchronous, memset = traits.T  # an asynchronous memset never blocks (_classify)
            return ((sync >= 0) | (memcpy == 1) | ((memset == 1) & (asynchronous == 0)))[codes]
        return blocking_api
    calls = kept["runtime"]
    start, end = calls.values("start_ns"), calls.values("end_ns")
    during = union_segments(start, end)
    if need in ("memcpy", "memset"):
        keys = distinct(_call_key(calls))
        return lambda batch: (key_places(keys, _call_key(batch))[1]
                              | touching(*during, batch.values("start_ns"), batch.values("end_ns")))
    if need == "kernel":
        return lambda batch: touching(*during, batch.values("start_ns"), batch.values("end_ns"))
    tid = calls.values("tid")
    on_thread = {t: union_segments(start[tid == t], end[tid == t]) for t in distinct(tid).tolist()}  # a few threads

    def around_calls(batch):
        out = np.zeros(len(batch), bool)
        range_tid = batch.values("tid")
        range_start, range_end = batch.values("start_ns"), batch.values("end_ns")
        for t, segments in on_thread.items():
            on = np.flatnonzero(range_tid == t)
            out[on] = touching(*segments, range_start[on], range_end[on])
        return out
    return around_calls


# Ranges that nest (push/pop ranges always do): a range that touches no call is neither around one nor around
# a range that is, so leaving it out changes no call's innermost range (inputs.selection reads the ranges that
# name a rank whatever this keeps). Start/end ranges that cross on one thread can differ: the depth walk of
# nvtx.innermost_of may miss, over all of them, a range the kept ones show around the call. GPU work outside
# every call adds nothing to a call's GPU time.
# Of copies and memsets only their times, launch keys and what `_classify` reads: each column read from SQLite goes
# through ADBC's conversion (the 5.4 GB export of bench/RESULTS.md's huge reports: 28.7 s with every column, 22.6 s).
SELECTION = Selection(tag="sync", order=("runtime", "memcpy", "memset", "kernel", "nvtx"), keep=_select,
                      columns={"kernel": ["start", "end", "globalPid"],
                               "memcpy": ["start", "end", "correlationId", "globalPid", "bytes", "copyKind", "srcKind",
                                          "dstKind", "srcDeviceId", "dstDeviceId"],
                               "memset": ["start", "end", "correlationId", "globalPid", "memKind"]})


MPI_ENV = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "MPI_LOCALRANKID")
TORCH_ENV = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "LOCAL_WORLD_SIZE")


def _flavour(env: dict) -> str:
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
    copies = np.isin(kind, _OWN_OP_CALLS) & (waited > 0)
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
    host = np.flatnonzero(np.isin(kind, _HOST_SYNCS) & (c["range"] >= 0))
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
    calls = ranked_tables(per_rank, "calls")
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
    selection=SELECTION,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.sync_summary",
)
