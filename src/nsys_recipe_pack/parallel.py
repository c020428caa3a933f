"""Parallel groups: which tensor-, pipeline- and data-parallel group each rank belongs to, and its coordinates.

Found, in this order: from NCCL's NVTX payloads (each communicator's id, size and every member's place in it), else
inferred from the NCCL kernels alone (collective kernels that end together on aligned clocks belong to one
communicator; SendRecv kernels that end together join pipeline neighbours), else from `--parallel` (Megatron Core's
rank order by default). Given together with payloads or inference, `--parallel` must agree with what the trace shows.

Communicators are named by what they carry: SendRecv between ranks, pp; of the others carrying collectives, the one
calling most (inside every forward and backward) tp, the one calling least (the gradient reduction at the step's
end) dp. A job with no NCCL communication is one group: every rank a data-parallel peer of every other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .errors import BadInputError, UsageError
from .lazy import pd

DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")
MEGATRON_ORDER = "tp-cp-ep-dp-pp"  # Megatron Core's default: tp varies fastest, pp slowest
GROUP_KINDS = ("tp", "pp", "dp", "cp", "ep", "other")
GROUP_COLUMNS = ["rank", "tp", "pp", "dp", "cp", "ep", "tp_group", "pp_group", "dp_group", "host", "source"]
# kernels of one collective end within this of each other on aligned clocks, or within TRANSFER_SHARE of the
# shortest one's duration (its transfer, the last member having waited for none) where that is longer (inference)
END_TOLERANCE_NS = 20_000
TRANSFER_SHARE = 0.25
SAMPLED_INSTANCES = 16  # instances of a channel compared across ranks when inferring communicators
P2P_SHARE = 0.25  # of the smaller rank's SendRecv kernels that must end with the other's for them to be neighbours
AGREEING_SHARE = 0.75  # of the sampled instances in which two channels must end together to be one communicator


@dataclass(frozen=True)
class Layout:
    """A job's parallel sizes and the order its ranks are numbered in (the first dimension varies fastest)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    order: str = MEGATRON_ORDER

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp * self.ep

    def size(self, dimension: str) -> int:
        return getattr(self, dimension)

    def coordinates(self, ranks) -> dict[str, np.ndarray]:
        """Each rank's coordinate in every dimension, from the rank order: rank = sum of coordinate x the sizes of
        the dimensions before it in `order`."""
        rest = np.asarray(ranks, np.int64).copy()
        out = {}
        for dimension in self.order.split("-"):
            rest, out[dimension] = np.divmod(rest, self.size(dimension))
        return out

    def rank_of(self, coordinates: dict[str, np.ndarray]) -> np.ndarray:
        rank, stride = 0, 1
        for dimension in self.order.split("-"):
            rank = rank + np.asarray(coordinates[dimension], np.int64) * stride
            stride *= self.size(dimension)
        return np.asarray(rank, np.int64)


def parse_parallel(text: str) -> Layout:
    """`tp=2,pp=4,dp=8[,cp=1,ep=1][,order=tp-cp-ep-dp-pp]` as a Layout; a clear error for anything else."""
    sizes: dict = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in (*DIMENSIONS, "order"):
            raise UsageError(f"--parallel {text!r}: {item!r} is not one of tp=, pp=, dp=, cp=, ep=, order=")
        if key == "order":
            order = value.strip().lower()
            if sorted(order.split("-")) != sorted(DIMENSIONS):
                raise UsageError(f"--parallel order={value}: name each of {', '.join(DIMENSIONS)} once, joined by '-' "
                                 f"(Megatron Core's is {MEGATRON_ORDER})")
            sizes["order"] = order
            continue
        if not re.fullmatch(r"\s*\d+\s*", value) or int(value) < 1:
            raise UsageError(f"--parallel {key}={value}: a size is a whole number of at least 1")
        sizes[key] = int(value)
    if not any(k in sizes for k in DIMENSIONS):
        raise UsageError(f"--parallel {text!r}: give at least one size, as tp=2,pp=2,dp=4")
    return Layout(**sizes)


def layout_groups(layout: Layout, ranks: np.ndarray) -> pd.DataFrame:
    """The groups a layout gives the ranks (world ranks 0..world-1), as groups.parquet has them."""
    ranks = np.asarray(ranks, np.int64)
    if len(ranks) and (ranks.max() >= layout.world or ranks.min() < 0):
        raise BadInputError(f"--parallel gives {layout.world} ranks (tp x pp x dp x cp x ep), but the inputs hold "
                            f"rank {int(ranks.max())}: check the sizes")
    coords = layout.coordinates(ranks)
    out = pd.DataFrame({"rank": ranks, **{d: coords[d] for d in ("tp", "pp", "dp", "cp", "ep")}})
    for kind in ("tp", "pp", "dp"):
        out[f"{kind}_group"] = [_members(layout, coords, i, kind) for i in range(len(ranks))]
    return out


def _members(layout: Layout, coords: dict, i: int, kind: str) -> list[int]:
    """The ranks that share every coordinate of rank i but `kind`'s."""
    one = {d: np.full(layout.size(kind), coords[d][i]) for d in DIMENSIONS}
    one[kind] = np.arange(layout.size(kind))
    return layout.rank_of(one).tolist()


def is_parallel(groups: pd.DataFrame) -> bool:
    """Whether the ranks form tensor- or pipeline-parallel groups (a job of data-parallel peers alone does not)."""
    if not len(groups) or (groups["source"] == "one_group").all():
        return False
    return bool((groups["tp_group"].map(len) > 1).any() or (groups["pp_group"].map(len) > 1).any())


def one_group(ranks: np.ndarray) -> pd.DataFrame:
    """Every rank a data-parallel peer of every other: a job without parallel groups."""
    ranks = np.sort(np.asarray(ranks, np.int64))
    everyone = ranks.tolist()
    return pd.DataFrame({"rank": ranks, "tp": 0, "pp": 0, "dp": np.arange(len(ranks)), "cp": 0, "ep": 0,
                         "tp_group": [[r] for r in everyone], "pp_group": [[r] for r in everyone],
                         "dp_group": [everyone] * len(ranks)})


# -----------------------------------------------------------------------------------------------------------------
# communicators: groups of ranks found in the trace, and what each carries


def communicator_table(members: list[list[int]], keys: list[str], collective_calls: list[int],
                       p2p_calls: list[int]) -> pd.DataFrame:
    """communicator, members (in communicator rank order), size, collective_calls and p2p_calls (per member), group
    (its label)."""
    table = pd.DataFrame({"communicator": keys, "members": members, "size": [len(m) for m in members],
                          "collective_calls": np.asarray(collective_calls, np.int64),
                          "p2p_calls": np.asarray(p2p_calls, np.int64)})
    table["group"] = label_groups(table)
    return table


def label_groups(table: pd.DataFrame) -> list[str]:
    """Each communicator's kind from what it carries: SendRecv, pp; of the others with collectives, those calling
    most tp (if they call at least as often as the pipeline exchanges: in every forward and backward; else other)
    and those calling least dp (communicators of one kind call as often as each other). Where all call equally
    often, they are tp if they call at least as often as the pipeline exchanges, else dp."""
    labels = ["other"] * len(table)
    sizes = table["size"].to_numpy()
    pp = (table["p2p_calls"].to_numpy() > 0) & (sizes > 1)
    calls = table["collective_calls"].to_numpy()
    collective = ~pp & (sizes > 1) & (calls > 0)
    for i in np.flatnonzero(pp):
        labels[i] = "pp"
    distinct = np.unique(calls[collective])
    if not len(distinct):
        return labels
    p2p = int(table.loc[pp, "p2p_calls"].min()) if pp.any() else 0
    if len(distinct) == 1:
        most, least = ("tp", None) if p2p and distinct[0] >= p2p else (None, "dp")
    else:  # tensor parallelism all-reduces in every forward and backward: at least as often as the stages exchange
        most, least = ("tp" if distinct[-1] >= p2p else "other"), "dp"
    for i in np.flatnonzero(collective):
        if calls[i] == distinct[-1] and most:
            labels[i] = most
        elif calls[i] == distinct[0] and least:
            labels[i] = least
    return labels


def groups_from_communicators(ranks: np.ndarray, comms: pd.DataFrame, source: str) -> pd.DataFrame:
    """groups.parquet's rows from communicators labelled tp, pp and dp: a rank's coordinate in each is its place in
    that communicator (0, alone, where it is in none)."""
    ranks = np.sort(np.asarray(ranks, np.int64))
    out = pd.DataFrame({"rank": ranks})
    for kind in ("tp", "pp", "dp"):
        place = {int(r): 0 for r in ranks}
        group = {int(r): [int(r)] for r in ranks}
        for members in comms.loc[comms["group"] == kind, "members"]:
            members = [int(m) for m in members]
            for i, m in enumerate(members):
                place[m], group[m] = i, members
        out[kind] = [place[int(r)] for r in ranks]
        out[f"{kind}_group"] = [group[int(r)] for r in ranks]
    out["cp"] = 0
    out["ep"] = 0
    out["source"] = source
    return out[["rank", "tp", "pp", "dp", "cp", "ep", "tp_group", "pp_group", "dp_group", "source"]]


def layout_differences(found: pd.DataFrame, layout: Layout) -> list[tuple[int, str, list, list]]:
    """(rank, kind, its group in the trace, its group by the layout) for each rank and kind where a group of more
    than one rank found in the trace is not the layout's."""
    given = layout_groups(layout, found["rank"].to_numpy())
    out = []
    for kind in ("tp", "pp", "dp"):
        have = found.set_index("rank")[f"{kind}_group"].map(lambda g: tuple(sorted(g)))
        want = given.set_index("rank")[f"{kind}_group"].map(lambda g: tuple(sorted(g)))
        out += [(int(r), kind, list(have[r]), list(want[r])) for r in have.index if have[r] != want[r] and
                len(have[r]) > 1]
    return out


def check_layout(found: pd.DataFrame, layout: Layout, how: str) -> None:
    """A `--parallel` layout that contradicts the groups found in the trace is an error naming the ranks."""
    differ = layout_differences(found, layout)
    if differ:
        r, kind, have, want = differ[0]
        ranks = sorted({d[0] for d in differ})
        raise UsageError(
            f"--parallel {_layout_text(layout)} contradicts the {how}: rank {r}'s {kind} group is {have} in the trace "
            f"but {want} by the layout ({len(ranks)} rank(s) differ: {', '.join(map(str, ranks[:8]))}); fix the sizes "
            "or the order, or leave --parallel out")


def _layout_text(layout: Layout) -> str:
    return ",".join(f"{d}={layout.size(d)}" for d in ("tp", "pp", "dp", "cp", "ep") if layout.size(d) > 1) + \
        (f",order={layout.order}" if layout.order != MEGATRON_ORDER else "")


# -----------------------------------------------------------------------------------------------------------------
# inference from the kernels


def tolerance(durations: np.ndarray) -> np.ndarray | int:
    """How far apart the ends of kernels of one collective may be, given the shortest kernel's duration."""
    return np.maximum(END_TOLERANCE_NS, TRANSFER_SHARE * np.asarray(durations))


def sampled_instances(count: int) -> np.ndarray:
    """Which of a channel's `count` kernels (in order) are compared across ranks: SAMPLED_INSTANCES spread evenly."""
    return np.unique(np.linspace(0, count - 1, min(SAMPLED_INSTANCES, count)).round().astype(np.int64))


def infer_collective_channels(channels: pd.DataFrame, ends: list[np.ndarray],
                              durations: list[np.ndarray]) -> np.ndarray:
    """Which channels (one rank's kernels of one collective kind on one stream: rows of `channels`, its `kind` and
    `count` of kernels; `ends` and `durations` of its `sampled_instances`, ends on aligned clocks) belong to one
    communicator: a label per channel, equal for channels whose kernels are as many and end together (`tolerance`)
    in most of the sampled instances. A channel matched with none keeps a label of its own."""
    n = len(channels)
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    counts = channels["count"].to_numpy(np.int64)
    kinds = channels["kind"].to_numpy()
    for key in {(k, c) for k, c in zip(kinds.tolist(), counts.tolist(), strict=True) if c > 0}:
        rows = np.flatnonzero((kinds == key[0]) & (counts == key[1]))
        if len(rows) < 2:
            continue
        matrix = np.stack([ends[i] for i in rows])  # channel x sampled instance
        allowed = tolerance(np.stack([durations[i] for i in rows]).min(axis=0))
        picked = matrix.shape[1]
        pairs, votes = np.unique(np.concatenate([_pairs_ending_together(matrix[:, j], allowed[j], len(rows))
                                                 for j in range(picked)]), return_counts=True)
        for code in pairs[votes >= AGREEING_SHARE * picked].tolist():
            ra, rb = find(rows[code // len(rows)]), find(rows[code % len(rows)])
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)], np.int64)


MAX_TOGETHER = 512  # channels ending together in one instance beyond which none of them is taken as one collective's


def _pairs_ending_together(ends: np.ndarray, allowed: float, n: int) -> np.ndarray:
    """Codes a * n + b (a < b) of the channels whose ends in one instance are in one run of ends each within
    `allowed` of the next, a run of at most MAX_TOGETHER."""
    order = np.argsort(ends, kind="stable")
    run = np.r_[0, np.cumsum(np.diff(ends[order]) > allowed)]
    size = np.bincount(run)
    kept = (size[run] >= 2) & (size[run] <= MAX_TOGETHER)
    members, run = order[kept], run[kept]
    codes = [np.zeros(0, np.int64)]
    for k in range(1, int(size[run].max()) if len(run) else 1):  # the k-th next member of the same run
        same = run[k:] == run[:-k]
        a, b = members[:-k][same], members[k:][same]
        codes.append(np.minimum(a, b) * n + np.maximum(a, b))
    return np.concatenate(codes)


def infer_p2p_pairs(rank: np.ndarray, start: np.ndarray, end: np.ndarray) -> list[tuple[int, int]]:
    """Pipeline neighbours from SendRecv kernels (every rank's, on aligned clocks): each kernel votes for the rank of
    the kernel of another rank that ends nearest to it (within `tolerance`: the two sides of one exchange end
    together); two ranks are neighbours where their votes come to at least a quarter of the smaller one's kernels (a
    middle stage exchanges with two neighbours, half of its exchanges each) and at least half of either's votes for
    the rank it votes for most (ranks of other pipelines exchanging at about the same instants draw a few)."""
    if len(end) < 2:
        return []
    order = np.argsort(end, kind="stable")
    r, e, d = rank[order], end[order], (end - start)[order]
    gap = np.diff(e).astype(np.float64)
    gap[r[1:] == r[:-1]] = np.inf  # a rank's own kernels are not its partner
    left, right = np.r_[np.inf, gap], np.r_[gap, np.inf]
    nearest = np.where(left <= right, np.arange(len(e)) - 1, np.arange(len(e)) + 1)
    nearest_gap = np.minimum(left, right)
    other = np.clip(nearest, 0, len(e) - 1)
    close = np.isfinite(nearest_gap) & (nearest_gap <= tolerance(np.minimum(d, d[other])))
    a, b = np.minimum(r[close], r[other[close]]), np.maximum(r[close], r[other[close]])
    if not len(a):
        return []
    pairs, votes = np.unique(np.stack([a, b], axis=1), axis=0, return_counts=True)
    per_rank = dict(zip(*np.unique(rank, return_counts=True), strict=True))
    strongest: dict = {}
    for (x, y), v in zip(pairs.tolist(), votes.tolist(), strict=True):
        strongest[x], strongest[y] = max(strongest.get(x, 0), v), max(strongest.get(y, 0), v)
    return [(int(x), int(y)) for (x, y), v in zip(pairs.tolist(), votes.tolist(), strict=True)
            if v >= P2P_SHARE * min(per_rank[x], per_rank[y]) and v >= 0.5 * max(strongest[x], strongest[y])]


def chains(pairs: list[tuple[int, int]]) -> list[list[int]]:
    """The connected sets of ranks that neighbour pairs join, each in rank order (a pipeline's stages)."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        parent.setdefault(i, i)
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    sets: dict[int, list[int]] = {}
    for r in list(parent):
        sets.setdefault(find(r), []).append(r)
    return [sorted(s) for s in sets.values()]
