"""A rank's communication split into waiting for the last member of each collective and transfer: what
compute_memory_share and comm_overlap say of their communication time, so that time a rank spent waiting for a slow
peer reads as that peer's, not as the network's.

A matched collective's member waits from its own kernel's start until the last member's start (its arrival); the
rest of its kernel is transfer (collective_match.py matches the members, across ranks where their payloads or their
kernels show the groups). A rank's waiting time is the union of its kernels' waiting parts; the waiting is charged
to the rank that arrived last (`waited_for_ns`: what its peers' kernels waited for it, added up).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .intervals import overlay_lengths, union_segments_by_group
from .lazy import pd
from .recipes import ms

COLUMNS = ["rank", "comm_kernel_ns", "waiting_ns", "transfer_ns", "waited_for_ns"]


@dataclass
class Waiting:
    ranks: pd.DataFrame  # COLUMNS per rank with NCCL kernels in its iterations
    segments: tuple  # (rank, start, end) of each rank's waiting, disjoint, on collective_match's aligned clocks
    clock: pd.Series  # per rank: what was taken out of its aligned times to match its host's clock


def split(matched, in_iterations: bool = True) -> Waiting | None:
    """The split of each rank's NCCL kernels (in_iterations: those in its iterations; else all) (None where no
    collective was matched)."""
    k = matched.kernels
    if k is None or not len(matched.collectives):
        return None
    if in_iterations:
        k = k[k["iteration"] >= 0]
    inst = k["instance"].to_numpy(np.int64)
    start, end = k["start_aligned_ns"].to_numpy(np.int64), k["end_aligned_ns"].to_numpy(np.int64)
    rank = k["rank"].to_numpy(np.int64)
    arrival = matched.collectives["last_arrival_aligned_ns"].to_numpy(np.int64)
    last_rank = matched.collectives["last_rank"].to_numpy(np.int64)
    matched_at = inst >= 0
    until = np.where(matched_at, np.clip(arrival[np.maximum(inst, 0)], start, end), start)
    ranks = np.unique(rank)
    at = np.searchsorted(ranks, rank)
    waits = until > start
    segments = union_segments_by_group(at[waits], start[waits], until[waits])
    waiting = np.zeros(len(ranks), np.int64)
    np.add.at(waiting, segments[0], segments[2] - segments[1])
    busy = union_segments_by_group(at, start, end)
    comm = np.zeros(len(ranks), np.int64)
    np.add.at(comm, busy[0], busy[2] - busy[1])
    charged = pd.Series(until - start).groupby(np.where(matched_at, last_rank[np.maximum(inst, 0)], -1)).sum()
    out = pd.DataFrame({"rank": ranks, "comm_kernel_ns": comm, "waiting_ns": waiting, "transfer_ns": comm - waiting})
    out["waited_for_ns"] = out["rank"].map(charged).fillna(0).astype("int64")
    return Waiting(out[COLUMNS], (ranks[segments[0]], segments[1], segments[2]), matched.host_offsets())


def exposed_waiting(waiting: Waiting, rank: np.ndarray, start_aligned: np.ndarray, end_aligned: np.ndarray
                    ) -> pd.Series:
    """Per rank of `waiting`, how much of its exposed communication (rank, start, end on the run's aligned clock,
    disjoint per rank) was waiting: the rest is exposed transfer."""
    ranks = waiting.ranks["rank"].to_numpy(np.int64)
    shift = waiting.clock.reindex(rank).fillna(0).to_numpy(np.int64)
    inside = np.isin(rank, ranks)
    exposed = union_segments_by_group(np.searchsorted(ranks, rank[inside]), (start_aligned - shift)[inside],
                                      (end_aligned - shift)[inside])
    seg_rank, seg_start, seg_end = waiting.segments
    mine = (np.searchsorted(ranks, seg_rank), seg_start, seg_end)
    return pd.Series(overlay_lengths(exposed, mine, len(ranks), both=True), index=ranks)


def phrase(ranks: pd.DataFrame) -> str:
    """'62 % of it waiting for the last member, 71 % of that for rank 4' from COLUMNS per rank ('' where no
    waiting)."""
    comm, waiting = int(ranks["comm_kernel_ns"].sum()), int(ranks["waiting_ns"].sum())
    if not comm or not waiting:
        return ""
    top = ranks.loc[ranks["waited_for_ns"].idxmax()]
    charged = int(ranks["waited_for_ns"].sum())
    return (f"{100 * waiting / comm:.0f} % of it waiting for the last member, "
            f"{100 * int(top['waited_for_ns']) / max(charged, 1):.0f} % of that for rank {int(top['rank'])}")


def summary_lines(ranks: pd.DataFrame, top: int = 5) -> list[str]:
    """The ranks the others waited for most, for a recipe's summary."""
    waited = ranks[ranks["waited_for_ns"] > 0].sort_values("waited_for_ns", ascending=False).head(top)
    if waited.empty:
        return []
    return ["NCCL kernels waiting for the last member: " + ms(ranks["waiting_ns"].sum()) + " of "
            + ms(ranks["comm_kernel_ns"].sum()) + "; waited for: "
            + ", ".join(f"rank {int(r.rank)} {ms(r.waited_for_ns)}" for r in waited.itertuples())]
