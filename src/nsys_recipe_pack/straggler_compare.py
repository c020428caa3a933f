"""straggler_heatmap's comparison of every cell with its peers, a run of iterations at a time (straggler_cells.Cells'
files): each cohort's median busy time and each iteration's median duration from a run's cells alone, the run-wide
order statistics (the median iteration, the typical busy time, the busy noise scale) found exactly in passes over the
files (order_statistics.py), then each cell flagged or not and its cause. Nothing of every cell is held but each
cell's cause code: ten thousand ranks of a thousand iterations are ten million cells."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import order_statistics
from .straggler_cells import Cells, group_medians
from .straggler_noise import MAD_TO_SIGMA, ComponentCauses, group_order

COMPONENT_BUSY_SIGMA = 0.75  # with a component beyond its own noise, the busy excess needs only this fraction of sigma


@dataclass
class Medians:
    """What the first pass over the cells finds: per cohort its median busy time and cells (`peers`), per iteration its
    median duration and whether it is compared (not warm-up, or warm-up kept), the typical busy time (the median over
    every cell of its cohort's median) and the busy noise scale before its floor (the MAD scale of the compared
    cells' excess)."""

    median_busy_ns: np.ndarray
    peers: np.ndarray
    median_duration_ns: np.ndarray
    compared: np.ndarray
    typical_ns: float
    busy_scale: float


def median_iteration(cells: Cells, runs: int) -> float:
    """The median duration of every cell (np.median's), from passes over the files."""
    if not cells.n:
        return 0.0

    def durations():
        for i in range(runs):
            values = cells.files.read(i, "duration_ns")
            yield np.zeros(len(values), np.int64), values, None

    least, most = cells.duration_bounds
    return float(order_statistics.medians(durations, 1, cells.n, ([least], [most], [cells.n]))[0])


def medians(cells: Cells, runs: list[tuple[int, int]], compared: np.ndarray) -> Medians:
    """The first pass (runs: each run's iterations, first and stop), which writes each cell's busy excess over its
    cohort's median (a float: whole numbers, as exact as int64 below 2**53 ns) beside the cells."""
    width, n_iterations = cells.width, len(compared)
    median_busy, peers = np.full(n_iterations * width, np.nan), np.zeros(n_iterations * width, np.int64)
    median_duration = np.full(n_iterations, np.nan)
    least, most, count = np.inf, -np.inf, 0
    for i, (low, high) in enumerate(runs):
        block = cells.block(i)
        local = block["cohort"] - low * width
        median_busy[low * width:high * width] = group_medians(local, block["busy_ns"], (high - low) * width)
        peers[low * width:high * width] = np.bincount(local, minlength=(high - low) * width)
        median_duration[low:high] = group_medians(block["iteration"] - low, block["duration_ns"], high - low)
        excess = np.round(block["busy_ns"] - median_busy[block["cohort"]])
        cells.files.append(i, "excess", excess)
        kept = excess[compared[block["iteration"]]]
        if len(kept):
            least, most, count = min(least, kept.min()), max(most, kept.max()), count + len(kept)
    has = np.flatnonzero(peers)
    typical = float(order_statistics.medians(lambda: [(np.zeros(len(has), np.int64), median_busy[has], peers[has])], 1,
                               cells.n)[0]) if cells.n else 0.0
    return Medians(median_busy, peers, median_duration, compared, typical,
                   _busy_scale(cells, len(runs), compared, (least, most, count)))


def _busy_scale(cells: Cells, runs: int, compared: np.ndarray, bounds: tuple) -> float:
    """The MAD scale of the compared cells' busy excess (as np.median gives it over them all)."""
    least, most, count = bounds
    if not count:
        return 0.0

    def excess():
        for i in range(runs):
            values = cells.files.read(i, "excess")[compared[cells.files.read(i, "iteration")]]
            yield np.zeros(len(values), np.int64), values, None

    middle = [(count - 1) // 2, count // 2]
    spread = order_statistics.deviations(excess, 1, count, ([least], [most], [count]), middle)
    return float(MAD_TO_SIGMA * np.median(spread))


@dataclass
class Flags:
    """What the second pass finds: the flagged cells (in order) and each one's recoverable time, and every cell's
    cause (a code into the components' names, their count where none is)."""

    flagged: np.ndarray
    recoverable_ns: np.ndarray
    cause: np.ndarray


def flags(cells: Cells, runs: list[tuple[int, int]], found: Medians, busy_scale: float, causes: ComponentCauses | None,
          n_names: int, threshold: float, sigma: float, micro_excess_ns: np.ndarray | None) -> Flags:
    """The second pass. A cell is flagged where its busy excess is large relative to its iteration (threshold) and
    to the noise (sigma, for busy time as a whole, or COMPONENT_BUSY_SIGMA of it where one component accounts for
    it beyond that component's own noise), it has a peer, and its iteration is compared; micro_excess_ns (per cell):
    the excess its long micro-batches explain, which does not count (uneven micro-batches on ranks not slow
    throughout)."""
    cause = np.full(cells.n, n_names, np.int32)
    flagged, recoverable = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for i in range(len(runs)):
        block = cells.block(i)
        cell, cohort, iteration, excess = block["cell"], block["cohort"], block["iteration"], block["excess"]
        noise_ok = np.zeros(len(cell), bool)
        if causes is not None:
            noise_ok, cause[cell] = causes.of_run(i, cell, excess, found.typical_ns, sigma)
        z_busy = excess / busy_scale
        allowed = threshold * found.median_duration_ns[iteration]
        is_straggler = (excess > allowed) & ((z_busy > sigma) | (noise_ok & (z_busy > COMPONENT_BUSY_SIGMA * sigma)))
        is_straggler &= found.peers[cohort] >= 2
        is_straggler &= found.compared[iteration]
        if micro_excess_ns is not None:
            explained = micro_excess_ns[cell]
            is_straggler &= ~((excess - explained <= allowed) & (explained > 0))
        at = np.flatnonzero(is_straggler)
        flagged.append(cell[at])
        recoverable.append(_recoverable(cohort, block["busy_ns"], block["wait_ns"], at, found.median_busy_ns))
    flagged, recoverable = np.concatenate(flagged), np.concatenate(recoverable)
    order = np.argsort(flagged)
    return Flags(flagged[order], recoverable[order], cause)


def _recoverable(cohort: np.ndarray, busy: np.ndarray, wait: np.ndarray, flagged: np.ndarray,
                 median_busy: np.ndarray) -> np.ndarray:
    """For each flagged cell, the time the whole iteration would have been shorter had the rank's busy time been the
    median peer's: its busy time above the busiest of its other peers (or the median, if higher), and no more than
    they waited beyond its own wait (the least-waiting other peer). cohort: each cell's peers (its stage's ranks in the
    iteration); median_busy: per cohort, their median busy time."""
    mark = np.zeros(len(median_busy), bool)
    mark[cohort[flagged]] = True
    peer = np.flatnonzero(mark[cohort])  # the cells of the flagged cells' cohorts, in order
    at = np.searchsorted(peer, flagged)
    cohort, busy, wait = cohort[peer], busy[peer].astype(float), wait[peer].astype(float)
    busy_other, wait_other = _of_the_others(cohort, busy, at), -_of_the_others(cohort, -wait, at)
    above = busy[at] - np.maximum(median_busy[cohort[at]], busy_other)
    waited_more = wait_other - wait[at]  # the least-waiting other rank's wait, beyond this rank's
    saving = np.clip(np.minimum(above, np.where(np.isfinite(waited_more), waited_more, 0.0)), 0.0, None)
    return np.round(saving).astype(np.int64)


def _of_the_others(group: np.ndarray, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each of these rows, the largest value among the other rows of its group (-inf when it is alone)."""
    n = len(values)
    order = group_order(group, -values)  # by group, then largest first (among equals any first: the same result)
    g, v = group[order], values[order]
    first = np.r_[True, g[1:] != g[:-1]] if n else np.zeros(0, bool)
    head = np.flatnonzero(first)
    nxt = np.minimum(head + 1, max(n - 1, 0))
    second = np.where((head + 1 < n) & (g[nxt] == g[head]), v[nxt], -np.inf)
    at = np.cumsum(first) - 1
    out = np.empty(n)
    out[order] = np.where(first, second[at], v[head][at])
    return out[rows]
