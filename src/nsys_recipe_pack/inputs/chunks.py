"""Several event tables read together in time order, a span of time at a time, for recipes whose map adds up over
time (their `Stream`, which nsys_recipe_pack.driver runs): an hour-long capture then never has to be held whole.

Nsight Systems exports every event table sorted by start. `time_chunks` reads each table a batch at a time and
hands over, span after span, every row of every table that starts in the span: a row starting before the span's
end is in it or in an earlier one. A table found out of order raises `NotSorted` before anything is handed over
twice, and the caller reads the tables whole instead. Each table is read, made into frames and viewed in a thread of
its own, a batch ahead of the spans, while the recipe folds the last span in (most of that work lets go of Python).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..groups import distinct, one_of
from .batches import RANGE_EVENTS, Extents, KeptRows, batch_frames
from .events import DOMAIN_CREATE
from .frames import Frame, numpy_of
from .readers import SQLITE_READERS, TABLES, ExportSource, StringTable, read_ahead

END_OF_TIME = np.iinfo(np.int64).max
START_OF_TIME = np.iinfo(np.int64).min


STREAM_MIN_ROWS = 2_000_000  # tables shorter than this are read whole (and their frames cached for warm runs)


@dataclass(frozen=True)
class Stream:
    """A recipe's map as a fold over time: a rank read whole is one span, a long capture many (`time_chunks`), and
    nsys_recipe_pack.driver runs both the same way; nothing in inputs does.

    needs: need -> the export columns its spans read (None: all those of `readers.TABLES`), in the order read;
    view(need, batch Frame) -> the plain Arrow columns (start_ns and pid among them) a span's rows carry;
    fold(state, span start, span end, need -> rows) adds one span into `state`, and gives the rows of the reading's
    output it finished (`AheadRequests.output`), or None;
    finish(state, NVTX names) -> pid -> the map's result for that process ({"error": text}: that error);
    prepare(ahead, options) -> the state before the first span (an empty dict without it): what a fold must know
    ahead of the spans, read (`Ahead`) from the tables of the needs in `ahead` (counted in the progress from the
    start; others cost a read more); it may ask the reading for more (`AheadRequests`)."""

    needs: dict
    view: Callable
    fold: Callable
    finish: Callable
    prepare: Callable | None = None
    ahead: tuple[str, ...] = ()


class AheadRequests:
    """What a stream's `prepare` may ask of the reading besides the tables it reads ahead: a need's rows kept from
    its read ahead, which the spans take instead of reading the table again (`replay`: tables in order of start,
    as `view` gives a span's); work on each span that needs only its rows, what `prepare` made and what the spans
    before it left in `carried` (a dict), done a span ahead of the fold in a thread of its own (`prefold`:
    work(state, carried, span start, span end, need -> rows) -> what the fold is handed instead); and a table too
    long to hold, one row per event (`output`): the fold gives the rows it finished a span at a time, written as
    they come into the output folder by `writer(folder)` (spill.SpillWriter), and `finish` gives in its place the
    rows finished late (or None), which the writer puts back in their places."""

    replays: dict
    prefold_work: Callable | None
    output_to: tuple[str, Callable] | None

    def _requests(self) -> None:
        self.replays, self.prefold_work, self.output_to = {}, None, None

    def replay(self, need: str, rows: Iterator[pa.Table]) -> None:
        self.replays[need] = rows

    def prefold(self, work: Callable) -> None:
        self.prefold_work = work

    def output(self, name: str, writer: Callable) -> None:
        self.output_to = (name, writer)


class ReadWhole(Exception):
    """Spans cannot give the answer a whole read gives: the tables are read whole instead."""


class NotSorted(ReadWhole):
    """A table's rows are not in the order of their start."""


@dataclass
class Ahead(AheadRequests):
    """The tables a stream's `prepare` reads before the spans, a batch at a time, as often as it needs them.

    The first read of a table the spans do not read adds up its extents, and NVTX's keeps the rank's identity
    (`found`, as `time_chunks` does); the first read of a need in the stream's `ahead` is in the progress's total
    already, any other read is added to it as it starts (expect(label, rows))."""

    src: ExportSource
    strings: StringTable
    extents: Extents
    found: dict
    progress: Callable[[str, int], None]
    expect: Callable[[str, int], None]
    stream: Stream
    spill_dir: str | None = None  # where a read ahead keeps what it holds beyond memory (None: TMPDIR)
    reads: dict = field(default_factory=dict)  # need -> reads started
    lock: threading.Lock = field(default_factory=threading.Lock)  # reads may start in several threads at once

    def __post_init__(self):
        self._requests()

    def spans(self, need: str, view: Callable, cols: list[str] | None = None) -> Iterator[pa.Table]:
        """The rows of each span of a new read of one need's table (`time_chunks`, view(need, Frame) -> columns;
        cols: the export columns read, default all)."""
        label, first = self._start(need)
        record = first and need not in self.stream.needs
        for _, _, chunk in time_chunks(self.src, [need], self.strings, view, self.extents if record else Extents(),
                                       lambda _table, rows: self.progress(label, rows), self.found if record else None,
                                       {need: cols} if cols else None):
            if chunk[need] is not None and chunk[need].num_rows:
                yield chunk[need]

    def frames(self, need: str, cols: list[str]) -> Iterator[Frame]:
        """The frames of a new read of one need's table, a batch at a time in the export's order, sorted or not (cols:
        the export columns read); its first read adds up its extents, as `spans` does."""
        label, first = self._start(need)
        extents = self.extents if first and need not in self.stream.needs else Extents()
        for _, frame in batch_frames(self.src, need, cols, self.strings, extents,
                                     lambda _table, rows: self.progress(label, rows), SQLITE_READERS):
            yield frame

    def whole(self, need: str, read: Callable[[ExportSource], Frame]) -> Frame:
        """One need of the stream's `ahead` read whole, once (read(src) -> its frame): tables that stay short in a
        long capture, as the memory events are beside the kernels and calls."""
        frame = read(self.src)
        for table in TABLES[need]:
            self.progress(first_read_label(table), self.src.count(table))
        return frame

    def _start(self, need: str) -> tuple[str, bool]:
        (table, _), = TABLES[need].items()
        with self.lock:
            reads = self.reads[need] = self.reads.get(need, 0) + 1
        first = reads == 1
        if first and need in self.stream.ahead:
            return first_read_label(table), first
        label = f"{table} (read {reads} ahead)"
        self.expect(label, self.src.count(table))
        return label, first


def first_read_label(table: str) -> str:
    return f"{table} (first read)"


def time_chunks(src: ExportSource, needs: list[str], strings: StringTable, view: Callable, extents: Extents,
                progress: Callable[[str, int], None], found: dict | None, columns: dict | None = None,
                given: dict | None = None) -> Iterator[tuple[int, int, dict[str, pa.Table]]]:
    """(span start, span end, need -> rows starting in the span) in time order; the last span ends at
    END_OF_TIME. view(need, batch Frame) -> the plain Arrow columns a chunk's rows carry (`start_ns` among them).
    Once NVTX is read, `found` holds its "names" (the name dictionary a whole read gives; a view refers to names
    by their strings) and "nvtx", the events every read keeps (inputs.batches.identity_rows); found None: a read
    again of a table, which keeps none of that. columns: need -> the export columns read (None or absent: all of
    `readers.TABLES`); given: need -> its rows (AheadRequests.replay) where they are not read from the table."""
    given = given or {}
    connections = SQLITE_READERS if len(needs) == 1 else 1  # several tables: already read side by side
    streams = {need: read_ahead(given[need] if need in given else
                                _batches(src, need, (columns or {}).get(need), strings, view, extents, progress,
                                         found, connections)) for need in needs}
    pending: dict[str, pa.Table | None] = dict.fromkeys(needs)
    live = set(needs)
    frontier = START_OF_TIME
    while True:
        for need in needs:  # every table that still has rows holds some beyond the last span's end
            while need in live and _exhausted_at(pending[need]):
                batch = next(streams[need], None)
                if batch is None:
                    live.discard(need)
                    break
                starts = numpy_of(batch.column("start_ns"))
                before = frontier if pending[need] is None or not pending[need].num_rows else _last_start(pending[need])
                if len(starts) and (starts[0] < before or np.any(starts[1:] < starts[:-1])):
                    raise NotSorted(need)
                pending[need] = batch if pending[need] is None else pa.concat_tables([pending[need], batch])
        end = min((_last_start(pending[n]) for n in live), default=END_OF_TIME)
        chunk = {}
        for need in needs:
            rows = pending[need]
            if rows is None:
                chunk[need] = None
                continue
            cut = int(np.searchsorted(numpy_of(rows.column("start_ns")), end, side="left")) if end < END_OF_TIME \
                else rows.num_rows
            chunk[need], pending[need] = rows.slice(0, cut), rows.slice(cut)
        yield frontier, end, chunk
        if end == END_OF_TIME:
            return
        frontier = end


def prefolded(spans: Iterator[tuple[int, int, dict]], prefold: Callable, state) -> Iterator[tuple[int, int, object]]:
    """time_chunks' spans, each as `prefold` makes it (AheadRequests.prefold), a span ahead in a thread of its own."""
    carried: dict = {}
    return read_ahead(spans, lambda span: (*span[:2], prefold(state, carried, *span)))


def _exhausted_at(rows: pa.Table | None) -> bool:
    """No row, or rows all starting at one instant (the span ends there, so none of them is handed over)."""
    if rows is None or not rows.num_rows:
        return True
    starts = numpy_of(rows.column("start_ns"))
    return starts[0] == starts[-1]


def _last_start(rows: pa.Table) -> int:
    return int(numpy_of(rows.column("start_ns"))[-1])


def _batches(src: ExportSource, need: str, cols: list[str] | None, strings: StringTable, view: Callable,
             extents: Extents, progress: Callable, found: dict | None, connections: int) -> Iterator[pa.Table]:
    (_, every), = TABLES[need].items()
    cols = every if cols is None or need == "nvtx" else [c for c in every if c in cols]  # NVTX: its frame's
    identity = KeptRows(need, cols, strings) if need == "nvtx" and found is not None else None
    named, unnamed = set(), set()  # NVTX domains: named so far; used by ranges before any event named them
    for raw, frame in batch_frames(src, need, cols, strings, extents, progress, connections):
        if identity is not None:  # the events every read keeps, and the rows that make the names' dictionary
            identity.add(raw, frame, np.zeros(len(frame), bool))
            event = numpy_of(raw.column("eventType"), 0)
            domain = (numpy_of(raw.column("domainId"), 0) if "domainId" in raw.column_names
                      else np.zeros(raw.num_rows, np.int64))
            creates = set(distinct(domain[event == DOMAIN_CREATE]).tolist())
            if creates & unnamed:  # the whole read names those earlier ranges' domain; these spans did not
                raise NotSorted("an NVTX domain named after ranges of it")
            named |= creates
            unnamed |= set(distinct(domain[one_of(event, RANGE_EVENTS)]).tolist()) - named
        yield view(need, frame)
    if identity is not None:
        nvtx, carried = identity.with_carried()
        found["names"] = list(nvtx.codes("name")[1][:-1])
        found["nvtx"] = nvtx.filter(~carried) if carried.any() else nvtx
