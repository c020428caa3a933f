"""Maps a recipe over the ranks of one input, the one place that chooses how they are read: each rank's tables whole
and the recipe's `map_rank` over them, or, for a long capture of a recipe with a `stream` (inputs.chunks.Stream),
its tables span by span of time, folded as they come so that the capture is never held whole, and the rest of the
rank whole after them. docs/internals.md, "Long captures", says when and how."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa

from . import recipes
from .allocator import give_back_freed_memory
from .errors import MissingToolError, MissingTraceError, PackError
from .inputs.chunks import END_OF_TIME, START_OF_TIME, ReadWhole, Stream, prefolded
from .inputs.rank_data import RankAhead, RankData, Reading, SpanRead
from .iterations import iteration_error
from .spill import remove_spilled

# what the reduce needs to know of each rank besides its result: key -> RankData attribute
IDENTITY = {"file": "file", "read_from": "read_from", "pid": "pid", "candidates": "rank_candidates", "host": "host",
            "local_rank": "local_rank", "gpu": "gpu", "session_start_ns": "session_start_ns",
            "synthetic": "synthetic", "unclosed_ranges": "unclosed_ranges", "read_note": "read_note",
            "program": "program"}


def map_file(path: str, recipe: str, options: dict, nsys_path: str | None = None,
             spill_dir: str | None = None) -> list[dict]:
    """Load one input and run the recipe's per-rank analysis on each rank it holds. spill_dir: where a long capture's
    map keeps what it holds beyond memory and writes its long output (the output folder being written)."""
    spec = recipes.get(recipe)
    stream = spec.stream_given(options)
    try:
        with reading_for(spec, path, options, nsys_path, spill_dir=spill_dir) as reading:
            folded = fold_ranks(reading, stream) if stream is not None and reading.long(stream) else None
            if folded is not None:
                return [map_rank_data(spec, rank_data, options, result) for rank_data, result in folded]
            ranks = reading.ranks()
        return [map_rank_data(spec, rank_data, options) for rank_data in ranks]
    except MissingToolError:
        raise
    except PackError as exc:  # a bad input: reported with all the others, or skipped with --skip-bad
        return [{"bad_file": str(path), "reason": str(exc)}]


def reading_for(spec, path, options: dict, nsys_path: str | None = None, needs: set | None = None,
                spill_dir: str | None = None) -> Reading:
    """One input opened for what the recipe reads with these options (needs: other needs)."""
    return Reading(Path(path), set(needs or spec.needs_given(options)), nsys_path, spec.rows_given(options),
                   spec.bytes_per_row, spill_dir=spill_dir)


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
    _raise_error(rank_data, folded)
    return stream.complete(rank_data, folded, options) if stream.complete is not None else folded


def fold_rank(stream: Stream, rank_data: RankData, options: dict | None = None, processes: bool = False) -> dict | None:
    """A stream's result over one rank read whole: what its `prepare` reads ahead and each table of its spans come as
    one part (`RankAhead`, one span of time), every row as the rank's process's. A recipe's `map_rank` that is this
    has one analysis for a report read whole and a long capture. None where the stream gives the rank nothing. A
    stream's `output` is the rows its one fold finished (all of them: it is the last span). processes: each row keeps
    its process, for a stream that gives one result for several (nvtx_gpu_proj's)."""
    pid = rank_data.pid if rank_data.pid is not None else 0
    ahead = RankAhead(rank_data, None if processes else pid)
    state = stream.prepare(ahead, {**stream.options, **(options or {})}) if stream.prepare else {}
    given = stream.replayed(state) if stream.replayed else {}
    chunk = {need: ahead.span(need, stream.view) for need in stream.needs}
    for need, rows in given.items():
        parts = list(rows)
        chunk[need] = pa.concat_tables(parts) if parts else None
    span = stream.prefold(state, {}, START_OF_TIME, END_OF_TIME, chunk) if stream.prefold else chunk
    rows = stream.fold(state, START_OF_TIME, END_OF_TIME, span)
    nvtx = rank_data.frame("nvtx")
    names = list(nvtx.codes("name")[1][:-1]) if nvtx is not None else []
    finished = stream.finish(state, names)
    result = next(iter(finished.values()), None) if processes else finished.get(pid)
    _raise_error(rank_data, result)
    if stream.output is not None and result is not None:
        result[stream.output] = rows
    return result


def _raise_error(rank_data: RankData, result: dict | None) -> None:
    """A stream's result that is the error of its rank (`{"error": text}`), raised as a whole read raises it."""
    if result is not None and "error" in result:
        raise iteration_error(rank_data.file, result["error"])


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
    writer = stream.output_writer(read.spill_dir) if stream.output else None
    with contextlib.closing(chunks):  # its reading threads stopped before any whole read
        for span_start, span_end, chunk in chunks:
            rows = stream.fold(state, span_start, span_end, chunk)
            if writer is not None and rows is not None:
                writer.write(rows)
    results = stream.finish(state, read.names())
    if writer is not None:  # a stream with an output gives one result: its one process's, or None's (several)
        (result,) = results.values()
        result[stream.output] = writer.close(result[stream.output])
    return results
