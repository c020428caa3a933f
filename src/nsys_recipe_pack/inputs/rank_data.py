"""One rank's data (`RankData`) as every recipe sees it, loaded from any input: the frames read, the ranks
split by process, the memory a rank needs checked first, and the loaded frames of a cached export kept for
warm runs."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..allocator import give_back_freed_memory
from ..errors import BadInputError, MissingTraceError
from ..groups import one_of
from ..lazy import pd
from .batches import NEED_FRAMES, RANGE_EVENTS, Extents
from .chunks import (
    END_OF_TIME,
    START_OF_TIME,
    STREAM_MIN_ROWS,
    Ahead,
    AheadRequests,
    Stream,
    first_read_label,
    time_chunks,
)
from .discovery import report_stem
from .events import (
    program_names,
    read_gpu,
    read_gpus,
    read_memory,
    read_mpi,
    read_nvtx,
    read_runtime,
    recorded_env,
    session_start,
)
from .export import open_source
from .frames import FRAME_NAMES, Frame, arrow_of, as_frame, numpy_of
from .loaded import loaded_dir, read_loaded, write_loaded
from .payloads import read_payloads
from .read_progress import ReadProgress, check_memory
from .readers import MEMORY_EVENTS, TABLES, ExportSource, StringTable, small_table, string_table, threads_pay

RANK_ENV_KEYS = ["RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"]
LOCAL_RANK_ENV_KEYS = ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                       "MV2_COMM_WORLD_LOCAL_RANK"]
HOST_ENV_KEYS = ["HOSTNAME", "SLURMD_NODENAME", "PMIX_HOSTNAME"]
NVTX_RANK_RE = re.compile(r"^\s*(?:MPI\s+)?rank\s*[:#_-]?\s*(\d+)\s*$", re.IGNORECASE)
FILE_RANK_RE = re.compile(r"(?:rank[_-]?|(?<=[_.-])r)(\d+)(?![0-9])", re.IGNORECASE)


TRACES = {  # what a recipe may need -> (description, the nsys profile -t value that records it)
    "nvtx": ("NVTX ranges", "nvtx"),
    "kernel": ("CUDA kernels", "cuda"),
    "runtime": ("CUDA runtime calls", "cuda"),
    "gpu": ("CUDA kernels, memcpy or memset", "cuda"),
}

class RankData:
    """One rank's events, with names resolved and times exactly as exported (ns).

    The event tables (`nvtx`, `kernels`, `memcpy`, `memset`, `runtime`, `sync`, `mpi`) are pandas frames
    built on first use; `frame(name)` gives the same table as a `Frame` without building one.
    """

    def __init__(self, file: str, pid: int | None, session_start_ns: int, env: dict | None = None,
                 rank_candidates: dict | None = None, host: str | None = None, local_rank: int | None = None,
                 has_cuda: bool = False, synthetic: bool = False, unclosed_ranges: int = 0,
                 read_from: str | None = None, extents: dict | None = None, read_note: str | None = None,
                 program: str | None = None, **tables):
        self.file = file  # the input as the user named it
        self.read_from = read_from or file  # what was read: the report, or the export beside it
        self.read_note = read_note  # why, where that is not what a user would expect (an export skipped)
        self.pid = pid
        self.program = program  # the process's name (PROCESSES), None where the export lacks it
        self.session_start_ns = session_start_ns  # TARGET_INFO_SESSION_START_TIME.utcEpochNs, 0 when absent
        self.env = env or {}
        self.rank_candidates = rank_candidates or {}  # source -> rank
        self.host = host
        self.local_rank = local_rank
        self.has_cuda = has_cuda
        self.synthetic = synthetic  # written by the pack's generator, not a profiler
        self.unclosed_ranges = unclosed_ranges  # NVTX ranges with no end: left out of every analysis
        # what the whole tables held where only some of their rows were read (inputs.batches.Extents.of)
        self.extents = extents or {}
        unknown = set(tables) - set(FRAME_NAMES)
        if unknown:
            raise TypeError(f"RankData takes no table {', '.join(sorted(unknown))}")
        self._tables: dict = dict(tables)  # name -> pd.DataFrame, Frame or None
        # the result of the recipe's stream where the driver read the rank's tables span by span (a long capture,
        # driver.fold_ranks), which driver.fold_rank gives; None: read whole
        self.streamed: dict | None = None

    def frame(self, name: str) -> Frame | None:
        t = self._tables.get(name)
        if t is not None and not isinstance(t, Frame):  # a pandas frame
            t = self._tables[name] = as_frame(t)
        return t

    def _pandas(self, name: str) -> pd.DataFrame | None:
        t = self._tables.get(name)
        if isinstance(t, Frame):
            t = self._tables[name] = t.to_pandas()
        return t

    def frame_for(self, need: str) -> Frame | None:
        """The frame of one need's table."""
        return self.frame(NEED_FRAMES[need][0] if need in NEED_FRAMES else need)

    nvtx = property(lambda self: self._pandas("nvtx"))
    kernels = property(lambda self: self._pandas("kernels"))
    memcpy = property(lambda self: self._pandas("memcpy"))
    memset = property(lambda self: self._pandas("memset"))
    runtime = property(lambda self: self._pandas("runtime"))
    sync = property(lambda self: self._pandas("sync"))
    mpi = property(lambda self: self._pandas("mpi"))

    def require(self, what: str, recipe: str) -> None:
        """Raise the one-line error naming the missing trace and the `nsys profile -t` value that records it."""
        desc, flag = TRACES.get(what, ("", ""))
        names = {"nvtx": ["nvtx"], "kernel": ["kernels"], "runtime": ["runtime"],
                 "gpu": ["kernels", "memcpy", "memset"], "memory": ["memory"]}[what]
        frames = [self.frame(n) for n in names]
        if any(n in self.extents for n in names):
            present = any(self.extents.get(n, (0,))[0] for n in names)
        elif what == "nvtx":
            present = frames[0] is not None and bool(one_of(frames[0].values("event_type"), RANGE_EVENTS).any())
        else:
            present = any(f is not None and len(f) for f in frames)
        if not present and what == "memory":
            raise MissingTraceError(
                f"{self.file}: {recipe} needs CUDA memory usage events ({MEMORY_EVENTS}) and this report has none; "
                "profile with `nsys profile --cuda-memory-usage=true` (`nsys-recipe profile` turns it on)")
        if not present and what == "nvtx":
            raise MissingTraceError(
                f"{self.file}: {recipe} needs NVTX ranges and this report has none: if the application marks its "
                "phases (torch.cuda.nvtx.range, nvtx.annotate, nvtxRangePush), profile with `nsys profile -t nvtx` "
                "(add nvtx to the -t list); if it marks none, add ranges around its phases, or use kernel_pace, "
                "sync_summary or compute_memory_share, which need none")
        if not present:
            raise MissingTraceError(f"{self.file}: {recipe} needs {desc} and this report has none; profile with "
                                    f"`nsys profile -t {flag}` (add {flag} to the -t list)")

    @property
    def gpu(self) -> int | None:
        """The device most of the rank's kernels ran on."""
        if "devices" in self.extents:
            counts = {d: n for d, n in self.extents["devices"].items() if d >= 0}
            return min(counts, key=lambda d: (-counts[d], d)) if counts else None
        k = self.frame("kernels")
        if k is None or not len(k):
            return None
        device = k.values("device", fill=-1)
        values, counts = np.unique(device[device >= 0], return_counts=True)
        return int(values[np.argmax(counts)]) if len(values) else None

    def extent(self, name: str) -> tuple[int, int, int]:
        """(rows, first start, last end) of one of the rank's event tables, all of it even where only some of
        its rows were read; (0, 0, 0) when it has none."""
        if name in self.extents:
            return tuple(self.extents[name])
        t = self.frame(name)
        if t is None or not len(t):
            return 0, 0, 0
        return len(t), int(t.values("start_ns").min()), int(t.values("end_ns").max())


class RankAhead(AheadRequests):
    """A rank read whole as a stream reads a long capture (`SpanRead`), in one span: what its `prepare` reads ahead
    (as from chunks.Ahead), each table in one part, and the span, every table whole. With a `pid`, its rows all of
    that process: a rank may hold rows of other processes (the one rank of a file, whose other processes do no GPU
    work), which a whole read counts as its own, their correlation ids left out so that their calls pair with none of
    its GPU work. Without, each row keeps its process."""

    def __init__(self, rank_data: RankData, pid: int | None, stream: Stream | None = None):
        self.rank_data, self.pid, self.stream = rank_data, pid, stream
        self.extents = self  # what a stream asks of the extents: the processes with rows in a table
        self.spill_dir = None
        self._requests()

    def ahead(self) -> RankAhead:
        return self

    def ahead_done(self) -> None:
        return None

    def chunks(self, given: dict) -> Iterator[tuple[int, int, dict]]:
        """The one span: every table the stream reads, and those `given` (AheadRequests.replay) as one part."""
        chunk = {need: self.span(need, self.stream.view) for need in self.stream.needs}
        for need, rows in given.items():
            parts = list(rows)
            chunk[need] = pa.concat_tables(parts) if parts else None
        yield START_OF_TIME, END_OF_TIME, chunk

    def names(self) -> list:
        nvtx = self.rank_data.frame("nvtx")
        return list(nvtx.codes("name")[1][:-1]) if nvtx is not None else []

    def writer(self, make: Callable) -> _OneSpanRows:
        return _OneSpanRows()

    def pids(self, attr: str) -> set[int]:
        frame = self.rank_data.frame(attr)
        if frame is None or not len(frame):
            return set()
        return {self.pid} if self.pid is not None else set(np.unique(frame.values("pid")).tolist())

    def frame(self, need: str) -> Frame | None:
        frame = self.rank_data.frame_for(need)
        if frame is None or "pid" not in frame or not len(frame) or self.pid is None:
            return frame
        pid = frame.values("pid")
        others = pid != self.pid
        if not others.any():
            return frame
        table = frame.table
        table = table.set_column(table.column_names.index("pid"), "pid",
                                 arrow_of(np.full(len(frame), self.pid, np.int64)))
        if "correlation_id" in frame:
            table = table.set_column(table.column_names.index("correlation_id"), "correlation_id",
                                     arrow_of(frame.values("correlation_id", fill=-1), valid=~others &
                                              ~frame.is_null("correlation_id")))
        return Frame(table, frame.dtypes)

    def span(self, need: str, view) -> pa.Table | None:
        """One need's rows as a span hands them over (`view`), in order of start."""
        frame = self.frame(need)
        if frame is None:
            return None
        rows = view(need, frame)
        start = numpy_of(rows.column("start_ns"))
        if np.any(start[1:] < start[:-1]):
            rows = rows.take(arrow_of(np.argsort(start, kind="stable")))
        return rows

    def spans(self, need: str, view, cols=None) -> Iterator[pa.Table]:
        rows = self.span(need, view)
        if rows is not None and rows.num_rows:
            yield rows

    def frames(self, need: str, cols=None) -> Iterator[Frame]:
        frame = self.frame(need)
        if frame is not None and len(frame):
            yield frame

    def whole(self, need: str, read) -> Frame | None:
        return self.frame(need)


class _OneSpanRows:
    """A rank read whole: its output is the rows its one fold finished (all of them: it is the last span)."""

    rows = None

    def write(self, rows) -> None:
        self.rows = rows

    def close(self, late):
        return self.rows


def _first_int(env: dict, keys: list[str]) -> tuple[int, str] | None:
    for key in keys:
        value = env.get(key, "").strip()
        if value.lstrip("-").isdigit():
            return int(value), key
    return None


def load_file(path: Path, needs: set[str], nsys_path: str | None = None,
              rows: dict[str, list[str]] | None = None, bytes_per_row: int | None = None) -> list[RankData]:
    """Read one input and split it into ranks (one per process that did GPU work, or NVTX work); see `Reading`."""
    with Reading(path, needs, nsys_path, rows, bytes_per_row) as reading:
        return reading.ranks()


class Reading:
    """One input opened for reading: `ranks()` reads the tables its needs name and splits them into ranks. For a long
    capture a caller may first read some tables span by span of time (`spans`), and then `ranks(after=...)` reads the
    rest whole: nothing here runs an analysis.

    rows: need -> names, for recipes that use only some rows (`kernel_pace --kernel`: one kernel's). An export
    is then read for those rows only; a report's export in the pack's cache is read whole once, as its loaded
    frames are kept for every later run. bytes_per_row: the recipe's peak memory per event row read (see
    `check_memory`). src: the input already opened (export.open_source). spill_dir: where the reads ahead of a long
    capture's spans keep what they hold beyond memory, and its long output is written (None: TMPDIR)."""

    def __init__(self, path: Path, needs: set[str], nsys_path: str | None = None,
                 rows: dict[str, list[str]] | None = None, bytes_per_row: int | None = None,
                 src: ExportSource | None = None, spill_dir: str | None = None):
        self.path, self.needs, self.bytes_per_row = Path(path), set(needs), bytes_per_row
        self.spill_dir = spill_dir
        self.src = src or open_source(self.path, self.needs, nsys_path)
        try:
            self.cache = loaded_dir(self.src, self.needs)
            self.loaded = read_loaded(self.cache) if self.cache is not None else None
        except BaseException:
            self.src.close()
            raise
        self.rows = rows if self.cache is None else None
        self._strings = None

    def __enter__(self) -> Reading:
        return self

    def __exit__(self, *exc) -> None:
        self.src.close()

    def long(self, stream: Stream) -> bool:
        """Whether a stream's tables are long enough to be read span by span (and not loaded whole already)."""
        wanted = set(stream.needs) | set(stream.ahead)
        return (self.loaded is None and wanted <= self.needs
                and sum(self.src.count(t) for need in wanted for t in TABLES[need]) >= STREAM_MIN_ROWS)

    def spans(self, stream: Stream) -> SpanRead:
        """Starts reading a stream's tables span by span of time (`SpanRead`); the tables it leaves are read whole by
        `ranks(after=...)` once its spans are through."""
        self._check_export()
        spans = list(stream.needs)
        ahead = [need for need in stream.ahead if need not in spans]  # read ahead only
        progress = self._progress(spans, ahead, stream.ahead)
        return SpanRead(self.src, self.strings, spans, ahead, stream, Extents(), {}, progress, self.spill_dir)

    @property
    def strings(self) -> StringTable:
        if self._strings is None:
            self._strings = string_table(self.src)
        return self._strings

    def ranks(self, after: SpanRead | None = None) -> list[RankData]:
        """The input's ranks; after: a read in spans gone through, whose tables are not read again."""
        if self.loaded is not None:
            frames, meta = self.loaded
        else:
            frames, meta = self.frames(after)
            if self.cache is not None and after is None and not self.src.exported_now:
                write_loaded(self.cache, frames, meta)
        return _split_ranks(self.path, frames, meta, read_from=self.src.origin, read_note=self.src.note)

    def _check_export(self) -> None:
        src = self.src
        if not (src.has("StringIds") or src.has("NVTX_EVENTS") or src.has("TARGET_INFO_SESSION_START_TIME")
                or src.origin != src.path):
            raise BadInputError(f"{self.path}: not an Nsight Systems export (no StringIds, NVTX_EVENTS or "
                                "TARGET_INFO_* tables); export the report with `nsys export`")

    def _whole(self, skipped: list[str]) -> list[str]:
        """The event tables read whole: those read for a few rows only hold little."""
        return [t for need in sorted(self.needs) if not (self.rows or {}).get(need) and need not in skipped
                for t in TABLES.get(need, {})]

    def _progress(self, spans: list[str], ahead: list[str], first_reads=()) -> ReadProgress:
        """The memory check of the tables read whole, and the progress of the whole read."""
        src = self.src
        counts = {t: src.count(t) for t in self._whole(spans + ahead)}
        check_memory(self.path, counts, bytes_per_row=self.bytes_per_row)
        batches = {t: src.count(t) for need in spans for t in TABLES[need]}
        first = {first_read_label(t): src.count(t) for need in first_reads for t in TABLES[need]}
        return ReadProgress(self.path, {**counts, **batches, **first})

    def frames(self, after: SpanRead | None = None) -> tuple[dict, dict]:
        """The normalised frames the needs name, and what identifies the file's ranks."""
        src, needs = self.src, self.needs
        spans, ahead = (after.spans, after.ahead_only) if after else ([], [])
        if after is None:
            self._check_export()
            done, extents, found = self._progress([], []), Extents(), {}
        else:
            done, extents, found = after.progress, after.extents, after.found
        strings = self.strings
        env, hostname = recorded_env(src)
        synthetic = "SYNTHETIC" in small_table(src, "META_DATA_EXPORT", ["name"]).get("name", [])
        frames: dict[str, Frame] = {}
        # the tables read whole, side by side: frame -> (table, its read)
        reads: dict[str, tuple[str | None, Callable[[], Frame]]] = {}
        # NVTX always: its "rank N" ranges are one of the sources of the rank (only those, when no recipe needs more)
        nvtx = found.get("nvtx")
        if nvtx is None:
            reads["nvtx"] = ("NVTX_EVENTS", functools.partial(read_nvtx, src, strings, "nvtx" not in needs))
        for need, attr in [("kernel", "kernels"), ("memcpy", "memcpy"), ("memset", "memset"), ("sync", "sync")]:
            if need in needs and need not in spans + ahead:
                (table, cols), = TABLES[need].items()
                reads[attr] = (table, functools.partial(_read_gpu_named, src, table, cols, strings,
                                                        (self.rows or {}).get(need)))
        if "runtime" in needs and "runtime" not in spans + ahead:
            reads["runtime"] = ("CUPTI_ACTIVITY_KIND_RUNTIME", functools.partial(read_runtime, src, strings))
        if "mpi" in needs and not spans:  # a stream that needs them reads them itself
            reads["mpi"] = (None, functools.partial(read_mpi, src, strings))
        if "memory" in needs and "memory" not in spans + ahead:
            reads["memory"] = (MEMORY_EVENTS, functools.partial(read_memory, src))
        if "memory" in needs:
            reads["gpus"] = (None, functools.partial(read_gpus, src))
        if "payload" in needs:  # NCCL's payloads: one event per NCCL call, read whole
            reads["payloads"] = (None, functools.partial(read_payloads, src, strings))
        frames.update(_side_by_side(reads, sum(src.count(t) for t in self._whole(spans + ahead)), done))
        nvtx = frames.pop("nvtx") if nvtx is None else nvtx
        if "nvtx" in needs:
            frames["nvtx"] = nvtx
        has_cuda = has_cuda_trace(src)
        gpu_pids: set[int] = set()
        if has_cuda:
            for attr in ("kernels", "memcpy"):
                if attr in extents.tables:
                    gpu_pids.update(extents.pids(attr))
                elif attr in frames:
                    gpu_pids.update(int(p) for p in np.unique(frames[attr].values("pid")))
            if not gpu_pids and "runtime" in extents.tables:
                gpu_pids.update(extents.pids("runtime"))
            elif not gpu_pids and "runtime" in frames:
                gpu_pids.update(int(p) for p in np.unique(frames["runtime"].values("pid")))
        if not gpu_pids and "nvtx" not in needs:  # the processes with NVTX ranges are the ranks: all ranges needed
            nvtx = read_nvtx(src, strings)
        if "nvtx" in extents.tables:
            range_pids = np.array(sorted(extents.pids("nvtx")), np.int64)
        else:
            range_pids = nvtx.values("pid")[one_of(nvtx.values("event_type"), RANGE_EVENTS)]
        pids = sorted(gpu_pids) if gpu_pids else sorted(int(p) for p in np.unique(range_pids))
        programs = program_names(src)
        meta = {"env": env, "hostname": hostname, "session_start_ns": session_start(src),
                "programs": {str(p): programs[str(p)] for p in pids if str(p) in programs},
                "synthetic": bool(synthetic), "has_cuda": bool(has_cuda), "pids": pids or [None],
                "nvtx_rank": _nvtx_ranks(nvtx, pids or [None]), "extents": extents.tables}
        return frames, meta


@dataclass
class SpanRead:
    """A long capture's tables read span by span of time (inputs.chunks): `ahead` gives what a stream reads before
    the spans, `chunks` the spans, `names` the NVTX names' dictionary once they are through. What they read of the
    rank's identity (extents, NVTX's ranges that name a rank) is kept for `Reading.ranks(after=...)`."""

    src: ExportSource
    strings: StringTable
    spans: list[str]  # the needs whose tables the spans read
    ahead_only: list[str]  # the needs read ahead only
    stream: Stream
    extents: Extents
    found: dict
    progress: ReadProgress
    spill_dir: str | None = None

    def ahead(self) -> Ahead:
        return Ahead(self.src, self.strings, self.extents, self.found, self.progress.add, self.progress.expect,
                     self.stream, self.spill_dir)

    def ahead_done(self) -> None:
        give_back_freed_memory()  # what the reads ahead let go, before the spans

    def chunks(self, given: dict) -> Iterator[tuple[int, int, dict]]:
        """time_chunks over the spans' tables and those `given` (AheadRequests.replay)."""
        return time_chunks(self.src, self.spans + list(given), self.strings, self.stream.view, self.extents,
                           self.progress.add, self.found, self.stream.needs, given)

    def names(self) -> list:
        return self.found.get("names", [])

    def writer(self, make: Callable):
        return make(self.spill_dir)


CUDA_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
               "CUPTI_ACTIVITY_KIND_RUNTIME")


def has_cuda_trace(src: ExportSource) -> bool:
    """Whether the export holds a CUDA trace (a rank's `has_cuda`)."""
    return any(src.has(t) for t in CUDA_TABLES)


def _read_gpu_named(src: ExportSource, table: str, cols: list[str], strings, names: list | None) -> Frame:
    """A GPU table, only the kernels of these names when some are given (all of them when it has none of those,
    for an error naming the closest)."""
    where = [("shortName", strings.ids_of(names))] if names and "shortName" in cols else None
    frame = read_gpu(src, table, cols, strings, where)
    return read_gpu(src, table, cols, strings) if where is not None and not len(frame) else frame


def _side_by_side(reads: dict, rows: int, done: Callable[[str], None]) -> dict[str, Frame]:
    """Whole tables read at once, a thread each: the readers let go of Python while they read (kernel_pace --kernel
    reads its kernels while SQLite looks for the ranges naming the rank). rows: what the tables hold; a few are read
    one after another (readers.threads_pay)."""
    out = {}

    def finished(name: str, frame: Frame) -> None:
        out[name] = frame
        if reads[name][0]:
            done(reads[name][0])

    if len(reads) <= 1 or READ_THREADS <= 1 or not threads_pay(rows):
        for name, (_, read) in reads.items():
            finished(name, read())
        return out
    with ThreadPoolExecutor(min(len(reads), READ_THREADS)) as pool:
        futures = {pool.submit(read): name for name, (_, read) in reads.items()}
        for future in as_completed(futures):
            finished(futures[future], future.result())
    return out


READ_THREADS = min(4, os.cpu_count() or 1)


def _nvtx_ranks(nvtx: Frame, pids: list) -> dict[str, int | None]:
    """The rank each process's NVTX names give ("rank 3", "MPI Rank 3"), None unless they all agree."""
    codes, words = nvtx.codes("name")
    said = np.array([_rank_in_name(w) for w in words], object)[codes]  # the rank a name gives, as text
    pid = nvtx.values("pid")
    out = {}
    for p in pids:
        hits = said[np.not_equal(said, None) & (True if p is None else pid == p)]
        out[str(p)] = int(hits[0]) if len(hits) and len(set(hits)) == 1 else None
    return out


def _rank_in_name(name) -> str | None:
    if not isinstance(name, str) or "RANK" not in name.upper():
        return None
    m = NVTX_RANK_RE.search(name)
    return m.group(1) if m else None


def _split_ranks(path: Path, frames: dict, meta: dict, read_from: Path | None = None,
                 read_note: str | None = None) -> list[RankData]:
    pids, env = meta["pids"], meta["env"]
    file_rank = None
    m = FILE_RANK_RE.search(report_stem(path))
    if m:
        file_rank = int(m.group(1))
    host = meta.get("hostname") or next((env[k] for k in HOST_ENV_KEYS if env.get(k)), None)
    local = _first_int(env, LOCAL_RANK_ENV_KEYS)
    env_rank = _first_int(env, RANK_ENV_KEYS)

    ranks = []
    for pid in pids:
        cands: dict = {}
        if env_rank is not None and len(pids) == 1:
            cands["env"] = env_rank
        if meta["nvtx_rank"].get(str(pid)) is not None:
            cands["nvtx"] = (meta["nvtx_rank"][str(pid)], "NVTX")
        if file_rank is not None and len(pids) == 1:
            cands["filename"] = (file_rank, "file name")
        extents = Extents(meta.get("extents")).of(pid if len(pids) > 1 else None)
        rank_data = RankData(file=str(path), pid=pid, session_start_ns=meta["session_start_ns"], env=env,
                      rank_candidates=cands, host=host, local_rank=local[0] if local and len(pids) == 1 else None,
                      has_cuda=meta["has_cuda"], synthetic=meta["synthetic"],
                      read_from=str(read_from) if read_from is not None else None, extents=extents,
                      read_note=read_note, program=meta.get("programs", {}).get(str(pid)))
        for attr, frame in frames.items():
            if pid is not None and len(pids) > 1 and "pid" in frame:
                frame = frame.filter(frame.values("pid") == pid)
            rank_data._tables[attr] = frame
        nvtx = rank_data.frame("nvtx")
        if nvtx is not None and len(nvtx):
            ranges = one_of(nvtx.values("event_type"), RANGE_EVENTS)
            rank_data.unclosed_ranges = int((ranges & nvtx.is_null("end_ns")).sum())
        ranks.append(rank_data)
    return ranks
