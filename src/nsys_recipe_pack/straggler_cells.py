"""straggler_heatmap's cells (rank x iteration) as the few NumPy columns its reduce compares, read from the maps'
tables a rank at a time, and written back out a rank at a time: what the output only shows (when an iteration
started, the GPU's busy time, the arrival skew, the score) is read again from the rank's table or worked out from
the run-wide results as the rank's rows are written, never held for every cell. Ten thousand ranks of a thousand
iterations are ten million cells: each column held is 80 MB."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .inputs import arrow_of, numpy_of
from .iterations import warmup
from .spill import output_schema, table_of
from .straggler_noise import sorted_in_groups

NONE = np.iinfo(np.int64).max  # an iteration where no rank arrived at a sync point
HELD = ("iteration", "duration_ns", "wait_ns", "busy_ns")


@dataclass
class Cells:
    """Every rank's cells in the output's order (by rank, then iteration): the ranks' numbers, clock offsets and
    tables (Arrow or spill.StoredTable), and per cell the columns the comparison needs (HELD)."""

    ranks: np.ndarray
    counts: np.ndarray  # cells per rank
    offsets: np.ndarray
    tables: list
    iteration: np.ndarray
    duration_ns: np.ndarray
    wait_ns: np.ndarray
    busy_ns: np.ndarray
    first_arrival_ns: np.ndarray  # per iteration: the earliest arrival of any rank, on aligned clocks (NONE: none)
    start_aligned_ns: np.ndarray | None  # per cell, where asked for
    first: np.ndarray = field(init=False)  # each rank's first cell

    def __post_init__(self):
        self.first = np.cumsum(self.counts) - self.counts


def read_cells(per_rank: list[dict], with_start: bool = False) -> Cells:
    """The cells of the maps' `iterations` tables (per_rank in rank order), one rank's table read at a time;
    with_start: each cell's start on aligned clocks too."""
    counts = np.array([len(r["iterations"]) for r in per_rank], np.int64)
    offsets = np.array([r["offset_ns"] for r in per_rank], np.int64)
    n = int(counts.sum())
    held = {c: np.empty(n, np.int64) for c in HELD}
    start = np.empty(n, np.int64) if with_start else None
    first_arrival = np.full(int(counts.max()) if len(counts) else 0, NONE, np.int64)
    at = 0
    for r, count, offset in zip(per_rank, counts.tolist(), offsets.tolist(), strict=True):
        rows = table_of(r["iterations"], [*HELD, "arrival_ns", *(["start_ns"] if with_start else [])])
        for c in HELD:
            held[c][at:at + count] = numpy_of(rows.column(c))
        if with_start:
            start[at:at + count] = numpy_of(rows.column("start_ns")) + offset
        iteration = held["iteration"][at:at + count]
        if len(iteration) and iteration.max() >= len(first_arrival):
            first_arrival = np.r_[first_arrival, np.full(int(iteration.max()) + 1 - len(first_arrival), NONE)]
        arrived = numpy_of(pc.is_valid(rows.column("arrival_ns")))
        it = iteration[arrived]  # once per rank each
        first_arrival[it] = np.minimum(first_arrival[it], numpy_of(rows.column("arrival_ns"))[arrived] + offset)
        at += count
    return Cells(np.array([r["rank"] for r in per_rank], np.int64), counts, offsets,
                 [r["iterations"] for r in per_rank], held["iteration"], held["duration_ns"], held["wait_ns"],
                 held["busy_ns"], first_arrival, start)


def warmup_iterations(cells: Cells) -> np.ndarray:
    """Per iteration, whether it is warm-up on any rank (iterations.warmup, given the run's median iteration, a
    rank at a time: over every cell at once it would sort them all and hold several columns of them)."""
    n_iterations = int(cells.iteration.max()) + 1 if len(cells.iteration) else 0
    is_warmup = np.zeros(n_iterations, bool)
    median = float(np.median(cells.duration_ns)) if len(cells.iteration) else 0.0
    for low, count in zip(cells.first.tolist(), cells.counts.tolist(), strict=True):
        iteration = cells.iteration[low:low + count]
        is_warmup[iteration[warmup(np.zeros(count, np.int64), iteration, cells.duration_ns[low:low + count],
                                   median)]] = True
    return is_warmup


def rank_scores(cells: Cells, median_busy: np.ndarray, cohort: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of each rank with cells, the median and the greatest score of its cells (busy time over its cohort's median, 1
    where that is 0), a rank at a time: no column of every cell's scores."""
    median, worst = [], []
    for low, count in zip(cells.first.tolist(), cells.counts.tolist(), strict=True):
        if count:
            score = _score(cells.busy_ns[low:low + count], median_busy[cohort[low:low + count]])
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
    median busy time, per iteration whether it is warm-up, the busy noise scale, per cell whether it is flagged and
    its cause (a code into cause_names, len(cause_names) for none, and whether on the GPU), the flagged cells'
    recoverable time, each rank's stage (None: the job has no pipeline)."""

    cohort_width: int
    median_busy_ns: np.ndarray
    is_warmup: np.ndarray
    busy_scale: float
    is_straggler: np.ndarray
    cause: np.ndarray
    cause_names: pa.Array
    cause_on_gpu: np.ndarray
    flagged: np.ndarray  # the flagged cells, in order
    recoverable_ns: np.ndarray  # of each flagged cell
    stage: np.ndarray | None


def rank_rows(cells: Cells, found: Verdicts, at: int) -> pa.Table:
    """The rows of iterations.parquet of the rank at place `at` among the ranks, without the rank column."""
    low, high = int(cells.first[at]), int(cells.first[at] + cells.counts[at])
    rows = table_of(cells.tables[at], ["start_ns", "gpu_busy_ns", "arrival_ns"])  # what the cells do not hold
    iteration, busy = cells.iteration[low:high], cells.busy_ns[low:high]
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
    recoverable = np.zeros(high - low, np.int64)
    mine = slice(*np.searchsorted(found.flagged, [low, high]))
    recoverable[found.flagged[mine] - low] = found.recoverable_ns[mine]
    columns = {
        "iteration": arrow_of(iteration), "start_ns": rows.column("start_ns"),
        "start_aligned_ns": arrow_of(start + cells.offsets[at]), "duration_ns": arrow_of(cells.duration_ns[low:high]),
        "wait_ns": arrow_of(cells.wait_ns[low:high]), "busy_ns": arrow_of(busy),
        "gpu_busy_ns": rows.column("gpu_busy_ns"),
        "arrival_skew_ns": arrow_of(np.where(arrived, skew, 0), valid=arrived),
        "score": arrow_of(_score(busy, median)),
        "is_straggler": arrow_of(found.is_straggler[low:high]),
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
