"""The one iteration finder: a rank's iterations from its closed NVTX ranges (and kernels) read a span of time at a
time, holding a few numbers per thread and range name, not every range. A long capture comes in many spans, a rank
read whole in one (`find_iterations`).

A first read of the ranges counts, per process, thread, name and domain, the ranges, the time they cover, where
they first appear and whether two of them overlap. That gives each process's busiest thread and its candidate
delimiters there (repeating at least MIN_REPEATS times, never overlapping themselves, named and in a domain, not
NCCL's own API ranges) in the order they are tried: the most time covered first (the most frequent would be a per-op
range in reports made with PyTorch's emit_nvtx), then the most repeats, then the first seen. The first that lies
mostly inside no other candidate delimits the iterations. Whether it does needs their ranges side by side: a
further read answers it for the first few candidates of that order (`INNER_QUERIES`), counting, for each of their
ranges, the other candidates' last range started by then that holds it, and collects those candidates' ranges, whose
outermost are the iterations. A further read replays the first read's ranges as ids (`_Replay`), not
the table, and so do the spans of a map that takes them all (`FirstRead`). A delimiter named by --iteration is
collected in the first read. A process without a delimiting range takes its kernels: one read counts their names,
another collects the launches.

Every function reads spans through a `read()` that starts a new read of the table each call, each span holding
every row of one instant (inputs.chunks.time_chunks), so that ties between starts are settled as in a whole table.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .groups import SortedGroups, Vocabulary, distinct, factorize
from .inputs.batches import RANGE_EVENTS
from .inputs.chunks import ReadWhole
from .inputs.frames import arrow_of, column_codes, dictionary_column, numpy_of, strings_of
from .inputs.rank_data import RankAhead
from .inputs.readers import read_ahead
from .intervals import outermost
from .iterations import (
    MIN_REPEATS,
    NCCL_API_RE,
    Delimiter,
    Iterations,
    closed_range_view,
    iteration_error,
    kernel_windows,
    most_common,
    no_iterations_text,
    no_kernel_text,
    no_range_text,
    parse_name_domain,
)
from .spill import SpilledRows, SpillWriter

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
INNER_QUERIES = 20_000_000  # (range, candidate) pairs a further read tests, beyond those of the first candidate
INNER_CANDIDATES = 8  # candidates a further read tests at most
REPLAY_ROWS = 8_000_000  # closed ranges of the first read a replay holds in memory (32 bytes each); the rest in a file
# ... and one kept for a sliced map's spans, which take it after the iterations are found, beside their own buffers
KEPT_REPLAY_ROWS = 1_000_000
QUERIES = 1_000_000  # (range, candidate) pairs tested at once


@dataclass
class _Span:
    """One span's closed ranges, their thread, name and domain also as ids."""
    pid: np.ndarray
    tid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    thread: np.ndarray
    name: np.ndarray
    domain: np.ndarray


class _Tally:
    """Per (process, thread, name, domain): ranges, time covered, first position, overlap, last end."""

    COLUMNS = {"pid": 0, "tid": 0, "name": 0, "domain": 0, "count": 0, "covered": 0, "first": INT64_MAX,
               "overlaps": 0, "last_end": INT64_MIN}

    def __init__(self):
        self.index: dict[int, int] = {}
        self.size = 0
        self.cols = {c: np.full(1024, v, np.int64) for c, v in self.COLUMNS.items()}

    def add_keys(self, keys: list[tuple], parts: dict[str, np.ndarray]) -> np.ndarray:
        """The entries of distinct (thread, name, domain) keys, new ones made with their `parts` (pid, tid, name,
        domain)."""
        at = np.array([self.index.get(k, -1) for k in keys], np.int64)
        new = np.flatnonzero(at < 0)
        if len(new):
            need = self.size + len(new)
            if need > len(self.cols["count"]):
                grown = max(need, 2 * len(self.cols["count"]))
                for c, v in self.COLUMNS.items():
                    self.cols[c] = np.r_[self.cols[c], np.full(grown - len(self.cols[c]), v, np.int64)]
            at[new] = np.arange(self.size, need)
            for k, i in zip([keys[i] for i in new.tolist()], at[new].tolist(), strict=True):
                self.index[k] = i
            for c, v in parts.items():
                self.cols[c][at[new]] = v[new]
            self.size = need
        return at

    def __getitem__(self, column: str) -> np.ndarray:
        return self.cols[column][:self.size]


class RangeScan:
    """The first read: `add` every span, then `named` (for --iteration) or `plans` (found automatically)."""

    def __init__(self, iteration: str | None = None):
        self.iteration = parse_name_domain(iteration) if iteration else None
        self.tids, self.names, self.domains = Vocabulary(), Vocabulary(), Vocabulary()
        self.tally = _Tally()
        self.rows = 0
        self.collected: list[tuple] = []  # --iteration: (pid, tid, start, end) of the ranges with its name

    def span(self, rows: pa.Table) -> _Span:
        """A span's rows (start_ns, end_ns, tid, pid, name, domain: closed ranges) as ids."""
        tid = numpy_of(rows.column("tid"))
        tid_words, tid_code = factorize(tid)
        tid_id = self.tids.ids(tid_words.tolist())[tid_code]
        ids = []
        for column, words in (("name", self.names), ("domain", self.domains)):
            codes, distinct = column_codes(rows.column(column))
            used = np.flatnonzero(np.bincount(codes + 1, minlength=len(distinct) + 1))  # a dictionary may hold more
            at = np.full(len(distinct), -1, np.int64)
            at[used - 1] = words.ids([distinct[u - 1] for u in used.tolist()])
            ids.append(at[codes])
        name, domain = ids
        return _Span(numpy_of(rows.column("pid")), tid, numpy_of(rows.column("start_ns")),
                     numpy_of(rows.column("end_ns")), tid_id, name, domain)

    def add(self, rows: pa.Table) -> tuple[np.ndarray, ...]:
        """Count one span of the first read; its rows' process, start, end and tally entry."""
        s = self.span(rows)
        n = len(s.start)
        if not n:
            return s.pid, s.start, s.end, s.thread
        # in order of (thread, name, domain) as ids below the counts met so far: few, so sorted by radix
        names, domains = len(self.names.words), len(self.domains.words)
        if len(self.tids.words) * names * domains < 1 << 62:
            groups = SortedGroups((s.thread * names + s.name) * domains + s.domain)
        else:  # more than one integer holds
            groups = SortedGroups(np.unique(np.c_[s.thread, s.name, s.domain], axis=0, return_inverse=True)[1])
        lead = groups.lead
        key = list(zip(s.thread[lead].tolist(), s.name[lead].tolist(), s.domain[lead].tolist(), strict=True))
        at = self.tally.add_keys(key, {"pid": s.pid[lead], "tid": s.tid[lead], "name": s.name[lead],
                                       "domain": s.domain[lead]})
        t = self.tally.cols
        t["count"][at] += groups.size
        t["covered"][at] += groups.sum(s.end - s.start)
        t["first"][at] = np.minimum(t["first"][at], self.rows + lead)
        # ranges of one key in table order (the table is in order of start): each against the one before it
        start, end = s.start[groups.order], s.end[groups.order]
        before = np.r_[INT64_MIN, end[:-1]]
        before[groups.first] = t["last_end"][at]
        t["overlaps"][at] |= np.logical_or.reduceat(start < before, groups.first)
        t["last_end"][at] = end[np.r_[groups.first[1:], n] - 1]
        self.rows += n
        if self.iteration is not None:
            name, domain = self.iteration
            hit = s.name == self.names.id_of.get(name, -1)
            if domain is not None:
                hit &= s.domain == self.domains.id_of.get(domain, -1)
            if hit.any():
                self.collected.append((s.pid[hit], s.tid[hit], s.start[hit], s.end[hit]))
        entry = np.empty(n, np.int64)
        entry[groups.order] = np.repeat(at, groups.size)
        return s.pid, s.start, s.end, entry

    def pids(self) -> list[int]:
        return sorted(set(self.tally["pid"].tolist()))

    def named(self) -> dict:
        """--iteration: pid -> Iterations, or the text of the error."""
        name, domain = self.iteration
        pid, tid, start, end = ([np.concatenate(c) for c in zip(*self.collected, strict=True)] if self.collected
                                else [np.zeros(0, np.int64)] * 4)
        out: dict = {}
        for p in self.pids():
            on = pid == p
            if not on.any():
                names = np.array(self.names.words, object)[self.tally["name"][self.tally["pid"] == p]]
                out[p] = no_range_text(self.iteration_text, names)
                continue
            out[p] = _outermost_of(Delimiter("nvtx", name, domain, "--iteration"), tid[on], start[on], end[on])
        return out

    @property
    def iteration_text(self) -> str:
        name, domain = self.iteration
        return name if domain is None else f"{name}@{domain}"

    def plans(self) -> dict[int, _Plan]:
        """Per process with ranges, what finding its delimiter takes (found automatically)."""
        t = {c: self.tally[c] for c in _Tally.COLUMNS}
        named = np.array([w not in ("", None) and not NCCL_API_RE.match(str(w)) for w in self.names.words], bool)
        domain_words = np.array(self.domains.words, object)
        pair = t["name"] * len(self.domains.words) + t["domain"]  # each entry's (name, domain)
        out = {}
        for p in self.pids():
            mine = np.flatnonzero(t["pid"] == p)
            busiest = most_common(t["tid"][mine], t["count"][mine], t["first"][mine])
            cand = mine[(t["tid"][mine] == busiest) & (t["count"][mine] >= MIN_REPEATS) & named[t["name"][mine]]
                        & np.not_equal(domain_words[t["domain"][mine]], None) & (t["overlaps"][mine] == 0)]
            cand = cand[np.lexsort((t["first"][cand], -t["count"][cand], -t["covered"][cand]))]
            # the thread each candidate's iterations are taken on: where its name and domain are most common (an
            # entry per thread of them: the most ranges, ties to the first seen)
            by_pair = mine[np.lexsort((t["first"][mine], -t["count"][mine], pair[mine]))]
            best = by_pair[np.r_[True, pair[by_pair][1:] != pair[by_pair][:-1]]]
            out[p] = _Plan(self, cand, best[np.searchsorted(pair[best], pair[cand])])
        return out


class _Plan:
    """One process's candidate delimiters (tally entries, in the order they are tried) and what is known of them."""

    def __init__(self, scan: RangeScan, cand: np.ndarray, home: np.ndarray):
        self.scan, self.cand, self.home = scan, cand, home
        self.next = 0  # the first candidate not yet tested
        self.result: Iterations | None = None
        self.done = not len(cand)
        self.inner = np.zeros(0, np.int64)
        self.start_inner()

    def start_inner(self) -> None:
        """The candidates the next read tests, and collects the ranges of."""
        if self.done:
            return
        # each tested range is looked up among every candidate's
        queries = np.cumsum(self.scan.tally["count"][self.cand[self.next:]]) * len(self.cand)
        take = max(1, min(INNER_CANDIDATES, int(np.searchsorted(queries, INNER_QUERIES, side="right"))))
        self.inner = np.arange(self.next, min(self.next + take, len(self.cand)))
        self.inside = np.zeros((len(self.inner), len(self.cand)), np.int64)
        self.carry_end = np.full(len(self.cand), INT64_MIN)
        self.carry_seen = np.zeros(len(self.cand), bool)
        self.ranges: list[list[tuple]] = [[] for _ in self.inner]
        # tally entry -> place among the candidates, and among the tested ones' home entries (-1: none)
        self.cand_pos = np.full(self.scan.tally.size, -1, np.int64)
        self.cand_pos[self.cand] = np.arange(len(self.cand))
        self.home_of = np.full(self.scan.tally.size, -1, np.int64)
        self.home_of[self.home[self.inner]] = np.arange(len(self.inner))
        self.inner_of = np.full(len(self.cand), -1, np.int64)  # candidate -> place among the tested ones
        self.inner_of[self.inner] = np.arange(len(self.inner))

    def add(self, start: np.ndarray, end: np.ndarray, at: np.ndarray) -> None:
        """A span of a further read, the process's rows: their start, end and tally entry. Each candidate's last range
        so far is filled forward over the rows to the tested ranges, rather than sorting every candidate's ranges by
        time."""
        home = self.home_of[at]
        for i in np.unique(home[home >= 0]).tolist():
            hit = home == i
            self.ranges[i].append((start[hit], end[hit]))
        g = self.cand_pos[at]
        rows = np.flatnonzero(g >= 0)
        if not len(rows) or len(self.cand) < 2:
            return
        g, start, end = g[rows], start[rows], end[rows]
        n_cand = len(self.cand)
        queries = np.flatnonzero(self.inner_of[g] >= 0)
        # each query is held by the last range of a candidate started by its start (rows are in order of start): the
        # last row of each candidate before the first row that starts later, in this span (else carried)
        seen = np.searchsorted(start, start[queries], side="right")
        last = np.full(n_cand, -1, np.int64)  # per candidate, its last row of the span so far
        taken = 0  # the rows that `last` has seen
        for part in np.array_split(np.arange(len(queries)), max(1, len(queries) * n_cand // QUERIES)):
            if not len(part):
                continue
            fresh = np.arange(taken, seen[part[-1]])  # the rows the part's queries see that `last` has not
            holder = np.full((len(part), n_cand), -1, np.int64)  # per query of the part and candidate
            step = np.searchsorted(seen[part], fresh, side="right")  # the part's first query that sees the row
            np.maximum.at(holder.reshape(-1), step * n_cand + g[fresh], fresh)
            holder[0] = np.maximum(holder[0], last)
            np.maximum.accumulate(holder, axis=0, out=holder)
            last, taken = holder[-1].copy(), seen[part[-1]]
            q = queries[part]
            here = holder >= 0
            held = (here | self.carry_seen) & (end[q][:, None] <= np.where(here, end[np.maximum(holder, 0)],
                                                                           self.carry_end))
            tested = self.inner_of[g[q]]
            held[np.arange(len(part)), self.inner[tested]] = False  # a candidate does not hold its own ranges
            for i in np.unique(tested).tolist():
                self.inside[i] += np.count_nonzero(held[tested == i], axis=0)
        fresh = np.arange(taken, len(g))
        np.maximum.at(last, g[fresh], fresh)
        met = last >= 0
        self.carry_end[met] = end[last[met]]
        self.carry_seen |= met

    def decide(self) -> None:
        """After a further read: the first tested candidate that lies mostly inside no other is the delimiter."""
        count = self.scan.tally["count"][self.cand[self.inner]]
        for n, i in enumerate(self.inner.tolist()):
            if not (2 * self.inside[n] > count[n]).any():
                k = self.home[i]
                t = self.scan.tally
                name, domain = self.scan.names.words[t["name"][k]], self.scan.domains.words[t["domain"][k]]
                start, end = (np.concatenate(c) for c in zip(*self.ranges[n], strict=True))
                self.result = _outermost_of(Delimiter("nvtx", str(name), domain or None, "auto"),
                                            np.full(len(start), t["tid"][k]), start, end)
                self.done = True
                return
        self.next += len(self.inner)
        self.done = self.next >= len(self.cand)
        self.start_inner()


def _outermost_of(delimiter: Delimiter, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> Iterations:
    """The last step: the delimiter's ranges on their most common thread, outermost of nested repeats."""
    thread = int(most_common(tid))
    on = tid == thread
    start, end = start[on], end[on]
    keep = outermost(np.zeros(len(start), np.int64), start, end)
    return Iterations(delimiter, start[keep].astype(np.int64), end[keep].astype(np.int64), thread)


def nvtx_iterations(read: Callable[[], Iterable[pa.Table]], iteration: str | None = None, spill_dir: str | None = None,
                    keep: bool = False, find: bool = True) -> tuple[dict, FirstRead | None]:
    """(pid -> Iterations, the text of an error (--iteration names no range of it), or None (no range delimits its
    iterations: its kernels may), for each process with closed ranges; with `keep`, the first read's closed ranges,
    else None). read() -> the spans of a new read; spill_dir: where a replay longer than REPLAY_ROWS (KEPT_REPLAY_ROWS
    kept) keeps the rest (None: TMPDIR); find False: only the ranges kept, no iteration looked for (their kernels
    delimit them)."""
    scan = RangeScan(iteration)
    replay = _Replay(spill_dir, KEPT_REPLAY_ROWS if keep else REPLAY_ROWS)
    kept = None
    try:
        for rows in read():
            placed = scan.add(rows)
            if keep or find and not iteration:
                replay.add(placed)
        if not find:
            windows = {}
        elif iteration:
            windows = scan.named()
        else:
            windows = _found(scan.plans(), replay)
        kept = FirstRead(scan, replay) if keep else None
        return windows, kept
    finally:
        if kept is None:
            replay.remove()


def _found(plans: dict, replay: _Replay) -> dict:
    """Each process's delimiter, from as many further reads as its candidates take."""
    while not all(p.done for p in plans.values()):
        with contextlib.closing(iter(replay)) as spans:  # a test that fails stops the file's read at once
            for pid, start, end, at in spans:
                for p, plan in plans.items():
                    if not plan.done:
                        on = slice(None) if len(pid) and pid[0] == p and pid[-1] == p and (pid == p).all() \
                            else np.flatnonzero(pid == p)
                        plan.add(start[on], end[on], at[on])
        for plan in plans.values():
            if not plan.done:
                plan.decide()
    return {pid: plan.result for pid, plan in plans.items()}


class FirstRead:
    """A first read's closed ranges, kept for the spans of a map that would otherwise read the table again
    (iteration_slices): per range its process, start, end and tally entry (`_Replay`), which holds its thread, name
    and domain. Reading them back costs a fraction of reading the table again and making its frames."""

    def __init__(self, scan: RangeScan, replay: _Replay):
        self.scan, self.replay = scan, replay
        self._gone = weakref.finalize(self, replay.remove)  # a map given up half way leaves no file behind

    def spans(self) -> Iterator[pa.Table]:
        """The ranges a span at a time, in the table's order, as `closed_range_view` gives them (and event_type),
        each span's names and domains a dictionary of the words it holds."""
        t = self.scan.tally
        tid, name, domain = t["tid"], t["name"], t["domain"]
        words = {c: strings_of(w.words, large=True) for c, w in (("name", self.scan.names),
                                                                ("domain", self.scan.domains))}
        try:
            for pid, start, end, at in self.replay.drain():
                columns = {"start_ns": arrow_of(start), "end_ns": arrow_of(end),
                           "event_type": arrow_of(np.full(len(start), RANGE_EVENTS[0], np.int64))}
                for c, ids in (("name", name[at]), ("domain", domain[at])):
                    used = distinct(ids)
                    used = used[used >= 0]
                    place = np.full(len(words[c]) + 1, -1, np.int64)  # the last: none
                    place[used] = np.arange(len(used))
                    columns[c] = dictionary_column(place[ids], words[c].take(arrow_of(used)))
                yield pa.table({**columns, "tid": arrow_of(tid[at]), "pid": arrow_of(pid)})
        finally:
            self.remove()

    def remove(self) -> None:
        self._gone()


class _Replay:
    """The first read's closed ranges as the further reads need them (process, start, end, tally entry), span by
    span: the first `in_memory` in memory, the rest written to a file (spill.SpillWriter), so that the table is read
    once however long the capture (replaying ids from a file costs less than reading the table again)."""

    COLUMNS = ("pid", "start", "end", "at")

    def __init__(self, spill_dir: str | None, in_memory: int):
        self.in_memory = in_memory
        self.held: list[tuple] = []
        self.rows = 0
        self.spill_dir = spill_dir
        self.writer: SpillWriter | None = None
        self.spilled: SpilledRows | None = None

    def add(self, placed: tuple) -> None:
        if self.rows + len(placed[0]) <= self.in_memory and self.writer is None:
            self.held.append(placed)
        else:
            if self.writer is None:
                self.writer = SpillWriter(pa.schema([(c, pa.int64()) for c in self.COLUMNS]), "start", self.spill_dir)
            self.writer.write(pa.table(dict(zip(self.COLUMNS, map(arrow_of, placed), strict=True))))
        self.rows += len(placed[0])

    def __iter__(self) -> Iterator[tuple]:
        """A further read: the file's part read in a thread of its own while the caller tests the span before, as
        nothing else runs beside the tests then."""
        yield from self.held
        if self._spilled() is not None:
            yield from read_ahead(self._from_file())

    def drain(self) -> Iterator[tuple]:
        """A last read: each span let go of as it is handed over."""
        while self.held:
            yield self.held.pop(0)
        yield from self._from_file()

    def _from_file(self) -> Iterator[tuple]:
        spilled = self._spilled()
        for rows in spilled.batches() if spilled is not None else ():
            yield tuple(numpy_of(rows.column(c)) for c in self.COLUMNS)

    def remove(self) -> None:
        spilled = self._spilled()
        if spilled is not None:
            spilled.remove()

    def _spilled(self) -> SpilledRows | None:
        if self.writer is not None and self.spilled is None:
            self.spilled = self.writer.close()
        return self.spilled


def kernel_iterations(read: Callable[[], Iterable[pa.Table]], name: str | None, ranged: set[int],
                      settled: set[int]) -> dict:
    """pid -> Iterations or the text of an error, for the processes with kernels or closed NVTX ranges (`ranged`) whose
    iterations are not `settled`: launches of `name` (--iteration-kernel), or else of each process's most common
    kernel. read() -> spans of kernels (start_ns, end_ns, pid, name, full_name: kernel_view)."""
    pids = set(ranged) - settled
    launches: dict[int, dict] = {}  # pid -> short name -> (launches, first position)
    launching: set[int] = set()  # the processes with kernels
    position = 0
    for rows in read() if name is None else ():
        pid = numpy_of(rows.column("pid"))
        codes, words = column_codes(rows.column("name"))
        for p in set(np.unique(pid).tolist()) - settled:
            launching.add(p)
            on = np.flatnonzero((pid == p) & (codes >= 0))
            groups = SortedGroups(codes[on])
            for code, n, first in zip(groups.keys.tolist(), groups.size.tolist(),
                                      (position + on[groups.lead]).tolist(), strict=True):
                count, seen = launches.setdefault(p, {}).get(words[code], (0, first))
                launches[p][words[code]] = (count + n, min(seen, first))
        position += len(pid)
    out: dict = {}
    wanted = {}
    for p in pids | launching if name is None else ():
        words = list(launches.get(p, {}))
        count = np.array([launches[p][w][0] for w in words], np.int64)
        first = np.array([launches[p][w][1] for w in words], np.int64)
        top = np.flatnonzero(count == count.max()) if len(count) else count
        best = top[np.argmin(first[top])] if len(top) else None
        if best is not None and count[best] >= MIN_REPEATS:
            wanted[p] = words[best]
        else:
            out[p] = no_iterations_text(p in ranged, p in launching)
    hits: dict[int, list] = {}
    named: dict[int, set] = {}  # --iteration-kernel: each process's kernel names, for the error's closest ones
    for rows in read() if wanted or name is not None else ():
        pid = numpy_of(rows.column("pid"))
        short, short_words = column_codes(rows.column("name"))
        full, full_words = column_codes(rows.column("full_name"))
        for p in set(np.unique(pid).tolist()) - settled:
            on = pid == p
            if name is not None:
                named.setdefault(p, set()).update(short_words[c] for c in np.unique(short[on]).tolist())
            w = name if name is not None else wanted.get(p)
            if w is None:
                continue
            hit = on & (np.array([x == w for x in short_words], bool)[short]
                        | np.array([x is not None and (x == w or x.startswith(w + "(")) for x in full_words],
                                   bool)[full])
            if hit.any():
                hits.setdefault(p, []).append((numpy_of(rows.column("start_ns"))[hit],
                                               numpy_of(rows.column("end_ns"))[hit]))
    if name is not None:
        wanted = dict.fromkeys(pids | set(named), name)
    for p, w in wanted.items():
        if not hits.get(p):
            out[p] = no_kernel_text(w, list(named.get(p, ())))
            continue
        start, end = (np.concatenate(c) for c in zip(*hits[p], strict=True))
        start, end = kernel_windows(start, end)
        out[p] = Iterations(Delimiter("kernel", w, None, "--iteration-kernel" if name else "auto"), start, end, None)
    return out


KERNEL_COLUMNS = ["start", "end", "globalPid", "shortName", "demangledName"]  # for iterations that kernels delimit


def iterations_ahead(ahead, options: dict, keep: bool = False) -> tuple[dict, bool, FirstRead | None]:
    """pid -> Iterations or the text of an error, for each process, found from its NVTX ranges (or its kernels) read
    ahead of the spans (inputs.chunks.Ahead, or a rank read whole: RankAhead) with the recipe's --iteration and
    --iteration-kernel; whether kernels were read for them (a process missing then has no GPU work); with `keep`, the
    closed ranges read (`FirstRead`), else None."""
    windows: dict = {}
    kept = None
    read = lambda: ahead.spans("nvtx", closed_range_view)  # noqa: E731
    if options.get("iteration_kernel") and not keep:
        for _ in read():  # read once all the same: the rank's identity is in it
            pass
    else:
        windows, kept = nvtx_iterations(read, options.get("iteration"), ahead.spill_dir, keep,
                                        find=not options.get("iteration_kernel"))
    ranged = set(windows)
    kernels_read = bool(options.get("iteration_kernel")) or not options.get("iteration") and (
        not windows or any(w is None for w in windows.values()))
    if kernels_read:
        settled = {p for p, w in windows.items() if w is not None}
        read = lambda: ahead.spans("kernel", kernel_view, KERNEL_COLUMNS)  # noqa: E731
        windows.update(kernel_iterations(read, options.get("iteration_kernel"), ranged, settled))
    return windows, kernels_read, kept


def find_iterations(rank_data, iteration: str | None = None, iteration_kernel: str | None = None) -> Iterations:
    """The rank's iterations: instances of the delimiting NVTX range on its busiest thread (outermost of nested
    repeats), or launches of the delimiting kernel; found as a long capture's are, its tables read as one span."""
    pid = rank_data.pid if rank_data.pid is not None else 0
    options = {"iteration": iteration, "iteration_kernel": iteration_kernel}
    windows, kernels_read, _ = iterations_ahead(RankAhead(rank_data, pid), options)
    found = windows.get(pid)
    if found is None or isinstance(found, str):
        raise iteration_error(rank_data.file, found or no_windows_text(options, kernels_read))
    return found


def no_windows_text(options: dict, kernels_read: bool) -> str:
    """The error of a process with GPU work and no iterations from `iterations_ahead`: no closed NVTX range and, where
    kernels were read, no kernel (a whole read tells the rest)."""
    if options.get("iteration_kernel"):
        return no_kernel_text(options["iteration_kernel"], [])
    if options.get("iteration"):
        return no_range_text(options["iteration"], [])
    if not kernels_read:
        raise ReadWhole("GPU work of a process whose kernels were not read ahead")
    return no_iterations_text(False, False)


def kernel_view(need: str, frame) -> pa.Table:
    """The columns a span of kernels carries for the scans: times, process and names."""
    columns = {c: arrow_of(frame.values(c)) for c in ("start_ns", "end_ns", "pid")}
    for c in ("name", "full_name"):
        codes, words = frame.codes(c)
        columns[c] = dictionary_column(codes, words[:-1])
    return pa.table(columns)
