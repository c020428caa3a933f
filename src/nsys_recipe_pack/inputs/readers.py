"""One Arrow read path for SQLite and Parquet exports: only the needed columns (and rows), integers as int64,
text as strings; and the export's string table."""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import BadInputError
from ..groups import runs_of_about
from ..lazy import pd
from .frames import arrow_of, numpy_of, objects_of, one_array
from .sqlite import SQLITE_BATCH_ROWS, SqliteReader, TypeMismatch, literal, quoted, sqlite_query

PID_SHIFT = 24
PID_MASK = 0xFFFFFF

# What each kind of data needs from an export: table -> columns (only those are read).
TABLES = {
    "nvtx": {"NVTX_EVENTS": ["start", "end", "eventType", "text", "textId", "globalTid", "domainId"]},
    "kernel": {"CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "deviceId", "streamId", "correlationId",
                                              "globalPid", "shortName", "demangledName"]},
    "memcpy": {"CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "deviceId", "streamId", "correlationId",
                                              "globalPid", "bytes", "copyKind", "srcKind", "dstKind",
                                              "srcDeviceId", "dstDeviceId"]},
    "memset": {"CUPTI_ACTIVITY_KIND_MEMSET": ["start", "end", "deviceId", "streamId", "correlationId",
                                              "globalPid", "bytes", "memKind"]},
    "runtime": {"CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "end", "globalTid", "correlationId", "nameId"]},
    "sync": {"CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ["start", "end", "deviceId", "streamId", "correlationId",
                                                      "globalPid", "syncType"]},
    # `nsys profile --cuda-memory-usage=true`: every allocation and free, the GPUs' sizes and the memory kinds' names
    "memory": {"CUDA_GPU_MEMORY_USAGE_EVENTS": ["start", "globalPid", "deviceId", "correlationId", "address", "bytes",
                                                "memKind", "memoryOperationType", "localMemoryPoolAddress",
                                                "localMemoryPoolSize"],
               "TARGET_INFO_GPU": ["id", "name", "totalMemory"],
               "ENUM_CUDA_MEM_KIND": ["id", "label"]},
}
MEMORY_EVENTS = "CUDA_GPU_MEMORY_USAGE_EVENTS"
# exported from every report: names, the clock, and the environment the rank is read from (a report made
# by nsys is never synthetic, so the generator's META_DATA_EXPORT label is not needed from it)
ALWAYS = ["StringIds", "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV"]
MPI_PREFIX = "MPI_"


# the few text columns the pack reads (NVTX_EVENTS.text, StringIds.value, the name/value rows of the TARGET_INFO
# and META_DATA tables); every other column it reads holds integers
TEXT_COLUMNS = {"NVTX_EVENTS": {"text"}, "StringIds": {"value"}, "TARGET_INFO_SYSTEM_ENV": {"name", "value"},
                "META_DATA_EXPORT": {"name", "value"}, "TARGET_INFO_GPU": {"name"}, "ENUM_CUDA_MEM_KIND": {"label"},
                "NVTX_PAYLOAD_SCHEMAS": {"name"}, "NVTX_PAYLOAD_SCHEMA_ENTRIES": {"name", "description"},
                "PROCESSES": {"name"}}
# text a batched read (ExportSource.read_batches) gives from Parquet as the file's dictionary: NVTX range names repeat,
# and making a string of every row, then hashing them all again, would take most of the text's time
DICTIONARY_TEXT = {"NVTX_EVENTS": {"text"}}
STREAM_BATCH_ROWS = 1 << 18  # rows of a long table handled at a time when it is read in batches
# fewer rows than this are read without threads: starting one and handing parts over to it cost more than the
# read (on the Jacobi reports of bench/RESULTS.md, about a third of the pack's CPU per report, cold)
THREADED_READ_MIN_ROWS = STREAM_BATCH_ROWS


def threads_pay(rows: int) -> bool:
    """Whether a read of this many rows is worth threads (THREADED_READ_MIN_ROWS)."""
    return rows >= THREADED_READ_MIN_ROWS

# connections that read the batches of an SQLite table read alone: the driver lets go of Python while it reads,
# so such a table takes about half the time on two cores
SQLITE_READERS = 2


# a folder export's kind -> the file name ending of its tables
FOLDER_SUFFIXES = {"parquetdir": ".parquet", "arrowdir": ".arrow"}


class ExportSource:
    """Read-only access to an export's tables as Arrow: only the columns (and rows) asked for, integers as int64
    and text as strings, the same whether the export is SQLite, Parquet or Arrow files (`nsys export --type
    arrowdir`: one Arrow IPC stream a table, read memory-mapped)."""

    def __init__(self, path: Path, kind: str, origin: Path | None = None, exported_now: bool = False):
        self.path = path
        self.kind = kind
        self.origin = origin or path
        self.exported_now = exported_now  # a report's export, made by this read (inputs.export)
        self.note: str | None = None  # what the user should know of how the input was read (an export skipped)
        self._tables: set[str] | None = None  # a folder export's are listed on first use
        self._cols: dict[str, list[str]] = {}
        self._counts: dict[str, int] = {}
        self._footers: dict[str, pq.FileMetaData] = {}  # Parquet: each table's, read once
        self._mapped: dict[str, pa.Table] = {}  # Arrow files: each table, mapped once
        self._readers: dict[int, SqliteReader] = {}  # SQLite: a connection per thread that reads
        self._pool: ThreadPoolExecutor | None = None  # SQLite: the threads that read a table's batches
        self._lock = threading.Lock()
        if kind == "sqlite":
            self._check_sqlite()
            self._tables = set(self._db.query("SELECT name FROM sqlite_master WHERE type='table'").column(0)
                               .to_pylist())

    @property
    def _db(self) -> SqliteReader:
        """This thread's connection: tables may be read by several threads at once (rank_data reads them so)."""
        me = threading.get_ident()
        with self._lock:
            if me not in self._readers:
                self._readers[me] = SqliteReader(self.path)
            return self._readers[me]

    def _check_sqlite(self) -> None:
        with open(self.path, "rb") as fh:
            head = fh.read(16)
        if not head:
            raise BadInputError(f"{self.path}: empty file; re-export it with `nsys export --type sqlite`")
        if head != b"SQLite format 3\x00":
            raise BadInputError(f"{self.path}: not an SQLite file; make it with `nsys export --type sqlite REPORT`")

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
            self._footers.clear()
            self._mapped.clear()
        for reader in readers:
            reader.close()

    @property
    def tables(self) -> set[str]:
        if self._tables is None:
            suffix = FOLDER_SUFFIXES[self.kind]
            self._tables = {f.name[: -len(suffix)] for f in self.path.glob(f"*{suffix}")}
        return self._tables

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        if table not in self._cols:
            if self.kind == "sqlite":
                info = self._db.query(f"PRAGMA table_info({quoted(table)})")
                self._cols[table] = [str(c) for c in info.column("name").to_pylist()] if info.num_columns else []
            elif self.kind == "arrowdir":
                self._cols[table] = list(self._arrow_file(table).schema.names)
            else:
                self._cols[table] = list(self._footer(table).schema.to_arrow_schema().names)
        return self._cols[table]

    def count(self, table: str) -> int:
        """Rows in a table (0 when absent), without reading them (SQLite still walks the table: once)."""
        if table not in self._counts:
            if not self.has(table):
                self._counts[table] = 0
            elif self.kind == "sqlite":
                self._counts[table] = int(self._db.query(f"SELECT count(*) FROM {quoted(table)}").column(0)[0]
                                          .as_py())
            elif self.kind == "arrowdir":
                self._counts[table] = self._arrow_file(table).num_rows
            else:
                self._counts[table] = self._footer(table).num_rows
        return self._counts[table]

    def _footer(self, table: str) -> pq.FileMetaData:
        """A Parquet table's footer, read once for every read of the table: Nsight Systems writes row groups of
        2,048 rows, so the footer of a long table is large, and larger once parsed."""
        with self._lock:
            if table not in self._footers:
                self._footers[table] = pq.read_metadata(self.path / f"{table}.parquet")
            return self._footers[table]

    def _arrow_file(self, table: str) -> pa.Table:
        """An Arrow table file, memory-mapped once for its columns, count and reads: its columns are read only
        where used, without a copy."""
        with self._lock:
            if table not in self._mapped:
                with pa.memory_map(str(self.path / f"{table}.arrow")) as source:
                    self._mapped[table] = pa.ipc.open_stream(source).read_all()
            return self._mapped[table]

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
        read = {"sqlite": self._read_sqlite, "parquetdir": self._read_parquet, "arrowdir": self._read_arrow_file}
        raw = read[self.kind](table, cols, where)
        return _normalised_table(raw, cols, TEXT_COLUMNS.get(table, set()))

    def read_batches(self, table: str, columns: list[str], rows: int | None = None, connections: int = 1):
        """The asked-for columns of a table as `read_arrow` gives them (but DICTIONARY_TEXT from Parquet as the
        file's dictionary), a batch of about `rows` rows at a time in the table's order, so that a long table is
        never held whole. connections: SQLite connections reading it at once (more than one where no other table is
        read alongside)."""
        if not self.has(table):
            return
        have = self.columns(table)
        cols = [c for c in dict.fromkeys(columns) if c in have]
        if not cols:
            return
        rows = rows or STREAM_BATCH_ROWS
        if self.kind == "sqlite":
            parts = self._sqlite_batches(table, cols, rows, connections)
        elif self.kind == "arrowdir":  # a generator, which read_ahead closes
            parts = (part for part in self._arrow_file(table).select(cols).to_batches(max_chunksize=rows))
        else:
            # without pre-buffering: it keeps every row group's pages read so far until the read ends (the whole
            # table's, at its end), and reads slower
            parts = pq.ParquetFile(self.path / f"{table}.parquet", metadata=self._footer(table), pre_buffer=False,
                                   read_dictionary=_dictionary_text(table, cols)).iter_batches(batch_size=rows,
                                                                                               columns=cols)
        made = functools.partial(_normalised_table, cols=cols, text=TEXT_COLUMNS.get(table, set()),
                                 dictionary=DICTIONARY_TEXT.get(table, set()))
        if not threads_pay(self.count(table)):
            with contextlib.closing(parts):
                yield from map(made, parts)
        else:
            yield from read_ahead(parts, made)

    def _sqlite_batches(self, table: str, cols: list[str], rows: int, connections: int):
        """The table's rows in batches of about `rows`, in the order of a scan of the table; a damaged export
        (values of another type than their column's) is read whole through `_read_sqlite`, which reads those
        values as nulls."""
        given = 0
        try:
            for batch in self._sqlite_parts(table, cols, TEXT_COLUMNS.get(table, set()), rows, connections):
                if batch.num_rows:
                    given += batch.num_rows
                    yield batch
        except TypeMismatch:  # the rows not given yet, from the whole table read the careful way
            whole = self._read_sqlite(table, cols, None)
            for at in range(given, whole.num_rows, rows):
                yield whole.slice(at, rows)

    def _sqlite_parts(self, table: str, cols: list[str], text: set[str], rows: int, connections: int):
        """Blocks of `rows` rowids, in rowid order (that of a scan), read by `connections` connections at once;
        by one, or where a table's rowids are sparse (nsys numbers an event table's rows 1 to N), one scan."""
        if connections < 2:
            yield from self._sqlite_scan(table, cols, text, rows)
            return
        try:  # one aggregate a query: SQLite then finds it at an end of the table's b-tree instead of scanning
            low, high = (self._db.query(f"SELECT {end}(rowid) FROM {quoted(table)}").column(0)[0].as_py()
                         for end in ("min", "max"))
        except BadInputError:  # a table without rowids
            low = high = None
        if low is None or high - low + 1 > 2 * self.count(table):
            yield from self._sqlite_scan(table, cols, text, rows)
            return

        def block(first_rowid: int) -> pa.Table:
            condition = f" WHERE rowid BETWEEN {first_rowid} AND {first_rowid + rows - 1}"
            sql, first = sqlite_query(table, cols, text, False, condition)
            return _text_as_strings(self._db.query(sql).slice(first), cols, text)

        yield from self._in_order(block, range(low, high + 1, rows), connections)

    def _sqlite_scan(self, table: str, cols: list[str], text: set[str], rows: int):
        """The driver's batches of one scan of the table, gathered into batches of about `rows`."""
        sql, first = sqlite_query(table, cols, text, False)
        pending, size = [], 0
        for batch in self._db.stream(sql, min(rows, SQLITE_BATCH_ROWS)):
            pending.append(batch.slice(first))
            first = 0
            size += pending[-1].num_rows
            if size >= rows:
                yield _text_as_strings(_joined(pending), cols, text)
                pending, size = [], 0
        if pending:
            yield _text_as_strings(_joined(pending), cols, text)

    def _in_order(self, read: Callable, parts, at_once: int) -> Iterator:
        """read(part) of each part, in order, `at_once` parts read at once in threads of their own."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(SQLITE_READERS, thread_name_prefix="nsys-recipe-sqlite")
            pool = self._pool
        parts = iter(parts)
        reading = collections.deque(pool.submit(read, part) for part in itertools.islice(parts, at_once))
        try:
            while reading:
                done = reading.popleft().result()
                for part in itertools.islice(parts, 1):
                    reading.append(pool.submit(read, part))
                yield done
        finally:
            for future in reading:
                future.cancel()

    def _read_sqlite(self, table: str, cols: list[str], where) -> pa.Table:
        text = TEXT_COLUMNS.get(table, set())
        condition = ""
        if where is not None:
            tests = []
            for column, test in where:
                if isinstance(test, str):
                    tests.append(f"{quoted(column)} LIKE '%' || {literal(test)} || '%'")
                else:
                    tests.append(f"{quoted(column)} IN ({','.join(str(int(v)) for v in np.unique(test))})")
            condition = " WHERE " + " OR ".join(tests)

        sql, first = sqlite_query(table, cols, text, False, condition)
        try:
            raw = self._db.query(sql)
        except TypeMismatch:  # a damaged export: values of other types than the column's are read as nulls
            try:
                raw = self._db.query(sqlite_query(table, cols, text, True, condition)[0])
            except TypeMismatch as exc:
                raise BadInputError(f"{self.path}: table {table} cannot be read ({exc}); export the report again "
                                    "with `nsys export --type sqlite`") from None
        return _text_as_strings(raw.slice(first), cols, text)

    def _read_parquet(self, table: str, cols: list[str], where) -> pa.Table:
        text = TEXT_COLUMNS.get(table, set())
        tested = list(dict.fromkeys(c for c, _ in where or []))
        # text tested as the file's dictionary of it: each distinct word once, no string per row
        file = pq.ParquetFile(self.path / f"{table}.parquet", metadata=self._footer(table),
                              read_dictionary=[c for c in tested if c in text])
        if where is None:
            return file.read(columns=cols)
        others = [c for c in cols if c not in tested]
        parts = []  # a run of row groups at a time, the tested columns first: only the matching rows are ever held,
        for run in row_group_runs(file.metadata, STREAM_BATCH_ROWS):  # and a run with none has nothing else read
            group = file.read_row_groups(run, columns=tested)
            keep = _meeting(group, where, text)
            if keep.any():
                if others:
                    rest = file.read_row_groups(run, columns=others)
                    group = pa.table({c: (group if c in tested else rest).column(c) for c in cols})
                parts.append(group.select(cols).filter(arrow_of(keep)))
        return pa.concat_tables(parts) if parts else file.schema_arrow.empty_table().select(cols)

    def _read_arrow_file(self, table: str, cols: list[str], where) -> pa.Table:
        raw = self._arrow_file(table)
        if where is None:
            return raw.select(cols)
        return raw.select(cols).filter(arrow_of(_meeting(raw, where, TEXT_COLUMNS.get(table, set()))))


def row_group_runs(metadata: pq.FileMetaData, rows: int) -> list[list[int]]:
    """A Parquet file's row groups in runs of consecutive groups of about `rows` rows (at least one group each):
    Nsight Systems writes groups of 2,048 rows, and a read per group would cost more than the reading."""
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    return [list(range(first, stop)) for first, stop in runs_of_about(sizes, rows)]


def _text_as_strings(raw: pa.Table, cols: list[str], text: set[str]) -> pa.Table:
    """A query's columns in `cols` order, whatever the driver named them, text as strings."""
    return pa.table({c: _normalised(raw.column(i), True) if c in text else raw.column(i)
                     for i, c in enumerate(cols)})


def _dictionary_text(table: str, cols: list[str]) -> list[str]:
    """The columns of DICTIONARY_TEXT among those read (Parquet's reader fails on one the file lacks)."""
    return [c for c in DICTIONARY_TEXT.get(table, ()) if c in cols]


def _normalised_table(raw: pa.Table | pa.RecordBatch, cols: list[str], text: set[str],
                      dictionary: set[str] = frozenset()) -> pa.Table:
    return pa.table({c: _normalised(raw.column(c), c in text, c in dictionary) for c in cols})


def _joined(batches: list[pa.RecordBatch]) -> pa.Table:
    """Record batches as one table; a column the driver typed null in a batch of nulls takes the others' type."""
    return pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")


def _tested(col: pa.ChunkedArray, text: bool) -> pa.Array:
    """A column as `_meets` tests it: text read as the file's dictionary kept so."""
    col = one_array(col)
    return col if text and pa.types.is_dictionary(col.type) else _normalised(col, text)


def _meeting(rows: pa.Table, where: list[tuple[str, object]], text: set[str]) -> np.ndarray:
    """Which rows meet one of the (column, test) of `where`."""
    keep = np.zeros(rows.num_rows, bool)
    for column, test in where:
        keep |= _meets(_tested(rows.column(column), column in text), test)
    return keep


def _meets(col: pa.Array, test) -> np.ndarray:
    """Which values hold one of the integers `test`, or (text) contain the word `test` in any case."""
    if not isinstance(test, str):
        return np.isin(numpy_of(col, -1), np.asarray(test, np.int64))
    enc = col.dictionary_encode()
    word = test.lower()
    hit = np.array([word in w.lower() for w in enc.dictionary.to_pylist()], bool)
    codes = numpy_of(enc.indices, -1)
    return np.where(codes >= 0, np.r_[hit, False][codes], False)


def _normalised(col: pa.ChunkedArray | pa.Array, text: bool, dictionary: bool = False) -> pa.Array:
    """Text as strings (`dictionary`: a dictionary of strings read so kept so), anything else as int64 (unsigned ids
    keep their bits, as the export's readers do; floats are truncated and NaN is null; values that are no number are
    null)."""
    col = one_array(col)
    kind = col.type
    if dictionary and text and pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type):
        recorded = col.dictionary
        words = utf8(recorded)
        return col if words is recorded else pa.DictionaryArray.from_arrays(col.indices, words)
    if pa.types.is_dictionary(kind):
        col, kind = col.dictionary_decode(), kind.value_type
    if text:
        if pa.types.is_null(kind):
            return pa.nulls(len(col), pa.string())
        return utf8(col.cast(pa.string(), safe=False))  # unchecked: utf8() replaces what is not UTF-8
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
        return arrow_of(numpy_of(col, False).astype(np.int64), valid=valid_of(col))
    # text in a column of numbers: a damaged export (rare, so pandas may parse it)
    numbers = pd.to_numeric(pd.Series(col.to_pylist(), dtype=object), errors="coerce")
    ok = numbers.notna().to_numpy()
    return arrow_of(numbers.fillna(0).to_numpy().astype(np.int64), valid=ok)


def valid_utf8(col: pa.Array) -> bool:
    try:
        col.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def utf8(col: pa.Array) -> pa.Array:
    """Text with any bytes that are not UTF-8 (a name a program wrote as raw bytes, a damaged export) read as U+FFFD,
    as a text editor shows them: the drivers hand such bytes on unchecked, and every later step would fail on them.
    Only the distinct values are decoded."""
    if valid_utf8(col):
        return col
    codes = col.cast(pa.binary()).dictionary_encode()
    words = [w.decode("utf-8", "replace") for w in codes.dictionary.to_pylist()]
    return pa.DictionaryArray.from_arrays(codes.indices, pa.array(words, pa.string())).dictionary_decode()


def valid_of(col: pa.Array) -> np.ndarray:
    return np.ones(len(col), bool) if not col.null_count else ~numpy_of(col.is_null(), False)


READ_AHEAD = 1  # batches a batched read holds ready beyond the one its caller works on


def read_ahead(parts: Generator, made: Callable = lambda part: part) -> Iterator:
    """made(part) of each part of a read, the next ones read and made in a thread of their own while the caller
    works on the last: the readers let go of Python while they read, so a batch is read as the one before it is
    handled. What the read raises is raised here; a caller that stops early stops the thread, and the read is
    closed in it."""
    ready: queue.Queue = queue.Queue(READ_AHEAD)
    stop = threading.Event()

    def read() -> None:
        try:
            for part in parts:
                part = made(part)
                while not stop.is_set():
                    with contextlib.suppress(queue.Full):
                        ready.put((part, None), timeout=0.05)
                        break
                if stop.is_set():
                    return
            ready.put((None, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            ready.put((None, exc))
        finally:
            parts.close()

    worker = threading.Thread(target=read, name="nsys-recipe-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            part, exc = ready.get()
            if exc is not None:
                try:
                    raise exc
                finally:  # else this frame, which the traceback holds, holds the error: a cycle only a collection
                    del exc  # frees, keeping what the frames of the read's caller hold (files it would remove)
            if part is None:
                return
            yield part
    finally:
        stop.set()
        while worker.is_alive():  # the thread may wait to hand over a part
            with contextlib.suppress(queue.Empty):
                ready.get(timeout=0.05)
        worker.join()


def pid_of(global_id) -> np.ndarray:
    """Bits 24 to 47 of a globalTid or globalPid, taken from int64 as from uint64 (the mask drops the bits an
    arithmetic shift carries in)."""
    return (np.asarray(global_id).astype(np.int64, copy=False) >> PID_SHIFT) & PID_MASK


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
        if len(ids) and ids.null_count == len(ids):  # no id at all, as where every name is text
            return np.array([None], object), np.zeros(len(ids), np.int64)
        return self._words(numpy_of(ids, -1).astype(np.int64))

    def ids_of(self, wanted) -> np.ndarray:
        """The ids whose string is one of `wanted`."""
        return self._ids[np.isin(self.string_table(), list(wanted))]

    def ids_containing(self, word: str) -> np.ndarray:
        """The ids whose string holds `word`, in any case."""
        word = word.lower()
        return self._ids[np.array([isinstance(v, str) and word in v.lower() for v in self.string_table()], bool)]

    def string_table(self) -> np.ndarray:
        """Each id's string, in the order of the ids."""
        if not len(self._ids):
            return np.zeros(0, object)
        return objects_of(self._values.take(arrow_of(self._rows)))

    def _words(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        distinct, where = _distinct(ids)
        words = np.full(len(distinct), None, dtype=object)
        if len(self._ids):
            pos = np.minimum(np.searchsorted(self._ids, distinct), len(self._ids) - 1)
            known = self._ids[pos] == distinct
            if known.any():
                words[known] = objects_of(self._values.take(arrow_of(self._rows[pos[known]])))
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


def string_table(src: ExportSource) -> StringTable:
    s = src.read_arrow("StringIds", ["id", "value"])
    if not {"id", "value"} <= set(s.column_names):
        return StringTable(np.zeros(0, np.int64), pa.nulls(0, pa.string()))
    return StringTable(numpy_of(s.column("id"), -1), one_array(s.column("value")))

def small_table(src: ExportSource, table: str, cols: list[str]) -> dict[str, list]:
    """A few-row table's columns as Python lists (a missing column is left out)."""
    return src.read_arrow(table, cols).to_pydict()
