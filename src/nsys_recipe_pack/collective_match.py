"""NCCL collectives matched across ranks, and the parallel groups they show: what the `collectives` recipe reports,
and what `straggler_heatmap` and `comm_overlap` use to compare a rank with its own peers.

Each rank's NCCL kernels are its arrivals: a kernel starts when the rank's GPU reaches the collective and ends when
the data has moved, once every member has arrived. A rank's kernels of one communicator and operation, in order, are
matched with the same-numbered kernels of the other members (`seq`). Per instance: the first and last arrival on
aligned clocks, the rank that arrived last, the time the members waited for it (each member's arrival to the last
one's, added up), the transfer (the last arrival to the members' median end) and the algorithm bandwidth (bytes over
transfer). A SendRecv is matched with its peer's: between two ranks that exchange as often as each other, in
order; otherwise the kernel that ends with it.

A kernel's communicator is the one NCCL's NVTX payload names (the NCCL call around its launch), else the one inferred
by `parallel.py` (its rank, stream and operation); the groups come from the same place, or from `--parallel`.
Where a collective's members end further apart than its own transfer takes, the hosts' clocks disagree: each host's
offset is estimated from the collectives' ends (they end together) and taken out before anything is compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from . import parallel
from .gpu import launched_ops
from .inputs.frames import arrow_of, numpy_of
from .iterations import NCCL_KERNEL_RE
from .lazy import pd
from .nvtx import innermost_of
from .spill import table_of

NEEDS = {"kernel", "runtime", "payload"}
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "send_recv", "broadcast", "reduce", "all_to_all", "other"]
KIND_OF_OP = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "sendrecv": "send_recv", "send": "send_recv", "recv": "send_recv", "broadcast": "broadcast",
               "reduce": "reduce", "alltoall": "all_to_all"}
_OP_RE = re.compile(r"^ncc(?:l|lDev)Kernel_([A-Za-z]+)")
KIND_LABELS = np.array(KINDS, dtype=object)
SEND_RECV = KINDS.index("send_recv")
KERNEL_COLUMNS = ("op", "stream", "start_ns", "end_ns", "comm_id", "bytes", "iteration")
INIT_COLUMNS = ("comm_id", "nranks", "comm_rank")
COLLECTIVE_COLUMNS = ["communicator", "group", "members", "iteration", "seq", "op", "bytes",
                      "first_arrival_aligned_ns", "last_arrival_aligned_ns", "end_aligned_ns", "last_rank", "wait_ns",
                      "transfer_ns", "algbw_gbps"]


def collective_kind(name: str | None) -> int:
    """Index into KINDS of a communication kernel's collective, -1 for any other kernel."""
    if name is None or not NCCL_KERNEL_RE.search(name):
        return -1
    op = _OP_RE.match(name)
    return KINDS.index(KIND_OF_OP.get(op.group(1).lower(), "other")) if op else KINDS.index("other")


def nccl_kernels(rank_data, it=None) -> dict:
    """One rank's NCCL kernels (operation, stream, start, end; communicator id and bytes from NCCL's NVTX payloads,
    -1 where none; the iteration of `it` each starts in, -1 outside) and the communicators it joined, as Arrow
    tables: what a map hands the reduce for `match`. A rank without kernels has none; a long capture read span by
    span, whose kernels were not kept, gives no tables."""
    kernels = rank_data.frame("kernels")
    if kernels is None and rank_data.streamed is not None:  # a long capture's kernels went by span by span
        return {}
    if kernels is None or not len(kernels):
        return _tables({c: np.zeros(0, np.int64) for c in KERNEL_COLUMNS}, {c: np.zeros(0, np.int64)
                                                                          for c in INIT_COLUMNS})
    kind = collective_kinds(kernels)
    nccl = np.flatnonzero(kind >= 0)
    start, end = kernels.values("start_ns")[nccl], kernels.values("end_ns")[nccl]
    comm, nbytes = np.full(len(nccl), -1, np.int64), np.full(len(nccl), -1, np.int64)
    calls = rank_data.frame("payloads")
    if calls is not None and len(calls) and rank_data.has_cuda and len(nccl):
        comm, nbytes = _from_payloads(rank_data, calls, nccl)
    iteration = it.of(start) if it is not None and len(it.start_ns) else np.full(len(nccl), -1, np.int64)
    init = calls.values("nranks") > 0 if calls is not None else np.zeros(0, bool)
    inits = {c: calls.values(c)[init] if calls is not None else np.zeros(0, np.int64) for c in INIT_COLUMNS}
    columns = {"op": kind[nccl], "stream": kernels.values("stream", fill=-1)[nccl], "start_ns": start,
               "end_ns": end, "comm_id": comm, "bytes": nbytes, "iteration": iteration}
    return _tables(columns, inits)


def collective_kinds(kernels) -> np.ndarray:
    """Each kernel's collective (`collective_kind`), from the frame's few distinct names."""
    if kernels is None or not len(kernels):
        return np.zeros(0, np.int64)
    codes, words = kernels.codes("name")
    return np.array([collective_kind(None if w is None else str(w)) for w in words], np.int64)[codes]


def nccl_rows(kernels) -> dict:
    """The NCCL kernels of a kernel frame (a span's, as a map keeps them while the spans pass): collective, stream,
    start and end, for `kernel_tables`."""
    kind = collective_kinds(kernels)
    at = np.flatnonzero(kind >= 0)
    return {"op": kind[at], "stream": kernels.values("stream", fill=-1)[at],
            "start_ns": kernels.values("start_ns")[at], "end_ns": kernels.values("end_ns")[at]}


def kernel_tables(parts: list[dict], it=None) -> dict:
    """`nccl_kernels`' tables from a rank's NCCL kernels where a map kept them itself as they passed (`nccl_rows`'
    parts, in time order: compute_memory_share's fold, iteration_slices), without payloads: -1 in their communicator
    and size, no communicator joined; the iteration of `it` each starts in (-1: none)."""
    columns = ("op", "stream", "start_ns", "end_ns")
    kernels = {c: np.concatenate([p[c] for p in parts]) if parts else np.zeros(0, np.int64) for c in columns}
    none = np.full(len(kernels["op"]), -1, np.int64)
    iteration = it.of(kernels["start_ns"]) if it is not None and len(it.start_ns) else none
    columns = {**kernels, "comm_id": none, "bytes": none, "iteration": iteration}
    return _tables({c: columns[c] for c in KERNEL_COLUMNS}, {c: np.zeros(0, np.int64) for c in INIT_COLUMNS})


def _tables(columns: dict, inits: dict) -> dict:
    return {"nccl_kernels": pa.table({c: arrow_of(np.asarray(v, np.int64)) for c, v in columns.items()}),
            "nccl_inits": pa.table({c: arrow_of(np.asarray(v, np.int64)) for c, v in inits.items()})}


def comm_ids(rank_data, kind: np.ndarray) -> np.ndarray:
    """The communicator id NCCL's payloads give each kernel with a collective kind (`kind`, per kernel: -1 for
    none), -1 where none does (no payloads read, as in a long capture)."""
    out = np.full(len(kind), -1, np.int64)
    calls = rank_data.frame("payloads")
    nccl = np.flatnonzero(kind >= 0)
    if calls is not None and len(calls) and rank_data.has_cuda and len(nccl):
        out[nccl] = _from_payloads(rank_data, calls, nccl)[0]
    return out


def _from_payloads(rank_data, calls, nccl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The communicator and message size of each NCCL kernel: those of the NCCL call (an NVTX range with a payload)
    around the runtime call that launched it, on the same thread."""
    comm, nbytes = np.full(len(nccl), -1, np.int64), np.full(len(nccl), -1, np.int64)
    ops = launched_ops(rank_data)
    kernels = len(rank_data.frame("kernels"))
    mine = np.flatnonzero(ops.op < kernels)
    place = np.full(kernels, -1, np.int64)
    place[nccl] = np.arange(len(nccl))
    mine = mine[place[ops.op[mine]] >= 0]
    if not len(mine):
        return comm, nbytes
    around = innermost_of(calls.values("tid"), calls.values("start_ns"), calls.values("end_ns"), ops.tid[mine],
                          ops.call_start_ns[mine], ops.call_end_ns[mine])
    hit = around >= 0
    at = place[ops.op[mine[hit]]]
    comm[at] = calls.values("comm_id")[around[hit]]
    nbytes[at] = calls.values("bytes")[around[hit]]
    return comm, nbytes


# -----------------------------------------------------------------------------------------------------------------
# across ranks


@dataclass
class Matched:
    """The ranks' parallel groups (groups.parquet's rows), how they were found, the communicators, every collective
    matched across its members (empty where no rank ran NCCL kernels), each host's clock offset, what the inputs
    showed that a reader should know (`notes`), and the group kind of each rank's (stream, op, comm_id) channel of
    NCCL kernels (`channels`: comm_id -1 where NCCL's payloads named none); `kernels`: every NCCL kernel (rank,
    iteration, aligned start and end, group kind) and the row of `collectives` it is a member of (-1: none)."""
    groups: pd.DataFrame
    source: str
    communicators: pd.DataFrame
    collectives: pd.DataFrame
    clock: pd.DataFrame
    notes: list
    channels: pd.DataFrame
    kernels: pd.DataFrame

    def host_offsets(self) -> pd.Series:
        """Per rank, its host's clock offset taken out of the kernels' aligned times (0 where none): what a table of
        the run's aligned times loses to meet them."""
        by_host = self.clock.set_index("host")["offset_ns"] if len(self.clock) else {}
        return self.groups.set_index("rank")["host"].map(by_host).fillna(0).astype("int64")

    def shifts(self, per_rank: list[dict]) -> dict:
        """Per rank (the reduce's items), what its own clock's times gain on the kernels' aligned clock."""
        offsets = self.host_offsets()
        return {r["rank"]: r["offset_ns"] - int(offsets.get(r["rank"], 0)) for r in per_rank}


MEMBER_COLUMNS = ["rank", "iteration", "start_aligned_ns", "end_aligned_ns", "group", "instance"]


def match(per_rank: list[dict], options: dict, only_parallel: bool = False) -> Matched:
    """Groups and matched collectives from the maps' `nccl_kernels` (per_rank items: its nccl_kernels and nccl_inits,
    rank, offset_ns, identity; no nccl_kernels where the map read none, as a long capture's). `--parallel`
    (options["parallel"]) gives the groups where the trace shows none; it must agree with NCCL's payloads, and wins
    over groups inferred from the kernels' timing (a note names the ranks where they differ). only_parallel: no
    collectives are matched for a job without tensor or pipeline parallel groups (its caller has no use for them)."""
    ranks = np.array(sorted(r["rank"] for r in per_rank), np.int64)
    hosts = {r["rank"]: r.get("identity", {}).get("host") for r in per_rank}
    layout = parallel.parse_parallel(options["parallel"]) if options.get("parallel") else None
    read = [r for r in per_rank if r.get("nccl_kernels") is not None]
    seen = _seen(read)
    notes: list[str] = []
    if len(read) < len(per_rank):
        notes.append(f"{len(per_rank) - len(read)} rank(s) were read as long captures, whose NCCL kernels are not "
                     "matched: their groups come from --parallel, else the ranks are one group")
    comms = pd.DataFrame(columns=["communicator", "members", "size", "collective_calls", "p2p_calls", "group"])
    source = "one_group"
    if seen.n_kernels and len(read) == len(per_rank):
        comms, source = _communicators(read, seen, notes)
    found = comms["group"].isin(["tp", "pp", "dp"]).any()
    if found and not (source == "inferred" and layout is not None):
        groups = parallel.groups_from_communicators(ranks, comms, source)
        if layout is not None:
            parallel.check_layout(groups, layout, "NCCL payloads")
    elif layout is not None:
        groups = parallel.layout_groups(layout, ranks).assign(source="--parallel")
        if found:
            differ = sorted({d[0] for d in parallel.layout_differences(
                parallel.groups_from_communicators(ranks, comms, source), layout)})
            if differ:
                notes.append(f"the groups are --parallel's; the NCCL kernels' timing suggested others for rank(s) "
                             f"{', '.join(map(str, differ[:8]))}{', …' if len(differ) > 8 else ''}")
    else:
        groups = parallel.one_group(ranks).assign(source="one_group")
        source = "one_group"
    if source == "inferred" and layout is not None:
        source = "--parallel"
    groups["host"] = groups["rank"].map(hosts)
    groups = groups[parallel.GROUP_COLUMNS].reset_index(drop=True)
    channels = _channels(seen, comms)
    if not seen.n_kernels or not len(comms) or (only_parallel and not parallel.is_parallel(groups)):
        return Matched(groups, source, comms, pd.DataFrame(columns=COLLECTIVE_COLUMNS),
                       pd.DataFrame(columns=["host", "offset_ns", "collectives"]), notes, channels,
                       pd.DataFrame(columns=MEMBER_COLUMNS))
    kernels = _kernels(read, seen)
    clock = _clock_offsets(kernels, hosts, notes)
    collectives, seq = _matched(kernels, comms, notes)
    collectives = collectives.sort_values(["first_arrival_aligned_ns", "communicator"], kind="stable")
    collectives = collectives[COLLECTIVE_COLUMNS].reset_index(drop=True)
    members = _members(kernels, comms, collectives, seq)
    for c in ("iteration", "seq", "first_arrival_aligned_ns", "last_arrival_aligned_ns", "end_aligned_ns", "last_rank",
              "wait_ns", "transfer_ns"):
        collectives[c] = collectives[c].astype("int64")
    collectives["bytes"] = collectives["bytes"].astype("Int64")
    collectives["members"] = collectives["members"].map(lambda m: [int(x) for x in m])
    comms = comms.assign(members=comms["members"].map(lambda m: [int(x) for x in m]))
    return Matched(groups, source, comms, collectives, clock, notes, channels, members)


def _members(kernels: pd.DataFrame, comms: pd.DataFrame, collectives: pd.DataFrame, seq: pd.Series) -> pd.DataFrame:
    """MEMBER_COLUMNS of every NCCL kernel: its instance from its communicator, operation and seq (`seq`, by the
    kernels' index: those matched)."""
    instance = pd.Series(np.arange(len(collectives), dtype=np.int64),
                         index=pd.MultiIndex.from_frame(collectives[["communicator", "op", "seq"]].astype(
                             {"seq": "int64"})))
    matched = kernels.loc[seq.index]
    at = pd.MultiIndex.from_arrays([matched["communicator"], KIND_LABELS[matched["op"].to_numpy(np.int64)],
                                    seq.astype("int64")])
    out = kernels[["rank", "iteration", "start_aligned_ns", "end_aligned_ns"]].astype("int64")
    group = kernels["communicator"].map(dict(zip(comms["communicator"], comms["group"], strict=True)))
    out["group"] = group.astype(object).where(group.notna(), "other")
    out["instance"] = -1
    out.loc[seq.index, "instance"] = instance.reindex(at).fillna(-1).to_numpy(np.int64)
    return out[MEMBER_COLUMNS].reset_index(drop=True)


CHANNEL_KEY = ["rank", "stream", "op", "comm_id"]


@dataclass
class _Seen:
    """What one pass over the ranks' NCCL kernels keeps of them, a few rows a rank: each channel (CHANNEL_KEY) with
    its count of kernels and the place of its first among them all (`first`), a rank's in CHANNEL_KEY's order, and
    `starts`: each rank's first channel; the collective kernels of each (rank, stream, operation), in order (`timed`:
    rank, stream, kind, count), with the ends on aligned clocks and the durations of their sampled instances
    (parallel.sampled_instances), what inferring groups from timing compares; and every SendRecv kernel (rank, start
    and end on aligned clocks). Ten thousand ranks have millions of kernels, which a job without tensor or pipeline
    groups then never holds."""
    channels: pd.DataFrame
    starts: list
    timed: pd.DataFrame
    ends: list
    durations: list
    sends: list
    n_kernels: int


def _seen(per_rank: list[dict]) -> _Seen:
    channels, starts, timed, ends, durations = [], [], [], [], []
    sends = [[np.zeros(0, np.int64)] for _ in range(3)]
    at = n_channels = 0
    for r in per_rank:
        rows = table_of(r["nccl_kernels"], ["op", "stream", "start_ns", "end_ns", "comm_id"])
        op, stream, comm = (numpy_of(rows.column(c)) for c in ("op", "stream", "comm_id"))
        start, end = (numpy_of(rows.column(c)) + r["offset_ns"] for c in ("start_ns", "end_ns"))
        starts.append(n_channels)
        if len(op):
            key, first, count = np.unique(np.stack([stream, op, comm], axis=1), axis=0, return_index=True,
                                          return_counts=True)
            channels.append(np.column_stack([np.full(len(key), r["rank"]), key, count, first + at]))
            n_channels += len(key)
            coll = np.flatnonzero(op != SEND_RECV)
            order = coll[np.lexsort((start[coll], op[coll], stream[coll]))]
            lead = np.flatnonzero(np.r_[True, (stream[order][1:] != stream[order][:-1]) |
                                        (op[order][1:] != op[order][:-1])]) if len(order) else np.zeros(0, np.int64)
            size = np.diff(np.r_[lead, len(order)])
            for f, c in zip(lead.tolist(), size.tolist(), strict=True):  # a rank has a few channels
                picked = order[f + parallel.sampled_instances(c)]
                ends.append(end[picked])
                durations.append(end[picked] - start[picked])
            timed.append(np.column_stack([np.full(len(lead), r["rank"]), stream[order[lead]], op[order[lead]], size]))
            p2p = np.flatnonzero(op == SEND_RECV)
            for kept, values in zip(sends, (np.full(len(p2p), r["rank"]), start[p2p], end[p2p]), strict=True):
                kept.append(values)
        at += len(op)
    channels = pd.DataFrame(np.concatenate(channels) if channels else np.zeros((0, 6), np.int64),
                            columns=[*CHANNEL_KEY, "count", "first"]).astype("int64")
    timed = pd.DataFrame(np.concatenate(timed) if timed else np.zeros((0, 4), np.int64),
                         columns=["rank", "stream", "kind", "count"]).astype("int64")
    # in order of rank, stream and operation, whatever the maps' order
    order = np.lexsort((timed["kind"], timed["stream"], timed["rank"]))
    timed = timed.iloc[order].reset_index(drop=True)
    return _Seen(channels, starts, timed, [ends[i] for i in order], [durations[i] for i in order],
                 [np.concatenate(s) for s in sends], at)


def _channels(seen: _Seen, comms: pd.DataFrame) -> pd.DataFrame:
    """Each (rank, stream, op, comm_id) of NCCL kernels, in order of its first kernel, and the group kind of its
    communicator ("other": none)."""
    if not seen.n_kernels or "communicator" not in seen.channels:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in CHANNEL_KEY}).assign(group=pd.Series(dtype=object))
    group_of = dict(zip(comms["communicator"], comms["group"], strict=True))
    out = seen.channels.sort_values("first", kind="stable")
    group = out["communicator"].map(group_of).astype(object)
    out = out.assign(group=group.where(group.notna(), "other"))
    return out[[*CHANNEL_KEY, "group"]].astype({c: "int64" for c in CHANNEL_KEY}).reset_index(drop=True)


def communicator_keys(comm_id: np.ndarray) -> np.ndarray:
    """NCCL's communicator ids as the keys the outputs show (16 hex digits), each distinct id formatted once."""
    ids, at = np.unique(comm_id, return_inverse=True)
    return np.array([f"{c & 0xFFFFFFFFFFFFFFFF:016x}" for c in ids.tolist()], dtype=object)[at.reshape(-1)]


def _kernels(per_rank: list[dict], seen: _Seen) -> pd.DataFrame:
    """Every rank's NCCL kernels in one table, with its rank, its times on aligned clocks and its channel's
    communicator, filled a rank's table at a time: ten thousand ranks have millions, which one Arrow table of them
    all, then pandas', would hold twice."""
    counts = [r["nccl_kernels"].num_rows for r in per_rank]
    held = [c for c in KERNEL_COLUMNS if c not in ("start_ns", "end_ns")]
    columns = {c: np.empty(sum(counts), np.int64) for c in (*held, "rank", "start_aligned_ns", "end_aligned_ns")}
    channel = np.empty(sum(counts), np.int64)
    at = 0
    for r, count, first in zip(per_rank, counts, seen.starts, strict=True):
        rows = table_of(r["nccl_kernels"])
        for c in held:
            columns[c][at:at + count] = numpy_of(rows.column(c))
        columns["rank"][at:at + count] = r["rank"]
        if count:
            key = np.stack([columns[c][at:at + count] for c in CHANNEL_KEY if c != "rank"], axis=1)
            channel[at:at + count] = first + np.unique(key, axis=0, return_inverse=True)[1].reshape(-1)
        for c in ("start", "end"):
            columns[f"{c}_aligned_ns"][at:at + count] = numpy_of(rows.column(f"{c}_ns"))
            columns[f"{c}_aligned_ns"][at:at + count] += r["offset_ns"]
        at += count
    kernels = pd.DataFrame(columns, copy=False)
    kernels["communicator"] = seen.channels["communicator"].to_numpy(object)[channel]
    return kernels


def _ranked(per_rank: list[dict], table: str) -> pd.DataFrame:
    """One of the maps' tables over every rank, with a rank column."""
    out = pa.concat_tables([table_of(r[table]) for r in per_rank]).to_pandas()
    out["rank"] = np.repeat([r["rank"] for r in per_rank], [r[table].num_rows for r in per_rank]).astype(np.int64)
    return out


def _communicators(per_rank: list[dict], seen: _Seen, notes: list[str]) -> tuple[pd.DataFrame, str]:
    """The communicators (members in communicator order, group label) and each channel's communicator key (written
    into seen.channels["communicator"]); how they were found."""
    inits = _ranked(per_rank, "nccl_inits")
    channels = seen.channels
    p2p = channels["op"] == SEND_RECV
    if len(inits) and (channels["comm_id"] >= 0).any():
        inits = inits.drop_duplicates(["comm_id", "rank"])
        channels["communicator"] = communicator_keys(channels["comm_id"].to_numpy(np.int64))
        inits["communicator"] = communicator_keys(inits["comm_id"].to_numpy(np.int64))
        members, keys, sizes = [], [], []
        for key, rows in inits.sort_values("comm_rank").groupby("communicator", sort=True):
            keys.append(key)
            members.append(rows["rank"].astype(int).tolist())
            sizes.append(int(rows["nranks"].max()))
        short = [(k, m, s) for k, m, s in zip(keys, members, sizes, strict=True) if len(m) < s]
        if short:
            notes.append(f"{len(short)} communicator(s) have members not among the inputs, e.g. {short[0][0]}: "
                         f"{len(short[0][1])} of {short[0][2]} ranks ({', '.join(map(str, short[0][1][:8]))}); "
                         "their collectives are matched among the ranks present")
        source = "nvtx_payload"
    else:
        channels["communicator"] = None
        keys, members = _inferred(seen, p2p)
        source = "inferred"
    comms = _table(channels, p2p, keys, members)
    if source == "inferred":
        # ranks that act at once in other groups end together: split by tensor-parallel place, then by stage
        for kind in ("tp", "pp"):
            place = {int(r): i for m in comms.loc[comms["group"] == kind, "members"] for i, r in enumerate(m)}
            comms = _split(channels, p2p, comms, place, kind)
    return comms, source


def _split(channels: pd.DataFrame, p2p: pd.Series, comms: pd.DataFrame, place: dict, kind: str) -> pd.DataFrame:
    """Communicators not of `kind` split so that their members share one place in a `kind` communicator (Megatron's
    groups are orthogonal); the channels' communicator keys follow."""
    new_key: dict = {}
    keys, members = [], []
    for key, m, group in comms[["communicator", "members", "group"]].itertuples(index=False):
        parts: dict = {}
        for r in m:
            parts.setdefault(place.get(int(r), 0) if group != kind else 0, []).append(int(r))
        for i, part in enumerate(parts.values()):
            keys.append(key if len(parts) == 1 else f"{key}.{i}")
            members.append(part)
            new_key.update({(key, r): keys[-1] for r in part})
    if keys == comms["communicator"].tolist():  # none split (a job of one kind of group): every key stays
        return comms
    channels["communicator"] = _renamed(channels, new_key)
    return _table(channels, p2p, keys, members)


def _renamed(channels: pd.DataFrame, new_key: dict) -> np.ndarray:
    """Each channel's communicator after a split: new_key maps (old key, rank) to the new key."""
    found = pd.Series(new_key)
    at = pd.MultiIndex.from_arrays([channels["communicator"], channels["rank"].astype("int64")])
    looked = found.reindex(at).to_numpy() if len(found) else np.full(len(channels), None, object)
    return np.where(pd.isna(looked), channels["communicator"].to_numpy(object), looked)


def _table(channels: pd.DataFrame, p2p: pd.Series, keys: list[str], members: list[list[int]]) -> pd.DataFrame:
    collective_calls, p2p_calls = [], []
    counted = channels.groupby(["communicator", p2p.rename("p2p")])["count"].sum()
    for key, m in zip(keys, members, strict=True):
        collective_calls.append(int(counted.get((key, False), 0)) // max(len(m), 1))
        p2p_calls.append(int(counted.get((key, True), 0)) // max(len(m), 1))
    return parallel.communicator_table(members, keys, collective_calls, p2p_calls)


def _inferred(seen: _Seen, p2p: pd.Series) -> tuple[list[str], list[list[int]]]:
    """Communicators inferred from the kernels' timing (parallel.py), each channel's written into
    seen.channels["communicator"]."""
    keys, members = [], []
    table = seen.timed
    labels = parallel.infer_collective_channels(table, seen.ends, seen.durations) if len(table) else \
        np.zeros(0, np.int64)
    channel_key = np.full(len(table), np.nan, dtype=object)  # a channel of no communicator: as a lookup misses
    for _, rows in table.assign(label=labels).groupby("label", sort=True):
        ranks = sorted(set(rows["rank"].astype(int)))
        if len(ranks) < 2:
            continue
        key = f"inferred-{len(keys)}"
        keys.append(key)
        members.append(ranks)
        channel_key[rows.index.to_numpy()] = key
    channels = seen.channels
    if keys:  # each collective channel's communicator: that of its rank, stream and operation
        of_timed = pd.Series(channel_key, index=pd.MultiIndex.from_frame(table[["rank", "stream", "kind"]]))
        coll = ~p2p.to_numpy()
        at = pd.MultiIndex.from_arrays([channels[c].to_numpy()[coll] for c in ("rank", "stream", "op")])
        communicator = channels["communicator"].to_numpy(object).copy()
        communicator[coll] = of_timed.reindex(at).to_numpy()
        channels["communicator"] = communicator
    pairs = parallel.infer_p2p_pairs(*seen.sends)
    for chain in parallel.chains(pairs):
        key = f"inferred-{len(keys)}"
        keys.append(key)
        members.append(chain)
        channels.loc[p2p & channels["rank"].isin(chain), "communicator"] = key
    return keys, members


def _matched(kernels: pd.DataFrame, comms: pd.DataFrame, notes: list[str]) -> tuple[pd.DataFrame, pd.Series]:
    """One row per collective instance (per communicator, operation and seq), and per SendRecv pair; the seq of each
    matched kernel (by the kernels' index)."""
    group_of = dict(zip(comms["communicator"], comms["group"], strict=True))
    members_of = dict(zip(comms["communicator"], comms["members"], strict=True))
    k = kernels[kernels["communicator"].isin(group_of)].copy()
    k = k.sort_values(["communicator", "op", "rank", "start_aligned_ns"], kind="stable")
    coll = k[k["op"] != SEND_RECV].copy()
    coll["seq"] = coll.groupby(["communicator", "op", "rank"]).cumcount()
    counts = coll.groupby(["communicator", "op", "rank"]).size()
    for (key, op), per in counts.groupby(level=[0, 1]):
        if per.nunique() > 1 or len(per) < len(members_of[key]):
            absent = sorted(set(members_of[key]) - set(per.index.get_level_values(2)))
            notes.append(f"communicator {key} ({group_of[key]}), {KINDS[op]}: kernels per rank differ ("
                         + ", ".join(f"rank {r[2]}: {n}" for r, n in per.items())
                         + (f"; no kernel on rank(s) {', '.join(map(str, absent))}" if absent else "")
                         + "): instances are matched by their order, the last ones on fewer ranks")
    rows = [_instances(coll, ["communicator", "op", "seq"])]
    seqs = [coll["seq"]]
    sends = k[k["op"] == SEND_RECV].sort_values(["communicator", "end_aligned_ns"], kind="stable")
    if len(sends):
        # two ranks exchanging as often as each other: their exchanges in order; otherwise by their ends
        per = sends.groupby(["communicator", "rank"]).size().groupby(level=0).agg(["size", "nunique"])
        in_order = sends["communicator"].isin(per.index[(per["size"] == 2) & (per["nunique"] == 1)])
        ordered = sends[in_order].sort_values(["communicator", "rank", "start_aligned_ns"], kind="stable")
        ordered = ordered.assign(seq=ordered.groupby(["communicator", "rank"]).cumcount())
        paired = pd.concat([ordered, _paired(sends[~in_order])])
        rows.append(_instances(paired, ["communicator", "op", "seq"]))
        seqs.append(paired["seq"])
    out = pd.concat([r for r in rows if len(r)], ignore_index=True) if any(len(r) for r in rows) else \
        pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    out["group"] = out["communicator"].map(group_of)
    return out, pd.concat(seqs)


def _paired(sends: pd.DataFrame) -> pd.DataFrame:
    """SendRecv kernels in pairs: each with the next kernel of its communicator to end (of another rank), within
    parallel.tolerance; a kernel with none is left out. seq numbers the pairs of each communicator."""
    end = sends["end_aligned_ns"].to_numpy(np.int64)
    duration = end - sends["start_aligned_ns"].to_numpy(np.int64)
    rank = sends["rank"].to_numpy(np.int64)
    comm = sends["communicator"].to_numpy(object)
    close = np.flatnonzero((np.diff(end) <= parallel.tolerance(np.minimum(duration[1:], duration[:-1]))) &
                           (rank[1:] != rank[:-1]) & (comm[1:] == comm[:-1]))
    # a run of kernels each close to the next pairs up from its start: the first with the second, the third with
    # the fourth...
    run_start = np.maximum.accumulate(np.where(np.r_[True, np.diff(close) != 1], close, 0)) if len(close) else close
    first = close[(close - run_start) % 2 == 0]
    seq = np.full(len(sends), -1, np.int64)
    seq[first] = seq[first + 1] = np.arange(len(first))
    # numbered from 0 in each communicator (the pairs come communicator after communicator)
    first_of_comm = pd.Series(seq[first]).groupby(comm[first]).transform("min").to_numpy() if len(first) else first
    seq[first] -= first_of_comm
    seq[first + 1] = seq[first]
    out = sends.assign(seq=seq)
    return out[out["seq"] >= 0]


def _instances(k: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    if not len(k):
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    g = k.groupby(key, sort=True)
    last = k.loc[g["start_aligned_ns"].idxmax()].set_index(key)
    sizes = g.size()
    # each instance's ranks in order: one sort of all the kernels, not a sort per instance
    rank = k["rank"].to_numpy(np.int64)[np.lexsort((k["rank"].to_numpy(np.int64), g.ngroup().to_numpy()))]
    out = pd.DataFrame({
        "members": pd.Series([m.tolist() for m in np.split(rank, np.cumsum(sizes.to_numpy())[:-1])],
                             index=sizes.index, dtype=object),
        "iteration": g["iteration"].max(),
        "bytes": g["bytes"].max(),
        "first_arrival_aligned_ns": g["start_aligned_ns"].min(),
        "last_arrival_aligned_ns": g["start_aligned_ns"].max(),
        "end_aligned_ns": g["end_aligned_ns"].median().round().astype("int64"),
        "last_rank": last["rank"],
    })
    out["wait_ns"] = g["start_aligned_ns"].size() * out["last_arrival_aligned_ns"] - g["start_aligned_ns"].sum()
    out["transfer_ns"] = (out["end_aligned_ns"] - out["last_arrival_aligned_ns"]).clip(lower=0)
    out = out.reset_index()
    out["op"] = KIND_LABELS[out["op"].to_numpy(np.int64)]
    out["bytes"] = out["bytes"].where(out["bytes"] >= 0)
    out["algbw_gbps"] = out["bytes"] / out["transfer_ns"].where(out["transfer_ns"] > 0)
    return out


def _clock_offsets(kernels: pd.DataFrame, hosts: dict, notes: list[str]) -> pd.DataFrame:
    """Each host's clock offset, estimated from the collectives that span hosts (their members end together), where
    members end further apart than the collective's transfer; the kernels' aligned times corrected by it."""
    kernels["host"] = kernels["rank"].map(hosts).fillna("")
    if kernels["host"].nunique() < 2 or "communicator" not in kernels:
        return pd.DataFrame(columns=["host", "offset_ns", "collectives"])
    coll = kernels[(kernels["op"] != SEND_RECV) & kernels["communicator"].notna()].copy()
    coll["seq"] = coll.sort_values("start_aligned_ns").groupby(["communicator", "op", "rank"]).cumcount()
    g = coll.groupby(["communicator", "op", "seq"])
    spread = g["end_aligned_ns"].transform("max") - g["end_aligned_ns"].transform("min")
    shortest = g["end_aligned_ns"].transform("min") - g["start_aligned_ns"].transform("max")
    spans_hosts = g["host"].transform("nunique") > 1
    skewed = spans_hosts & (spread > shortest.clip(lower=parallel.END_TOLERANCE_NS))
    if not skewed.any():
        return pd.DataFrame(columns=["host", "offset_ns", "collectives"])
    late = (coll["end_aligned_ns"] - g["end_aligned_ns"].transform("median"))[spans_hosts]
    per_host = late.groupby(coll.loc[spans_hosts, "host"])
    offsets = (per_host.median() - per_host.median().median()).round().astype("int64")
    for column in ("start_aligned_ns", "end_aligned_ns"):
        kernels[column] = kernels[column] - kernels["host"].map(offsets).fillna(0).astype("int64")
    worst = offsets.abs().idxmax()
    notes.append(f"the hosts' clocks disagree (collectives' members end up to {int(spread.max()) / 1e6:,.1f} ms "
                 "apart, more than their transfer): each host's offset was estimated from the collectives' ends and "
                 f"taken out (largest: {worst}, {int(offsets[worst]) / 1e6:,.1f} ms; clock.parquet)")
    return pd.DataFrame({"host": offsets.index, "offset_ns": offsets.to_numpy(),
                         "collectives": per_host.size().reindex(offsets.index).to_numpy()})


