"""straggler_heatmap's cells (rank x iteration): the few columns its reduce compares, read from the maps' tables a
rank at a time into files a run of iterations at a time (the cells compared with one another are of one iteration),
and the output written back a rank at a time: what the output shows is read again from the rank's table and worked
out from the run-wide results as the rank's rows are written, never held for every cell. Ten thousand ranks of a
thousand iterations are ten million cells: each column held would be 80 MB."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .inputs import arrow_of, numpy_of
from .iterations import warmup
from .lazy import pd
from .spill import ColumnFiles, output_schema, table_of
from .straggler_noise import sorted_in_groups

NONE = np.iinfo(np.int64).max  # an iteration where no rank arrived at a sync point
HELD = ("iteration", "duration_ns", "wait_ns", "busy_ns")
FILED = {"cell": np.int64, "at": np.int64, **dict.fromkeys(HELD, np.int64), "excess": np.float64}


@dataclass
class Cells:
    """Every rank's cells (the output's order: by rank, then iteration; a cell's number its place in it): the ranks'
    numbers, clock offsets, tables (Arrow or spill.StoredTable) and stages (`width` cohort codes an iteration: a
    cell's cohort, the cells compared with one another, is its iteration * width + its rank's stage), and the columns
    the comparison needs (FILED: the cell, its rank's place `at`, HELD, and the excess the comparison adds) in files,
    a part per run of iterations, each part's cells in order."""

    ranks: np.ndarray
    counts: np.ndarray  # cells per rank
    offsets: np.ndarray
    tables: list
    stage: np.ndarray
    width: int
    files: ColumnFiles
    first_arrival_ns: np.ndarray  # per iteration: the earliest arrival of any rank, on aligned clocks (NONE: none)
    duration_bounds: tuple  # the least and greatest duration of any cell
    first: np.ndarray = field(init=False)  # each rank's first cell

    def __post_init__(self):
        self.first = np.cumsum(self.counts) - self.counts

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def per_iteration(self) -> np.ndarray:
        """The cells of each iteration (a rank's iterations are 0 to its count - 1)."""
        return np.cumsum(np.bincount(self.counts, minlength=int(self.counts.max(initial=0)) + 1)[::-1])[::-1][1:]

    def block(self, i: int) -> dict:
        """FILED of run i's cells, and each one's cohort."""
        out = {c: self.files.read(i, c) for c in FILED}
        out["cohort"] = out["iteration"] * self.width + self.stage[out["at"]]
        return out

    def rank_table(self, at: int, columns: list[str]) -> pa.Table:
        return table_of(self.tables[at], columns)

    def close(self) -> None:
        self.files.close()


def read_cells(per_rank: list[dict], stage: np.ndarray, width: int, run_of: np.ndarray, near: str | None) -> Cells:
    """The cells of the maps' `iterations` tables (per_rank in rank order), one rank's table read at a time, written
    to files (spill.ColumnFiles, near: where) a part per run of iterations (run_of: each iteration's run)."""
    counts = np.array([len(r["iterations"]) for r in per_rank], np.int64)
    offsets = np.array([r["offset_ns"] for r in per_rank], np.int64)
    first_arrival = np.full(int(counts.max(initial=0)), NONE, np.int64)
    files = ColumnFiles(FILED, near)
    least, most, at = np.inf, -np.inf, 0
    try:
        for place, (r, count, offset) in enumerate(zip(per_rank, counts.tolist(), offsets.tolist(), strict=True)):
            rows = table_of(r["iterations"], [*HELD, "arrival_ns"])
            held = {c: numpy_of(rows.column(c)) for c in HELD}
            iteration = held["iteration"]
            files.hold(run_of[iteration], {"cell": np.arange(at, at + count), "at": np.full(count, place), **held})
            if count:
                least, most = min(least, held["duration_ns"].min()), max(most, held["duration_ns"].max())
            arrived = numpy_of(pc.is_valid(rows.column("arrival_ns")))
            it = iteration[arrived]  # once per rank each
            first_arrival[it] = np.minimum(first_arrival[it], numpy_of(rows.column("arrival_ns"))[arrived] + offset)
            at += count
        files.flush()
    except BaseException:
        files.close()
        raise
    return Cells(np.array([r["rank"] for r in per_rank], np.int64), counts, offsets,
                 [r["iterations"] for r in per_rank], stage, width, files, first_arrival, (least, most))


def cell_frame(cells: Cells) -> pd.DataFrame:
    """Every cell's rank, iteration, stage, start on aligned clocks, duration and busy time in one frame: what a job's
    pipeline stages are compared with (microbatches.py, peers.stage_imbalance), read a rank's table at a time."""
    parts = []
    for at in range(len(cells.ranks)):
        rows = cells.rank_table(at, ["iteration", "start_ns", "duration_ns", "busy_ns"])
        parts.append({"iteration": numpy_of(rows.column("iteration")),
                      "start_aligned_ns": numpy_of(rows.column("start_ns")) + cells.offsets[at],
                      "duration_ns": numpy_of(rows.column("duration_ns")),
                      "busy_ns": numpy_of(rows.column("busy_ns"))})
    joined = {c: np.concatenate([p[c] for p in parts]) if parts else np.zeros(0, np.int64) for c in
              ("iteration", "start_aligned_ns", "duration_ns", "busy_ns")}
    return pd.DataFrame({"rank": np.repeat(cells.ranks, cells.counts), "iteration": joined["iteration"],
                         "stage": np.repeat(cells.stage, cells.counts), **{c: joined[c] for c in
                                                                           ("start_aligned_ns", "duration_ns",
                                                                            "busy_ns")}})


def warmup_iterations(cells: Cells, median: float) -> np.ndarray:
    """Per iteration, whether it is warm-up on any rank (iterations.warmup, given the run's median iteration), a rank's
    table at a time."""
    is_warmup = np.zeros(len(cells.first_arrival_ns), bool)
    for at, count in enumerate(cells.counts.tolist()):
        rows = cells.rank_table(at, ["iteration", "duration_ns"])
        iteration = numpy_of(rows.column("iteration"))
        is_warmup[iteration[warmup(np.zeros(count, np.int64), iteration, numpy_of(rows.column("duration_ns")),
                                   median)]] = True
    return is_warmup


def rank_scores(cells: Cells, median_busy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of each rank with cells, the median and the greatest score of its cells (busy time over its cohort's median, 1
    where that is 0), a rank's table at a time."""
    median, worst = [], []
    for at, count in enumerate(cells.counts.tolist()):
        if count:
            rows = cells.rank_table(at, ["iteration", "busy_ns"])
            cohort = numpy_of(rows.column("iteration")) * cells.width + cells.stage[at]
            score = _score(numpy_of(rows.column("busy_ns")), median_busy[cohort])
            median.append(np.median(score))
            worst.append(score.max())
    return np.array(median, np.float64), np.array(worst, np.float64)


def _score(busy: np.ndarray, median: np.ndarray) -> np.ndarray:
    """Busy time over the cohort's median busy time (1 where that is 0)."""
    return np.where(median > 0, busy / np.where(median > 0, median, 1), 1.0)


def group_medians(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Each group's median of `values` (group codes 0 to n_groups - 1; NaN for a group without values), as pandas'
    groupby median gives it: the mean of the middle two of an even count."""
    in_order = sorted_in_groups(group, values, groups=False)[1]
    size = np.bincount(group, minlength=n_groups)
    first = np.cumsum(size) - size
    out = np.full(n_groups, np.nan)
    has = np.flatnonzero(size)
    low, high = first[has] + (size[has] - 1) // 2, first[has] + size[has] // 2
    out[has] = (in_order[low] + in_order[high]) / 2
    return out


@functools.cache
def cell_schema(with_stage: bool) -> pa.Schema:
    """iterations.parquet's columns and the pandas dtypes they read back as."""
    return output_schema({**OUTPUT_DTYPES, **({"stage": "int64"} if with_stage else {}),
                          "recoverable_ns": "int64"})


OUTPUT_DTYPES = {"rank": "int64", "iteration": "int64", "start_ns": "int64", "start_aligned_ns": "int64",
                 "duration_ns": "int64", "wait_ns": "int64", "busy_ns": "int64", "gpu_busy_ns": "Int64",
                 "arrival_skew_ns": "Int64", "score": "float64", "is_straggler": "bool", "cause": "object",
                 "cause_side": "object", "excess_ns": "int64", "noise_z": "float64", "is_warmup": "bool"}


@dataclass
class Verdicts:
    """What the reduce found over the whole run, from which a rank's output rows are made: per cohort code the
    median busy time, per iteration whether it is warm-up, the busy noise scale, per cell its cause (a code into
    cause_names, len(cause_names) for none, and whether on the GPU), the flagged cells and their recoverable time,
    each rank's stage (None: the job has no pipeline)."""

    cohort_width: int
    median_busy_ns: np.ndarray
    is_warmup: np.ndarray
    busy_scale: float
    cause: np.ndarray
    cause_names: pa.Array
    cause_on_gpu: np.ndarray
    flagged: np.ndarray  # the flagged cells, in order
    recoverable_ns: np.ndarray  # of each flagged cell
    stage: np.ndarray | None


def rank_rows(cells: Cells, found: Verdicts, at: int) -> pa.Table:
    """The rows of iterations.parquet of the rank at place `at` among the ranks, without the rank column."""
    low, high = int(cells.first[at]), int(cells.first[at] + cells.counts[at])
    rows = cells.rank_table(at, [*HELD, "start_ns", "gpu_busy_ns", "arrival_ns"])
    iteration, busy = numpy_of(rows.column("iteration")), numpy_of(rows.column("busy_ns"))
    start = numpy_of(rows.column("start_ns"))
    stage = 0 if found.stage is None else int(found.stage[at])
    median = found.median_busy_ns[iteration * found.cohort_width + stage]
    excess = np.round(busy - median).astype(np.int64)
    arrived = numpy_of(pc.is_valid(rows.column("arrival_ns")))
    skew = numpy_of(rows.column("arrival_ns")) + cells.offsets[at] - cells.first_arrival_ns[iteration]
    code = found.cause[low:high]
    named = code < len(found.cause_names)
    code = np.where(named, code, 0).astype(np.int32)
    side = found.cause_on_gpu[code].astype(np.int32) if len(found.cause_names) else code
    recoverable, is_straggler = np.zeros(high - low, np.int64), np.zeros(high - low, bool)
    mine = slice(*np.searchsorted(found.flagged, [low, high]))
    recoverable[found.flagged[mine] - low] = found.recoverable_ns[mine]
    is_straggler[found.flagged[mine] - low] = True
    columns = {
        "iteration": arrow_of(iteration), "start_ns": rows.column("start_ns"),
        "start_aligned_ns": arrow_of(start + cells.offsets[at]), "duration_ns": rows.column("duration_ns"),
        "wait_ns": rows.column("wait_ns"), "busy_ns": rows.column("busy_ns"),
        "gpu_busy_ns": rows.column("gpu_busy_ns"),
        "arrival_skew_ns": arrow_of(np.where(arrived, skew, 0), valid=arrived),
        "score": arrow_of(_score(busy, median)),
        "is_straggler": arrow_of(is_straggler),
        "cause": _coded(code, named, found.cause_names),
        "cause_side": _coded(side, named, _sides()),
        "excess_ns": arrow_of(excess), "noise_z": arrow_of(excess / found.busy_scale),
        "is_warmup": arrow_of(found.is_warmup[iteration]),
        **({} if found.stage is None else {"stage": arrow_of(np.full(high - low, stage, np.int64))}),
        "recoverable_ns": arrow_of(recoverable),
    }
    schema = cell_schema(found.stage is not None)
    return pa.table({c: columns[c].cast(schema.field(c).type) for c in columns})


@functools.cache
def _sides() -> pa.Array:
    """cause_side's words (made on first use: a map never imports pandas, which pa.array of a list would)."""
    return pa.array(["host", "gpu"])


def _coded(code: np.ndarray, valid: np.ndarray, words: pa.Array) -> pa.Array:
    """Text as codes into `words`, null where not valid."""
    if not valid.any():
        return pa.nulls(len(code), pa.string())
    return pa.DictionaryArray.from_arrays(arrow_of(code, valid=valid), words)
