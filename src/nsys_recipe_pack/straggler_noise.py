"""Which component explains a straggling cell: each component's excess over its cross-rank median per iteration
(or per cohort of peers), and its own noise scale over the whole run, read and held a run of components at a time so
that hundreds of millions of cells need not be held at once (straggler_heatmap's reduce)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .groups import runs_of_about
from .inputs import numpy_of
from .iterations import DEFAULT_SYNC_RE
from .lazy import pd
from .spill import table_of

MAD_TO_SIGMA = 1.4826
Q90_TO_SIGMA = 1.645  # the 90th percentile of |N(0, 1)|
EXPLAINS = 0.5  # a component must account for this share of the excess to flag on its own noise


def robust_scale(x: pd.Series) -> float:
    x = x.dropna()
    if x.empty:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


class ComponentRows:
    """Every rank's component rows (the maps' `components` tables: iteration, component, ns, on_gpu), read a rank at a
    time whenever some of them are needed: a run of many ranks has hundreds of millions of them, more than memory
    holds. Codes: a component's word times 2 plus its side (a range's host time and the GPU time of its work apart).
    parts: (table or spill.StoredTable, the cell of its iteration 0)."""

    COLUMNS = ["iteration", "component", "ns", "on_gpu"]

    def __init__(self, parts: list[tuple]):
        self.parts = parts
        index: dict = {}
        self.recode = []  # per part: its dictionary's codes as indices into self.words
        counts = []
        for rows in self._tables():
            words = rows.column("component").chunk(0).dictionary.to_pylist() if rows.num_rows else []
            self.recode.append(np.array([index.setdefault(w, len(index)) for w in words] or [0], np.int64))
            counts.append(np.bincount(self._codes(rows, self.recode[-1]), minlength=2 * len(index)))
        self.words = np.array(list(index), dtype=object)
        self.counts = np.zeros(2 * len(index), np.int64)
        for c in counts:
            self.counts[:len(c)] += c

    def _tables(self):
        for rows, _ in self.parts:
            yield table_of(rows, self.COLUMNS).combine_chunks()

    @staticmethod
    def _codes(rows: pa.Table, recode: np.ndarray) -> np.ndarray:
        if not rows.num_rows:
            return np.zeros(0, np.int64)
        return recode[numpy_of(rows.column("component").chunk(0).indices)] * 2 + numpy_of(rows.column("on_gpu"))

    def rows(self, column: np.ndarray, low: int, high: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cell, column - low, ns as float) of the rows whose code's `column` is in [low, high)."""
        cells, cols, ns = [], [], []
        for (_, first), rows, recode in zip(self.parts, self._tables(), self.recode, strict=True):
            col = column[self._codes(rows, recode)]
            take = np.flatnonzero((col >= low) & (col < high))
            cells.append(numpy_of(rows.column("iteration"))[take] + first)
            cols.append(col[take] - low)
            ns.append(numpy_of(rows.column("ns"))[take].astype(np.float64))
        return tuple(np.concatenate(x) if x else np.zeros(0, np.int64) for x in (cells, cols, ns))


def component_causes(cell_iteration: np.ndarray, comps: ComponentRows, sync_names: set, cell_excess: np.ndarray,
                     typical: float, sigma: float) -> tuple[np.ndarray, ...]:
    """For each cell (rank, iteration): whether one component accounts for its excess and stands out of
    that component's own noise, the component furthest above its cross-rank median (None if none is), and
    whether that is host time or GPU time ("host", "gpu").

    Over a cell x component table, 0 where a cell lacks a component, of which only the components each cell
    has are held, a run of components at a time (EXCESS_CHUNK_ROWS rows about): with torch's emit_nvtx every op's
    range name carries its sequence number, so a report can have tens of thousands of child range names, and ten
    thousand ranks hundreds of millions of rows; a component's excess and noise depend on its own cells only.
    """
    words, gpu_side = np.repeat(comps.words, 2), np.tile([False, True], len(comps.words))
    present = np.flatnonzero(comps.counts)
    present = present[np.argsort(words[present], kind="stable")]  # columns in name order, as a pivot table's
    kept = np.array([not (DEFAULT_SYNC_RE.search(str(w)) or w in sync_names) for w in words[present]], bool)
    names = np.asarray(words[present][kept], dtype=object)
    on_gpu = gpu_side[present][kept]
    column = np.full(len(words), -1)
    column[present[kept]] = np.arange(len(names))
    n_cells = len(cell_iteration)
    noise_ok = np.zeros(n_cells, bool)
    top = np.full(n_cells, -np.inf)  # each cell's largest excess above 0 so far, and its first column in name order
    first_col = np.full(n_cells, len(names))
    floor = max(1000.0, 0.001 * typical)
    for low, high in runs_of_about(comps.counts[present[kept]], EXCESS_CHUNK_ROWS):
        cell, col, ns = comps.rows(column, low, high)
        width = high - low
        cell, col, excess, scale = _excess_by_component(cell_iteration, cell * width + col, ns, width)
        scale = np.maximum(scale, floor)
        explains = (excess >= EXPLAINS * cell_excess[cell]) & (excess / scale[col] > sigma)
        noise_ok[cell[explains]] = True
        above = excess > 0
        cell, col, excess = cell[above], col[above] + low, excess[above]
        cells, at = np.unique(cell, return_inverse=True)
        best = np.full(len(cells), -np.inf)
        np.maximum.at(best, at, excess)
        best_col = np.full(len(cells), len(names))
        at_best = excess == best[at]
        np.minimum.at(best_col, at[at_best], col[at_best])
        better = best > top[cells]  # a run's columns come after those of the runs before: among equals, the earlier's
        top[cells[better]], first_col[cells[better]] = best[better], best_col[better]
    cause = np.full(n_cells, None, dtype=object)
    cause_side = np.full(n_cells, None, dtype=object)
    has = first_col < len(names)
    cause[has] = names[first_col[has]]
    cause_side[has] = np.where(on_gpu[first_col[has]], "gpu", "host")
    return noise_ok, cause, cause_side


EXCESS_CHUNK_ROWS = 1_000_000  # component cells worked on at once, about (~170 B each at its peak)


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
