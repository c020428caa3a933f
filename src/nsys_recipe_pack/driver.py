"""Maps a recipe over the ranks of one input, the one place that chooses how they are read: each rank's tables whole
and the recipe's `map_rank` over them, or, for a long capture of a recipe with a `stream` (inputs.chunks.Stream),
its tables span by span of time, folded as they come so that the capture is never held whole, and the rest of the
rank whole after them. docs/internals.md, "Long captures", says when and how."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from . import recipes
from .allocator import give_back_freed_memory
from .errors import BadInputError, MissingToolError, MissingTraceError, PackError
from .inputs.chunks import END_OF_TIME, START_OF_TIME, ReadWhole, Stream, prefolded
from .inputs.frames import Frame, arrow_of, numpy_of
from .inputs.rank_data import RankData, Reading, SpanRead
from .spill import remove_spilled

# what the reduce needs to know of each rank besides its result: key -> RankData attribute
IDENTITY = {"file": "file", "read_from": "read_from", "pid": "pid", "candidates": "rank_candidates", "host": "host",
            "local_rank": "local_rank", "gpu": "gpu", "session_start_ns": "session_start_ns",
            "synthetic": "synthetic", "unclosed_ranges": "unclosed_ranges", "read_note": "read_note"}


def map_file(path: str, recipe: str, options: dict, nsys_path: str | None = None) -> list[dict]:
    """Load one input and run the recipe's per-rank analysis on each rank it holds."""
    spec = recipes.get(recipe)
    stream = spec.stream_given(options)
    try:
        with reading_for(spec, path, options, nsys_path) as reading:
            folded = fold_ranks(reading, stream) if stream is not None and reading.long(stream) else None
            if folded is not None:
                return [map_rank_data(spec, rank_data, options, result) for rank_data, result in folded]
            ranks = reading.ranks()
        return [map_rank_data(spec, rank_data, options) for rank_data in ranks]
    except MissingToolError:
        raise
    except PackError as exc:  # a bad input: reported with all the others, or skipped with --skip-bad
        return [{"bad_file": str(path), "reason": str(exc)}]


def reading_for(spec, path, options: dict, nsys_path: str | None = None, needs: set | None = None) -> Reading:
    """One input opened for what the recipe reads with these options (needs: other needs)."""
    return Reading(Path(path), set(needs or spec.needs_given(options)), nsys_path, spec.rows_given(options),
                   spec.bytes_per_row)


def map_rank_data(spec, rank_data, options: dict, folded: dict | None = None) -> dict:
    """`rank_map`, with what the reduce needs to know of the rank."""
    try:
        res = rank_map(spec, rank_data, options, folded)
    except MissingTraceError as exc:  # nothing to say about this rank; fatal only if true of all
        remove_spilled(folded)  # what a long capture's map wrote as it went, unused
        res = {"missing": str(exc)}
    res["identity"] = {key: getattr(rank_data, attr) for key, attr in IDENTITY.items()}
    return res


def rank_map(spec, rank_data, options: dict, folded: dict | None = None) -> dict:
    """The recipe's map of one rank: its `map_rank` over the rank's tables, or (folded: the rank's result of the
    recipe's stream, where its tables were read span by span) that result, completed as the stream says."""
    if folded is None:
        return spec.map_rank(rank_data, options)
    stream = spec.stream
    for need in stream.requires:
        rank_data.require(need, spec.name)
    if "error" in folded:
        raise BadInputError(f"{rank_data.file}: {folded['error']}")
    return stream.complete(rank_data, folded, options) if stream.complete is not None else folded


def fold_rank(stream: Stream, rank_data: RankData, options: dict | None = None) -> dict | None:
    """A stream's result over one rank read whole: what its `prepare` reads ahead and each table of its spans come as
    one part (`_RankAhead`, one span of time), every row as the rank's process's. A recipe's `map_rank` that is this
    has one analysis for a report read whole and a long capture. None where the stream gives the rank nothing."""
    pid = rank_data.pid if rank_data.pid is not None else 0
    ahead = _RankAhead(rank_data, pid)
    state = stream.prepare(ahead, {**stream.options, **(options or {})}) if stream.prepare else {}
    given = stream.replayed(state) if stream.replayed else {}
    chunk = {need: ahead.span(need, stream.view) for need in stream.needs}
    for need, rows in given.items():
        parts = list(rows)
        chunk[need] = pa.concat_tables(parts) if parts else None
    span = stream.prefold(state, {}, START_OF_TIME, END_OF_TIME, chunk) if stream.prefold else chunk
    stream.fold(state, START_OF_TIME, END_OF_TIME, span)
    nvtx = rank_data.frame("nvtx")
    names = list(nvtx.codes("name")[1][:-1]) if nvtx is not None else []
    return stream.finish(state, names).get(pid)


class _RankAhead:
    """A rank read whole, as a stream's `prepare` reads ahead of the spans (inputs.chunks.Ahead): each table in one
    part, its rows all of one process (the rank's: a rank may hold rows of others, which a whole read counts as its
    own)."""

    def __init__(self, rank_data: RankData, pid: int):
        self.rank_data, self.pid = rank_data, pid
        self.extents = self  # what a stream asks of the extents: the processes with rows in a table

    def pids(self, attr: str) -> set[int]:
        frame = self.rank_data.frame(attr)
        return {self.pid} if frame is not None and len(frame) else set()

    def frame(self, need: str) -> Frame | None:
        frame = self.rank_data.frame_for(need)
        if frame is None or "pid" not in frame or not len(frame):
            return frame
        pid = frame.values("pid")
        if (pid == self.pid).all():
            return frame
        table = frame.table
        return Frame(table.set_column(table.column_names.index("pid"), "pid",
                                      arrow_of(np.full(len(frame), self.pid, np.int64))), frame.dtypes)

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


def fold_ranks(reading: Reading, stream: Stream) -> list[tuple[RankData, dict]] | None:
    """Each rank with its result of the stream's fold, the stream's tables read span by span and the rest whole after
    them; None where the spans cannot give what a whole read gives (a table out of time order, or processes the
    stream did not tell apart as the ranks are): the caller then reads the input whole."""
    read = reading.spans(stream)
    try:
        results = _fold(read, stream)
    except ReadWhole:
        return None
    ranks = reading.ranks(after=read)
    if len(ranks) == 1:  # one rank: all the input's processes (its map is not the sum of theirs where there are some)
        folded = [next(iter(results.values())) if len(results) == 1 else None]
    else:
        folded = [results.get(rank_data.pid) for rank_data in ranks]
    if any(f is None for f in folded):
        remove_spilled(results)
        return None
    return list(zip(ranks, folded, strict=True))


def _fold(read: SpanRead, stream: Stream) -> dict:
    """pid -> the stream's result for that process, its tables read span by span."""
    state = stream.prepare(read.reader_ahead(), stream.options) if stream.prepare else {}
    give_back_freed_memory()  # what the reads ahead let go, before the spans
    given = stream.replayed(state) if stream.replayed else {}
    chunks = read.chunks(given)
    if stream.prefold:
        chunks = prefolded(chunks, stream.prefold, state)
    with contextlib.closing(chunks):  # its reading threads stopped before any whole read
        for span_start, span_end, chunk in chunks:
            stream.fold(state, span_start, span_end, chunk)
    return stream.finish(state, read.names())
