"""The per-rank data analyses get: `Frame`, Arrow columns read as NumPy arrays, and back to Arrow for outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ..groups import Vocabulary
from ..lazy import pd

FRAME_NAMES = ("nvtx", "kernels", "memcpy", "memset", "runtime", "sync", "mpi", "memory", "gpus", "payloads")


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
            codes, words = column_codes(self.table.column(column))
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
        return one_array(self.table.column(column)).to_numpy(zero_copy_only=False).astype(dtype, copy=False)

    @classmethod
    def from_pandas(cls, df: pd.DataFrame) -> Frame:
        """Raises TypeError for a column whose dtype has no Arrow layout here."""
        cols = {c: _column_to_arrow(df[c]) for c in df.columns}
        return cls(pa.table({c: arr for c, (arr, _) in cols.items()}), {c: t for c, (_, t) in cols.items()})


def column_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A string column (a table's, dictionary-encoded or not) as (codes, words): words[codes] is the column; the
    last word is None (code -1)."""
    if not pa.types.is_dictionary(col.type):  # a damaged export's names that are not strings
        col = col.cast(pa.string()).dictionary_encode()
    col = one_array(col)
    return numpy_of(col.indices, -1).astype(np.int64, copy=False), np.array([*col.dictionary.to_pylist(), None], object)


def dictionary_column(codes: np.ndarray, words) -> pa.DictionaryArray:
    """Codes into a list of strings (-1 = null) as an Arrow dictionary column: per-event results keep
    their names as codes from the workers to the Parquet file. words: also an Arrow array of large strings (made once
    for several columns)."""
    dictionary = words if isinstance(words, pa.Array) else strings_of(words, large=True)
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


def one_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one Arrow array: its only chunk as it is, where pyarrow's combine_chunks copies even that (every
    column of every read batch, faulting fresh pages in)."""
    if not isinstance(col, pa.ChunkedArray):
        return col
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


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


class NameIds(Vocabulary):
    """Names met so far, by id, for maps that read a long capture span by span and refer to names by id (NVTX range
    names and domains). A span's dictionary chunks mostly share one dictionary (the export's strings): its words are
    looked up once, not once a chunk (with them as Arrow rebuilt from Python each time, that took a quarter of
    nvtx_gpu_proj's adding of a span's ranges)."""

    def __init__(self):
        super().__init__()
        self._looked_up: tuple[pa.Array, np.ndarray] | None = None  # the last dictionary and its words' ids, then -1
        self._arrow = strings_of([], large=True)

    def arrow(self) -> pa.Array:
        """The words as an Arrow array, by id."""
        if len(self._arrow) < len(self.words):
            self._arrow = pa.concat_arrays([self._arrow, strings_of(self.words[len(self._arrow):], large=True)])
        return self._arrow

    def ids_in(self, column: pa.ChunkedArray) -> np.ndarray:
        """A span's names (dictionary chunks) as ids (-1: none); only words not met before are looked at in Python."""
        ids = []
        for chunk in column.chunks:
            if self._looked_up is None or not chunk.dictionary.equals(self._looked_up[0]):
                words = chunk.dictionary.cast(pa.large_string())
                at = pc.index_in(words, value_set=self.arrow())
                if at.null_count:  # words not met before: they take the next ids
                    self.ids(words.filter(at.is_null()).to_pylist())
                    at = pc.index_in(words, value_set=self.arrow())
                self._looked_up = chunk.dictionary, np.r_[numpy_of(at, -1).astype(np.int64), -1]
            ids.append(self._looked_up[1][numpy_of(chunk.indices, -1)])
        return np.concatenate(ids or [np.zeros(0, np.int64)])


def objects_of(arr: pa.Array) -> np.ndarray:
    """Arrow strings as a NumPy object array, nulls as None. pyarrow's to_numpy of strings, like every
    conversion of Python values in pa.array, imports pandas (0.3 s of CPU) that a map never needs."""
    out = np.empty(len(arr), dtype=object)
    out[:] = arr.to_pylist()
    return out


def strings_of(words, large: bool = False) -> pa.Array:
    """Python strings (None a null) as an Arrow string array, large: with 64-bit offsets. Built from its
    buffers (see objects_of)."""
    words = np.asarray(words, dtype=object)
    valid = np.not_equal(words, None)
    data = [w.encode() for w in words[valid]]
    sizes = np.zeros(len(words), np.int64)
    sizes[valid] = [len(b) for b in data]
    offsets = np.r_[0, np.cumsum(sizes)]
    if not large and offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{offsets[-1]} bytes of strings: more than an Arrow string array holds")
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(words),
                                 [validity, pa.py_buffer(offsets if large else offsets.astype(np.int32)),
                                  pa.py_buffer(b"".join(data))])


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

def _column_to_arrow(series: pd.Series) -> tuple[pa.Array, str]:
    dtype = str(series.dtype)
    if dtype in ("object", "str"):
        return pa.array(series.to_numpy(object), type=pa.string(), from_pandas=True).dictionary_encode(), dtype
    if dtype in ("int64", "Int64", "bool", "float64", "int32", "uint64"):
        return pa.array(series, from_pandas=True), dtype
    raise TypeError(f"no cached layout for dtype {dtype}")
