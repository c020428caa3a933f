"""collectives: every NCCL collective matched across the ranks of its communicator, who arrived last and what the
others waited for, and each rank's parallel groups.

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

import numpy as np
import pyarrow as pa

from .. import parallel
from ..errors import BadInputError, NotApplicableError
from ..gpu import launched_ops
from ..inputs.frames import arrow_of
from ..iteration_scan import find_iterations
from ..lazy import pd
from ..nvtx import innermost_of
from . import Recipe, indented, iteration_options, ms, ms_cell
from .comm_overlap import KINDS, collective_kind

NEEDS = {"nvtx", "kernel", "runtime", "payload"}
SEND_RECV = KINDS.index("send_recv")
COLLECTIVE_COLUMNS = ["communicator", "group", "members", "iteration", "seq", "op", "bytes",
                      "first_arrival_aligned_ns", "last_arrival_aligned_ns", "end_aligned_ns", "last_rank", "wait_ns",
                      "transfer_ns", "algbw_gbps"]


def map_rank(rank_data, options: dict) -> dict:
    rank_data.require("kernel", "collectives")
    kernels = rank_data.frame("kernels")
    codes, words = kernels.codes("name")
    kind = np.array([collective_kind(None if w is None else str(w)) for w in words], np.int64)[codes]
    nccl = np.flatnonzero(kind >= 0)
    start, end = kernels.values("start_ns")[nccl], kernels.values("end_ns")[nccl]
    comm, nbytes = np.full(len(nccl), -1, np.int64), np.full(len(nccl), -1, np.int64)
    calls = rank_data.frame("payloads")
    if calls is not None and len(calls) and rank_data.has_cuda and len(nccl):
        comm, nbytes = _from_payloads(rank_data, calls, nccl)
    iteration = np.full(len(nccl), -1, np.int64)
    delimiter = None
    try:
        it = find_iterations(rank_data, options.get("iteration"), options.get("iteration_kernel"))
        delimiter = it.delimiter.as_dict()
        at = np.searchsorted(it.start_ns, start, side="right") - 1
        inside = (at >= 0) & (start < it.end_ns[np.maximum(at, 0)])
        iteration[inside] = at[inside]
    except BadInputError:
        if options.get("iteration") or options.get("iteration_kernel"):
            raise
    init = calls.values("nranks") > 0 if calls is not None else np.zeros(0, bool)
    inits = {c: calls.values(c)[init] if calls is not None else np.zeros(0, np.int64)
             for c in ("comm_id", "nranks", "comm_rank")}
    columns = {"op": kind[nccl], "stream": kernels.values("stream", fill=-1)[nccl], "start_ns": start,
               "end_ns": end, "comm_id": comm, "bytes": nbytes, "iteration": iteration}
    return {"kernels": pa.table({c: arrow_of(np.asarray(v, np.int64)) for c, v in columns.items()}),
            "inits": pa.table({c: arrow_of(np.asarray(v, np.int64)) for c, v in inits.items()}),
            "delimiter": delimiter}


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


# ---------------------------------------------------------------------------------------------------------------
# reduce


def _kernels(per_rank: list[dict]) -> pd.DataFrame:
    parts = [r["kernels"].to_pandas().assign(rank=r["rank"]).assign(
        start_aligned_ns=lambda d, o=r["offset_ns"]: d["start_ns"] + o,
        end_aligned_ns=lambda d, o=r["offset_ns"]: d["end_ns"] + o) for r in per_rank]
    return pd.concat(parts, ignore_index=True)


def _communicators(per_rank: list[dict], kernels: pd.DataFrame, notes: list[str]) -> tuple[pd.DataFrame, str]:
    """The communicators (members in communicator order, group label) and each kernel's communicator key (written
    into kernels["communicator"]); how they were found."""
    inits = pd.concat([r["inits"].to_pandas().assign(rank=r["rank"]) for r in per_rank], ignore_index=True)
    p2p = kernels["op"] == SEND_RECV
    if len(inits) and (kernels["comm_id"] >= 0).any():
        inits = inits.drop_duplicates(["comm_id", "rank"])
        kernels["communicator"] = kernels["comm_id"].map(lambda c: f"{c & 0xFFFFFFFFFFFFFFFF:016x}")
        inits["communicator"] = inits["comm_id"].map(lambda c: f"{c & 0xFFFFFFFFFFFFFFFF:016x}")
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
        kernels["communicator"] = None
        keys, members = _inferred(kernels, p2p)
        source = "inferred"
    comms = _table(kernels, p2p, keys, members)
    if source == "inferred":  # ranks that act at once in other groups end together: split by tensor-parallel place
        place = {int(r): i for m in comms.loc[comms["group"] == "tp", "members"] for i, r in enumerate(m)}
        new_key: dict = {}
        keys, members = [], []
        for key, m, group in comms[["communicator", "members", "group"]].itertuples(index=False):
            parts = {}
            for r in m:
                parts.setdefault(place.get(int(r), 0) if group != "tp" else 0, []).append(int(r))
            for i, part in enumerate(parts.values()):
                keys.append(key if len(parts) == 1 else f"{key}.{i}")
                members.append(part)
                new_key.update({(key, r): keys[-1] for r in part})
        kernels["communicator"] = _renamed(kernels, new_key)
        comms = _table(kernels, p2p, keys, members)
    return comms, source


def _renamed(kernels: pd.DataFrame, new_key: dict) -> np.ndarray:
    """Each kernel's communicator after a split: new_key maps (old key, rank) to the new key."""
    found = pd.Series(new_key)
    at = pd.MultiIndex.from_arrays([kernels["communicator"], kernels["rank"].astype("int64")])
    looked = found.reindex(at).to_numpy() if len(found) else np.full(len(kernels), None, object)
    return np.where(pd.isna(looked), kernels["communicator"].to_numpy(object), looked)


def _table(kernels: pd.DataFrame, p2p: pd.Series, keys: list[str], members: list[list[int]]) -> pd.DataFrame:
    collective_calls, p2p_calls = [], []
    counted = kernels.groupby(["communicator", p2p.rename("p2p")]).size()
    for key, m in zip(keys, members, strict=True):
        collective_calls.append(int(counted.get((key, False), 0)) // max(len(m), 1))
        p2p_calls.append(int(counted.get((key, True), 0)) // max(len(m), 1))
    return parallel.communicator_table(members, keys, collective_calls, p2p_calls)


def _inferred(kernels: pd.DataFrame, p2p: pd.Series) -> tuple[list[str], list[list[int]]]:
    """Communicators inferred from the kernels (parallel.py), each kernel's written into kernels["communicator"]."""
    keys, members = [], []
    coll = kernels[~p2p]
    channels = coll.groupby(["rank", "stream", "op"], sort=True)
    table = pd.DataFrame(list(channels.groups.keys()), columns=["rank", "stream", "kind"]) if len(coll) else \
        pd.DataFrame(columns=["rank", "stream", "kind"])
    ordered = [g.sort_values("start_aligned_ns") for _, g in channels]
    ends = [g["end_aligned_ns"].to_numpy(np.int64) for g in ordered]
    durations = [e - g["start_aligned_ns"].to_numpy(np.int64) for e, g in zip(ends, ordered, strict=True)]
    labels = parallel.infer_collective_channels(table, ends, durations) if len(table) else np.zeros(0, np.int64)
    table["label"] = labels
    channel_key = {}
    for _, rows in table.groupby("label", sort=True):
        ranks = sorted(set(rows["rank"].astype(int)))
        if len(ranks) < 2:
            continue
        key = f"inferred-{len(keys)}"
        keys.append(key)
        members.append(ranks)
        channel_key.update({(int(r), int(s), int(k)): key for r, s, k in
                            rows[["rank", "stream", "kind"]].itertuples(index=False)})
    if channel_key:
        found = pd.Series(channel_key)
        at = pd.MultiIndex.from_arrays([kernels["rank"].astype("int64"), kernels["stream"].astype("int64"),
                                        kernels["op"].astype("int64")])
        kernels.loc[~p2p, "communicator"] = found.reindex(at).to_numpy()[~p2p.to_numpy()]
    sends = kernels[p2p]
    pairs = parallel.infer_p2p_pairs(*(sends[c].to_numpy(np.int64) for c in ("rank", "start_aligned_ns",
                                                                              "end_aligned_ns")))
    for chain in parallel.chains(pairs):
        key = f"inferred-{len(keys)}"
        keys.append(key)
        members.append(chain)
        kernels.loc[p2p & kernels["rank"].isin(chain), "communicator"] = key
    return keys, members


def _matched(kernels: pd.DataFrame, comms: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """One row per collective instance (per communicator, operation and seq), and per SendRecv pair."""
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
    sends = k[k["op"] == SEND_RECV].sort_values(["communicator", "end_aligned_ns"], kind="stable")
    if len(sends):
        # two ranks exchanging as often as each other: their exchanges in order; otherwise by their ends
        per = sends.groupby(["communicator", "rank"]).size().groupby(level=0).agg(["size", "nunique"])
        in_order = sends["communicator"].isin(per.index[(per["size"] == 2) & (per["nunique"] == 1)])
        ordered = sends[in_order].sort_values(["communicator", "rank", "start_aligned_ns"], kind="stable")
        ordered = ordered.assign(seq=ordered.groupby(["communicator", "rank"]).cumcount())
        rows.append(_instances(pd.concat([ordered, _paired(sends[~in_order])]), ["communicator", "op", "seq"]))
    out = pd.concat([r for r in rows if len(r)], ignore_index=True) if any(len(r) for r in rows) else \
        pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    out["group"] = out["communicator"].map(group_of)
    return out


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
    out = pd.DataFrame({
        "members": g["rank"].agg(lambda r: sorted(int(x) for x in r)),
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
    out["op"] = out["op"].map(lambda o: KINDS[int(o)])
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
    notes.append(f"the hosts' clocks disagree (collectives' members end up to {ms(int(spread.max()))} apart, more "
                 f"than their transfer): each host's offset was estimated from the collectives' ends and taken out "
                 f"(largest: {worst}, {ms(int(offsets[worst]))}; clock.parquet)")
    return pd.DataFrame({"host": offsets.index, "offset_ns": offsets.to_numpy(),
                         "collectives": per_host.size().reindex(offsets.index).to_numpy()})


def reduce(per_rank: list[dict], options: dict) -> dict:
    ranks = np.array(sorted(r["rank"] for r in per_rank), np.int64)
    hosts = {r["rank"]: r["identity"].get("host") for r in per_rank}
    kernels = _kernels(per_rank)
    layout = parallel.parse_parallel(options["parallel"]) if options.get("parallel") else None
    if not len(kernels):
        raise NotApplicableError(
            f"collectives does not apply: none of the {len(per_rank)} rank(s) ran NCCL kernels (ncclKernel*, "
            "ncclDevKernel*); collectives run by the host (gloo, MPI) leave none to match, and the ranks are one "
            "group of peers")
    notes: list[str] = []
    comms, source = _communicators(per_rank, kernels, notes)
    found = comms["group"].isin(["tp", "pp", "dp"]).any()
    if found:
        groups = parallel.groups_from_communicators(ranks, comms, source)
        if layout is not None:
            parallel.check_layout(groups, layout, "NCCL payloads" if source == "nvtx_payload" else
                                  "communicators inferred from the NCCL kernels")
    elif layout is not None:
        groups = parallel.layout_groups(layout, ranks).assign(source="--parallel")
    else:
        groups = parallel.one_group(ranks).assign(source="one_group")
    groups["host"] = groups["rank"].map(hosts)
    groups = groups[parallel.GROUP_COLUMNS]
    clock = _clock_offsets(kernels, hosts, notes)
    collectives = _matched(kernels, comms, notes)
    collectives = collectives.sort_values(["first_arrival_aligned_ns", "communicator"], kind="stable")
    collectives = collectives[COLLECTIVE_COLUMNS].reset_index(drop=True)
    for c in ("iteration", "seq", "first_arrival_aligned_ns", "last_arrival_aligned_ns", "end_aligned_ns", "last_rank",
              "wait_ns", "transfer_ns"):
        collectives[c] = collectives[c].astype("int64")
    collectives["bytes"] = collectives["bytes"].astype("Int64")
    collectives["members"] = collectives["members"].map(lambda m: [int(x) for x in m])
    comms_out = comms.assign(members=comms["members"].map(lambda m: [int(x) for x in m]))
    return {"groups": groups.reset_index(drop=True), "communicators": comms_out, "collectives": collectives,
            "ranks": _rank_table(collectives), "links": _links(collectives, hosts), "clock": clock,
            "settings": {"groups_source": source, "notes": notes}}


def _rank_table(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per rank and group kind: collectives it took part in, how often it arrived last, what its peers waited for it."""
    each = collectives[["group", "members", "last_rank", "wait_ns"]].explode("members")
    each = each.rename(columns={"members": "rank"}).astype({"rank": "int64"})
    each["last"] = each["rank"] == each["last_rank"]
    each["waited_for_ns"] = each["wait_ns"].where(each["last"], 0)
    t = each.groupby(["rank", "group"]).agg(collectives=("last", "size"), last_arrivals=("last", "sum"),
                                            waited_for_ns=("waited_for_ns", "sum")).reset_index()
    return t.astype({"collectives": "int64", "last_arrivals": "int64", "waited_for_ns": "int64"})


def _links(collectives: pd.DataFrame, hosts: dict) -> pd.DataFrame:
    """Per communicator, operation and message size class (a power of two): intra- or inter-node, instances, the
    median transfer and algorithm bandwidth."""
    c = collectives.copy()
    c["size_class_bytes"] = c["bytes"].map(lambda b: None if pd.isna(b) or b <= 0 else int(2 ** np.floor(np.log2(b))))
    c["intra_node"] = c["members"].map(lambda m: len({hosts.get(r) for r in m}) == 1)
    t = c.groupby(["communicator", "group", "op", "size_class_bytes", "intra_node"], dropna=False).agg(
        collectives=("seq", "size"), median_transfer_ns=("transfer_ns", "median"),
        median_algbw_gbps=("algbw_gbps", "median")).reset_index()
    t["median_transfer_ns"] = t["median_transfer_ns"].round().astype("int64")
    t["size_class_bytes"] = t["size_class_bytes"].astype("Int64")
    return t


def summary(out) -> list[str]:
    groups = pd.read_parquet(out / "groups.parquet")
    ranks = pd.read_parquet(out / "ranks.parquet")
    lines = [_groups_line(groups)]
    top = ranks.sort_values("waited_for_ns", ascending=False).head(5)
    return lines + indented("peers waited longest for:", pd.DataFrame({
        "rank": top["rank"], "group": top["group"], "last arrivals": top["last_arrivals"],
        "of collectives": top["collectives"], "waited for, ms": top["waited_for_ns"].map(ms_cell)}).to_string(
        index=False))


def _groups_line(groups: pd.DataFrame) -> str:
    source = groups["source"].iat[0] if len(groups) else "one_group"
    if source == "one_group":
        return f"groups: one group of {len(groups)} ranks (no parallel groups found)"
    sizes = ", ".join(f"{k}={int(groups[f'{k}_group'].map(len).max())}" for k in ("tp", "pp", "dp"))
    how = {"nvtx_payload": "from NCCL's NVTX payloads", "inferred": "inferred from the NCCL kernels",
           "--parallel": "as --parallel gives them"}.get(source, source)
    return f"groups: {sizes} ({how})"


def headline(out) -> str:
    groups = pd.read_parquet(out / "groups.parquet")
    ranks = pd.read_parquet(out / "ranks.parquet")
    collectives = pd.read_parquet(out / "collectives.parquet", columns=["wait_ns"])
    worst = ranks.loc[ranks["waited_for_ns"].idxmax()] if len(ranks) else None
    tail = f"; peers waited longest for rank {int(worst['rank'])} ({worst['group']}, {ms(worst['waited_for_ns'])})" \
        if worst is not None and worst["waited_for_ns"] > 0 else ""
    return f"{_groups_line(groups)}; {len(collectives)} collectives matched, {ms(int(collectives['wait_ns'].sum()))} " \
           f"waited{tail}"


def add_options(add, framework: bool = False) -> None:
    iteration_options(add)
    add("--parallel", metavar="tp=T,pp=P,dp=D[,cp=C,ep=E][,order=...]", default=None,
        help="the job's parallel sizes (Megatron Core's rank order tp-cp-ep-dp-pp by default): the groups where the "
             "trace shows none, checked against those it shows")


RECIPE = Recipe(
    name="collectives",
    display_name="Collectives and parallel groups",
    description="Every NCCL collective matched across its communicator's ranks: who arrived last, what the others "
                "waited, transfer and bandwidth; each rank's tensor, pipeline and data parallel groups.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=add_options,
    summary=summary,
    headline=headline,
)
