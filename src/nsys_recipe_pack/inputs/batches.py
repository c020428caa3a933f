"""Event tables read a batch at a time (inputs.chunks, for a long capture): each batch's frame, with the same
dictionaries and column types as a whole read's (the first row of every distinct name is carried through the read,
then dropped), and what the rest of the pack reads from a whole table (a rank's processes, its GPU, its unclosed NVTX
ranges and the ranges that name its rank) taken from every row while it passes (`Extents`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..groups import one_of
from .events import DOMAIN_CREATE, NVTX_TIMES, gpu_frame, nvtx_frame, runtime_frame, timed_rows
from .frames import Frame, arrow_of, numpy_of, one_array
from .readers import TABLES, ExportSource, StringTable

RANGE_EVENTS = (59, 60)  # push/pop and start/end ranges


# need -> (frame attribute, columns whose distinct values make a frame's dictionaries, columns whose nulls
# make a frame's column nullable)
NEED_FRAMES = {"nvtx": ("nvtx", ("text", "textId", "domainId"), ()),
               "kernel": ("kernels", ("shortName", "demangledName"), ()),
               "memcpy": ("memcpy", (), ()), "memset": ("memset", (), ()), "sync": ("sync", (), ()),
               "runtime": ("runtime", ("nameId",), ("correlationId",))}


class Extents:
    """Per process, what the whole of each table held: its rows (for NVTX, its range events), first start and
    last end, and for kernels the devices they ran on. Kept as plain lists, to travel in JSON."""

    def __init__(self, saved: dict | None = None):
        self.tables: dict = saved or {}  # attr -> {pid: [rows, start, end]}; "devices" -> {pid: {device: n}}

    def add(self, attr: str, frame: Frame) -> None:
        table = self.tables.setdefault(attr, {})
        if not len(frame):
            return
        pid, start = frame.values("pid"), frame.values("start_ns")
        end = frame.values("end_ns", fill=np.iinfo(np.int64).min)
        if attr == "nvtx":
            event_type = frame.values("event_type")
            counted = (event_type == RANGE_EVENTS[0]) | (event_type == RANGE_EVENTS[1])
        else:
            counted = None
        one = pid.min() == pid.max()  # usually: a batch of one process's rows
        for p in pid[:1] if one else np.unique(pid):  # a few processes
            on = slice(None) if one else pid == p
            rows, low, high = table.get(str(p), [0, np.iinfo(np.int64).max, np.iinfo(np.int64).min])
            counted_rows = len(start[on]) if counted is None else np.count_nonzero(counted[on])
            table[str(p)] = [rows + int(counted_rows), min(low, int(start[on].min())), max(high, int(end[on].max()))]
            if attr == "kernels" and "device" in frame:
                devices = self.tables.setdefault("devices", {}).setdefault(str(p), {})
                device = frame.values("device", fill=-1)[on]
                least = int(device.min())
                if int(device.max()) - least < 1 << 16:  # a few small device numbers: counted without a sort
                    counts = np.bincount(device - least)
                    values = np.flatnonzero(counts)
                    values, counts = values + least, counts[values]
                else:
                    values, counts = np.unique(device, return_counts=True)
                for d, n in zip(values.tolist(), counts.tolist(), strict=True):
                    devices[str(d)] = devices.get(str(d), 0) + n

    def pids(self, attr: str) -> set[int]:
        """The processes with rows in the table (NVTX: with ranges)."""
        return {int(p) for p, (rows, *_) in self.tables.get(attr, {}).items() if attr != "nvtx" or rows}

    def of(self, pid: int | None) -> dict:
        """One process's extents (all processes together for None): attr -> (rows, start, end), and
        "devices" -> {device: kernels}."""
        out: dict = {}
        for attr, table in self.tables.items():
            rows = [v for p, v in table.items() if pid is None or p == str(pid)]
            if attr == "devices":
                merged: dict = {}
                for counts in rows:
                    for d, n in counts.items():
                        merged[int(d)] = merged.get(int(d), 0) + n
                out[attr] = merged
            elif rows:
                out[attr] = (sum(r[0] for r in rows), min(r[1] for r in rows), max(r[2] for r in rows))
        return out


def batch_frames(src: ExportSource, need: str, cols: list[str], strings: StringTable, extents: Extents,
                 progress: Callable[[str, int], None], connections: int) -> Iterator[tuple[pa.Table, Frame]]:
    """(raw rows, their frame) of one need's table a batch at a time, each batch added to `extents`
    (connections: as `ExportSource.read_batches`)."""
    (table, _), = TABLES[need].items()
    times = NVTX_TIMES if need == "nvtx" else ("start", "end")
    creates = None  # NVTX: the domain-create events read so far, which name the domains of the ranges after them
    for raw in src.read_batches(table, cols, connections=connections):
        raw = timed_rows(raw, cols, times)
        named = raw
        if need == "nvtx" and "eventType" in raw.column_names:
            if creates is not None:  # before the batch: a frame leaves create events out
                named = pa.concat_tables([creates, raw])
            create = numpy_of(raw.column("eventType"), 0) == DOMAIN_CREATE
            if create.any():
                creates = pa.concat_tables([t for t in (creates, raw.filter(arrow_of(create))) if t is not None])
        frame = frame_of(need, named, cols, strings)
        extents.add(NEED_FRAMES[need][0], frame)
        yield raw, frame
        progress(table, raw.num_rows)


class KeptRows:
    """The rows of one table a batched read keeps, and the frame they make, with the dictionaries and column
    types a whole read gives (the first row of every name, and the first null, carried through, then dropped).
    NVTX also keeps every domain's create events (they name domains) and `identity_rows`."""

    def __init__(self, need: str, wanted: list[str], strings: StringTable):
        self.need, self.wanted, self.strings = need, wanted, strings
        _, dictionary_cols, null_cols = NEED_FRAMES[need]
        self.firsts = FirstRows([c for c in dictionary_cols if c in wanted], [c for c in null_cols if c in wanted])
        self.parts: list[pa.Table] = []
        self.extra: list[np.ndarray] = []  # per kept row: carried for a name or null only

    def add(self, raw: pa.Table, frame: Frame, chosen: np.ndarray) -> None:
        """Keep the `chosen` rows of a batch's frame (and of its raw rows, the first of each name)."""
        if self.need == "nvtx":
            chosen = chosen | identity_rows(frame)
            create = numpy_of(raw.column("eventType"), 0) == DOMAIN_CREATE
            rows = create.copy()
            rows[~create] = chosen  # the frame has no create events
        else:
            rows = chosen
        first = self.firsts.of(raw)
        take = rows | first
        self.parts.append(raw.select([c for c in self.wanted if c in raw.column_names]).filter(arrow_of(take)))
        self.extra.append((first & ~rows)[take])

    def frame(self) -> Frame:
        frame, carried = self.with_carried()
        return frame.filter(~carried) if carried.any() else frame

    def with_carried(self) -> tuple[Frame, np.ndarray]:
        """The frame with the rows carried for a name or a null still in (its dictionaries are the whole read's
        even where it keeps no row), and which rows those are."""
        if not self.parts:
            times = NVTX_TIMES if self.need == "nvtx" else ("start", "end")
            return (frame_of(self.need, timed_rows(pa.table({}), self.wanted, times), self.wanted, self.strings),
                    np.zeros(0, bool))
        raw = pa.concat_tables(self.parts)
        self.parts = []
        carried = np.concatenate(self.extra)
        if self.need == "nvtx":  # the frame has no create events
            carried = carried[numpy_of(raw.column("eventType"), 0) != DOMAIN_CREATE]
        return frame_of(self.need, raw, self.wanted, self.strings), carried


def frame_of(need: str, raw: pa.Table, cols: list[str], strings: StringTable) -> Frame:
    if need == "nvtx":
        return nvtx_frame(raw, strings)
    if need == "runtime":
        return runtime_frame(raw, strings)
    return gpu_frame(raw, cols, strings)


def identity_rows(nvtx: Frame) -> np.ndarray:
    """NVTX events every run reads whatever its recipe: ranges never closed (counted and reported) and the
    events whose names may give the rank."""
    codes, words = nvtx.codes("name")
    names_rank = np.array([isinstance(w, str) and "RANK" in w.upper() for w in words], bool)[codes]
    unclosed = one_of(nvtx.values("event_type"), RANGE_EVENTS) & nvtx.is_null("end_ns")
    return names_rank | unclosed


class FirstRows:
    """The first row of every distinct value of some columns, and the first null of others, across batches."""

    def __init__(self, distinct_cols: list[str], null_cols: list[str]):
        self.distinct_cols, self.null_cols = distinct_cols, null_cols
        self.seen_words: dict[str, set] = {c: set() for c in distinct_cols}  # text columns
        self.seen_ints: dict[str, np.ndarray] = {c: np.zeros(0, np.int64) for c in distinct_cols}  # id columns
        self.null_ids_seen: set[str] = set()
        self.nulls_seen: set[str] = set()

    def of(self, raw: pa.Table) -> np.ndarray:
        out = np.zeros(raw.num_rows, bool)
        for c in self.distinct_cols:
            if c not in raw.column_names:
                continue
            col = one_array(raw.column(c))
            text = pa.types.is_string(col.type) or pa.types.is_dictionary(col.type)
            # the rows whose value is not seen yet (none, after the first batches), then the first of each
            if text:
                words = col.dictionary if pa.types.is_dictionary(col.type) else pc.unique(col)
                if all(w in self.seen_words[c] for w in words.to_pylist()):
                    continue  # the usual batch after the first ones: no word not seen (a set is quicker to make)
                enc = col if pa.types.is_dictionary(col.type) else col.dictionary_encode()
                codes = numpy_of(enc.indices, -1)
                words = [*enc.dictionary.to_pylist(), None]  # code -1: null
                known = np.array([w in self.seen_words[c] for w in words], bool)
                fresh = np.flatnonzero(~known[codes])
            else:  # ids: the seen ones (nulls apart, so that numpy tests them against a table of their span)
                codes = numpy_of(col, NULL_ID)
                fresh = ~np.isin(codes, self.seen_ints[c])
                if c in self.null_ids_seen and col.null_count:
                    fresh &= codes != NULL_ID
                fresh = np.flatnonzero(fresh)
            if not len(fresh):
                continue
            distinct, first = np.unique(codes[fresh], return_index=True)
            out[fresh[first]] = True
            if text:
                self.seen_words[c].update(words[i] for i in distinct.tolist())
            else:
                if distinct[0] == NULL_ID:
                    self.null_ids_seen.add(c)
                self.seen_ints[c] = np.union1d(self.seen_ints[c], distinct[distinct != NULL_ID])
        for c in self.null_cols:
            if c in raw.column_names and c not in self.nulls_seen and raw.column(c).null_count:
                out[np.argmax(numpy_of(raw.column(c).is_null(), False))] = True
                self.nulls_seen.add(c)
        return out


NULL_ID = np.iinfo(np.int64).min  # a null id among the ids FirstRows has seen
