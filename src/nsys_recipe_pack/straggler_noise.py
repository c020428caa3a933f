"""Which component explains a straggling cell: each component's excess over its cross-rank median per iteration
(or per cohort of peers), and its own noise scale over the whole run, held a run of components at a time so that
tens of millions of cells need not be held at once (straggler_heatmap's reduce)."""

from __future__ import annotations

import numpy as np

from .groups import runs_of_about
from .inputs import Frame
from .iterations import DEFAULT_SYNC_RE
from .lazy import pd

MAD_TO_SIGMA = 1.4826
Q90_TO_SIGMA = 1.645  # the 90th percentile of |N(0, 1)|
EXPLAINS = 0.5  # a component must account for this share of the excess to flag on its own noise


def robust_scale(x: pd.Series) -> float:
    x = x.dropna()
    if x.empty:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


def component_causes(cell_iteration: np.ndarray, comp_cell: np.ndarray, comps: Frame, sync_names: set,
                      cell_excess: np.ndarray, typical: float, sigma: float) -> tuple[np.ndarray, ...]:
    """For each cell (rank, iteration): whether one component accounts for its excess and stands out of
    that component's own noise, the component furthest above its cross-rank median (None if none is), and
    whether that is host time or GPU time ("host", "gpu").

    Over a cell x component table, 0 where a cell lacks a component, of which only the components each cell
    has are held: with torch's emit_nvtx every op's range name carries its sequence number, so a report can
    have tens of thousands of child range names and the whole table would not fit in memory.
    """
    codes, words = comps.codes("component")
    codes = codes * 2 + comps.values("on_gpu")  # a range's host time and the GPU time of its work apart
    words, gpu_side = np.repeat(words, 2), np.tile([False, True], len(words))
    present = np.unique(codes)
    present = present[np.argsort(words[present], kind="stable")]  # columns in name order, as a pivot table's
    kept = np.array([not (DEFAULT_SYNC_RE.search(str(w)) or w in sync_names) for w in words[present]], bool)
    names = np.asarray(words[present][kept], dtype=object)
    on_gpu = gpu_side[present][kept]
    column = np.full(len(words), -1)
    column[present[kept]] = np.arange(len(names))
    take = column[codes] >= 0
    n_cells = len(cell_iteration)
    cell, col, excess, scale = component_excess(cell_iteration, comp_cell[take] * len(names) + column[codes][take],
                                                 comps.values("ns")[take].astype(np.float64), len(names))
    scale = np.maximum(scale, max(1000.0, 0.001 * typical))
    explains = (excess >= EXPLAINS * cell_excess[cell]) & (excess / scale[col] > sigma)
    noise_ok = np.zeros(n_cells, bool)
    noise_ok[cell[explains]] = True
    # the cause: the largest excess above 0, the first component in name order among equals
    above = excess > 0
    top = np.full(n_cells, -np.inf)
    np.maximum.at(top, cell[above], excess[above])
    at_top = above & (excess == top[cell])
    first_col = np.full(n_cells, len(names))
    np.minimum.at(first_col, cell[at_top], col[at_top])
    cause = np.full(n_cells, None, dtype=object)
    cause_side = np.full(n_cells, None, dtype=object)
    has = first_col < len(names)
    cause[has] = names[first_col[has]]
    cause_side[has] = np.where(on_gpu[first_col[has]], "gpu", "host")
    return noise_ok, cause, cause_side


EXCESS_CHUNK_ROWS = 1_000_000  # component cells `component_excess` works on at once (~170 B each at its peak)


def component_excess(cell_iteration: np.ndarray, cell_col: np.ndarray, ns: np.ndarray, n_names: int):
    """`_excess_by_component` over runs of components of about EXCESS_CHUNK_ROWS cells at a time: a component's
    excess and scale depend on its own cells only, so that a long capture or many ranks (tens of millions of
    cells) need not hold every column of the work at once. Rows come by component run."""
    col = cell_col % max(n_names, 1)
    per_col = np.bincount(col, minlength=n_names)
    runs = runs_of_about(per_col, EXCESS_CHUNK_ROWS)
    if len(cell_col) <= EXCESS_CHUNK_ROWS or len(runs) < 2:
        return _excess_by_component(cell_iteration, cell_col, ns, n_names)
    by_col = np.argsort(col, kind="stable")
    ends = np.cumsum(per_col)
    cell, out_col, excess = np.empty(len(col), np.int64), np.empty(len(col), np.int64), np.empty(len(col))
    scale, at = np.zeros(n_names), 0  # the runs' rows, one after another (fewer where a cell's repeats are summed)
    for low, high in runs:
        rows = by_col[ends[low] - per_col[low]:ends[high - 1]]
        width = high - low
        part = _excess_by_component(cell_iteration, cell_col[rows] // n_names * width + col[rows] - low, ns[rows],
                                    width)
        size = len(part[0])
        cell[at:at + size], out_col[at:at + size], excess[at:at + size], scale[low:high] = part
        out_col[at:at + size] += low
        at += size
    return cell[:at], out_col[:at], excess[:at], scale


def _excess_by_component(cell_iteration: np.ndarray, cell_col: np.ndarray, ns: np.ndarray, n_names: int):
    """The cell x component table's excess over each iteration's median and each component's noise scale
    (the larger of the MAD scale and the 90th percentile of the absolute deviation read as a normal
    quantile, over every cell: on a contended CPU a forward pass's time is heavy-tailed, and the MAD alone
    would call its ordinary slow iterations outliers), from the cells' own components only: (cell, component,
    excess) of each component a cell has, and the scale of each component. Component times are never negative,
    so a component a cell lacks is at or below the median there: it can neither explain a cell's excess nor be
    its cause."""
    n_cells = len(cell_iteration)
    sorted_cell_col = np.sort(cell_col)
    if (sorted_cell_col[1:] == sorted_cell_col[:-1]).any():  # a child range named like a fixed component
        cell_col, at = np.unique(cell_col, return_inverse=True)
        ns = np.bincount(at.reshape(-1), weights=ns)
    cell, col = np.divmod(cell_col, max(n_names, 1))
    del sorted_cell_col, cell_col  # millions of rows each: no more columns of their length at once than needed
    # each (iteration, component)'s median over the iteration's cells, the cells without it counting 0
    per_iteration = np.bincount(cell_iteration)
    group_key = cell_iteration[cell] * n_names + col
    order = _by_group(group_key, ns, 1)
    sorted_ns = ns[order]
    first = np.flatnonzero(np.r_[True, group_key[order][1:] != group_key[order][:-1]]) if len(order) else \
        np.zeros(0, np.int64)
    size = np.diff(np.r_[first, len(order)])
    cells_in = per_iteration[cell_iteration[cell[order[first]]]]
    lacking = cells_in - size

    # the middle two of each group, its missing cells as zeros before its values
    median = np.median(np.stack([np.where(n < lacking, 0.0, sorted_ns[first + np.maximum(n - lacking, 0)])
                                 for n in ((cells_in - 1) // 2, cells_in // 2)]), axis=0)
    excess = np.empty(len(ns))
    excess[order] = sorted_ns - np.repeat(median, size)
    group_col = col[order[first]]
    del order, sorted_ns, group_key, first, size
    # each component's excess over all cells: the cells that have it, those of the same iterations that
    # lack it (0 minus the median), and those of iterations where no cell has it (0)
    covered = np.bincount(group_col, weights=cells_in, minlength=n_names).astype(np.int64)
    x_col = np.concatenate([col, group_col, np.arange(n_names)])
    x = np.concatenate([excess, 0.0 - median, np.zeros(n_names)])
    weight = np.concatenate([np.ones(len(excess), np.int64), lacking, n_cells - covered])
    middle = [(n_cells - 1) // 2, n_cells // 2]
    deviation = x
    deviation -= np.median(_order_stats(x_col, x, weight, n_cells, middle, 2), axis=0)[x_col]
    np.abs(deviation, out=deviation)
    del x
    q90 = (n_cells - 1) * 0.90  # where np.quantile finds it: between two values
    around = [int(np.floor(q90)), min(int(np.floor(q90)) + 1, n_cells - 1)]
    dev = _order_stats(x_col, deviation, weight, n_cells, middle + around, 4)
    # np.median and np.quantile on the values they would pick from the whole column: the same to the last bit
    scale = np.maximum(MAD_TO_SIGMA * np.median(dev[:2], axis=0),
                       np.quantile(dev[2:], q90 - np.floor(q90), axis=0) / Q90_TO_SIGMA)
    return cell, col, excess, scale


def _order_stats(col: np.ndarray, x: np.ndarray, weight: np.ndarray, n: int, positions: list[int],
                 step: int) -> np.ndarray:
    """The values at these positions of each column's sorted values, each value repeated `weight` times
    (every column's weights add up to n)."""
    order = _by_group(col, x, step)
    ends = np.cumsum(weight[order])
    columns = np.arange(int(col.max()) + 1 if len(col) else 0) * n
    return np.stack([x[order[np.searchsorted(ends, columns + p, side="right")]] for p in positions])


def _by_group(group: np.ndarray, x: np.ndarray, step: int) -> np.ndarray:
    """The order that sorts by group, then by x within a group (ties in any order). Times in ns, and their
    medians and deviations, are whole multiples of 1/step: then one sort of one packed integer key does it,
    several times faster than np.lexsort on millions of rows."""
    if len(x):
        scaled = x * step
        low = float(scaled.min())
        span = int(scaled.max() - low) + 1
        if span < 1 << 52 and (int(group.max()) + 1) * span < 1 << 62 and (scaled == np.floor(scaled)).all():
            scaled -= low
            key = scaled.astype(np.int64)
            del scaled
            key += group * span
            return np.argsort(key)
    return np.lexsort((x, group))
