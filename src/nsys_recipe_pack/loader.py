"""Load one rank: find the inputs, export a report when needed (cached), read only the needed columns.

Every recipe sees the same normalised frames (`RankData`) whatever the input was: a `.nsys-rep` or
`.qdrep` (exported through nsys to Parquet, cached by the report's name, size, mtime and the nsys
version), an `nsys export --type sqlite` file, or an `nsys export --type parquetdir` folder. A report with
a complete export beside it (`X.sqlite`, `X_pqtdir/`, `X.parquetdir/` next to `X.nsys-rep`) is read from
that export: no nsys is needed, and a report newer than the nsys found can still be used.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from . import nsys_tool, versions
from .errors import BadInputError, MissingTraceError, PackError, UsageError
from .lazy import pd

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
EXPORT_DIR_SUFFIXES = ("_pqtdir", ".parquetdir")
# the exports looked for beside a report X.nsys-rep, in the order preferred (Parquet reads fastest)
EXPORTS_BESIDE = (*EXPORT_DIR_SUFFIXES, ".sqlite")
PID_SHIFT = 24
PID_MASK = 0xFFFFFF

# What each kind of data needs from an export: table -> columns (only those are read).
TABLES = {
    "nvtx": {"NVTX_EVENTS": ["start", "end", "eventType", "text", "textId", "globalTid", "endGlobalTid",
                             "domainId"]},
    "kernel": {"CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "deviceId", "streamId", "correlationId",
                                              "globalPid", "shortName", "demangledName", "graphNodeId"]},
    "memcpy": {"CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "deviceId", "streamId", "correlationId",
                                              "globalPid", "bytes", "copyKind", "srcKind", "dstKind",
                                              "srcDeviceId", "dstDeviceId"]},
    "memset": {"CUPTI_ACTIVITY_KIND_MEMSET": ["start", "end", "deviceId", "streamId", "correlationId",
                                              "globalPid", "bytes", "memKind"]},
    "runtime": {"CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "end", "globalTid", "correlationId", "nameId"]},
    "sync": {"CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ["start", "end", "deviceId", "streamId", "correlationId",
                                                      "globalPid", "syncType"]},
}
# exported from every report: names, the clock, and the environment the rank is read from (a report made
# by nsys is never synthetic, so the generator's META_DATA_EXPORT label is not needed from it)
ALWAYS = ["StringIds", "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV"]
MPI_PREFIX = "MPI_"

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


FRAME_NAMES = ("nvtx", "kernels", "memcpy", "memset", "runtime", "sync", "mpi")


class Frame:
    """One normalised table kept as Arrow columns, strings dictionary-encoded; pandas only when asked for.

    The fast analyses read numeric columns as NumPy arrays and string columns as codes into their few
    distinct values, so a run over cached exports never makes a Python string per event.
    """

    def __init__(self, table: pa.Table, dtypes: dict[str, str]):
        self.table = table
        self.dtypes = dtypes  # column -> the pandas dtype the column has in to_pandas()
        self._memo: dict = {}  # analyses ask for the same columns several times

    def __len__(self) -> int:
        return self.table.num_rows

    def __contains__(self, column: str) -> bool:
        return column in self.dtypes

    def values(self, column: str, dtype=np.int64, fill=0) -> np.ndarray:
        """A numeric column as a read-only NumPy array, nulls replaced by `fill`."""
        key = ("values", column, np.dtype(dtype), fill)
        if key not in self._memo:
            out = numpy_of(self.table.column(column), fill).astype(dtype, copy=False)
            out.flags.writeable = False
            self._memo[key] = out
        return self._memo[key]

    def is_null(self, column: str) -> np.ndarray:
        col = self.table.column(column)
        if not col.null_count:
            return np.zeros(len(self), bool)
        return ~_concat([_valid(c) for c in col.chunks], bool)

    def codes(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """A string column as read-only (codes, words): words[codes] is the column; the last word is None
        (code -1)."""
        key = ("codes", column)
        if key not in self._memo:
            col = self.table.column(column)
            if not pa.types.is_dictionary(col.type):  # a damaged export's names that are not strings
                col = col.cast(pa.string()).dictionary_encode()
            col = col.combine_chunks()
            words = np.array([*col.dictionary.to_pylist(), None], object)
            codes = numpy_of(col.indices, -1).astype(np.int64, copy=False)
            codes.flags.writeable = words.flags.writeable = False
            self._memo[key] = codes, words
        return self._memo[key]

    def filter(self, mask: np.ndarray) -> Frame:
        return Frame(self.table.filter(arrow_of(np.asarray(mask, bool))), self.dtypes)

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame({c: self._pandas_column(c, t) for c, t in self.dtypes.items()}, copy=False)

    def _pandas_column(self, column: str, dtype: str):
        """A column back to exactly the pandas dtype it was written from, without pandas' generic conversion."""
        if dtype in ("object", "str"):  # dictionary-encoded: index the few distinct strings, no new string per row
            codes, words = self.codes(column)
            return words[codes] if dtype == "object" else pd.array(words[codes], dtype="str")
        if dtype == "Int64":
            return pd.arrays.IntegerArray(numpy_of(self.table.column(column), 0).astype(np.int64), self.is_null(column))
        return self.table.column(column).combine_chunks().to_numpy(zero_copy_only=False).astype(dtype, copy=False)

    @classmethod
    def from_pandas(cls, df: pd.DataFrame) -> Frame:
        """Raises TypeError for a column whose dtype has no Arrow layout here."""
        cols = {c: _column_to_arrow(df[c]) for c in df.columns}
        return cls(pa.table({c: arr for c, (arr, _) in cols.items()}), {c: t for c, (_, t) in cols.items()})


def dictionary_column(codes: np.ndarray, words) -> pa.DictionaryArray:
    """Codes into a list of strings (-1 = null) as an Arrow dictionary column: per-event results keep
    their names as codes from the workers to the Parquet file."""
    words = list(words)
    if any(not isinstance(w, str) for w in words):
        dictionary = pa.array(words, pa.large_string())
    else:
        data = [w.encode() for w in words]
        offsets = np.zeros(len(data) + 1, np.int64)
        np.cumsum([len(d) for d in data], out=offsets[1:])
        dictionary = pa.Array.from_buffers(pa.large_string(), len(data),
                                           [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])
    return pa.DictionaryArray.from_arrays(arrow_of(codes.astype(np.int32), valid=codes >= 0), dictionary)


def sorted_place(words) -> np.ndarray:
    """Each word's position in sorted order. Codes into `words` mapped through it sort and group rows by
    their strings, as pandas does, rather than by the codes."""
    place = np.empty(len(words), np.int64)
    place[np.argsort(np.array(words, dtype=object), kind="stable")] = np.arange(len(words))
    return place


def ranked_tables(per_rank: list[dict], key: str) -> pa.Table:
    """The ranks' per-event Arrow tables `key` one after another, with a leading int64 `rank` column.

    Each rank names its strings with its own dictionary; they are unified into one, as the Parquet writer
    writes a column whose dictionary changes from chunk to chunk as plain strings."""
    return pa.concat_tables([r[key].add_column(0, "rank", arrow_of(np.full(r[key].num_rows, r["rank"], np.int64)))
                             for r in per_rank]).unify_dictionaries()


# Arrow <-> NumPy from the buffers. pyarrow's own to_numpy, pa.array and compute functions import pandas
# (about 0.3 s) even when no pandas object is involved; the per-rank analyses use these instead.
_NUMPY_TYPES = {pa.int64(): np.int64, pa.int32(): np.int32, pa.int16(): np.int16, pa.int8(): np.int8,
                pa.uint64(): np.uint64, pa.uint32(): np.uint32, pa.uint16(): np.uint16, pa.uint8(): np.uint8,
                pa.float64(): np.float64, pa.float32(): np.float32}


def numpy_of(col: pa.Array | pa.ChunkedArray, fill=0) -> np.ndarray:
    """A numeric or boolean Arrow column as NumPy (a view when it has one chunk and no nulls), nulls as
    `fill`."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    return _concat([_chunk_numpy(c, fill) for c in chunks], _NUMPY_TYPES.get(col.type, bool))


def _chunk_numpy(arr: pa.Array, fill) -> np.ndarray:
    n, at = len(arr), arr.offset
    if pa.types.is_boolean(arr.type):
        values = _bits(arr.buffers()[1], at, n)
    elif arr.type in _NUMPY_TYPES:
        dtype = np.dtype(_NUMPY_TYPES[arr.type])
        values = np.frombuffer(arr.buffers()[1], dtype, count=n, offset=at * dtype.itemsize) if n else \
            np.zeros(0, dtype)
    else:  # no plain NumPy layout
        return arr.fill_null(fill).to_numpy(zero_copy_only=False)
    return np.where(_valid(arr), values, fill) if arr.null_count else values


def _valid(arr: pa.Array) -> np.ndarray:
    validity = arr.buffers()[0]
    return np.ones(len(arr), bool) if validity is None else _bits(validity, arr.offset, len(arr))


def _bits(buf: pa.Buffer, at: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buf, np.uint8), count=at + n, bitorder="little")[at:].astype(bool)


def _concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype)


def arrow_of(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A NumPy numeric or boolean array as Arrow, numbers without a copy; `valid` False marks nulls."""
    validity = None
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if values.dtype == bool:
        bits = pa.py_buffer(np.packbits(values, bitorder="little"))
        return pa.Array.from_buffers(pa.bool_(), len(values), [validity, bits])
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [validity, pa.py_buffer(values)])


def as_frame(table: pd.DataFrame | Frame) -> Frame:
    """A table as a Frame; values of a damaged export that are not strings become text."""
    if isinstance(table, Frame):
        return table
    try:
        return Frame.from_pandas(table)
    except (TypeError, pa.ArrowException):
        return Frame.from_pandas(table.apply(lambda c: c.astype(str).where(c.notna(), None)
                                             if c.dtype == object else c))


class RankData:
    """One rank's events, with names resolved and times exactly as exported (ns).

    The event tables (`nvtx`, `kernels`, `memcpy`, `memset`, `runtime`, `sync`, `mpi`) are pandas frames
    built on first use; `frame(name)` gives the same table as a `Frame` without building one.
    """

    def __init__(self, file: str, pid: int | None, session_start_ns: int, env: dict | None = None,
                 rank_candidates: dict | None = None, host: str | None = None, local_rank: int | None = None,
                 has_cuda: bool = False, synthetic: bool = False, unclosed_ranges: int = 0,
                 read_from: str | None = None, **tables):
        self.file = file  # the input as the user named it
        self.read_from = read_from or file  # what was read: the report, or the export beside it
        self.pid = pid
        self.session_start_ns = session_start_ns  # TARGET_INFO_SESSION_START_TIME.utcEpochNs, 0 when absent
        self.env = env or {}
        self.rank_candidates = rank_candidates or {}  # source -> rank
        self.host = host
        self.local_rank = local_rank
        self.has_cuda = has_cuda
        self.synthetic = synthetic  # written by the pack's generator, not a profiler
        self.unclosed_ranges = unclosed_ranges  # NVTX ranges with no end: left out of every analysis
        unknown = set(tables) - set(FRAME_NAMES)
        if unknown:
            raise TypeError(f"RankData takes no table {', '.join(sorted(unknown))}")
        self._tables: dict = dict(tables)  # name -> pd.DataFrame, Frame or None

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

    nvtx = property(lambda self: self._pandas("nvtx"))
    kernels = property(lambda self: self._pandas("kernels"))
    memcpy = property(lambda self: self._pandas("memcpy"))
    memset = property(lambda self: self._pandas("memset"))
    runtime = property(lambda self: self._pandas("runtime"))
    sync = property(lambda self: self._pandas("sync"))
    mpi = property(lambda self: self._pandas("mpi"))

    def require(self, what: str, recipe: str) -> None:
        """Raise the one-line error naming the missing trace and the `nsys profile -t` value that records it."""
        desc, flag = TRACES[what]
        names = {"nvtx": ["nvtx"], "kernel": ["kernels"], "runtime": ["runtime"],
                 "gpu": ["kernels", "memcpy", "memset"]}[what]
        frames = [self.frame(n) for n in names]
        if what == "nvtx":
            present = frames[0] is not None and bool(np.isin(frames[0].values("event_type"), [59, 60]).any())
        else:
            present = any(f is not None and len(f) for f in frames)
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
        k = self.frame("kernels")
        if k is None or not len(k):
            return None
        device = k.values("device", fill=-1)
        values, counts = np.unique(device[device >= 0], return_counts=True)
        return int(values[np.argmax(counts)]) if len(values) else None


# ---------------------------------------------------------------------------------------------------
# inputs


def input_kind(path: Path) -> str | None:
    name = path.name
    if path.is_dir():
        if name.endswith(EXPORT_DIR_SUFFIXES) or (path / "StringIds.parquet").exists():
            return "parquetdir"
        return None
    if name.endswith(REPORT_SUFFIXES):
        return "report"
    if name.endswith(".sqlite"):
        return "sqlite"
    return None


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files, folders and globs -> the list of rank inputs, one per report. A report and its exports beside
    it (same name) count once, as the report: `open_source` decides which of them is read."""
    if not inputs:
        raise UsageError("no inputs given; pass report files, export files or folders holding them")
    found: list[Path] = []
    for raw in inputs:
        matches = [Path(p) for p in sorted(glob.glob(raw))] if glob.has_magic(raw) else [Path(raw)]
        if not matches:
            raise BadInputError(f"{raw}: no file matches this pattern")
        for p in matches:
            if not p.exists():
                raise BadInputError(f"{p}: no such file or folder")
            kind = input_kind(p)
            if kind is not None:
                found.append(p)
            elif p.is_dir():
                inner = [c for c in sorted(p.iterdir()) if input_kind(c) is not None]
                if not inner:
                    raise BadInputError(
                        f"{p}: folder holds no reports (.nsys-rep, .qdrep) or exports (.sqlite, *_pqtdir)"
                    )
                found.extend(inner)
            else:
                raise BadInputError(
                    f"{p}: not a report or export; expected .nsys-rep, .qdrep, .sqlite or a *_pqtdir folder"
                )
    by_stem: dict[tuple[Path, str], Path] = {}
    for p in found:
        stem = _stem(p)
        key = (p.parent.resolve(), stem)
        prev = by_stem.get(key)
        if prev is None or (input_kind(p) == "report" and input_kind(prev) != "report"):
            by_stem[key] = p
    unique = list(dict.fromkeys(by_stem.values()))
    return sorted(unique, key=lambda x: str(x))


def _stem(p: Path) -> str:
    name = p.name
    for suffix in (*REPORT_SUFFIXES, *EXPORTS_BESIDE):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


# ---------------------------------------------------------------------------------------------------
# export sources: one Arrow read path for SQLite and Parquet exports

# the few text columns the pack reads (NVTX_EVENTS.text, StringIds.value, the name/value rows of the TARGET_INFO
# and META_DATA tables); every other column it reads holds integers
TEXT_COLUMNS = {"NVTX_EVENTS": {"text"}, "StringIds": {"value"}, "TARGET_INFO_SYSTEM_ENV": {"name", "value"},
                "META_DATA_EXPORT": {"name", "value"}}
SQLITE_BATCH_ROWS = 65536


class ExportSource:
    """Read-only access to an export's tables as Arrow: only the columns (and rows) asked for, integers as int64
    and text as strings, the same whether the export is SQLite or Parquet."""

    def __init__(self, path: Path, kind: str, origin: Path | None = None):
        self.path = path
        self.kind = kind
        self.origin = origin or path
        self._tables: set[str] | None = None  # a Parquet folder's are listed on first use
        self._cols: dict[str, list[str]] = {}
        if kind == "sqlite":
            self._check_sqlite()
            self._db = _SqliteReader(path)
            self._tables = set(self._db.query("SELECT name FROM sqlite_master WHERE type='table'").column(0)
                               .to_pylist())

    def _check_sqlite(self) -> None:
        with open(self.path, "rb") as fh:
            head = fh.read(16)
        if not head:
            raise BadInputError(f"{self.path}: empty file; re-export it with `nsys export --type sqlite`")
        if head != b"SQLite format 3\x00":
            raise BadInputError(f"{self.path}: not an SQLite file; make it with `nsys export --type sqlite REPORT`")

    def close(self) -> None:
        if self.kind == "sqlite":
            self._db.close()

    @property
    def tables(self) -> set[str]:
        if self._tables is None:
            self._tables = {f.name[: -len(".parquet")] for f in self.path.glob("*.parquet")}
        return self._tables

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        if table not in self._cols:
            if self.kind == "sqlite":
                info = self._db.query(f"PRAGMA table_info({_quoted(table)})")
                self._cols[table] = [str(c) for c in info.column("name").to_pylist()] if info.num_columns else []
            else:
                self._cols[table] = list(pq.read_schema(self.path / f"{table}.parquet").names)
        return self._cols[table]

    def count(self, table: str) -> int:
        """Rows in a table (0 when absent), without reading them."""
        if not self.has(table):
            return 0
        if self.kind == "sqlite":
            return int(self._db.query(f"SELECT count(*) FROM {_quoted(table)}").column(0)[0].as_py())
        return pq.ParquetFile(self.path / f"{table}.parquet").metadata.num_rows

    def read_arrow(self, table: str, columns: list[str], where: list[tuple[str, object]] | None = None) -> pa.Table:
        """The asked-for columns the table has, in that order, integers as int64 and text as strings (nulls kept).

        `where`: only the rows that meet one of these (column, test), a test being integer values the column holds
        one of, or a word a text column contains in any case. Tests on columns the table lacks are left out, and
        with none left every row is read. An absent table reads as no columns and no rows."""
        if not self.has(table):
            return pa.table({})
        have = self.columns(table)
        cols = [c for c in dict.fromkeys(columns) if c in have]
        where = [(c, test) for c, test in where or [] if c in have] or None
        if not cols:
            return pa.table({})
        raw = self._read_sqlite(table, cols, where) if self.kind == "sqlite" else self._read_parquet(table, cols, where)
        text = TEXT_COLUMNS.get(table, set())
        return pa.table({c: _normalised(raw.column(c), c in text) for c in cols})

    def _read_sqlite(self, table: str, cols: list[str], where) -> pa.Table:
        text = TEXT_COLUMNS.get(table, set())
        condition = ""
        if where is not None:
            tests = []
            for column, test in where:
                if isinstance(test, str):
                    tests.append(f"{_quoted(column)} LIKE '%' || {_literal(test)} || '%'")
                else:
                    tests.append(f"{_quoted(column)} IN ({','.join(str(int(v)) for v in np.unique(test))})")
            condition = " WHERE " + " OR ".join(tests)

        def sql(guarded: bool) -> str:
            return (f"SELECT {', '.join(_sqlite_column(c, c in text, guarded) for c in cols)} "
                    f"FROM {_quoted(table)}{condition}")

        try:
            raw = self._db.query(sql(guarded=False))
        except _TypeMismatch:  # a damaged export: values of other types than the column's are read as nulls
            try:
                raw = self._db.query(sql(guarded=True))
            except _TypeMismatch as exc:
                raise BadInputError(f"{self.path}: table {table} cannot be read ({exc}); export the report again "
                                    "with `nsys export --type sqlite`") from None
        return pa.table({c: _unprefixed(raw.column(i)) if c in text else raw.column(i)
                         for i, c in enumerate(cols)})

    def _read_parquet(self, table: str, cols: list[str], where) -> pa.Table:
        file = pq.ParquetFile(self.path / f"{table}.parquet")
        if where is None:
            return file.read(columns=cols)
        parts = []  # a row group at a time, so only the matching rows are ever held
        for i in range(file.num_row_groups):
            group = file.read_row_group(i, columns=list(dict.fromkeys([*cols, *(c for c, _ in where)])))
            keep = np.zeros(group.num_rows, bool)
            for column, test in where:
                keep |= _meets(_normalised(group.column(column), column in TEXT_COLUMNS.get(table, ())), test)
            parts.append(group.select(cols).filter(arrow_of(keep)))
        return pa.concat_tables(parts) if parts else file.schema_arrow.empty_table().select(cols)


def _meets(col: pa.Array, test) -> np.ndarray:
    """Which values hold one of the integers `test`, or (text) contain the word `test` in any case."""
    if not isinstance(test, str):
        return np.isin(numpy_of(col, -1), np.asarray(test, np.int64))
    enc = col.dictionary_encode()
    word = test.lower()
    hit = np.array([word in w.lower() for w in enc.dictionary.to_pylist()], bool)
    codes = numpy_of(enc.indices, -1)
    return np.where(codes >= 0, np.r_[hit, False][codes], False)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _sqlite_column(column: str, text: bool, guarded: bool) -> str:
    """A column in a SELECT. Text gets a leading '.' and nulls become '': Arrow types a column by its first
    rows, and a text column often starts with nulls. Integers as they are; `guarded`, anything else as null."""
    q = _quoted(column)
    if text:
        return f"COALESCE('.' || {q}, '')"
    if guarded:
        return f"CASE typeof({q}) WHEN 'integer' THEN {q} WHEN 'real' THEN CAST({q} AS INTEGER) END"
    return q


def _unprefixed(col: pa.ChunkedArray) -> pa.Array:
    """A text column read with `_sqlite_column` back to its strings and nulls (work on its distinct values)."""
    enc = col.combine_chunks().cast(pa.string()).dictionary_encode()
    words = enc.dictionary.to_pylist()
    codes = numpy_of(enc.indices).astype(np.int32)
    valid = np.array([w != "" for w in words], bool)[codes] if len(codes) else np.zeros(0, bool)
    return pa.DictionaryArray.from_arrays(arrow_of(codes, valid=valid),
                                          pa.array([w[1:] for w in words], pa.string())).dictionary_decode()


def _normalised(col: pa.ChunkedArray | pa.Array, text: bool) -> pa.Array:
    """Text as strings, anything else as int64 (unsigned ids keep their bits, as the export's readers do;
    floats are truncated and NaN is null; values that are no number are null)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    kind = col.type
    if pa.types.is_dictionary(kind):
        col, kind = col.dictionary_decode(), kind.value_type
    if text:
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return col.cast(pa.string())
        return col.cast(pa.string()) if not pa.types.is_null(kind) else pa.nulls(len(col), pa.string())
    if kind == pa.int64():
        return col
    if pa.types.is_integer(kind):
        return col.cast(pa.int64(), safe=False)
    if pa.types.is_floating(kind):
        values = numpy_of(col, np.nan).astype(np.float64)
        ok = np.isfinite(values)
        return arrow_of(np.where(ok, values, 0).astype(np.int64), valid=ok)
    if pa.types.is_null(kind):
        return pa.nulls(len(col), pa.int64())
    if pa.types.is_boolean(kind):
        return arrow_of(numpy_of(col, False).astype(np.int64), valid=_valid_of(col))
    # text in a column of numbers: a damaged export (rare, so pandas may parse it)
    numbers = pd.to_numeric(pd.Series(col.to_pylist(), dtype=object), errors="coerce")
    ok = numbers.notna().to_numpy()
    return arrow_of(numbers.fillna(0).to_numpy().astype(np.int64), valid=ok)


def _valid_of(col: pa.Array) -> np.ndarray:
    return np.ones(len(col), bool) if not col.null_count else ~numpy_of(col.is_null(), False)


class _TypeMismatch(Exception):
    """A column holds values of another type than its first rows."""


class _SqliteReader:
    """SQLite to Arrow through ADBC's SQLite driver (C, no Python object per value), read-only."""

    def __init__(self, path: Path):
        import adbc_driver_manager
        import adbc_driver_sqlite

        self._adbc = adbc_driver_manager
        self.path = path
        try:
            self._db = adbc_driver_sqlite.connect(Path(path).resolve().as_uri() + "?mode=ro")
            self._conn = adbc_driver_manager.AdbcConnection(self._db)
        except adbc_driver_manager.Error as exc:
            raise BadInputError(f"{path}: cannot be opened as an SQLite export ({_first_line(exc)}); export the "
                                "report again with `nsys export --type sqlite`") from None

    def query(self, sql: str) -> pa.Table:
        stmt = self._adbc.AdbcStatement(self._conn)
        try:
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(SQLITE_BATCH_ROWS)})
            stmt.set_sql_query(sql)
            handle, _ = stmt.execute_query()
            return pa.RecordBatchReader._import_from_c(handle.address).read_all()
        except (self._adbc.Error, pa.ArrowException, OSError) as exc:
            if "type mismatch" in str(exc).lower():
                raise _TypeMismatch(str(exc)) from None
            raise BadInputError(f"{self.path}: cannot be read as an SQLite export ({_first_line(exc)}); export "
                                "the report again with `nsys export --type sqlite`") from None
        finally:
            stmt.close()

    def close(self) -> None:
        self._conn.close()
        self._db.close()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# ---------------------------------------------------------------------------------------------------
# export cache for reports


def _report_key(report: Path, nsys: nsys_tool.Nsys) -> str:
    st = report.stat()
    h = hashlib.sha1()
    h.update(f"{report.name}|{st.st_size}|{st.st_mtime_ns}|{nsys.version}".encode())
    with open(report, "rb") as fh:  # a little content, so two different reports never share a key
        h.update(fh.read(65536))
        if st.st_size > 65536:
            fh.seek(-65536, os.SEEK_END)
            h.update(fh.read(65536))
    return h.hexdigest()[:24]


def export_cache_dir() -> Path:
    return nsys_tool.cache_root() / "exports"


def _export_entry(report: Path, nsys: nsys_tool.Nsys) -> Path:
    return export_cache_dir() / _report_key(report, nsys)


def _check_report_file(report: Path) -> None:
    size = report.stat().st_size
    if size == 0:
        raise BadInputError(f"{report}: empty file; profile again or copy the report completely")


def export_report(report: Path, tables: list[str], nsys: nsys_tool.Nsys) -> Path:
    """Parquet export of the given tables, cached and reused while the report is unchanged.

    Tables are exported on demand: a later recipe needing more tables adds them to the same entry.
    """
    _check_report_file(report)
    entry = _export_entry(report, nsys)
    manifest_path = entry / "manifest.json"
    if set(tables) <= set(_read_manifest(manifest_path).get("requested", [])):
        return entry  # the usual warm case: the manifest is replaced whole, so it is read without the lock
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _locked(entry.with_suffix(".lock")):
        manifest = _read_manifest(manifest_path)
        requested = set(manifest.get("requested", []))
        missing = [t for t in tables if t not in requested]
        if not missing:
            return entry
        entry.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=entry.parent))
        try:
            out = tmp / "x_pqtdir"
            patterns = ",".join(f"^{t}$" if not t.endswith("*") else f"^{t[:-1]}.*" for t in missing)
            nsys_tool.run_nsys(
                nsys,
                ["export", "--type", "parquetdir", "--quiet", "true", "--force-overwrite", "true",
                 "--tables", patterns, "--output", str(out), str(report)],
                report=report,
            )
            for f in out.glob("*.parquet") if out.exists() else []:
                os.replace(f, entry / f.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        manifest = {
            "report": str(report.resolve()),
            "nsys_version": nsys.version,
            "requested": sorted(requested | set(missing)),
        }
        tmp_manifest = entry / f".manifest.{os.getpid()}.json"
        tmp_manifest.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp_manifest, manifest_path)
    return entry


def _read_manifest(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def table_names(needs: set[str]) -> list[str]:
    names = [*ALWAYS, *TABLES["nvtx"]]  # NVTX always: its "rank N" ranges are one of the sources of the rank
    for need in sorted(needs):
        names.extend(TABLES.get(need, {}))
    if "mpi" in needs:
        names.append(MPI_PREFIX + "*")
    return names


def open_source(path: Path, needs: set[str], nsys_path: str | None = None) -> ExportSource:
    """The export to read for one input; `origin` is the file actually read (the report or an export)."""
    kind = input_kind(path)
    if kind == "report":
        beside, why_not = export_beside(path, needs)
        if beside is not None:
            return open_source(beside, needs)
        nsys = nsys_tool.find_nsys(nsys_path)
        made_by = versions.report_version(path)
        if versions.newer_than(made_by, nsys.version):  # nsys would fail, for some releases as if corrupt
            raise BadInputError(nsys_tool.too_new_message(path, made_by, nsys, why_not))
        entry = export_report(path, table_names(needs), nsys)
        return ExportSource(entry, "parquetdir", origin=path)
    if kind == "sqlite":
        if path.stat().st_size == 0:
            raise BadInputError(f"{path}: empty file; re-export it with `nsys export --type sqlite`")
        return ExportSource(path, "sqlite")
    if kind == "parquetdir":
        return ExportSource(path, "parquetdir")
    raise BadInputError(f"{path}: not a report or export")


def export_beside(report: Path, needs: set[str]) -> tuple[Path | None, str]:
    """The export next to a report to read instead of it, else None and why those there do not qualify ("" when
    there are none).

    `nsys profile --stats` and `nsys export` leave one there, and reading it needs no nsys, not even one
    as new as the report. One qualifies when it is a complete export (see `_beside_problem`) and not older
    than the report: a report profiled again under the same name leaves the old export stale."""
    stem, why = _stem(report), []
    for suffix in EXPORTS_BESIDE:
        candidate = report.with_name(stem + suffix)
        if candidate.exists():
            problem = _beside_problem(candidate, report, needs)
            if problem is None:
                return candidate, ""
            why.append(f"{candidate.name} beside it {problem}")
    return None, "; ".join(why)


def _beside_problem(export: Path, report: Path, needs: set[str]) -> str | None:
    """None when this export can stand for the report, else what is wrong with it.

    Complete means a full export (META_DATA_EXPORT present with no table filter: every table the report has is
    there, so a missing one means the trace was not recorded), or else one holding every table the needs name
    (as the exports `nsys recipe` leaves beside reports, made with a table filter and no META_DATA_EXPORT).
    New enough means a modification time not before the report's (its StringIds.parquet for a folder)."""
    sqlite_file = export.name.endswith(".sqlite")
    if export.is_dir() == sqlite_file:
        return "is not an export"
    stamp = export if sqlite_file else export / "StringIds.parquet"
    try:
        if stamp.stat().st_mtime_ns < report.stat().st_mtime_ns:
            return "is older than the report"
        tables, filtered = _export_tables(export)
    except (OSError, pa.ArrowException, BadInputError):
        return "is not a readable export"
    if "StringIds" not in tables:
        return "is not an Nsight Systems export"
    if "META_DATA_EXPORT" in tables and not filtered:
        return None
    missing = [t for t in table_names(needs) if not t.endswith("*") and t not in tables]
    return f"lacks {', '.join(missing)}" if missing else None


def _export_tables(path: Path) -> tuple[set[str], bool]:
    """The tables of an export, and whether it was made with a table filter (`nsys export --tables`)."""
    src = ExportSource(path, "sqlite" if path.name.endswith(".sqlite") else "parquetdir")
    try:
        meta = _small_table(src, "META_DATA_EXPORT", ["name", "value"])
        return src.tables, any(v for n, v in zip(meta.get("name", []), meta.get("value", []), strict=False)
                               if n == "EXPORT_PARAM_TABLES_TO_EXPORT")
    finally:
        src.close()


# ---------------------------------------------------------------------------------------------------
# reading and normalising


def _pid_of(global_id) -> np.ndarray:
    ids = np.asarray(global_id).astype(np.uint64)
    return ((ids >> np.uint64(PID_SHIFT)) & np.uint64(PID_MASK)).astype(np.int64)


class StringTable:
    """StringIds kept as Arrow: only the distinct ids a table refers to become Python strings."""

    def __init__(self, ids: np.ndarray, values: pa.Array):
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        # a repeated id: the last one
        last = np.r_[sorted_ids[1:] != sorted_ids[:-1], True] if len(ids) else np.zeros(0, bool)
        self._ids, self._rows, self._values = sorted_ids[last], order[last], values

    def distinct(self, ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(words, at) with words[at] the string of each id of an integer column; no string made per row."""
        return self._words(numpy_of(ids, -1).astype(np.int64))

    def ids_of(self, wanted) -> np.ndarray:
        """The ids whose string is one of `wanted`."""
        return self._ids[np.isin(self._strings(), list(wanted))]

    def ids_containing(self, word: str) -> np.ndarray:
        """The ids whose string holds `word`, in any case."""
        word = word.lower()
        return self._ids[np.array([isinstance(v, str) and word in v.lower() for v in self._strings()], bool)]

    def _strings(self) -> np.ndarray:
        """Each id's string, in the order of the ids."""
        if not len(self._ids):
            return np.zeros(0, object)
        return self._values.take(arrow_of(self._rows)).to_numpy(zero_copy_only=False)

    def _words(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        distinct, where = _distinct(ids)
        words = np.full(len(distinct), None, dtype=object)
        if len(self._ids):
            pos = np.minimum(np.searchsorted(self._ids, distinct), len(self._ids) - 1)
            known = self._ids[pos] == distinct
            if known.any():
                words[known] = self._values.take(arrow_of(self._rows[pos[known]])).to_numpy(zero_copy_only=False)
        return words, where


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True). String ids are small integers, so when their span is not much
    larger than their count a table of the span does it without a sort (several times faster)."""
    if not len(values):
        return np.zeros(0, values.dtype), np.zeros(0, np.int64)
    low, high = int(values.min()), int(values.max())
    if high - low > 4 * len(values) + 1024:
        distinct, where = np.unique(values, return_inverse=True)
        return distinct, where.reshape(-1)
    present = np.zeros(high - low + 1, bool)
    present[values - low] = True
    distinct = np.flatnonzero(present) + low
    return distinct.astype(values.dtype), (np.cumsum(present) - 1)[values - low]


def _strings(src: ExportSource) -> StringTable:
    s = src.read_arrow("StringIds", ["id", "value"])
    if not {"id", "value"} <= set(s.column_names):
        return StringTable(np.zeros(0, np.int64), pa.array([], pa.string()))
    return StringTable(numpy_of(s.column("id"), -1), s.column("value").combine_chunks())


def _small_table(src: ExportSource, table: str, cols: list[str]) -> dict[str, list]:
    """A few-row table's columns as Python lists (a missing column is left out)."""
    return src.read_arrow(table, cols).to_pydict()


def _env(src: ExportSource) -> tuple[dict, str | None]:
    """The profiled process's environment as the report recorded it, and the host name nsys recorded for
    the machine (a HOSTNAME variable may have been handed down by a launcher from another node)."""
    env = _small_table(src, "TARGET_INFO_SYSTEM_ENV", ["name", "value"])
    rows = dict(zip(env.get("name", []), env.get("value", []), strict=False))
    hostname = str(rows["Hostname"]).strip() if rows.get("Hostname") else None
    out = {}
    for item in str(rows.get("DeviceEnvironment") or "").split(";"):
        key, sep, value = item.partition("=")
        if sep:
            out[key.strip()] = value
    return out, hostname or None


def _session_start(src: ExportSource) -> int:
    starts = _small_table(src, "TARGET_INFO_SESSION_START_TIME", ["utcEpochNs"]).get("utcEpochNs", [])
    return next((int(v) for v in starts if v is not None), 0)


NVTX_DTYPES = {"start_ns": "int64", "end_ns": "Int64", "event_type": "int64", "name": "object", "domain": "object",
               "tid": "int64", "pid": "int64"}
MPI_DTYPES = {"start_ns": "int64", "end_ns": "int64", "tid": "int64", "pid": "int64"}


def _ints(raw: pa.Table, column: str, fill: int = 0) -> np.ndarray:
    """An integer column as int64, nulls (and a missing column) as `fill`."""
    if column not in raw.column_names:
        return np.full(raw.num_rows, fill, np.int64)
    return numpy_of(raw.column(column), fill).astype(np.int64, copy=False)


def _tids(raw: pa.Table) -> np.ndarray:
    """globalTid with nulls as 0."""
    return _ints(raw, "globalTid")


def _nullable(raw: pa.Table, column: str) -> pa.Array:
    """An integer column as int64 with its nulls (all null when missing): an `Int64` column of a Frame."""
    if column not in raw.column_names:
        return pa.nulls(raw.num_rows, pa.int64())
    return raw.column(column).combine_chunks()


def _read_events(src: ExportSource, table: str, cols: list[str], times: tuple[str, ...],
                 where: list | None = None) -> pa.Table:
    """A table's columns, without the rows lacking one of the `times` columns (never so in an export nsys
    wrote); a table with rows but without those columns is damaged."""
    raw = src.read_arrow(table, cols, where)
    if src.has(table) and not set(times) <= set(raw.column_names) and src.count(table):
        raise BadInputError(f"{src.origin}: table {table} has no {'/'.join(times)} columns, so the export is "
                            "damaged; export the report again with `nsys export`")
    if not raw.num_rows:
        return pa.table({c: pa.array([], pa.string() if c == "text" else pa.int64()) for c in cols})
    missing = np.zeros(raw.num_rows, bool)
    for c in times:
        if raw.column(c).null_count:
            missing |= ~_valid_of(raw.column(c).combine_chunks())
    return raw.filter(arrow_of(~missing)) if missing.any() else raw


def _read_nvtx(src: ExportSource, strings: StringTable, only_rank_names: bool = False) -> Frame:
    """NVTX events with their names and domains (a range's name: its text when it has one, else the string its
    textId names). only_rank_names: just the events whose name may give a rank ("rank 3", "MPI Rank 3")."""
    where = [("textId", strings.ids_containing("rank")), ("text", "rank")] if only_rank_names else None
    raw = _read_events(src, "NVTX_EVENTS", TABLES["nvtx"]["NVTX_EVENTS"], ("start", "eventType"), where)
    n = raw.num_rows
    if "text" in raw.column_names:
        text = raw.column("text").combine_chunks().dictionary_encode()
        text_words = np.array(text.dictionary.to_pylist(), object)
        has_text = ~numpy_of(text.is_null(), False)
        text_at = numpy_of(text.indices, 0).astype(np.int64)
    else:
        text_words, has_text, text_at = np.zeros(0, object), np.zeros(n, bool), np.zeros(n, np.int64)
    if "textId" in raw.column_names:
        id_words, id_at = strings.distinct(raw.column("textId"))
    else:
        id_words, id_at = np.array([None], object), np.zeros(n, np.int64)
    words = np.concatenate([text_words, id_words])
    unnamed = np.equal(words, None)
    words[unnamed] = ""
    at = np.where(has_text, text_at, len(text_words) + id_at)
    event_type = _ints(raw, "eventType")
    domain_id = _ints(raw, "domainId")
    # a range's domain: the name of the first domain-create event (type 75) with its domainId
    create = np.flatnonzero(event_type == 75)
    domain_at = np.full(n, len(words))
    if len(create):
        ids, first = np.unique(domain_id[create], return_index=True)
        pos = np.minimum(np.searchsorted(ids, domain_id), len(ids) - 1)
        known = ids[pos] == domain_id
        domain_at[known] = at[create[first[pos[known]]]]
    keep = event_type != 75
    tid = _tids(raw)
    arrays = {"start_ns": arrow_of(_ints(raw, "start")[keep]), "end_ns": _nullable(raw, "end").filter(arrow_of(keep)),
              "event_type": arrow_of(event_type[keep]), "name": _dictionary_of(words, at[keep]),
              "domain": _dictionary_of(np.r_[words, [""]].astype(object), domain_at[keep]),
              "tid": arrow_of(tid[keep]), "pid": arrow_of(_pid_of(tid[keep]))}
    # the domain column is `str` when some event (a create event included) has a named domain, as pandas infers it
    named_domain = bool(len(create)) and not np.r_[unnamed, True][domain_at].all()
    return Frame(pa.table(arrays), {**NVTX_DTYPES, "domain": "str" if named_domain else "object"})


GPU_COLUMNS = [("deviceId", "device"), ("streamId", "stream"), ("correlationId", "correlation_id"),
               ("bytes", "bytes"), ("copyKind", "copy_kind"), ("srcKind", "src_kind"), ("dstKind", "dst_kind"),
               ("syncType", "sync_type"), ("graphNodeId", "graph_node_id"), ("srcDeviceId", "src_device"),
               ("dstDeviceId", "dst_device"), ("memKind", "mem_kind")]


def _read_gpu(src: ExportSource, table: str, cols: list[str], strings: StringTable,
              where: list | None = None) -> Frame:
    """One GPU activity table, every column the recipes use present (null where the export lacks it)."""
    raw = _read_events(src, table, cols, ("start", "end"), where)
    n = raw.num_rows
    have = set(raw.column_names)
    arrays = {"start_ns": arrow_of(_ints(raw, "start")), "end_ns": arrow_of(_ints(raw, "end"))}
    dtypes = {"start_ns": "int64", "end_ns": "int64"}
    for src_col, dst in GPU_COLUMNS:
        if src_col in cols:
            arrays[dst] = raw.column(src_col).combine_chunks() if src_col in have else pa.nulls(n, pa.int64())
            dtypes[dst] = "Int64"
    arrays["pid"], dtypes["pid"] = arrow_of(_pid_of(_ints(raw, "globalPid"))), "int64"
    if "shortName" in cols:
        # a kernel's name: its short name (the full name when the export has no short names); its full name:
        # the demangled name, else the short name
        short = "shortName" if "shortName" in have else "demangledName" if "demangledName" in have else None
        full = "demangledName" if "demangledName" in have else short
        if short is None:
            name_words, name_at = np.array([""], object), np.zeros(n, np.int64)
            full_words, full_at = name_words, name_at
        else:
            name_words, name_at = strings.distinct(raw.column(short))
            name_words = np.array(["" if w is None else w for w in name_words], dtype=object)
            full_words, full_at = strings.distinct(raw.column(full))
            lacking = np.equal(full_words, None)
            if lacking.any():  # a full name missing: the short name stands for it
                short_for = lacking[full_at]
                full_at = np.where(short_for, len(full_words) + name_at, full_at)
                full_words = np.concatenate([full_words, name_words])
        arrays["name"], dtypes["name"] = _dictionary_of(name_words, name_at), "object"
        arrays["full_name"], dtypes["full_name"] = _dictionary_of(full_words, full_at), "object"
    return Frame(pa.table(arrays), dtypes)


def _dictionary_of(words: np.ndarray, at: np.ndarray) -> pa.DictionaryArray:
    """words[at] as a dictionary column with each distinct string once."""
    enc = pa.array(words, pa.string()).dictionary_encode()
    codes = numpy_of(enc.indices).astype(np.int32)[at] if len(at) else np.zeros(0, np.int32)
    return pa.DictionaryArray.from_arrays(arrow_of(codes), enc.dictionary)


def _read_runtime(src: ExportSource, strings: StringTable, where: list | None = None) -> Frame:
    raw = _read_events(src, "CUPTI_ACTIVITY_KIND_RUNTIME", TABLES["runtime"]["CUPTI_ACTIVITY_KIND_RUNTIME"],
                       ("start", "end"), where)
    tid = _tids(raw)
    corr = _nullable(raw, "correlationId")
    arrays = {"start_ns": arrow_of(_ints(raw, "start")), "end_ns": arrow_of(_ints(raw, "end")),
              "tid": arrow_of(tid), "pid": arrow_of(_pid_of(tid)), "correlation_id": corr,
              "name": _dictionary_of(*_id_words(raw, "nameId", strings, ""))}
    # a call without a correlation id makes the column nullable
    return Frame(pa.table(arrays), {"start_ns": "int64", "end_ns": "int64", "tid": "int64", "pid": "int64",
                                    "correlation_id": "Int64" if corr.null_count else "int64", "name": "str"})


def _id_words(raw: pa.Table, column: str, strings: StringTable, missing: str) -> tuple[np.ndarray, np.ndarray]:
    """(words, at): words[at] the strings a column of string ids names, `missing` for a null or unknown id or
    a missing column."""
    if column not in raw.column_names:
        return np.array([missing], object), np.zeros(raw.num_rows, np.int64)
    words, at = strings.distinct(raw.column(column))
    words[np.equal(words, None)] = missing
    return words, at


def _mpi_tables(src: ExportSource) -> list[str]:
    return sorted(t for t in src.tables if t.startswith(MPI_PREFIX) and t.endswith("_EVENTS"))


def _read_mpi(src: ExportSource, strings: StringTable) -> Frame:
    """Every MPI_*_EVENTS table's calls, tables in name order; a call's name is its textId's string, "MPI"
    without one."""
    raws = [raw for raw in (_read_events(src, t, ["start", "end", "globalTid", "textId"], ("start", "end"))
                            for t in _mpi_tables(src)) if raw.num_rows]
    tid = np.concatenate([_tids(raw) for raw in raws]) if raws else np.zeros(0, np.int64)
    names = [_id_words(raw, "textId", strings, "MPI") for raw in raws]
    words = np.concatenate([w for w, _ in names]) if names else np.zeros(0, object)
    base = np.cumsum([0] + [len(w) for w, _ in names[:-1]])
    at = np.concatenate([a + b for (_, a), b in zip(names, base, strict=True)]) if names else np.zeros(0, np.int64)
    arrays = {"start_ns": arrow_of(np.concatenate([_ints(raw, "start") for raw in raws]) if raws else tid),
              "end_ns": arrow_of(np.concatenate([_ints(raw, "end") for raw in raws]) if raws else tid),
              "tid": arrow_of(tid), "pid": arrow_of(_pid_of(tid)), "name": _dictionary_of(words, at)}
    # names are `str` when every table lacks textId (all "MPI"), else `object`, as pandas infers them
    named = not raws or any("textId" in raw.column_names for raw in raws)
    return Frame(pa.table(arrays), {**MPI_DTYPES, "name": "object" if named else "str"})


def _first_int(env: dict, keys: list[str]) -> tuple[int, str] | None:
    for key in keys:
        value = env.get(key, "").strip()
        if value.lstrip("-").isdigit():
            return int(value), key
    return None


def load_file(path: Path, needs: set[str], nsys_path: str | None = None,
              rows: dict[str, list[str]] | None = None, bytes_per_row: int | None = None) -> list[RankData]:
    """Read one input and split it into ranks (one per process that did GPU work, or NVTX work).

    rows: need -> names, for recipes that use only some rows (`kernel_pace --kernel`: one kernel's). An export
    is then read for those rows only; a report's export in the pack's cache is read whole once, as its loaded
    frames are kept for every later run. bytes_per_row: the recipe's peak memory per event row read (see
    `check_memory`)."""
    src = open_source(path, needs, nsys_path)
    cache = _loaded_dir(src, needs)
    try:
        loaded = _read_loaded(cache) if cache is not None else None
        if loaded is None:
            loaded = _read_frames(src, needs, path, rows if cache is None else None, bytes_per_row)
            if cache is not None:
                _write_loaded(cache, *loaded)
    finally:
        src.close()
    return _split_ranks(path, *loaded, read_from=src.origin)


def _read_frames(src: ExportSource, needs: set[str], path: Path, rows: dict | None = None,
                 bytes_per_row: int | None = None) -> tuple[dict, dict]:
    """The normalised frames a recipe needs, and what identifies the file's ranks."""
    if not (src.has("StringIds") or src.has("NVTX_EVENTS") or src.has("TARGET_INFO_SESSION_START_TIME")
            or src.kind == "parquetdir" and src.origin != src.path):
        raise BadInputError(f"{path}: not an Nsight Systems export (no StringIds, NVTX_EVENTS or "
                            "TARGET_INFO_* tables); export the report with `nsys export`")
    # the event tables read whole (those read for a few rows only hold little)
    whole = [t for need in sorted(needs) if not (rows or {}).get(need) for t in TABLES.get(need, {})]
    counts = {t: src.count(t) for t in whole}
    check_memory(path, counts, bytes_per_row=bytes_per_row)
    done = _ReadProgress(path, counts)
    strings = _strings(src)
    env, hostname = _env(src)
    synthetic = "SYNTHETIC" in _small_table(src, "META_DATA_EXPORT", ["name"]).get("name", [])
    frames: dict[str, Frame] = {}
    # NVTX always: its "rank N" ranges are one of the sources of the rank (only those, when no recipe needs more)
    nvtx = _read_nvtx(src, strings, only_rank_names="nvtx" not in needs)
    done("NVTX_EVENTS")
    if "nvtx" in needs:
        frames["nvtx"] = nvtx
    for need, attr in [("kernel", "kernels"), ("memcpy", "memcpy"), ("memset", "memset"), ("sync", "sync")]:
        if need in needs:
            (table, cols), = TABLES[need].items()
            names = (rows or {}).get(need)
            where = [("shortName", strings.ids_of(names))] if names and "shortName" in cols else None
            frame = _read_gpu(src, table, cols, strings, where)
            if where is not None and not len(frame):  # none of those: all of them, for an error naming the closest
                frame = _read_gpu(src, table, cols, strings)
            frames[attr] = frame
            done(table)
    if "runtime" in needs:
        frames["runtime"] = _read_runtime(src, strings)
        done("CUPTI_ACTIVITY_KIND_RUNTIME")
    if "mpi" in needs:
        frames["mpi"] = _read_mpi(src, strings)
    has_cuda = any(src.has(t) for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                                        "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME"))
    gpu_pids: set[int] = set()
    if has_cuda:
        for attr in ("kernels", "memcpy"):
            if attr in frames:
                gpu_pids.update(int(p) for p in np.unique(frames[attr].values("pid")))
        if not gpu_pids and "runtime" in frames:
            gpu_pids.update(int(p) for p in np.unique(frames["runtime"].values("pid")))
    if not gpu_pids and "nvtx" not in needs:  # the processes with NVTX ranges are the ranks: all ranges needed
        nvtx = _read_nvtx(src, strings)
    range_pids = nvtx.values("pid")[np.isin(nvtx.values("event_type"), [59, 60])]
    pids = sorted(gpu_pids) if gpu_pids else sorted(int(p) for p in np.unique(range_pids))
    meta = {"env": env, "hostname": hostname, "session_start_ns": _session_start(src), "synthetic": bool(synthetic),
            "has_cuda": bool(has_cuda), "pids": pids or [None], "nvtx_rank": _nvtx_ranks(nvtx, pids or [None])}
    return frames, meta


# Peak memory of a recipe over one rank per event row it reads, where the recipe does not say its own (each
# says what it was measured to take on the long captures of bench/RESULTS.md, with some margin)
BYTES_PER_ROW = 400
LONG_READ_ROWS = 2_000_000  # a read of more rows than this reports its progress


def check_memory(path: Path, counts: dict[str, int], available: int | None = None,
                 bytes_per_row: int | None = None) -> None:
    """Refuse a rank the machine cannot hold, naming the file and the memory it would need, instead of being
    killed for it (or swapping) minutes later. NSYS_RECIPE_MEMORY_GB sets the memory the pack may use."""
    rows = sum(counts.values())
    need = rows * (bytes_per_row or BYTES_PER_ROW)
    if available is None:
        told = os.environ.get("NSYS_RECIPE_MEMORY_GB", "").strip()
        if told:
            available = int(float(told) * 2**30)
        else:
            import psutil

            available = psutil.virtual_memory().available
    if need > available:
        biggest = ", ".join(f"{t} {n / 1e6:.1f} M" for t, n in sorted(counts.items(), key=lambda x: -x[1])[:3] if n)
        raise BadInputError(f"{path}: this rank needs about {need / 2**30:.1f} GB of memory ({rows / 1e6:.1f} M rows: "
                            f"{biggest}) and {available / 2**30:.1f} GB is free; run it on a machine with more memory, "
                            "or profile a shorter span (nsys profile --duration, --capture-range); "
                            "NSYS_RECIPE_MEMORY_GB=N lets the pack use N GB")


class _ReadProgress:
    """One long read (millions of rows): a line when it starts, and after each table the rows read so far and
    the time left at that pace. Silent for the usual small reports."""

    def __init__(self, path: Path, counts: dict[str, int], stream=None):
        self.path, self.counts = path, counts
        self.total = sum(counts.values())
        self.read = 0
        self.start = time.monotonic()
        self.stream = stream or sys.stderr
        if self.total >= LONG_READ_ROWS:
            print(f"{path}: reading {self.total / 1e6:.1f} M rows", file=self.stream, flush=True)

    def __call__(self, table: str) -> None:
        self.read += self.counts.get(table, 0)
        if self.total < LONG_READ_ROWS:
            return
        spent = time.monotonic() - self.start
        left = spent * (self.total - self.read) / max(self.read, 1)
        print(f"{self.path}: {self.read / 1e6:.1f} M of {self.total / 1e6:.1f} M rows read in {spent:.0f} s"
              + (f", about {left:.0f} s left" if self.read < self.total else ""), file=self.stream, flush=True)


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


def _split_ranks(path: Path, frames: dict, meta: dict, read_from: Path | None = None) -> list[RankData]:
    pids, env = meta["pids"], meta["env"]
    file_rank = None
    m = FILE_RANK_RE.search(_stem(path))
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
        rank_data = RankData(file=str(path), pid=pid, session_start_ns=meta["session_start_ns"], env=env,
                      rank_candidates=cands, host=host, local_rank=local[0] if local and len(pids) == 1 else None,
                      has_cuda=meta["has_cuda"], synthetic=meta["synthetic"],
                      read_from=str(read_from) if read_from is not None else None)
        for attr, frame in frames.items():
            if pid is not None and len(pids) > 1 and "pid" in frame:
                frame = frame.filter(frame.values("pid") == pid)
            rank_data._tables[attr] = frame
        nvtx = rank_data.frame("nvtx")
        if nvtx is not None and len(nvtx):
            ranges = np.isin(nvtx.values("event_type"), [59, 60])
            rank_data.unclosed_ranges = int((ranges & nvtx.is_null("end_ns")).sum())
        ranks.append(rank_data)
    return ranks


# ---------------------------------------------------------------------------------------------------
# the loaded frames of a cached report export, kept beside it as Arrow files: a warm run reads them
# memory-mapped instead of decoding the export's Parquet and string ids again

LOADED_FORMAT = 5  # bump when _read_frames or the layout below changes
LOADED_FILE = "frames.arrows"


def _loaded_dir(src: ExportSource, needs: set[str]) -> Path | None:
    if src.kind != "parquetdir" or src.origin == src.path:
        return None  # only report exports in the pack's cache; user exports are read as they are
    return _loaded_path(src.path, needs)


def _loaded_path(entry: Path, needs: set[str]) -> Path:
    return entry / f"loaded-v{LOADED_FORMAT}-{'-'.join(sorted(needs))}"


def frames_cached(report: Path, needs: set[str], nsys_path: str | None = None) -> bool:
    """Whether a warm read of this report needs neither nsys nor the export's Parquet: its loaded frames are
    in the cache. False, never an error, when that cannot be told (no nsys, an unreadable report)."""
    try:
        nsys = nsys_tool.find_nsys(nsys_path, required=False)
        return nsys is not None and _loaded_path(_export_entry(report, nsys), needs).is_dir()
    except (OSError, PackError):
        return False


def write_arrow_streams(path: str | Path, tables: list[pa.Table]) -> list[tuple[int, int]]:
    """Tables as Arrow IPC streams one after another in one file (one open and one map to read them all
    back); the (offset, size) of each. Each stream starts 64-byte aligned, so its buffers stay aligned in
    the map."""
    spans = []
    with pa.OSFile(str(path), "wb") as sink:
        for table in tables:
            at = sink.tell()
            with ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            size = sink.tell() - at
            sink.write(b"\0" * (-size % 64))
            spans.append((at, size))
    return spans


def read_arrow_streams(path: str | Path, spans: list) -> list[pa.Table]:
    """The tables `write_arrow_streams` wrote, memory-mapped: zero-copy views of the file."""
    mapped = pa.memory_map(str(path)).read_buffer()
    return [ipc.open_stream(mapped.slice(at, size)).read_all() for at, size in spans]


def _read_loaded(cache: Path) -> tuple[dict, dict] | None:
    try:
        meta = json.loads((cache / "meta.json").read_text())
        where = meta.pop("frames")
        tables = read_arrow_streams(cache / LOADED_FILE, [(at, size) for _, at, size in where.values()])
        frames = {attr: Frame(table, dtypes) for (attr, (dtypes, _, _)), table in zip(where.items(), tables,
                                                                                      strict=True)}
        return frames, meta
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None


def _column_to_arrow(series: pd.Series) -> tuple[pa.Array, str]:
    dtype = str(series.dtype)
    if dtype in ("object", "str"):
        return pa.array(series.to_numpy(object), type=pa.string(), from_pandas=True).dictionary_encode(), dtype
    if dtype in ("int64", "Int64", "bool", "float64", "int32", "uint64"):
        return pa.array(series, from_pandas=True), dtype
    raise TypeError(f"no cached layout for dtype {dtype}")


def _write_loaded(cache: Path, frames: dict, meta: dict) -> None:
    """All frames of one report in one file of Arrow IPC streams (one open and one map per warm read, where
    a file per frame cost several times more), with where each stream lies in meta.json."""
    tmp = Path(tempfile.mkdtemp(prefix=".loaded-", dir=cache.parent))
    try:
        spans = write_arrow_streams(tmp / LOADED_FILE, [frame.table for frame in frames.values()])
        where = {attr: (frame.dtypes, *span) for (attr, frame), span in zip(frames.items(), spans, strict=True)}
        (tmp / "meta.json").write_text(json.dumps({**meta, "frames": where}))
        try:
            os.rename(tmp, cache)
        except OSError:  # another process wrote it first: theirs is the same
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
