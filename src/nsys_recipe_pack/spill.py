"""Per-event output too long to hold (one row per NVTX range of an hour-long capture): written a piece at a time to
a file while the map reads the capture, read back a piece at a time when the output folder is written
(`RankedRows.write_parquet`, from runner.write_tables), or already written as the output of a run of one rank, as
its file. Outputs of usual size stay in memory as Arrow tables.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from .errors import PackError
from .inputs.frames import arrow_of, numpy_of, one_array
from .inputs.readers import read_ahead
from .lazy import pd

ROW_GROUP_ROWS = 1 << 20  # rows per Parquet row group of a table written in pieces
# a run of one report gives its process this rank unless the report names another: what a spill written as the output
# itself holds (SpillWriter's `output`)
SPILLED_RANK = 0


def output_schema(dtypes: dict) -> pa.Schema:
    """The Arrow schema pandas writes for a frame of these dtypes (its metadata gives readers them back): a table
    written a rank at a time reads back as the frame written whole would. A row of each, as an empty text column of
    dtype object would have no type."""
    return pa.Schema.from_pandas(pd.DataFrame({c: pd.Series(["" if d in ("str", "object") else 0], dtype=d)
                                               for c, d in dtypes.items()}), preserve_index=False)


def check_seen(path: str) -> None:
    """A file a worker wrote (a rank's results, or part of the output) must be where this process reads: a worker on
    another node writes into the output folder, which only a shared filesystem shows here."""
    if not os.path.exists(path):
        raise PackError(f"{path}: a worker wrote it, and this machine does not see it; write the output to a folder "
                        "every node sees (--output on a shared filesystem)")


@dataclass
class SpilledRows:
    """Rows in the order of an integer `key` column, in a file (of Arrow IPC batches, or with `output`, the Parquet
    file of a table's output, its rank SPILLED_RANK), and `late`: rows that were finished after rows with a greater
    key had been written, merged back into their places on reading."""

    path: str
    key: str
    late: pa.Table
    num_rows: int = 0
    output: pa.Schema | None = None

    def is_output(self, schema: pa.Schema, rank: int) -> bool:
        """Whether the file is already the output of one rank in this schema, all its rows in place."""
        return (self.output is not None and self.output.equals(schema, check_metadata=True) and rank == SPILLED_RANK
                and not self.late.num_rows)

    def batches(self) -> Iterator[pa.Table]:
        check_seen(self.path)
        late_keys = numpy_of(self.late.column(self.key)) if self.late.num_rows else np.zeros(0, np.int64)
        taken = 0
        for rows in self._pieces():
            if not rows.num_rows:
                continue
            cut = int(np.searchsorted(late_keys, numpy_of(rows.column(self.key))[-1], side="right"))
            if cut > taken:
                rows = _in_key_order(pa.concat_tables([rows, self.late.slice(taken, cut - taken)]), self.key)
                taken = cut
            yield rows
        if taken < self.late.num_rows:
            yield self.late.slice(taken)

    def _pieces(self) -> Iterator[pa.Table]:
        """The file's rows as written, without the output's rank."""
        if self.output is not None:
            file = pq.ParquetFile(self.path)
            for group in range(file.num_row_groups):
                yield file.read_row_group(group, columns=self.late.column_names)
            return
        with pa.OSFile(self.path, "rb") as source:
            for batch in ipc.open_stream(source):
                yield pa.Table.from_batches([batch])

    def remove(self) -> None:
        _remove(self.path)


def parquet_options(schema: pa.Schema) -> dict:
    """How an output table is written: dictionary-encoded only in the columns of few distinct values (names, kinds,
    processes, threads, levels). A time (`_ns`) or an id (`_id`) has about as many as rows, so trying a dictionary
    on it first is wasted work; as integers they are delta-encoded, close to each other as they mostly are (a
    smaller file, written and read back quicker). Text has no statistics: rows are never in order of a name, so its
    least and greatest words let a reader skip nothing and only cost time to find; numbers keep theirs (a time's
    lets a reader skip row groups)."""
    many = [f for f in schema if f.name.endswith(("_ns", "_id"))]
    return {"use_dictionary": [f.name for f in schema if f not in many],
            "column_encoding": {f.name: "DELTA_BINARY_PACKED" for f in many if pa.types.is_integer(f.type)},
            "write_statistics": [f.name for f in schema if not _is_text(f.type)]}


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _in_key_order(rows: pa.Table, key: str) -> pa.Table:
    return rows.take(arrow_of(np.argsort(numpy_of(rows.column(key)), kind="stable")))


WRITES_AHEAD = 2  # pieces a SpillWriter holds while its thread encodes and writes the ones before
SPILLED_GROUP_ROWS = 1 << 18  # rows per row group of a spill written as an output (held until written)
WORDS_KEPT_BYTES = 1 << 18  # a row group's dictionary kept whole up to this size (the writer's page limit is 1 MiB)


class SpillWriter:
    """Writes a table's rows a piece at a time, in `key` order, to a temporary file in `folder` (the run's output
    folder being written, where the runner gives one; else TMPDIR, which is often memory): LZ4-compressed Arrow, or
    with `output` (the schema of the table's output, its first column the rank), the output's Parquet file for
    SPILLED_RANK, which a run whose only rank that is takes as it is (RankedRows.write_parquet) and any other reads
    back. A thread of its own writes each piece (Arrow lets go of Python meanwhile) while the map goes on."""

    def __init__(self, schema: pa.Schema, key: str, folder: str | None = None, output: pa.Schema | None = None):
        fd, self.path = tempfile.mkstemp(prefix=".nsys-recipe-spill-", suffix=".arrows" if output is None else
                                         ".parquet", dir=folder if folder and os.path.isdir(folder) else None)
        os.close(fd)
        self.key, self.schema, self.output, self.rows = key, schema, output, 0
        self._sink = pa.OSFile(self.path, "wb")
        self._coded = None
        if output is None:
            self._writer = ipc.new_stream(self._sink, schema, options=ipc.IpcWriteOptions(compression="lz4"))
        else:  # text the map gives as codes written as codes (_coded), the file saying what it is (close)
            self._coded = pa.schema([_coded_field(f, schema) for f in output])
            self._writer = pq.ParquetWriter(self._sink, self._coded, store_schema=False, **parquet_options(output))
        self._held: list[pa.Table] = []  # pieces of the next row group of a Parquet file, the writing thread's
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="nsys-recipe-spill")
        self._written: deque[Future] = deque()
        # a map given up half way (its read failed, or its tables are read whole instead) leaves no file behind
        self._unclosed = weakref.finalize(self, _give_up, self._thread, self.path)

    def write(self, rows: pa.Table) -> None:
        if rows.num_rows:
            while len(self._written) >= WRITES_AHEAD:
                self._written.popleft().result()  # what the write raised, raised here
            self._written.append(self._thread.submit(_write_piece, self._writer, self._held, rows, self.schema,
                                                     self._coded))
            self.rows += rows.num_rows

    def close(self, late: pa.Table | None = None) -> SpilledRows:
        if self.output is not None:  # the last row group
            self._written.append(self._thread.submit(_write_piece, self._writer, self._held, self.schema.empty_table(),
                                                     self.schema, self._coded, True))
        while self._written:
            self._written.popleft().result()
        self._thread.shutdown()
        if self.output is not None:  # the metadata a write of `output` itself stores: readers get its types
            self._writer.add_key_value_metadata({**(self.output.metadata or {}),
                                                 b"ARROW:schema": base64.b64encode(self.output.serialize())})
        self._writer.close()
        self._sink.close()
        self._unclosed.detach()
        late = self.schema.empty_table() if late is None else _in_key_order(late.cast(self.schema), self.key)
        if self.output is not None:  # read back as the file holds them
            late = late.cast(pa.schema([self.output.field(c) for c in self.schema.names]))
        return SpilledRows(self.path, self.key, late, self.rows + late.num_rows, self.output)


def _write_piece(writer, held: list[pa.Table], rows: pa.Table, schema: pa.Schema, coded: pa.Schema | None,
                 last: bool = False) -> None:
    """A SpillWriter's piece written in its thread (given what it writes with, not the SpillWriter, whose last
    reference would otherwise go in that thread, where its clean-up cannot wait for the thread to end); coded: the
    schema of an output's row groups as written."""
    if coded is None:
        writer.write_table(rows.cast(schema))
        return
    if rows.num_rows:
        held.append(rows)
    count = sum(t.num_rows for t in held)
    if count >= SPILLED_GROUP_ROWS or last and count:
        rows = pa.concat_tables([t.cast(schema) for t in held])
        held.clear()
        rows = rows.add_column(0, coded.names[0], arrow_of(np.full(rows.num_rows, SPILLED_RANK, np.int64)))
        rows = pa.table([_used_words(rows.column(f.name)) if pa.types.is_dictionary(f.type) else rows.column(f.name)
                         for f in coded], schema=coded)
        writer.write_table(rows, row_group_size=rows.num_rows)


def _coded_field(field: pa.Field, schema: pa.Schema) -> pa.Field:
    """An output's text column as the codes `schema` gives it in (a dictionary of that text): the Parquet writer takes
    a row group's codes as they are, where it would look every row's words up again."""
    given = schema.field(field.name) if field.name in schema.names else None
    if given is not None and pa.types.is_dictionary(given.type) and given.type.value_type == field.type:
        return field.with_type(given.type)
    return field


def _used_words(column: pa.ChunkedArray) -> pa.DictionaryArray:
    """A dictionary column as one array over one dictionary, each word in it once: at another dictionary the writer
    would take every row's words again. Where the chunks' dictionaries are each the start of the longest (the names
    met so far, as a map gives them) and it is short, that one, the codes as they are; else only the words used (a
    dictionary past the writer's page limit has it write the words plainly)."""
    longest = max((c.dictionary for c in column.chunks), key=len, default=None)
    if longest is not None and longest.nbytes <= WORDS_KEPT_BYTES and \
            all(longest.slice(0, len(c.dictionary)).equals(c.dictionary) for c in column.chunks) and \
            pc.count_distinct(longest, mode="all").as_py() == len(longest):
        indices = pa.chunked_array([c.indices for c in column.chunks], column.type.index_type)
        return pa.DictionaryArray.from_arrays(one_array(indices), longest)
    dictionaries = [c.dictionary for c in column.chunks]
    first = np.cumsum([1, *map(len, dictionaries)])  # each chunk's first code among all their words, 0 for a null
    code = np.empty(len(column), np.int32)
    at = 0
    for chunk, offset in zip(column.chunks, first.tolist(), strict=False):
        code[at:at + len(chunk)] = numpy_of(chunk.indices, -offset)
        code[at:at + len(chunk)] += offset
        at += len(chunk)
    used = np.flatnonzero(np.bincount(code, minlength=int(first[-1]))[1:])
    words = pa.concat_arrays([pa.array([], column.type.value_type), *dictionaries]).take(arrow_of(used))
    once = words.dictionary_encode()  # a word in several chunks' dictionaries
    place = np.full(int(first[-1]), -1, np.int32)
    place[used + 1] = numpy_of(once.indices)
    code = place[code]
    return pa.DictionaryArray.from_arrays(arrow_of(code, valid=code >= 0 if column.null_count else None),
                                          once.dictionary)


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


def _give_up(thread: ThreadPoolExecutor, path: str) -> None:
    thread.shutdown(cancel_futures=True)
    _remove(path)


@dataclass
class RankedRows:
    """One output table made of each rank's rows (an Arrow table, a StoredTable or SpilledRows) one after another,
    with a leading `rank` column: written to Parquet a row group at a time, never held whole. With `made`, a part
    is what made(rank, part) turns into the rank's rows (an Arrow table) as they are written: rows that need what
    every rank gave (an iteration's earliest start) are then made a rank at a time too."""

    schema: pa.Schema  # with the `rank` column first; its pandas metadata gives readers the pandas dtypes
    parts: list[tuple[int, object]] = field(default_factory=list)
    made: Callable | None = None

    def tables(self) -> Iterator[pa.Table]:
        for rank, rows in self.parts:
            if self.made is not None:
                rows = self.made(rank, rows)
            for piece in (rows.batches() if isinstance(rows, SpilledRows) else [table_of(rows)]):
                piece = piece.add_column(0, "rank", arrow_of(np.full(piece.num_rows, rank, np.int64)))
                yield piece.select(self.schema.names).cast(self.schema)

    def to_pandas(self) -> pd.DataFrame:
        """The whole table as its Parquet file reads back (a few ranks' rows: tests, small runs)."""
        return pa.concat_tables([self.schema.empty_table(), *self.tables()]).to_pandas()

    def _row_groups(self) -> Iterator[pa.Table]:
        """Row groups of about ROW_GROUP_ROWS, each text column's dictionaries (a rank's names each) one: the writer
        takes a row group's codes as they are where its dictionary does not change."""
        held: list[pa.Table] = []
        coded = any(pa.types.is_dictionary(f.type) for f in self.schema)
        for piece in self.tables():
            held.append(piece)
            if sum(t.num_rows for t in held) >= ROW_GROUP_ROWS:
                yield pa.concat_tables(held).unify_dictionaries() if coded else pa.concat_tables(held)
                held = []
        if held or not self.parts:
            rows = pa.concat_tables(held) if held else self.schema.empty_table()
            yield rows.unify_dictionaries() if coded else rows

    def write_parquet(self, path) -> None:
        """The next row group is read back (a spill's LZ4 undone) and put together in a thread of its own while
        this one is encoded, which Arrow does letting go of Python. One rank's rows written as the output already
        (SpillWriter's `output`) are the file."""
        if len(self.parts) == 1 and isinstance(self.parts[0][1], SpilledRows) and \
                self.parts[0][1].is_output(self.schema, self.parts[0][0]):
            with open(path, "wb"):  # made as any output file is, for the spill to take its mode (not a temp file's)
                pass
            shutil.copymode(path, self.parts[0][1].path)
            shutil.move(self.parts[0][1].path, path)
            return
        # text kept as Arrow dictionaries is written without the Arrow schema, to read back as plain text
        coded = any(pa.types.is_dictionary(f.type) for f in self.schema)
        with pq.ParquetWriter(str(path), self.schema, store_schema=not coded, **parquet_options(self.schema)) as writer:
            for rows in read_ahead(self._row_groups()):
                writer.write_table(rows, row_group_size=ROW_GROUP_ROWS)


@dataclass(frozen=True)
class StoredTable:
    """A map's Arrow table where the worker that made it wrote it (one Arrow IPC stream of a file in the output folder
    being written, runner.MAP_RESULTS), read when the reduce needs it: a reduce over thousands of ranks then holds a
    few ranks' tables at a time, in memory it gives back (a memory map of them all would stay resident)."""

    path: str
    offset: int
    size: int
    num_rows: int

    def __len__(self) -> int:
        return self.num_rows

    def read(self, columns: list[str] | None = None) -> pa.Table:
        check_seen(self.path)
        with pa.OSFile(self.path, "rb") as source:
            source.seek(self.offset)
            table = ipc.open_stream(source.read_buffer(self.size)).read_all()
        return table if columns is None else table.select(columns)


def table_of(value, columns: list[str] | None = None) -> pa.Table:
    """A map's table as given to the reduce (an Arrow table, or a StoredTable), these columns of it."""
    if isinstance(value, StoredTable):
        return value.read(columns)
    return value if columns is None else value.select(columns)


def remove_spilled(mapped) -> None:
    """Remove the files of every SpilledRows among map results (lists of result dicts, nested as the runner
    keeps them)."""
    if isinstance(mapped, SpilledRows):
        mapped.remove()
    elif isinstance(mapped, dict):
        for value in mapped.values():
            remove_spilled(value)
    elif isinstance(mapped, list | tuple):
        for value in mapped:
            remove_spilled(value)


COLUMN_FLUSH_BYTES = 32 << 20  # what a ColumnFiles holds before it writes it out


class ColumnFiles:
    """NumPy columns too long to hold at once, appended a piece at a time to a file per (part, column) in a scratch
    folder (beside the maps' tables in the output folder being written, where they are files; else TMPDIR) and read
    back a part at a time: a reduce over ten thousand ranks regroups their rows by iteration this way. The folder
    goes on close. columns: each column's dtype."""

    def __init__(self, columns: dict, near: str | None = None):
        self.folder = tempfile.mkdtemp(prefix=".nsys-recipe-columns-", dir=near if near and os.path.isdir(near)
                                       else None)
        self.dtypes = {c: np.dtype(d) for c, d in columns.items()}
        self._held: list[tuple[np.ndarray, dict]] = []
        self._bytes = 0

    def hold(self, part: np.ndarray, columns: dict) -> None:
        """Rows for the parts each names (part: per row), written a part at a time once COLUMN_FLUSH_BYTES of them are
        held (and by `flush`), each part's in the order they came."""
        self._held.append((part, columns))
        self._bytes += part.nbytes + sum(v.nbytes for v in columns.values())
        if self._bytes >= COLUMN_FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self._held:
            return
        part = np.concatenate([h[0] for h in self._held])
        columns = {c: np.concatenate([h[1][c] for h in self._held]) for c in self._held[0][1]}
        self._held, self._bytes = [], 0
        order = np.argsort(part, kind="stable")
        bounds = np.r_[0, np.cumsum(np.bincount(part))]
        for i in np.flatnonzero(np.diff(bounds)).tolist():
            at = order[bounds[i]:bounds[i + 1]]
            for c, values in columns.items():
                self.append(i, c, values[at])

    def _path(self, part: int, column: str) -> str:
        return os.path.join(self.folder, f"{part}.{column}")

    def append(self, part: int, column: str, values: np.ndarray) -> None:
        with open(self._path(part, column), "ab") as file:
            np.ascontiguousarray(values, self.dtypes[column]).tofile(file)

    def read(self, part: int, column: str) -> np.ndarray:
        path = self._path(part, column)
        return np.fromfile(path, self.dtypes[column]) if os.path.exists(path) else np.zeros(0, self.dtypes[column])

    def drop(self, part: int, column: str) -> None:
        _remove(self._path(part, column))

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ColumnFiles:
        return self

    def __exit__(self, *_) -> None:
        self.close()


def folder_of(tables) -> str | None:
    """The folder of the first of these map tables that is in a file (spill.StoredTable), None where none is."""
    return next((os.path.dirname(t.path) for t in tables if isinstance(t, StoredTable)), None)
