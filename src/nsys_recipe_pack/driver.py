"""Maps a recipe over the ranks of one input, the one place that chooses how they are read: each rank's tables whole,
or, for a long capture of a recipe with a `stream` (inputs.chunks.Stream), the stream's tables span by span of time,
folded as they come so that the capture is never held whole, and the rest of the rank whole after them. Either way
the recipe's `map_rank` then maps the rank; `fold_rank` gives it its stream's result, folded over the rank read
whole as one span (`RankAhead`) or over the spans (`SpanRead`) by the same `_fold`. docs/internals.md, "Long
captures", says when and how."""

from __future__ import annotations

import contextlib
from pathlib import Path

from . import recipes
from .errors import MissingToolError, MissingTraceError, PackError
from .inputs.chunks import ReadWhole, Stream, prefolded
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
    try:
        with reading_for(spec, path, options, nsys_path, spill_dir=spill_dir) as reading:
            long = spec.stream is not None and reading.long(spec.stream)
            ranks = fold_ranks(reading, spec.stream, options) if long else None
            if ranks is None:
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


def map_rank_data(spec, rank_data, options: dict) -> dict:
    """The recipe's `map_rank`, with what the reduce needs to know of the rank."""
    try:
        res = spec.map_rank(rank_data, options)
    except MissingTraceError as exc:  # nothing to say about this rank; fatal only if true of all
        remove_spilled(rank_data.streamed)  # what a long capture's map wrote as it went, unused
        res = {"missing": str(exc)}
    res["identity"] = {key: getattr(rank_data, attr) for key, attr in IDENTITY.items()}
    return res


def fold_rank(stream: Stream, rank_data: RankData, options: dict | None = None, processes: bool = False) -> dict | None:
    """A stream's result for one rank: the driver's, where it read the rank span by span (`RankData.streamed`), else
    its fold over the rank read whole, what its `prepare` reads ahead and each table of its span as one part, every
    row as the rank's process's. A recipe's `map_rank` built on this has one analysis for a report read whole and a
    long capture. None where the stream gives the rank nothing; a result that is an error (`{"error": text}`) is
    raised as a whole read raises it. processes: each row keeps its process, for a stream that gives one result for
    several (nvtx_gpu_proj's)."""
    result = rank_data.streamed
    if result is None:
        pid = rank_data.pid if rank_data.pid is not None else 0
        results = _fold(RankAhead(rank_data, None if processes else pid, stream), stream, options or {})
        result = next(iter(results.values()), None) if processes else results.get(pid)
    if result is not None and "error" in result:
        raise iteration_error(rank_data.file, result["error"])
    return result


def fold_ranks(reading: Reading, stream: Stream, options: dict) -> list[RankData] | None:
    """Each rank with its result of the stream's fold (`RankData.streamed`), the stream's tables read span by span
    and the rest whole after them; None where the spans cannot give what a whole read gives (a table out of time
    order, or processes the stream did not tell apart as the ranks are): the caller then reads the input whole."""
    read = reading.spans(stream)
    try:
        results = _fold(read, stream, options)
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
    for rank_data, result in zip(ranks, folded, strict=True):
        rank_data.streamed = result
    return ranks


def _fold(reader: RankAhead | SpanRead, stream: Stream, options: dict) -> dict:
    """pid -> the stream's result for that process: its `prepare` over what the reader reads ahead, then its `fold`
    over each span the reader gives, then its `finish`; what `prepare` asked of the reading (chunks.AheadRequests)
    done on the way."""
    ahead = reader.ahead()
    state = stream.prepare(ahead, options) if stream.prepare else {}
    reader.ahead_done()
    chunks = reader.chunks(ahead.replays)
    if ahead.prefold_work is not None:
        chunks = prefolded(chunks, ahead.prefold_work, state)
    output, make = ahead.output_to or (None, None)
    writer = reader.writer(make) if output is not None else None
    with contextlib.closing(chunks):  # its reading threads stopped before any whole read
        for span_start, span_end, chunk in chunks:
            rows = stream.fold(state, span_start, span_end, chunk)
            if writer is not None and rows is not None:
                writer.write(rows)
    results = stream.finish(state, reader.names())
    if writer is not None and results:  # a stream with an output gives one result: its one process's, or None's
        (result,) = results.values()
        if result is not None:
            result[output] = writer.close(result[output])
    return results
