"""Which component explains a straggling cell: each component's excess over its cross-rank median per iteration
(or per cohort of peers), and its own noise scale over the whole run, the components read from the ranks' tables in
passes, a few at a time, so that hundreds of millions of cell x component values are never held at once
(straggler_heatmap's reduce)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .groups import runs_of_about
from .inputs import numpy_of
from .iterations import DEFAULT_SYNC_RE
from .spill import table_of

MAD_TO_SIGMA = 1.4826
Q90_TO_SIGMA = 1.645  # the 90th percentile of |N(0, 1)|
EXPLAINS = 0.5  # a component must account for this share of the excess to flag on its own noise


def robust_scale(x: np.ndarray) -> float:
    if not len(x):
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


EXCESS_CHUNK_ROWS = 1_000_000  # component cells worked on at once, about (~170 B each at its peak)
DENSE_SHARE = 4  # a component that at least one cell in this many has is worked on as a column over every cell
DENSE_BYTES = 512 << 20  # the columns over every cell read in one pass over the ranks (9 B a cell each)


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

    def _taken(self, local: np.ndarray):
        """Per part: (its cells, the local column of each row, ns) of the rows whose code's `local` is 0 or more."""
        for (_, first), rows, recode in zip(self.parts, self._tables(), self.recode, strict=True):
            col = local[self._codes(rows, recode)]
            take = np.flatnonzero(col >= 0)
            yield numpy_of(rows.column("iteration"))[take] + first, col[take], numpy_of(rows.column("ns"))[take]

    def rows(self, local: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cell, local column, ns as float) of the rows whose code has a local column (`local`, -1: none)."""
        parts = list(self._taken(local))
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                np.concatenate([p[2] for p in parts]).astype(np.float64))

    def dense(self, local: np.ndarray, width: int, n_cells: int) -> tuple[np.ndarray, np.ndarray]:
        """The columns over every cell (0 where a cell lacks the component; a cell's rows of one summed) and which
        cells have each, of the codes with a local column."""
        values, has = np.zeros((width, n_cells)), np.zeros((width, n_cells), bool)
        for cell, col, ns in self._taken(local):
            np.add.at(values, (col, cell), ns)
            has[col, cell] = True
        return values, has


def component_causes(cell_iteration: np.ndarray, comps: ComponentRows, sync_names: set, cell_excess: np.ndarray,
                     typical: float, sigma: float) -> tuple[np.ndarray, ...]:
    """For each cell (rank, iteration): whether one component accounts for its excess and stands out of
    that component's own noise, the component furthest above its cross-rank median (a code into the names given
    next, their count where none is), the components' names and whether each is GPU time (else host time).

    Over a cell x component table, 0 where a cell lacks a component, never held whole: a component most cells have
    as a column over every cell (a few at a time, DENSE_BYTES), the others from their rows alone, a run of them at a
    time (EXCESS_CHUNK_ROWS rows about). With torch's emit_nvtx every op's range name carries its sequence number, so
    a report can have tens of thousands of child range names; ten thousand ranks have hundreds of millions of
    rows. A component's excess and noise depend on its own cells only.
    """
    words, gpu_side = np.repeat(comps.words, 2), np.tile([False, True], len(comps.words))
    present = np.flatnonzero(comps.counts)
    present = present[np.argsort(words[present], kind="stable")]  # columns in name order, as a pivot table's
    kept = np.array([not (DEFAULT_SYNC_RE.search(str(w)) or w in sync_names) for w in words[present]], bool)
    codes = present[kept]
    names = np.asarray(words[codes], dtype=object)
    on_gpu = gpu_side[codes]
    n_cells = len(cell_iteration)
    causes = _Causes(n_cells, len(names), cell_excess, max(1000.0, 0.001 * typical), sigma)
    dense = comps.counts[codes] * DENSE_SHARE >= n_cells
    by_cohort = _Cohorts(cell_iteration) if dense.any() else None
    columns = np.flatnonzero(dense)
    step = max(1, DENSE_BYTES // (9 * max(n_cells, 1)))
    for group in (columns[i:i + step] for i in range(0, len(columns), step)):
        values, has = comps.dense(_local(len(words), codes[group]), len(group), n_cells)
        for j, col in enumerate(group.tolist()):
            causes.add_column(col, *by_cohort.excess(values[j]), has[j])
    columns = np.flatnonzero(~dense)
    for low, high in runs_of_about(comps.counts[codes[columns]], EXCESS_CHUNK_ROWS):
        run = columns[low:high]
        cell, col, ns = comps.rows(_local(len(words), codes[run]))
        cell, col, excess, scale = _excess_by_component(cell_iteration, cell * len(run) + col, ns, len(run))
        causes.add(cell, run[col], excess, scale[col])
    return causes.noise_ok, causes.first_col, names, on_gpu


def _local(n_codes: int, codes: np.ndarray) -> np.ndarray:
    """Each code's place among `codes`, -1 for the others."""
    local = np.full(n_codes, -1)
    local[codes] = np.arange(len(codes))
    return local


class _Causes:
    """Each cell's findings as the components' excesses come in, in any order: whether one explains the cell's excess
    beyond its noise, and the component furthest above its median (the first in name order among equals)."""

    def __init__(self, n_cells: int, n_names: int, cell_excess: np.ndarray, floor: float, sigma: float):
        self.cell_excess, self.floor, self.sigma, self.n_names = cell_excess, floor, sigma, n_names
        self.noise_ok = np.zeros(n_cells, bool)
        self.top = np.full(n_cells, -np.inf)
        self.first_col = np.full(n_cells, n_names, np.int32)

    def add_column(self, col: int, excess: np.ndarray, scale: float, has: np.ndarray) -> None:
        """A column's excess in every cell, its noise scale, and which cells have it: as `add` of the rows of the cells
        that have it, without a row's index arrays (ten million cells: 80 MB each)."""
        explains = excess >= EXPLAINS * self.cell_excess
        explains &= excess / max(scale, self.floor) > self.sigma
        explains &= has
        self.noise_ok |= explains
        del explains
        better = excess > self.top
        better |= (excess == self.top) & (col < self.first_col)
        better &= excess > 0
        better &= has
        self.top[better] = excess[better]
        self.first_col[better] = col

    def add(self, cell: np.ndarray, col: np.ndarray, excess: np.ndarray, scale: np.ndarray) -> None:
        """The excess of these (cell, column) rows, and the noise scale of each row's column (before its floor)."""
        explains = (excess >= EXPLAINS * self.cell_excess[cell]) & (excess / np.maximum(scale, self.floor) > self.sigma)
        self.noise_ok[cell[explains]] = True
        above = excess > 0
        cell, col, excess = cell[above], col[above], excess[above]
        cells, at = np.unique(cell, return_inverse=True)
        best = np.full(len(cells), -np.inf)
        np.maximum.at(best, at, excess)
        best_col = np.full(len(cells), self.n_names)
        at_best = excess == best[at]
        np.minimum.at(best_col, at[at_best], col[at_best])
        top, first = self.top[cells], self.first_col[cells]
        better = (best > top) | ((best == top) & (best_col < first))
        self.top[cells[better]], self.first_col[cells[better]] = best[better], best_col[better]


class _Cohorts:
    """The cells by cohort (`cell_iteration`: the cells compared with one another), for a column's median per cohort."""

    def __init__(self, cell_iteration: np.ndarray):
        present = np.bincount(cell_iteration) > 0  # cohort codes are small numbers (peers.cohorts): no sort
        self.code = np.flatnonzero(present)
        self.of_cell = (np.cumsum(present) - 1)[cell_iteration]
        self.order = np.argsort(self.of_cell, kind="stable")
        self.size = np.bincount(self.of_cell, minlength=len(self.code))
        self.first = np.cumsum(self.size) - self.size

    def excess(self, values: np.ndarray) -> tuple[np.ndarray, float]:
        """A column's excess over its cohort's median in every cell, and its noise scale over them all (as
        _excess_by_component gives them: the same to the last bit). The medians a run of cohorts at a time
        (EXCESS_CHUNK_ROWS cells about): sorting every cell's value at once would hold four copies of the column."""
        median = np.empty(len(self.code))
        for low, high in runs_of_about(self.size, EXCESS_CHUNK_ROWS):
            size = self.size[low:high]
            part = values[self.order[self.first[low]:self.first[high - 1] + size[-1]]]
            part = part[group_order(np.repeat(np.arange(high - low), size), part, 1)]
            first = np.cumsum(size) - size
            median[low:high] = np.median(np.stack([part[first + (size - 1) // 2], part[first + size // 2]]), axis=0)
        excess = values - median[self.of_cell]
        deviation = np.abs(excess - np.median(excess))
        scale = max(MAD_TO_SIGMA * np.median(deviation), np.quantile(deviation, 0.90) / Q90_TO_SIGMA)
        return excess, float(scale)


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
    order = group_order(group_key, ns, 1)
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
    order = group_order(col, x, step)
    ends = np.cumsum(weight[order])
    columns = np.arange(int(col.max()) + 1 if len(col) else 0) * n
    return np.stack([x[order[np.searchsorted(ends, columns + p, side="right")]] for p in positions])


def group_order(group: np.ndarray, x: np.ndarray, step: int = 1) -> np.ndarray:
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
