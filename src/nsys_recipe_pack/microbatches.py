"""Uneven micro-batches in a pipeline job, and what they cost: straggler_heatmap's `microbatch_imbalance` finding.

A pipeline rank's GPU timeline in an iteration is a chain: some work, an NCCL kernel, some work, the next... The
work between two of its pipeline exchanges (SendRecv kernels of its pp group) is one micro-batch's compute at its
place in the schedule (`position`: the exchanges before it), however the schedule interleaves forward and backward
passes. The ranks of one stage do the same work at each position, so a micro-batch much longer than its stage's
median at its position (SLOW times) is a long micro-batch (uneven sequence lengths), unless most of its rank's
micro-batches in that iteration are long: then the rank itself is slow (a straggler, straggler_heatmap's own verdict).

What the long micro-batches cost is found by re-timing each iteration: every kernel starts as long after the kernel
it followed (its rank's last to end before it started) as it did, and a matched NCCL kernel ends its own transfer
time after its last member starts (collective_match.py); the iteration once as it ran (the model gives back its own
ends) and once with the long micro-batches' gaps shortened to their stage's median, from the same starts. The cost
is the difference of the iterations' last ends over the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .lazy import pd
from .peers import findings_table
from .recipes import ms

SLOW = 1.3  # a micro-batch this many times its stage's median at its position is long
OWN_SHARE = 0.5  # a cell with at least this share of its micro-batches long is a slow rank, not uneven micro-batches
FLOOR_SHARE = 0.01  # ... and longer by at least this share of the median iteration; a place in the schedule where
# the median micro-batch computes for less than this is not one
SPREAD_COLUMNS = ["stage", "ranks", "passes", "long_passes", "median_ns", "p95_ns", "max_ns",
                  "p95_ratio", "max_ratio"]
STEP_COLUMNS = ["iteration", "long_passes", "cost_ns"]
NONE = np.iinfo(np.int64).min // 4  # no member to wait for


@dataclass
class Chains:
    """Every cell's (rank and iteration) NCCL kernels (or other meeting points) in start order, as the re-timing
    needs them; `order` gives their rows of the members table."""
    cell: np.ndarray  # per kernel: its cell
    start: np.ndarray  # per kernel: aligned start
    end: np.ndarray
    pred: np.ndarray  # per kernel: the kernel of its cell that ended last before it started (-1: none)
    gap: np.ndarray  # per kernel: its start after pred's end (or after its cell's start)
    transfer: np.ndarray  # per kernel: its end after its instance's last member started (unmatched: its duration)
    instance: np.ndarray  # per kernel: its collective instance, -1 for none
    position: np.ndarray  # per kernel: pipeline exchanges before it in the cell
    cell_start: np.ndarray  # per cell
    cell_end: np.ndarray
    final_gap: np.ndarray  # per cell: its end after its last kernel's end (or its start)
    exchanges: np.ndarray  # per cell: its pipeline exchanges
    order: np.ndarray = None  # per kernel: its row in the members table


def chains(members: pd.DataFrame, cells: pd.DataFrame) -> Chains:
    """members: collective_match's Matched.kernels; cells: rank, iteration, start_aligned_ns, end_aligned_ns."""
    key = pd.MultiIndex.from_frame(cells[["rank", "iteration"]].astype("int64"))
    at = pd.Series(np.arange(len(cells)), index=key)
    k = members.reset_index(drop=True)
    k = k[k["iteration"] >= 0]
    cell = at.reindex(pd.MultiIndex.from_frame(k[["rank", "iteration"]].astype("int64"))).to_numpy()
    k = k[~np.isnan(cell)].assign(cell=cell[~np.isnan(cell)].astype(np.int64))
    k = k.sort_values(["cell", "start_aligned_ns"], kind="stable")
    c = k["cell"].to_numpy(np.int64)
    start, end = k["start_aligned_ns"].to_numpy(np.int64), k["end_aligned_ns"].to_numpy(np.int64)
    cell_start = cells["start_aligned_ns"].to_numpy(np.int64)
    cell_end = cells["end_aligned_ns"].to_numpy(np.int64)
    pred = _ended_before(c, start, end)
    gap = start - np.where(pred >= 0, end[np.maximum(pred, 0)], cell_start[c])
    instance = k["instance"].to_numpy(np.int64)
    last = pd.Series(members["start_aligned_ns"].to_numpy(np.int64)).groupby(
        members["instance"].to_numpy(np.int64)).max()
    arrival = last.reindex(instance).to_numpy()
    transfer = np.where(instance >= 0, np.clip(end - np.nan_to_num(arrival, nan=0).astype(np.int64), 0, None),
                        end - start)
    is_pp = (k["group"] == "pp").to_numpy()
    position = pd.Series(is_pp.astype(np.int64)).groupby(c).cumsum().to_numpy(np.int64) - is_pp
    last_end = np.full(len(cells), NONE)
    np.maximum.at(last_end, c, end)
    final_gap = cell_end - np.maximum(last_end, cell_start)
    exchanges = np.bincount(c[is_pp], minlength=len(cells))
    return Chains(c, start, end, pred, gap, transfer, instance, position, cell_start, cell_end, final_gap, exchanges,
                  k.index.to_numpy(np.int64))


def _ended_before(cell: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per kernel, the kernel of its cell with the latest end at or before its start (-1: none): the work it
    followed. A kernel still running when the next starts (another stream's) is not it."""
    n = len(cell)
    if not n:
        return np.zeros(0, np.int64)
    # every end and start in one order, by cell, then time, an end before a start at the same instant
    order = np.lexsort((np.r_[np.zeros(n, np.int64), np.ones(n, np.int64)], np.r_[end, start], np.r_[cell, cell]))
    kernel = np.r_[np.arange(n), np.arange(n)][order]
    is_end = order < n
    last_end = np.maximum.accumulate(np.where(is_end, np.arange(2 * n), -1))  # the latest end so far
    before_own = np.r_[-1, last_end[:-1]]  # ... not counting the event itself
    at = np.empty(2 * n, np.int64)
    at[order] = np.arange(2 * n)
    found = last_end[at[n:]]
    own = (found >= 0) & (kernel[np.maximum(found, 0)] == np.arange(n))  # a kernel of no length: its own end
    found[own] = before_own[at[:n][own]]
    ok = (found >= 0) & (cell[kernel[np.maximum(found, 0)]] == cell)
    return np.where(ok, kernel[np.maximum(found, 0)], -1)


def retimed_ends(ch: Chains, gap: np.ndarray, final_gap: np.ndarray, max_sweeps: int = 10_000) -> np.ndarray:
    """Each cell's end had its kernels' gaps been `gap` (and its last stretch `final_gap`), every cell starting where
    it did. A kernel ends at E_i = max(E_pred + gap_i, G_i) + transfer_i (G_i: its instance's last member's start);
    along a run of kernels each following the one before, E_i = A_i + max(base, max over k <= i of G_k +
    transfer_k - A_k) (A: the run's sums of gap + transfer, base: where the run's first kernel's predecessor ended),
    so a sweep solves every run at once and sweeps go on until no start moves (as many as the times the longest chain
    of waits changes rank or run)."""
    n_cells = len(ch.cell_start)
    c = ch.cell
    n = len(c)
    if not n:
        return ch.cell_start + final_gap
    head = ch.pred != np.arange(n) - 1
    run = np.cumsum(head) - 1
    heads = np.flatnonzero(head)
    a = gap + ch.transfer
    total = np.cumsum(a)
    acc = total - (total[heads] - a[heads])[run]  # A within each run
    matched = ch.instance >= 0
    n_instances = int(ch.instance.max()) + 1 if matched.any() else 0
    start = ch.start.copy()
    end = start + ch.transfer
    for _ in range(max_sweeps):
        last = np.full(n_instances, NONE)
        np.maximum.at(last, ch.instance[matched], start[matched])
        pred = ch.pred[heads]
        base = np.where(pred >= 0, end[np.maximum(pred, 0)], ch.cell_start[c[heads]])[run]
        b = np.where(matched, last[np.maximum(ch.instance, 0)] + ch.transfer, NONE)
        lead = pd.Series(np.maximum(b - acc, base)).groupby(run).cummax().to_numpy(np.int64)
        end = acc + lead
        new_start = np.where(head, base, np.r_[0, end[:-1]]) + gap
        if np.array_equal(new_start, start):
            break
        start = new_start
    last_end = np.full(n_cells, NONE)
    np.maximum.at(last_end, c, end)
    return np.where(last_end > NONE, last_end, ch.cell_start) + final_gap


@dataclass
class Microbatches:
    finding: pd.DataFrame  # findings.parquet's microbatch_imbalance row (none: no such finding)
    spread: pd.DataFrame  # SPREAD_COLUMNS per stage (none where no finding)
    cell_excess_ns: np.ndarray  # per cell: its long micro-batches' time above their stage's medians
    steps: pd.DataFrame  # STEP_COLUMNS per compared iteration (none where no micro-batch was long)


def microbatch_imbalance(members: pd.DataFrame, cells: pd.DataFrame, compared: np.ndarray, threshold: float
                         ) -> Microbatches:
    """cells: rank, iteration, stage, start_aligned_ns, end_aligned_ns, duration_ns; compared: per cell, whether its
    iteration is compared (not warm-up)."""
    ch = chains(members, cells)
    n = len(cells)
    stage = cells["stage"].to_numpy(np.int64)
    iteration = cells["iteration"].to_numpy(np.int64)
    passes = pd.DataFrame({"cell": np.r_[ch.cell, np.arange(n)], "position": np.r_[ch.position, ch.exchanges],
                           "ns": np.r_[ch.gap, np.maximum(ch.final_gap, 0)]})
    passes = passes.groupby(["cell", "position"], sort=True)["ns"].sum().reset_index()
    passes["stage"] = stage[passes["cell"].to_numpy()]
    # the ranks of a stage compared where they have the stage's usual number of exchanges (the same schedule)
    usual = pd.Series(ch.exchanges).groupby(stage).agg(lambda e: e.mode().iloc[0]).reindex(stage).to_numpy()
    usable = (ch.exchanges == usual) & (ch.exchanges > 0) & compared
    passes = passes[usable[passes["cell"].to_numpy()]].copy()
    duration = float(np.median(cells["duration_ns"].to_numpy()[compared])) if compared.any() else 0.0
    no_steps = pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_COLUMNS})
    empty = Microbatches(findings_table([]), pd.DataFrame(columns=SPREAD_COLUMNS), np.zeros(n, np.int64), no_steps)
    if not len(passes):
        return empty
    passes["median_ns"] = passes.groupby(["stage", "position"])["ns"].transform("median")
    # the places in the schedule where a stage computes (not the instant between a receive and a send)
    passes = passes[passes["median_ns"] >= FLOOR_SHARE * duration].copy()
    if not len(passes):
        return empty
    passes["ratio"] = passes["ns"] / passes["median_ns"]
    long = (passes["ratio"] >= SLOW) & (passes["ns"] - passes["median_ns"] >= FLOOR_SHARE * duration)
    own = long.groupby(passes["cell"]).transform("mean") >= OWN_SHARE  # the rank itself is slow there
    passes["long"] = long & ~own
    excess = (passes["ns"] - passes["median_ns"]).where(passes["long"], 0)
    cell_excess = np.zeros(n, np.int64)
    np.add.at(cell_excess, passes["cell"].to_numpy(), np.round(excess.to_numpy(float)).astype(np.int64))
    chosen = passes[passes["long"]]
    if not len(chosen):
        return Microbatches(findings_table([]), _spread(passes, cells), cell_excess, no_steps)

    # re-timed with the long micro-batches at their stage's median: their gaps shortened in proportion
    scale = pd.Series(chosen["median_ns"].to_numpy() / chosen["ns"].to_numpy(),
                      index=pd.MultiIndex.from_frame(chosen[["cell", "position"]]))
    kernel_scale = scale.reindex(pd.MultiIndex.from_arrays([ch.cell, ch.position])).fillna(1.0).to_numpy()
    final_scale = scale.reindex(pd.MultiIndex.from_arrays([np.arange(n), ch.exchanges])).fillna(1.0).to_numpy()
    gap = np.where(ch.gap > 0, np.round(ch.gap * kernel_scale), ch.gap).astype(np.int64)
    final = np.where(ch.final_gap > 0, np.round(ch.final_gap * final_scale), ch.final_gap).astype(np.int64)
    as_ran = retimed_ends(ch, ch.gap, ch.final_gap)
    evened = retimed_ends(ch, gap, final)
    span = pd.DataFrame({"iteration": iteration, "start": ch.cell_start, "ran": as_ran, "even": evened})[compared]
    g = span.groupby("iteration")
    cost = (g["ran"].max() - g["even"].max()).clip(lower=0)
    steps = pd.DataFrame({"iteration": cost.index.to_numpy(np.int64),
                          "long_passes": chosen.groupby(iteration[chosen["cell"].to_numpy()]).size().reindex(
                              cost.index, fill_value=0).to_numpy(np.int64), "cost_ns": cost.to_numpy(np.int64)})
    per_step = float(cost.mean())
    ranks = sorted({int(r) for r in cells["rank"].to_numpy()[np.unique(chosen["cell"].to_numpy())]})
    hit = np.unique(iteration[chosen["cell"].to_numpy()])
    spread = _spread(passes, cells)
    if per_step <= threshold * duration or len(ranks) < 2 or len(hit) < 2:
        return Microbatches(findings_table([]), spread, cell_excess, steps)
    pct = 100.0 * per_step / max(duration, 1.0)
    worst = chosen.loc[chosen["ratio"].idxmax()]
    evidence = (f"micro-batches take unevenly long: {len(chosen)} of {len(passes)} micro-batch passes (a rank's "
                f"compute between two pipeline exchanges) took at least {SLOW:g} times their stage's median at their "
                f"place in the schedule, up to {worst['ratio']:.1f} times at stage {int(worst['stage'])}, on "
                f"{len(ranks)} ranks in {len(hit)} of {len(cost)} iterations, no rank slow throughout; they cost "
                f"+{ms(per_step)} per iteration ({pct:.0f} % of the iteration: each re-timed with every micro-batch at "
                "its stage's median)")
    row = ("microbatch_imbalance", None, ranks, evidence, int(round(per_step)),
           "balance the micro-batches by tokens (pack sequences of similar length together)", pct, int(cost.sum()),
           len(cost), len(hit))
    return Microbatches(findings_table([row]), spread, cell_excess, steps)


def _spread(passes: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """SPREAD_COLUMNS: per stage, its micro-batches' compute (median, p95, longest) and their ratios to their stage's
    median at their position."""
    rank = cells["rank"].to_numpy()
    g = passes.assign(rank=rank[passes["cell"].to_numpy()]).groupby("stage")
    out = pd.DataFrame({
        "ranks": g["rank"].agg(lambda r: sorted(int(x) for x in set(r))),
        "passes": g.size(),
        "long_passes": g["long"].sum().astype("int64"),
        "median_ns": g["ns"].median().round().astype("int64"),
        "p95_ns": g["ns"].quantile(0.95).round().astype("int64"),
        "max_ns": g["ns"].max().astype("int64"),
        "p95_ratio": g["ratio"].quantile(0.95),
        "max_ratio": g["ratio"].max(),
    })
    return out.reset_index()[SPREAD_COLUMNS]
