"""Which component explains a straggling cell: each component's excess over its cross-rank median per iteration
(or per cohort of peers), and its own noise scale over the whole run. The components are read from the ranks' tables
once, regrouped in files a run of iterations at a time, and worked on a block at a time, so that hundreds of millions
of cell x component values are never held at once (straggler_heatmap's reduce)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .groups import runs_of_about
from .inputs import numpy_of
from .iterations import DEFAULT_SYNC_RE
from .order_statistics import deviations
from .spill import ColumnFiles, table_of

MAD_TO_SIGMA = 1.4826
Q90_TO_SIGMA = 1.645  # the 90th percentile of |N(0, 1)|
EXPLAINS = 0.5  # a component must account for this share of the excess to flag on its own noise


BLOCK_ROWS = 1_000_000  # component rows worked on at once, about (~170 B each at their peak)


class ComponentRows:
    """Every rank's component rows (the maps' `components` tables: iteration, component, ns, on_gpu), read a rank at a
    time: a run of many ranks has hundreds of millions of them, more than memory holds. Codes: a component's word
    times 2 plus its side (a range's host time and the GPU time of its work apart). parts: (table or
    spill.StoredTable, the cell of its iteration 0, its rank's stage); width: cohort codes per iteration (a cell's
    cohort, the cells compared with one another: its iteration * width + its rank's stage). The rows of each
    iteration are counted as they are first read (`iteration_rows`)."""

    COLUMNS = ["iteration", "component", "ns", "on_gpu"]

    def __init__(self, parts: list[tuple], width: int):
        self.parts, self.width = parts, width
        index: dict = {}
        self.recode = []  # per part: its dictionary's codes as indices into self.words
        counts = []
        self.merged = False  # a rank names two of its components alike (a child range named like a fixed one)
        self.iteration_rows = np.zeros(0, np.int64)
        for rows in self._tables():
            words = rows.column("component").chunk(0).dictionary.to_pylist() if rows.num_rows else []
            self.recode.append(np.array([index.setdefault(w, len(index)) for w in words] or [0], np.int64))
            self.merged |= len(set(words)) < len(words)
            counts.append(np.bincount(self._codes(rows, self.recode[-1]), minlength=2 * len(index)))
            per = np.bincount(numpy_of(rows.column("iteration"))) if rows.num_rows else np.zeros(0, np.int64)
            if len(per) > len(self.iteration_rows):
                self.iteration_rows = np.r_[self.iteration_rows, np.zeros(len(per) - len(self.iteration_rows),
                                                                          np.int64)]
            self.iteration_rows[:len(per)] += per
        self.words = np.array(list(index), dtype=object)
        self.counts = np.zeros(2 * len(index), np.int64)
        for c in counts:
            self.counts[:len(c)] += c

    def _tables(self):
        for rows, *_ in self.parts:
            yield table_of(rows, self.COLUMNS).combine_chunks()

    @staticmethod
    def _codes(rows: pa.Table, recode: np.ndarray) -> np.ndarray:
        if not rows.num_rows:
            return np.zeros(0, np.int64)
        return recode[numpy_of(rows.column("component").chunk(0).indices)] * 2 + numpy_of(rows.column("on_gpu"))

    def columns(self, sync_names: set) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The codes compared (every component but sync points), in name order as a pivot table's columns, their
        names and whether each is GPU time (else host time)."""
        words, gpu_side = np.repeat(self.words, 2), np.tile([False, True], len(self.words))
        present = np.flatnonzero(self.counts)
        present = present[np.argsort(words[present], kind="stable")]
        kept = np.array([not (DEFAULT_SYNC_RE.search(str(w)) or w in sync_names) for w in words[present]], bool)
        codes = present[kept]
        return codes, np.asarray(words[codes], dtype=object), gpu_side[codes]

    def by_block(self, codes: np.ndarray, blocks: Blocks, near: str | None) -> ColumnFiles:
        """The rows of these codes as (cell, cohort, col: the code's place among them, ns) in files, a part per
        block."""
        local = np.full(len(self.counts), -1)
        local[codes] = np.arange(len(codes))
        files = ColumnFiles({"cell": np.int64, "cohort": np.int64, "col": np.int32, "ns": np.int64,
                             "excess": np.float64}, near)
        try:
            for (_, first, stage), rows, recode in zip(self.parts, self._tables(), self.recode, strict=True):
                col = local[self._codes(rows, recode)]
                take = np.flatnonzero(col >= 0)
                iteration = numpy_of(rows.column("iteration"))[take]
                files.hold(blocks.of(iteration, col[take]), {
                    "cell": iteration + first, "cohort": iteration * self.width + stage, "col": col[take],
                    "ns": numpy_of(rows.column("ns"))[take]})
            files.flush()
        except BaseException:
            files.close()
            raise
        return files


class Blocks:
    """The rank x iteration cells and their components cut into blocks of about BLOCK_ROWS rows: runs of iterations
    (the cells compared with one another are of one iteration), each cut into runs of components where one iteration
    alone has more rows (with torch's emit_nvtx a report can have tens of thousands of child range names). Block
    i * len(columns) + j: iteration run i, component run j. iteration_rows: the rows of each iteration; column_rows:
    of each component."""

    def __init__(self, iteration_rows: np.ndarray, column_rows: np.ndarray):
        self.iterations = runs_of_about(iteration_rows, BLOCK_ROWS)
        pieces = max(1, -(-int(iteration_rows.max(initial=0)) // BLOCK_ROWS))  # an iteration alone beyond a block
        self.columns = runs_of_about(column_rows, -(-int(column_rows.sum()) // pieces)) or [(0, 0)]
        self.iteration_run = np.repeat(np.arange(len(self.iterations)), [h - lo for lo, h in self.iterations])
        self.column_run = np.repeat(np.arange(len(self.columns)), [h - lo for lo, h in self.columns])

    def __len__(self) -> int:
        return len(self.iterations) * len(self.columns)

    def of(self, iteration: np.ndarray, col: np.ndarray) -> np.ndarray:
        return self.iteration_run[iteration] * len(self.columns) + self.column_run[col]


class ComponentCauses:
    """Which component explains a cell's excess: each component's excess over its cohort's median in every cell, 0
    where a cell lacks it, and its noise scale over the whole run (_ComponentExcess), from the rows regrouped in files
    a block at a time; then, a run of iterations at a time (`of_run`), each cell's findings. With torch's emit_nvtx
    every op's range name carries its sequence number, so a report can have tens of thousands of child range names;
    ten thousand ranks have hundreds of millions of rows. A component's excess and noise depend on its own cells
    only. cells_in: the cells of each cohort; near: where the files go (spill.ColumnFiles)."""

    def __init__(self, comps: ComponentRows, codes: np.ndarray, blocks: Blocks, cells_in: np.ndarray, n_cells: int,
                 near: str | None):
        self.blocks, self.n_names = blocks, len(codes)
        self.files = comps.by_block(codes, blocks, near)
        try:
            self.scale = _ComponentExcess(self.files, cells_in, n_cells, len(blocks), self.n_names,
                                          comps.merged).scales()
        except BaseException:
            self.files.close()
            raise

    def of_run(self, i: int, cells: np.ndarray, cell_excess: np.ndarray, typical: float,
               sigma: float) -> tuple[np.ndarray, np.ndarray]:
        """Of each cell of iteration run i (cells: theirs, in order; cell_excess: their busy excess): whether one
        component accounts for its excess and stands out of that component's own noise, and the component furthest
        above its cohort's median (a code into the names, their count where none is)."""
        causes = _Causes(len(cells), self.n_names, cell_excess, max(1000.0, 0.001 * typical), sigma)
        width = len(self.blocks.columns)
        for part in range(i * width, (i + 1) * width):
            col = self.files.read(part, "col")
            causes.add(np.searchsorted(cells, self.files.read(part, "cell")), col, self.files.read(part, "excess"),
                       self.scale[col])
        return causes.noise_ok, causes.first_col

    def close(self) -> None:
        self.files.close()


class _ComponentExcess:
    """Each component's excess over its cohort's median in every cell that has it (written to the run's files as
    `excess`, beside the rows' cells and columns), the cells lacking it counting 0; and each component's noise scale:
    the larger of the MAD scale and the 90th percentile of the absolute deviation read as a normal quantile, over
    every cell (on a contended CPU a forward pass's time is heavy-tailed, and the MAD alone would call its ordinary
    slow iterations outliers). Component times are never negative, so a component a cell lacks is at or below the
    median there: it can neither explain a cell's excess nor be its cause. merged: a cell may have several rows of
    one component (a child range named like a fixed component), which are added up."""

    def __init__(self, blocks: ColumnFiles, cells_in: np.ndarray, n_cells: int, n_blocks: int, n_names: int,
                 merged: bool):
        self.blocks, self.n_names, self.n_cells = blocks, n_names, n_cells
        # per run: of each (cohort, component) with cells lacking it, its column, 0 minus its median, and those cells
        self.lacking: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        covered, rows = np.zeros(n_names, np.int64), np.zeros(n_names, np.int64)
        least, most = np.full(n_names, np.inf), np.full(n_names, -np.inf)
        for i in range(n_blocks):
            cell, cohort, col = blocks.read(i, "cell"), blocks.read(i, "cohort"), blocks.read(i, "col")
            if merged:
                cell, cohort, col, ns = _merged(cell, cohort, col, blocks.read(i, "ns"), n_names)
                for c, values in (("cell", cell), ("col", col)):
                    blocks.drop(i, c)
                    blocks.append(i, c, values)
            else:
                ns = blocks.read(i, "ns").astype(np.float64)
            for c in ("ns", "cohort"):
                blocks.drop(i, c)
            excess, groups = _excess_in_cohorts(cohort, cells_in, col, ns, n_names)
            blocks.append(i, "excess", excess)
            group_col, group_least, group_most, median, lacking, cohort_cells = groups
            covered += np.bincount(group_col, weights=cohort_cells, minlength=n_names).astype(np.int64)
            rows += np.bincount(col, minlength=n_names)
            np.minimum.at(least, group_col, group_least)
            np.maximum.at(most, group_col, group_most)
            some = lacking > 0
            self.lacking.append((group_col[some], 0.0 - median[some], lacking[some]))
            rows += np.bincount(group_col[some], minlength=n_names)
            np.minimum.at(least, group_col[some], 0.0 - median[some])
            np.maximum.at(most, group_col[some], 0.0 - median[some])
        self.runs = n_blocks
        # the cells of cohorts where no cell has the component: 0
        self.absent = self.n_cells - covered
        some = self.absent > 0
        rows += some
        least[some], most[some] = np.minimum(least[some], 0.0), np.maximum(most[some], 0.0)
        self.bounds = (least, most, rows)

    def values(self):
        """Every component's excess over all cells: the cells that have it, those of the same cohorts that lack it
        (0 minus the median), and those of cohorts where no cell has it (0), as (column, value, weight)."""
        for i in range(self.runs):
            yield self.blocks.read(i, "col"), self.blocks.read(i, "excess"), None
            yield self.lacking[i]
        some = np.flatnonzero(self.absent > 0)
        yield some, np.zeros(len(some)), self.absent[some]

    def scales(self) -> np.ndarray:
        q90 = (self.n_cells - 1) * 0.90  # where np.quantile finds it: between two values
        places = [(self.n_cells - 1) // 2, self.n_cells // 2, int(np.floor(q90)),
                  min(int(np.floor(q90)) + 1, self.n_cells - 1)]
        dev = deviations(self.values, self.n_names, self.n_cells, self.bounds, places).T
        # np.median and np.quantile on the values they would pick from the whole column: the same to the last bit
        return np.maximum(MAD_TO_SIGMA * np.median(dev[:2], axis=0),
                          np.quantile(dev[2:], q90 - np.floor(q90), axis=0) / Q90_TO_SIGMA)


def _merged(cell: np.ndarray, cohort: np.ndarray, col: np.ndarray, ns: np.ndarray,
            n_names: int) -> tuple[np.ndarray, ...]:
    """Each (cell, column)'s rows added up into one."""
    cell_col, first, at = np.unique(cell * n_names + col, return_index=True, return_inverse=True)
    ns = np.bincount(at.reshape(-1), weights=ns.astype(np.float64))
    cell, col = np.divmod(cell_col, max(n_names, 1))
    return cell, cohort[first], col.astype(np.int32), ns


class _Causes:
    """Each of a run's cells' findings as the components' excesses come in, a run of components after another: whether
    one explains the cell's excess beyond its noise, and the component furthest above its median (the first in name
    order among equals; n_names where none is above)."""

    def __init__(self, n_cells: int, n_names: int, cell_excess: np.ndarray, floor: float, sigma: float):
        self.cell_excess, self.floor, self.sigma, self.n_names = cell_excess, floor, sigma, n_names
        self.noise_ok = np.zeros(n_cells, bool)
        self.top = np.full(n_cells, -np.inf)
        self.first_col = np.full(n_cells, n_names, np.int32)

    def add(self, cell: np.ndarray, col: np.ndarray, excess: np.ndarray, scale: np.ndarray) -> None:
        """The excess of these (cell: its place among the run's cells, column) rows, and the noise scale of each row's
        column (before its floor)."""
        explains = (excess >= EXPLAINS * self.cell_excess[cell]) & (excess / np.maximum(scale, self.floor) > self.sigma)
        self.noise_ok[cell[explains]] = True
        above = excess > 0
        best = np.full(len(self.top), -np.inf)
        np.maximum.at(best, cell[above], excess[above])
        above &= excess == best[cell]
        best_col = np.full(len(self.top), self.n_names, np.int32)
        np.minimum.at(best_col, cell[above], col[above])
        better = (best > self.top) | ((best == self.top) & (best_col < self.first_col))
        self.top[better], self.first_col[better] = best[better], best_col[better]


def _excess_in_cohorts(cohort: np.ndarray, cells_in: np.ndarray, col: np.ndarray, ns: np.ndarray, n_names: int):
    """The rows of whole cohorts (one per cell and column: its cohort, column and ns): each row's excess over its
    cohort's median of the component (the cohort's cells without it counting 0); and per (cohort, component): its
    column, its least and greatest excess, its median, the cells lacking it and the cells of its cohort. cells_in:
    cells per cohort."""
    group_key = cohort * n_names + col
    sorted_key, sorted_ns = sorted_in_groups(group_key, ns)
    first = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]]) if len(ns) else np.zeros(0, np.int64)
    size = np.diff(np.r_[first, len(ns)])
    keys = sorted_key[first]
    del sorted_key
    cohort_cells = cells_in[keys // n_names]
    lacking = cohort_cells - size

    # the middle two of each group, its missing cells as zeros before its values
    median = np.median(np.stack([np.where(n < lacking, 0.0, sorted_ns[first + np.maximum(n - lacking, 0)])
                                 for n in ((cohort_cells - 1) // 2, cohort_cells // 2)]), axis=0)
    excess = ns - median[np.searchsorted(keys, group_key)]
    groups = (keys % n_names, sorted_ns[first] - median, sorted_ns[first + size - 1] - median, median, lacking,
              cohort_cells)
    return excess, groups


PACK_CHUNK = 1 << 20  # values packed or unpacked at once: ten million cells' temporaries would be 80 MB each


def _packed(group: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, int, float] | None:
    """Group and value as one integer key (group * span + x - low, its span and low) where the values are whole
    numbers of a span that fits (times in ns, and their medians, are whole multiples of 1/2): one sort of it orders
    by group, then value, several times quicker than np.lexsort on millions of rows. None where they are not."""
    if not len(x):
        return None
    low = x.min()
    span = int(x.max() - low) + 1
    if span >= 1 << 52 or (int(group.max()) + 1) * span >= 1 << 62:
        return None
    key = np.empty(len(x), np.int64)
    for at in range(0, len(x), PACK_CHUNK):
        part = x[at:at + PACK_CHUNK]
        if part.dtype.kind == "f" and not (part == np.floor(part)).all():
            return None
        key[at:at + PACK_CHUNK] = group[at:at + PACK_CHUNK] * span
        key[at:at + PACK_CHUNK] += (part - low).astype(np.int64)
    return key, span, float(low)


def group_order(group: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The order that sorts by group, then by x within a group (ties in any order)."""
    packed = _packed(group, x)
    return np.argsort(packed[0]) if packed is not None else np.lexsort((x, group))


def sorted_in_groups(group: np.ndarray, x: np.ndarray, groups: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """The groups (where asked for) and values (as floats) sorted by group, then value: where they pack into one key,
    without the order itself (a sort of the keys alone is about twice as quick)."""
    packed = _packed(group, x)
    if packed is None:
        order = np.lexsort((x, group))
        return group[order] if groups else None, np.asarray(x, np.float64)[order]
    key, span, low = packed
    key.sort()
    sorted_group = np.empty(len(key), np.int64) if groups else None
    sorted_x = np.empty(len(key))
    for at in range(0, len(key), PACK_CHUNK):
        part = key[at:at + PACK_CHUNK]
        of = part // span
        sorted_x[at:at + PACK_CHUNK] = part - of * span
        sorted_x[at:at + PACK_CHUNK] += low
        if groups:
            sorted_group[at:at + PACK_CHUNK] = of
    return sorted_group, sorted_x
