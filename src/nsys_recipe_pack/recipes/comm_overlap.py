"""comm_overlap: how much of each rank's communication the GPU hides behind compute, and how much is exposed.

On each GPU, in each iteration: communication time is the union of its communication kernels (NCCL's, found by
name: `ncclKernel*`, `ncclDevKernel*`, and, where NCCL's NVTX ranges were recorded, any kernel launched inside
one of them), compute time the union of every other kernel. The overlapped part of the
communication is the time some compute kernel runs beside it on the same GPU; the rest is exposed: the GPU only
communicates, and the step waits for it. Exposed compute is compute with no communication beside it. Per
collective kind (all_reduce, all_gather, reduce_scatter, send_recv, broadcast, reduce, other), the same with that
kind's kernels only; and per NVTX phase (the ranges directly inside an NVTX-delimited iteration: forward,
backward, optimizer...) with the communication kernels each launched (by its thread, or by another thread of the
process with no range of its own open, as PyTorch's autograd thread), beside any compute. Copies and memsets count
as neither; times are clipped to the iteration. In a job with tensor or pipeline parallel groups (collective_match.py),
the same per group kind (tp, pp, dp, other): a rank's NCCL kernels of one stream, collective and communicator are
one channel, measured in the map, and the reduce gives each channel its communicator's kind. Where the NCCL kernels
match up across ranks, each rank's communication and its exposed part are split into waiting for the last member
and transfer (waiting.py): the map ships a rank's exposed communication as time.

Where a GPU's compute kernels never overlap one another, a communication kernel's overlapped time is what
Nsight Systems' `nccl_gpu_overlap_trace` adds up as its compute overlap (the sum over the compute kernels it
overlaps); where they do, that sum counts the time twice and the union here does not.

A long capture is measured a few iterations at a time as it is read (iteration_slices, `STREAM`, which keeps its
NCCL kernels as they pass, but not NCCL's payloads: its groups are inferred); a rank without iterations is one window
over its whole capture, read whole.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .. import collective_match, parallel, waiting
from ..collective_match import KIND_OF_OP, KINDS
from ..driver import fold_rank
from ..errors import BadInputError, NotApplicableError
from ..gpu import call_key, key_places, launched_ops
from ..groups import Vocabulary, factorize
from ..inputs import arrow_of, dictionary_column
from ..inputs.chunks import END_OF_TIME
from ..inputs.frames import column_codes
from ..intervals import overlay, split_into_windows, union_lengths, union_segments_by_group
from ..iteration_scan import find_iterations
from ..iteration_slices import sliced_stream
from ..iterations import Delimiter, Iterations, range_arrays
from ..lazy import pd
from ..nvtx import innermost_of
from ..phases import child_ranges, launching_child
from ..spill import RankedRows, output_schema, table_of
from . import Metric, Recipe, indented, iteration_and_parallel_options, ms, ms_cell

NEEDS = {"nvtx", "kernel", "runtime"}
GROUP_NEEDS = {"payload"}  # NCCL's payloads: the groups (collective_match.py); a long capture reads none
WHOLE_CAPTURE = {"kind": "capture", "name": "whole capture", "domain": None,
                 "source": "no repeating NVTX range or kernel: the capture is one window"}
WINDOW_COLUMNS = ["iteration", "device", "start_ns", "end_ns", "busy_ns", "compute_ns", "comm_ns",
                  "overlapped_ns", "exposed_comm_ns", "exposed_compute_ns"]
SUMMED = ["busy_ns", "compute_ns", "comm_ns", "overlapped_ns", "exposed_comm_ns", "exposed_compute_ns"]
RANK_COLUMNS = ["rank", "iterations", "wall_ns", *SUMMED, "exposed_comm_pct", "overlapped_of_comm_pct"]
GROUP_SUMS = ["kernels", "comm_ns", "overlapped_ns", "exposed_ns"]
NCCL_DOMAIN = "NCCL"


def _iterations(rank_data, options: dict):
    """The rank's iterations, and its NVTX ranges; with no iteration to be found (and none asked for), its
    whole capture as one window."""
    ranges = range_arrays(rank_data.frame("nvtx"))
    try:
        return find_iterations(rank_data, options.get("iteration"), options.get("iteration_kernel")), ranges
    except BadInputError:
        if options.get("iteration") or options.get("iteration_kernel"):
            raise
        kernels = rank_data.frame("kernels")
        start, end = kernels.values("start_ns"), kernels.values("end_ns")
        return Iterations(Delimiter(**WHOLE_CAPTURE), np.array([start.min()]), np.array([end.max()]), None), ranges


def _kind_from_nccl_ranges(rank_data, ranges, n_kernels: int, ops) -> np.ndarray:
    """The collective kind of each kernel launched inside one of NCCL's own NVTX ranges (domain "NCCL",
    `ncclAllReduce`, `ncclSend`...), from the range's name; -1 for the others."""
    kind = np.full(n_kernels, -1, np.int64)
    nccl = np.flatnonzero(ranges.domain_is(NCCL_DOMAIN))
    if not len(nccl) or ops is None:
        return kind
    kernels = np.flatnonzero(ops.op < n_kernels)  # gpu_intervals order: kernels first
    inside = innermost_of(ranges.tid[nccl], ranges.start_ns[nccl], ranges.end_ns[nccl], ops.tid[kernels],
                          ops.call_start_ns[kernels], ops.call_end_ns[kernels])
    hit = inside >= 0
    names, at = np.unique(ranges.name[nccl[inside[hit]]], return_inverse=True)  # the few NCCL calls' names
    kind_of_name = np.array([KINDS.index(KIND_OF_OP.get(str(w)[4:].lower(), "other")) for w in ranges.names[names]],
                            np.int64)
    kind[ops.op[kernels[hit]]] = kind_of_name[at.reshape(-1)]
    return kind


def _phase_of_kernels(rank_data, ranges, it, n_kernels: int, ops) -> np.ndarray:
    """The NVTX phase (a code into the ranges' names) that launched each kernel, -1 for none."""
    phase = np.full(n_kernels, -1, np.int64)
    if ops is None:
        return phase
    child_start, child_end, child_name, _ = child_ranges(ranges, it)
    if not len(child_start):
        return phase
    kernels = np.flatnonzero(ops.op < n_kernels)  # gpu_intervals order: kernels first
    child, op = launching_child(rank_data, ranges, it.tid, ops, kernels, child_start, child_end)
    phase[ops.op[op]] = child_name[child]
    return phase


def _coded(words: np.ndarray, names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(words, codes): names (None: none) as codes into words (the last one None), words grown by the names not
    among them; a name is hashed once (Arrow's dictionary), not compared with every word."""
    codes, distinct = column_codes(pa.chunked_array([pa.array(names, pa.string())]))
    vocabulary = Vocabulary(words[:-1].tolist())
    at = np.r_[vocabulary.ids(distinct[:-1].tolist()), -1]
    return np.array([*vocabulary.words, None], object), at[codes]


def _union(group: np.ndarray, start: np.ndarray, end: np.ndarray, keep: np.ndarray, size: int) -> np.ndarray:
    """Length of the union of the kept intervals in each group 0..size-1."""
    out = np.zeros(size, np.int64)
    groups, lengths = union_lengths(group[keep], start[keep], end[keep])
    out[groups] = lengths
    return out


def overlap_by_window(group: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray,
                      size: int) -> tuple[dict, dict]:
    """Per group (a window on one device): busy, compute, communication, overlapped and exposed time; and per
    (group, collective kind) with kernels: kernels, communication, overlapped and exposed time. kind: -1 for
    compute kernels. Overlap by inclusion-exclusion of unions: |comm and compute| = |comm| + |compute| - |either|."""
    comm = kind >= 0
    busy = _union(group, start, end, np.ones(len(group), bool), size)
    # kernels of one side only (a job without NCCL: compute only) are the busy time's union already
    none = np.zeros(size, np.int64)
    compute = busy if not comm.any() else none if comm.all() else _union(group, start, end, ~comm, size)
    communication = none if not comm.any() else busy if comm.all() else _union(group, start, end, comm, size)
    totals = {"busy_ns": busy, "compute_ns": compute, "comm_ns": communication,
              "overlapped_ns": communication + compute - busy, "exposed_comm_ns": busy - compute,
              "exposed_compute_ns": busy - communication}
    return totals, overlap_by_kind(group, kind, start, end, size, compute)


def overlap_by_kind(group: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray, size: int,
                    compute: np.ndarray) -> dict:
    """overlap_by_window's rows per (group, collective kind), given the union of the compute kernels (kind -1) per
    group that it found: a grouping of the same communication kernels another way (by phase) takes it as it is."""
    comm = kind >= 0
    rows = {c: [] for c in ("group", "kind", "kernels", "comm_ns", "overlapped_ns", "exposed_ns")}
    for k in np.unique(kind[comm]):  # a few collective kinds: one pass over the kernels each
        of_kind = kind == k
        kernels = np.bincount(group[of_kind], minlength=size)
        with_kind = kernels > 0
        alone = _union(group, start, end, of_kind, size)
        either = _union(group, start, end, of_kind | ~comm, size)
        for column, values in (("group", np.flatnonzero(with_kind)), ("kind", np.full(with_kind.sum(), k)),
                               ("kernels", kernels[with_kind]), ("comm_ns", alone[with_kind]),
                               ("overlapped_ns", (alone + compute - either)[with_kind]),
                               ("exposed_ns", (either - compute)[with_kind])):
            rows[column].append(values)
    return {c: np.concatenate(v) if v else np.zeros(0, np.int64) for c, v in rows.items()}


def map_rank(rank_data, options: dict) -> dict:
    rank_data.require("kernel", "comm_overlap")
    if rank_data.streamed is not None:  # a long capture, measured a few iterations at a time as it was read
        return fold_rank(STREAM, rank_data, options)
    it, ranges = _iterations(rank_data, options)
    piece, _ = window_rows(rank_data, ranges, it, options)
    return {**map_result(it, [piece], ranges.names[:-1]), **collective_match.nccl_kernels(rank_data, it)}


def window_rows(rank_data, ranges, it: Iterations, options: dict, before: int = END_OF_TIME, first: int = 0,
                carried: dict | None = None) -> tuple[dict, dict]:
    """The windows, per-kind and per-phase rows of the iterations `it` (the rank's, or some of them: index `first`
    onward) from the events of the rank that bear on them; and, by launch key, the collective kind (from NCCL's
    ranges) and the phase name of the kernels launched before `before`, whose launching ranges a later piece may no
    longer have (`carried`: what earlier pieces learnt so)."""
    kernels = rank_data.frame("kernels")
    n_kernels = 0 if kernels is None else len(kernels)
    kind = collective_match.collective_kinds(kernels)
    start, end = (kernels.values(c) if n_kernels else np.zeros(0, np.int64) for c in ("start_ns", "end_ns"))
    ops = launched_ops(rank_data) if n_kernels and rank_data.has_cuda and len(ranges) else None
    by_range = _kind_from_nccl_ranges(rank_data, ranges, n_kernels, ops)
    phase_words = ranges.names  # the phases' names: the ranges', then those only carried from earlier pieces
    phase = _phase_of_kernels(rank_data, ranges, it, n_kernels, ops)  # a code into `phase_words`, -1: none
    key = call_key(kernels) if n_kernels else np.zeros(0, np.int64)
    decided = np.zeros(n_kernels, bool)  # launched before `before`: the ranges around the call were all read
    if ops is not None:
        decided[ops.op[(ops.op < n_kernels) & (ops.call_start_ns < before)]] = True
    if carried is not None and len(carried["key"]):  # learnt by an earlier piece, its ranges since let go
        at, known = key_places(carried["key"], key)
        known = np.flatnonzero(known)
        phase_words, phase[known] = _coded(phase_words, carried["phase"][at[known]])
        by_range[known], decided[known] = carried["kind"][at[known]], True
    carry = np.flatnonzero(decided)
    carry = carry[np.argsort(key[carry], kind="stable")]  # by key, as letting go keeps it
    carry = {"key": key[carry], "kind": by_range[carry], "phase": phase_words[phase[carry]]}  # code -1: None
    channel, channels = _channels(rank_data, kernels, kind)
    kind = np.where(kind < 0, by_range, kind)

    window_start, window_end = it.start_ns, it.end_ns
    event, window, clipped_start, clipped_end = split_into_windows(start, end, window_start, window_end)
    devices, device_at = factorize(kernels.values("device", fill=-1)[event] if n_kernels else event)
    group = window * max(len(devices), 1) + device_at
    size = len(window_start) * max(len(devices), 1)
    totals, per_kind = overlap_by_window(group, kind[event], clipped_start, clipped_end, size)
    # one row per window and device that ran kernels
    ran = np.flatnonzero(totals["busy_ns"] > 0)
    iteration, device = np.divmod(ran, max(len(devices), 1))
    windows = {"iteration": first + iteration, "device": devices[device], "start_ns": window_start[iteration],
               "end_ns": window_end[iteration], **{c: v[ran] for c, v in totals.items()}}
    by_kind = _rows(per_kind, devices, "kind", np.array(KINDS, object), first)
    # the same per NVTX phase: the communication kernels each phase launched take the place of the kinds
    # the phases that launched kernels in sorted order: their few names sorted, not each kernel's name as text
    used = np.flatnonzero(np.bincount(phase[phase >= 0], minlength=len(phase_words)))
    phase_label, used_at = np.unique(phase_words[used].astype(str), return_inverse=True)
    place = np.full(len(phase_words), -1, np.int64)  # code -1: the last word, None
    place[used] = used_at.reshape(-1)
    phase_code = place[phase]
    comm_phase = np.where(kind[event] >= 0, phase_code[event], -1)
    launched = (kind[event] < 0) | (comm_phase >= 0)  # compute, and communication some phase launched
    # every compute kernel is among them: the union of the compute kernels is the windows' own
    per_phase = overlap_by_kind(group[launched], comm_phase[launched], clipped_start[launched], clipped_end[launched],
                                size, totals["compute_ns"])
    by_phase = _rows(per_phase, devices, "phase", phase_label.astype(object), first)
    # the same per channel of NCCL kernels (stream, op, communicator), which the reduce gives its group kind
    nccl = (channel[event] >= 0) | (kind[event] < 0)
    per_channel = overlap_by_kind(group[nccl], channel[event][nccl], clipped_start[nccl], clipped_end[nccl], size,
                                  totals["compute_ns"])
    by_channel = _rows(per_channel, devices, "channel", np.arange(len(channels)), first)
    at = by_channel.pop("channel")
    by_channel.update({c: channels[at, i] for i, c in enumerate(("stream", "op", "comm_id"))})
    # its exposed communication as time, for waiting.py's split (each window's, which a long capture's pieces add up)
    comm = kind[event] >= 0
    _, start, end = overlay(union_segments_by_group(group[comm], clipped_start[comm], clipped_end[comm]),
                            union_segments_by_group(group[~comm], clipped_start[~comm], clipped_end[~comm]),
                            both=False)
    out = {"windows": windows, "by_kind": by_kind, "by_phase": by_phase, "by_channel": by_channel,
           "exposed": {"start_ns": start, "end_ns": end}}
    return out, carry


def _channels(rank_data, kernels, kind: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel's channel (-1: not an NCCL kernel by name) and the channels' (stream, op, comm_id) rows: the keys
    collective_match gives a group kind."""
    if not len(kind):
        return kind, np.zeros((0, 3), np.int64)
    nccl = kind >= 0
    keys = np.stack([kernels.values("stream", fill=-1), kind, collective_match.comm_ids(rank_data, kind)], axis=1)
    channels, at = np.unique(keys[nccl], axis=0, return_inverse=True)
    channel = np.full(len(kind), -1, np.int64)
    channel[nccl] = at.reshape(-1)
    return channel, channels


def map_result(it: Iterations, pieces: list[dict], names) -> dict:
    """The map's result from the pieces of all a rank's iterations, in order; the phases of each window and device in
    the order of the rank's NVTX names (`names`, as its whole table gives them), as a whole map has them."""
    tables = ("windows", "by_kind", "by_phase", "by_channel", "exposed")
    out = {table: {c: np.concatenate([p[table][c] for p in pieces]) for c in pieces[0][table]} for table in tables}
    by_phase = out["by_phase"]
    place = {w: i for i, w in enumerate(names)}
    labels, label_at = np.unique(by_phase["phase"].astype(str), return_inverse=True)
    name_place = np.array([place.get(w, -1) for w in labels], np.int64)[label_at.reshape(-1)]
    order = np.lexsort((name_place, by_phase["device"], by_phase["iteration"]))
    out["by_phase"] = {c: v[order] for c, v in by_phase.items()}
    totals = _totals(out["windows"])
    # as Arrow tables, which a worker writes to a file of its own and the reduce reads a rank at a time
    out = {table: pa.Table.from_arrays([_arrow(v) for v in columns.values()], names=list(columns))
           for table, columns in out.items()}
    return {**out, "totals": totals, "delimiter": it.delimiter.as_dict(), "start_ns": it.start_ns}


def _totals(windows: dict) -> list | None:
    """The rank's row of ranks.parquet (its iterations, their wall time and the windows' sums; None without
    windows), made where the windows are: the reduce then reads none of them for it."""
    if not len(windows["iteration"]):
        return None
    _, first = np.unique(windows["iteration"], return_index=True)  # a window's rows share its times
    wall = windows["end_ns"][first] - windows["start_ns"][first]
    return [len(first), int(wall.sum()), *(int(windows[c].sum()) for c in SUMMED)]


def _arrow(values: np.ndarray) -> pa.Array:
    """A column of the map's tables as Arrow; its labels (kinds, phases) coded against their few words."""
    if values.dtype != object:
        return arrow_of(values)
    words, codes = np.unique(values, return_inverse=True)
    return dictionary_column(codes.reshape(-1), words.tolist())


STREAM = sliced_stream(window_rows, map_result, NEEDS, whole_capture=True, nccl=True)


def _rows(per_key: dict, devices: np.ndarray, key: str, labels: np.ndarray, first: int) -> dict:
    """overlap_by_window's rows per (group, key) as columns: iteration (from `first`), device, the key's label, the
    times."""
    iteration, device = np.divmod(per_key["group"], max(len(devices), 1))
    return {"iteration": first + iteration, "device": devices[device] if len(devices) else device,
            key: labels[per_key["kind"]],
            **{c: per_key[c] for c in ("kernels", "comm_ns", "overlapped_ns", "exposed_ns")}}


def _ranked(per_rank: list[dict], key: str, dtypes: dict) -> RankedRows:
    """A map table of every rank as one output, written a rank at a time: each rank's rows by iteration and device,
    in the map's order among equals."""
    def made(rank: int, rows) -> pa.Table:
        rows = table_of(rows)
        return rows.take(np.lexsort((rows["device"].to_numpy(), rows["iteration"].to_numpy())))

    return RankedRows(output_schema({"rank": "int64", **dtypes}), [(r["rank"], r[key]) for r in per_rank], made)


def _ranks(per_rank: list[dict]) -> pd.DataFrame:
    """ranks.parquet: each rank's windows added up, by its map (a rank without windows has no row)."""
    rows = [[r["rank"], *r["totals"]] for r in per_rank if r["totals"] is not None]
    ranks = pd.DataFrame(rows, columns=RANK_COLUMNS[:-2], dtype="int64")
    ranks["exposed_comm_pct"] = 100.0 * ranks["exposed_comm_ns"] / ranks["wall_ns"].where(ranks["wall_ns"] > 0)
    ranks["overlapped_of_comm_pct"] = 100.0 * ranks["overlapped_ns"] / ranks["comm_ns"].where(ranks["comm_ns"] > 0)
    return ranks


def reduce(per_rank: list[dict], options: dict) -> dict:
    per_rank = sorted(per_rank, key=lambda r: r["rank"])  # every output in rank order, made a rank at a time
    ranks = _ranks(per_rank)
    if not ranks["comm_ns"].sum():
        raise NotApplicableError(
            f"comm_overlap does not apply: none of the {len(per_rank)} rank(s) ran communication kernels on the GPU "
            "(NCCL's ncclKernel*/ncclDevKernel*, or kernels launched inside NCCL's NVTX ranges); collectives run by "
            "the host (gloo, MPI) have no GPU time to overlap")
    sums = dict.fromkeys(GROUP_SUMS, "int64")
    tables = {"windows": _ranked(per_rank, "windows", dict.fromkeys(WINDOW_COLUMNS, "int64")),
              "collectives": _ranked(per_rank, "by_kind", {"iteration": "int64", "device": "int64", "kind": "str",
                                                           **sums}),
              "phases": _ranked(per_rank, "by_phase", {"iteration": "int64", "device": "int64", "phase": "object",
                                                       **sums}),
              "ranks": ranks}
    matched = collective_match.match(per_rank, options)
    if parallel.is_parallel(matched.groups):
        tables.update(_by_group(per_rank, matched, ranks))
    split = waiting.split(matched)
    if split is not None and all("exposed" in r for r in per_rank):
        tables["ranks"] = _with_waiting(per_rank, split, tables["ranks"])
    return tables


def _with_waiting(per_rank: list[dict], split, ranks: pd.DataFrame) -> pd.DataFrame:
    """ranks.parquet with each rank's NCCL kernels' time split into waiting for the last member and transfer, what
    its peers waited for it, and its exposed communication split the same way: exposure that is waiting belongs to
    the rank waited for, not to the network."""
    exposed = [table_of(r["exposed"]) for r in per_rank]
    rank = np.concatenate([np.full(t.num_rows, r["rank"], np.int64) for r, t in zip(per_rank, exposed, strict=True)])
    start, end = (np.concatenate([t[c].to_numpy() + r["offset_ns"] for r, t in zip(per_rank, exposed, strict=True)])
                  .astype(np.int64) for c in ("start_ns", "end_ns"))
    exposed_waiting = waiting.exposed_waiting(split, rank, start, end)
    out = ranks.merge(split.ranks, on="rank", how="left")
    for c in waiting.COLUMNS[1:]:
        out[c] = out[c].fillna(0).astype("int64")
    out["exposed_waiting_ns"] = out["rank"].map(exposed_waiting).fillna(0).astype("int64")
    out["exposed_transfer_ns"] = (out["exposed_comm_ns"] - out["exposed_waiting_ns"]).clip(lower=0)
    return out


def _by_group(per_rank: list[dict], matched, ranks: pd.DataFrame) -> dict:
    """A job with tensor or pipeline parallel groups: the communication of each group kind (tp, pp, dp, other), its
    overlapped and exposed time, per rank and iteration (`groups_exposure`) and per rank (exposed_<kind>_ns): TP
    exposure and DP exposure have different fixes. A channel's kernels are a group kind's; a rank's channels of one
    kind are added up (their kernels seldom run at once). Made a rank at a time."""
    kinds = matched.channels[[*collective_match.CHANNEL_KEY, "group"]]
    of_rank = dict(iter(kinds.groupby("rank", sort=False)))

    def joined(rank: int, by_channel) -> pd.DataFrame:
        channels = table_of(by_channel).to_pandas()
        channels.insert(0, "rank", np.int64(rank))
        out = channels.merge(of_rank.get(rank, kinds.iloc[:0]), on=collective_match.CHANNEL_KEY, how="left")
        out["group"] = out["group"].fillna("other").astype(str)
        return out

    def per_iteration(rank: int, by_channel) -> pa.Table:
        rows = joined(rank, by_channel).groupby(["iteration", "group"], sort=True)[GROUP_SUMS].sum()
        return pa.Table.from_pandas(rows.reset_index(), preserve_index=False)

    with_rows = [r for r in per_rank if len(r["by_channel"])]
    exposed = pd.DataFrame({r["rank"]: joined(r["rank"], r["by_channel"]).groupby("group")["exposed_ns"].sum()
                            for r in with_rows}).T
    ranks = ranks.copy()
    for kind in ("tp", "pp", "dp"):
        ranks[f"exposed_{kind}_ns"] = ranks["rank"].map(exposed[kind] if kind in exposed else {}).fillna(0) \
            .astype("int64")
    groups_exposure = RankedRows(output_schema({"rank": "int64", "iteration": "int64", "group": "str", **{
        c: "int64" for c in GROUP_SUMS}}), [(r["rank"], r["by_channel"]) for r in with_rows], per_iteration)
    return {"groups_exposure": groups_exposure, "ranks": ranks, "groups": matched.groups,
            "settings": {"groups_source": matched.source, "notes": matched.notes}}


def summary(out) -> list[str]:
    kinds = pd.read_parquet(out / "collectives.parquet")
    t = kinds.groupby("kind")[["kernels", "comm_ns", "overlapped_ns", "exposed_ns"]].sum()
    table = pd.DataFrame({"kernels": t["kernels"], "comm ms": t["comm_ns"].map(ms_cell),
                          "overlapped ms": t["overlapped_ns"].map(ms_cell), "exposed ms": t["exposed_ns"].map(ms_cell)})
    ranks = pd.read_parquet(out / "ranks.parquet").sort_values("exposed_comm_ns", ascending=False).head(5)
    # a run without communication kernels writes no output (reduce: not applicable)
    waited = waiting.summary_lines(pd.read_parquet(out / "ranks.parquet")) if "waiting_ns" in ranks else []
    head = indented("communication by collective, all ranks:", table.to_string()) + _group_lines(out) + waited
    return head + indented(
        "most exposed communication:", pd.DataFrame({
            "rank": ranks["rank"], "exposed ms": ranks["exposed_comm_ns"].map(ms_cell),
            "% of iterations": ranks["exposed_comm_pct"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}"),
            "overlapped % of comm": ranks["overlapped_of_comm_pct"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}"),
        }).to_string(index=False))


def _group_lines(out) -> list[str]:
    """A parallel job's communication per group kind, all ranks (groups_exposure.parquet)."""
    if not (out / "groups_exposure.parquet").exists():
        return []
    g = pd.read_parquet(out / "groups_exposure.parquet").groupby("group")[["kernels", "comm_ns", "overlapped_ns",
                                                                          "exposed_ns"]].sum()
    return indented("communication by group kind, all ranks:", pd.DataFrame({
        "kernels": g["kernels"], "comm ms": g["comm_ns"].map(ms_cell), "overlapped ms": g["overlapped_ns"].map(ms_cell),
        "exposed ms": g["exposed_ns"].map(ms_cell)}).to_string())


def headline(out) -> str:
    ranks = pd.read_parquet(out / "ranks.parquet")
    comm, exposed, wall = (int(ranks[c].sum()) for c in ("comm_ns", "exposed_comm_ns", "wall_ns"))
    said = f"communication {ms(comm)}, {100 * (comm - exposed) / comm:.0f} % of it overlapped"
    waited = waiting.phrase(ranks) if "waiting_ns" in ranks else ""
    if not waited:  # no collective matched across ranks (one rank, a long capture): all of it as exposed
        worst = ranks.loc[ranks["exposed_comm_ns"].idxmax()]
        return (f"{said}; exposed {100 * exposed / max(wall, 1):.1f} % of the iterations' time; most on rank "
                f"{int(worst['rank'])} ({ms(worst['exposed_comm_ns'])})")
    transfer = int(ranks["exposed_transfer_ns"].sum())
    worst = ranks.loc[ranks["exposed_transfer_ns"].idxmax()]
    return (f"{said}, {waited}; exposed transfer {100 * transfer / max(wall, 1):.1f} % of the iterations' time "
            f"(exposed waiting {100 * (exposed - transfer) / max(wall, 1):.1f} %), most on rank {int(worst['rank'])} "
            f"({ms(worst['exposed_transfer_ns'])})")


def diff_metrics(ranks) -> pd.DataFrame | None:
    """Exposed communication by collective kind over a run (ranks without iterations or kernels add nothing)."""
    parts = []
    for rank_data in ranks:
        if rank_data.kernels is None or not len(rank_data.kernels):
            continue
        by_kind = map_rank(rank_data, {})["by_kind"]
        parts.append(pd.DataFrame({"key": by_kind["kind"].to_pylist(), "value": by_kind["exposed_ns"].to_numpy()}))
    if not parts:
        return None
    t = pd.concat(parts, ignore_index=True).groupby("key")["value"].sum()
    return pd.DataFrame({"metric": "exposed_comm_ns", "key": t.index, "value": t.to_numpy(np.float64)}) if len(t) \
        else None


RECIPE = Recipe(
    name="comm_overlap",
    display_name="Communication overlap",
    description="How much of each rank's communication (NCCL kernels) runs beside compute on its GPU and how much "
                "is exposed, per iteration and collective kind.",
    needs=frozenset(NEEDS | GROUP_NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=iteration_and_parallel_options,
    per_iteration=True,
    lazy_tables=True,  # its windows and per-kind rows, a row per rank, iteration and device: read a rank at a time
    stream=STREAM,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.comm_overlap",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("exposed_comm_ns", "exposed communication"),),
)
