"""Iteration delimiters and sync points, shared by every recipe."""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .errors import BadInputError, MissingTraceError
from .groups import one_of, picked
from .inputs.batches import RANGE_EVENTS
from .inputs.frames import arrow_of, dictionary_column
from .lazy import pd

MIN_REPEATS = 5
NO_ITERATIONS = "cannot find iterations"  # how the error of a rank where nothing repeats begins
DEFAULT_SYNC_RE = re.compile(r"allreduce|all_reduce|allgather|all_gather|reduce_scatter|reducescatter|barrier",
                             re.IGNORECASE)
NCCL_KERNEL_RE = re.compile(r"^(?:ncclKernel|ncclDevKernel)")
NCCL_API_RE = re.compile(r"^nccl[A-Z]")


@dataclass(frozen=True)
class Delimiter:
    kind: str  # "nvtx" or "kernel"
    name: str
    domain: str | None
    source: str  # "--iteration", "--iteration-kernel" or "auto"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "domain": self.domain, "source": self.source}


@dataclass
class Iterations:
    delimiter: Delimiter
    start_ns: np.ndarray
    end_ns: np.ndarray
    tid: int | None  # thread of the NVTX delimiter

    def of(self, t: np.ndarray) -> np.ndarray:
        """The iteration each instant lies in (from its start, before its end), -1 for none."""
        at = np.searchsorted(self.start_ns, t, side="right") - 1
        return np.where((at >= 0) & (t < self.end_ns[np.maximum(at, 0)]), at, -1)


def closed_ranges(nvtx: pd.DataFrame | None) -> pd.DataFrame:
    if nvtx is None or nvtx.empty:
        return pd.DataFrame(columns=["start_ns", "end_ns", "name", "domain", "tid", "pid"])
    r = nvtx[nvtx["event_type"].isin([59, 60]) & nvtx["end_ns"].notna()]
    r = r[r["end_ns"] >= r["start_ns"]].copy()
    r["end_ns"] = r["end_ns"].astype("int64")
    return r


def closed_range_mask(nvtx) -> np.ndarray:
    """Which rows of an inputs.Frame of NVTX events are the ranges `closed_ranges` keeps, without pandas."""
    start, end = nvtx.values("start_ns"), nvtx.values("end_ns")
    return one_of(nvtx.values("event_type"), RANGE_EVENTS) & ~nvtx.is_null("end_ns") & (end >= start)


def closed_range_view(need: str, frame) -> pa.Table:
    """A span's closed ranges (inputs.chunks: a Stream's view of NVTX events): times, thread, process, name and
    domain."""
    closed = picked(closed_range_mask(frame))
    columns = {c: arrow_of(frame.values(c)[closed]) for c in ("start_ns", "end_ns", "tid", "pid")}
    for c in ("name", "domain"):
        codes, words = frame.codes(c)
        columns[c] = dictionary_column(codes[closed], words[:-1])
    return pa.table(columns)


def parse_name_domain(text: str) -> tuple[str, str | None]:
    name, sep, domain = text.rpartition("@")
    return (name, domain) if sep and name else (text, None)


def closest_names(wanted: str, names, n: int = 5) -> str:
    pool = sorted({str(x) for x in names if str(x)})
    close = difflib.get_close_matches(wanted, pool, n=n, cutoff=0.3) or pool[:n]
    return ", ".join(repr(c) for c in close) if close else "none"


@dataclass
class Ranges:
    """A rank's closed NVTX ranges as arrays, in the NVTX table's order; names and domains as codes into
    their few distinct words (-1: none)."""
    start_ns: np.ndarray
    end_ns: np.ndarray
    tid: np.ndarray
    name: np.ndarray
    domain: np.ndarray
    names: np.ndarray
    domains: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)

    def domain_is(self, wanted: str) -> np.ndarray:
        """Where the ranges' domain is the string `wanted`."""
        return np.isin(self.domain, np.flatnonzero(self.domains[:-1] == wanted))


def range_arrays(nvtx) -> Ranges:
    """The closed ranges (`closed_range_mask`) of an inputs.Frame of NVTX events, or of none."""
    if nvtx is None or not len(nvtx):
        empty, none = np.zeros(0, np.int64), np.array([None], object)
        return Ranges(empty, empty, empty, empty, empty, none, none)
    closed = closed_range_mask(nvtx)
    name, names = nvtx.codes("name")
    domain, domains = nvtx.codes("domain")
    columns = [nvtx.values("start_ns"), nvtx.values("end_ns"), nvtx.values("tid"), name, domain]
    if not closed.all():  # else every row, as the ranges a long capture's spans hand over (iteration_slices)
        columns = [c[closed] for c in columns]
    return Ranges(*columns, names, domains)


def most_common(values: np.ndarray, counts: np.ndarray | None = None, first: np.ndarray | None = None):
    """The value pandas' value_counts() lists first: the most frequent, ties going to the first seen. counts, first:
    each entry of `values` stands for that many rows, the first at that position (the tallies of iteration_scan)."""
    distinct, at = np.unique(values, return_inverse=True)
    at = at.reshape(-1)
    total = np.bincount(at, counts, len(distinct))
    seen = np.full(len(distinct), np.iinfo(np.int64).max)
    np.minimum.at(seen, at, np.arange(len(at)) if first is None else first)
    top = np.flatnonzero(total == total.max())
    return distinct[top[np.argmin(seen[top])]]


def kernel_windows(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Iterations from one kernel's launches (in table order): each from a launch to the next, the last as long as
    the median period, or to its kernel's end if that is later."""
    order = np.argsort(start, kind="stable")
    starts = start[order].astype(np.int64)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    period = int(np.median(np.diff(starts))) if len(starts) > 1 else 0
    ends[-1] = max(int(end[order][-1]), starts[-1] + period)
    return starts, ends


def no_range_text(iteration: str, names) -> str:
    """The error for --iteration naming no closed range of the rank (names: those of its closed ranges)."""
    return f"no NVTX range named {iteration!r}; closest names: {closest_names(parse_name_domain(iteration)[0], names)}"


def no_kernel_text(name: str, names) -> str:
    """The error for a delimiting kernel that no kernel of the rank is (names: its kernels' names; none: no kernel)."""
    if not len(names):
        return ("--iteration-kernel needs CUDA kernels and this report has none; profile with `nsys profile -t cuda` "
                "(add cuda to the -t list) or use --iteration")
    return f"no kernel named {name!r}; closest names: {closest_names(name, names)}"


def no_iterations_text(has_ranges: bool, has_kernels: bool) -> str:
    """The error for a rank where no NVTX range or kernel repeats enough to delimit iterations."""
    what = ("has no NVTX ranges or CUDA kernels (profile with `nsys profile -t cuda,nvtx`)"
            if not has_ranges and not has_kernels else "has no NVTX range or kernel that repeats at least 5 times")
    return (f"{NO_ITERATIONS}: the report {what}; or pass --iteration NAME (an NVTX range) or "
            "--iteration-kernel NAME")


def iteration_error(file: str, text: str) -> BadInputError:
    """The error of a rank whose iterations were not found, from its text: where nothing repeats, the rank has
    nothing to say (MissingTraceError: the run fails only if every rank is so); where the options named a delimiter
    that is not there, the input is bad."""
    return (MissingTraceError if text.startswith(NO_ITERATIONS) else BadInputError)(f"{file}: {text}")


def matching(words: np.ndarray, pattern) -> np.ndarray:
    """Whether each of a column's distinct words (the last one None) matches a regex, to index by code (read-only)."""
    return _matching(pattern, tuple(words))


@functools.lru_cache(maxsize=32)
def _matching(pattern, words: tuple) -> np.ndarray:
    """A long capture's map asks again for each span with the same words: searched once."""
    search = re.compile(pattern).search  # once, not once a word
    out = np.array([w is not None and search(str(w)) is not None for w in words], bool)
    out.flags.writeable = False
    return out


SYNC_SOURCES = ("collective NVTX range", "NCCL kernel", "MPI call", "CUDA sync call")
PEER_SOURCES = 3  # the first three are where ranks meet; a CUDA sync waits for the rank's own GPU and NCCL
HOST_SYNC_API_RE = r"Synchronize"  # device, stream and event syncs: the host blocks until the GPU gets there


@dataclass
class SyncPoints:
    """Where a rank may sit waiting: intervals in time order of start, each with its source (an index into
    SYNC_SOURCES). NCCL kernels are on the GPU's timeline, the others on the host's."""
    start_ns: np.ndarray
    end_ns: np.ndarray
    source: np.ndarray

    @property
    def on_gpu(self) -> np.ndarray:
        return self.source == SYNC_SOURCES.index("NCCL kernel")

    @property
    def peer(self) -> np.ndarray:
        return self.source < PEER_SOURCES


def sync_points(rank_data, ranges: Ranges, sync_names: list[str] | None = None) -> SyncPoints:
    """Collectives and sync points of a rank: NVTX ranges of the NCCL domain or with collective names (and
    `sync_names`), NCCL kernels, MPI calls, and CUDA runtime calls that block the host on the GPU."""
    parts = []
    if len(ranges):
        is_sync = matching(ranges.names, DEFAULT_SYNC_RE)[ranges.name] | ranges.domain_is("NCCL")
        if sync_names:
            is_sync |= np.isin(ranges.names, list(sync_names))[ranges.name]
        parts.append((ranges.start_ns[is_sync], ranges.end_ns[is_sync], 0))
    k = rank_data.frame("kernels")
    if k is not None and len(k):
        codes, words = k.codes("name")
        nccl = matching(words, NCCL_KERNEL_RE)[codes]
        parts.append((k.values("start_ns")[nccl], k.values("end_ns")[nccl], 1))
    mpi = rank_data.frame("mpi")
    if mpi is not None and len(mpi):
        parts.append((mpi.values("start_ns"), mpi.values("end_ns"), 2))
    runtime = rank_data.frame("runtime")
    if runtime is not None and len(runtime):
        codes, words = runtime.codes("name")
        blocking = matching(words, HOST_SYNC_API_RE)[codes]
        parts.append((runtime.values("start_ns")[blocking], runtime.values("end_ns")[blocking], 3))
    if not parts:
        empty = np.zeros(0, np.int64)
        return SyncPoints(empty, empty, empty)
    start = np.concatenate([p[0] for p in parts]).astype(np.int64)
    end = np.concatenate([p[1] for p in parts]).astype(np.int64)
    source = np.concatenate([np.full(len(p[0]), p[2], np.int64) for p in parts])
    order = np.argsort(start, kind="stable")
    return SyncPoints(start[order], end[order], source[order])


WARMUP_FACTOR = 2.0  # a leading iteration longer than this many times the run's median iteration is warm-up
WARMUP_RULE = (f"on each rank, the iterations from its first on that each last more than {WARMUP_FACTOR:g} x the "
               "median iteration of the run (all ranks); the first shorter one ends them")


def warmup(rank: np.ndarray, iteration: np.ndarray, duration: np.ndarray, median: float | None = None) -> np.ndarray:
    """Which rows are warm-up iterations (WARMUP_RULE): CUDA context and library start-up, autotuning and first
    allocations make a job's first steps many times its usual one, and steadiness measured over them measures
    the start-up. median: the run's median iteration, where these rows are some ranks of it (theirs otherwise)."""
    n = len(duration)
    if not n:
        return np.zeros(0, bool)
    steady = duration <= WARMUP_FACTOR * (np.median(duration) if median is None else median)
    order = np.lexsort((iteration, rank))
    r, s = rank[order], steady[order].astype(np.int64)
    first = np.r_[True, r[1:] != r[:-1]]
    seen = np.cumsum(s)  # steady iterations so far, on the rank: from the run's start, less those of earlier ranks
    before = (seen - s)[first][np.cumsum(first) - 1]
    out = np.empty(n, bool)
    out[order] = (seen - before) == 0
    return out


def steady_rows(frame):
    """The rows of a table with an `is_warmup` column that are not warm-up; all of them where every one is."""
    steady = ~frame["is_warmup"]
    return frame[steady] if steady.any() else frame


def warmup_option(add) -> None:
    """--keep-warmup, for the recipes that leave warm-up iterations out of their statistics."""
    add("--keep-warmup", action="store_true", default=False,
        help="count warm-up iterations in statistics and flags too (default: marked and left out; "
             "README.md, 'Warm-up iterations')")
