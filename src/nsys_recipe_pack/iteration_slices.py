"""A per-iteration map over a long capture, a few iterations at a time: the events of a span of time are held until
the iterations they bear on can be measured, then let go, so that the tables are never held whole.

The iterations are found first (`iteration_scan.iterations_ahead`), and every GPU op's launch key is counted
(`gpu.launch_keys`). Then every table is read span by span of time (inputs.chunks.time_chunks) into a buffer, but
NVTX: its closed ranges, the only NVTX events a map uses, are those the read that found the iterations kept
(`iteration_scan.FirstRead`), handed over span by span in the same way. An
iteration is measured once every event that starts before its end has been read and every op launched by a call
that starts before its end has come: the ops of a call may run long after it. The map (`measure`) then gets the
buffer as a `RankData` and the iterations ready, with `before` the start of the next iteration not measured yet (or
of the earliest call whose ops are still to come, where that is earlier).
Then only the events that may still bear on later iterations are kept: those that start at `before` or later or
end after it, the calls whose ops are still to come or still kept, and what the map asks to carry of the ops kept,
by launch key (`_Rank.carried`: what ranges since let go told of an op, such as the phase that launched it). A map
over the whole tables gives the same measures: each depends only on the events that overlap its iteration, the
calls that launched them, and the ops launched before its sync points, which are kept while they may end inside it.
The measures run in turn in a thread of their own, a few behind the fold, which lets go of the events meanwhile.

Each process of a file is measured apart, as a whole read splits a file into ranks. Where the slices cannot promise
the whole read's answer the tables are read whole instead (inputs.chunks.ReadWhole): a launch key held by several
calls, an op read before the call that launched it, or a process without iterations where the map measures its
whole capture as one window. MPI calls are few next to the events: they are read whole ahead and handed to the
buffer in time.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .collective_match import kernel_tables, nccl_rows
from .gpu import GPU_NEEDS, call_key, key_places, launch_keys
from .groups import add_counts, distinct
from .inputs import Frame, arrow_of, numpy_of
from .inputs.batches import NEED_FRAMES
from .inputs.chunks import END_OF_TIME, ReadWhole, Stream
from .inputs.events import NVTX_DTYPES, read_mpi
from .inputs.rank_data import RankData, has_cuda_trace
from .iteration_scan import FirstRead, iterations_ahead, no_windows_text
from .iterations import Iterations, range_arrays

GPU_FRAMES = tuple(NEED_FRAMES[need][0] for need in GPU_NEEDS)
MEASURES_AHEAD = 2  # measures queued or running while the fold goes on


@dataclass
class _Rank:
    """One process's part of a sliced map: its iterations (or the text of the error a whole read gives), the events
    held, and the map's pieces so far."""
    pid: int
    it: Iterations | str
    mpi: Frame | None  # its MPI calls, by start
    mpi_at: int = 0  # the first MPI call not handed to the buffer yet
    rows: dict = field(default_factory=dict)  # frame -> the buffered rows (pa.Table)
    next: int = 0  # the first iteration not measured yet
    pieces: list = field(default_factory=list)  # futures of (piece, what the map carries of the ops kept then)
    carried: Future | None = None  # the last measure's: what the map carries, by key
    call_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per buffered call: its key's place
    # among the launch keys (-1: none of the ops read ahead has it)
    nccl: list = field(default_factory=list)  # each span's NCCL kernels, kept once as they pass (sliced_stream's nccl)


@dataclass
class Slices:
    """What a sliced map carries from span to span: each process's part, and every GPU op's launch key."""
    ranks: dict  # pid -> _Rank
    kernels_read: bool  # whether iterations_ahead read kernels (a process it did not give then has none)
    has_cuda: bool
    keys: np.ndarray  # distinct and sorted
    remaining: np.ndarray  # per key, its ops not read yet
    options: dict
    measure: Callable
    whole_capture: bool  # a process without iterations is one window: read whole
    nccl: bool = False  # keep every NCCL kernel as it passes, for the result's nccl_kernels tables
    called: np.ndarray | None = None  # per key: a call holding it was read
    measuring: ThreadPoolExecutor | None = None  # one thread: the measures run in turn, beside the fold
    in_flight: deque = field(default_factory=deque)
    ranges: FirstRead | None = None  # the closed NVTX ranges read ahead, which the spans take

    def __post_init__(self):
        self.called = np.zeros(len(self.keys), bool)


def sliced_stream(measure: Callable, finish: Callable, needs: set, whole_capture: bool = False,
                  nccl: bool = False) -> Stream:
    """A Stream running `measure(rank_data, ranges, iterations, options, before, first, carried) -> (piece, carry)`
    on a few iterations of a process at a time, and `finish(iterations, pieces, names) -> result` once all are
    measured (the NVTX names as the whole table's dictionary holds them). carry: arrays by launch key ("key"),
    what the map learnt of some ops, handed back as `carried` next time for the ops still kept. The GPU ops and MPI
    calls read are those the recipe needs; whole_capture: the map measures a process without iterations (none
    asked for) as one window over its whole capture, which only a whole read gives; nccl: the result holds the
    process's NCCL kernels too, kept once each as the spans pass, as collective_match.nccl_kernels gives them from a
    whole read but for NCCL's payloads (communicator ids and sizes -1: the groups are then inferred)."""
    gpu_needs = tuple(need for need in GPU_NEEDS if need in needs)

    def prepare(ahead, options: dict) -> Slices:
        state = _prepare(ahead, options, measure, "mpi" in needs, gpu_needs, whole_capture)
        state.nccl = nccl
        ahead.prefold(_key_places)
        ahead.replay("nvtx", _ranges(state))
        return state

    def done(state: Slices, names: list) -> dict:
        if not state.ranks:
            raise ReadWhole("no process with iterations or GPU work")
        for rank in state.ranks.values():
            if isinstance(rank.it, str):
                continue
            _advance(state, rank, END_OF_TIME)
            if rank.next < len(rank.it.start_ns):
                raise ReadWhole("iterations whose launched ops never came")
        if state.measuring is not None:
            state.measuring.shutdown()
        state.ranges.remove()
        return {pid: {"error": rank.it} if isinstance(rank.it, str)
                else {**finish(rank.it, [f.result()[0] for f in rank.pieces], names),
                      **(kernel_tables(rank.nccl, rank.it) if state.nccl else {})}
                for pid, rank in state.ranks.items()}

    # read ahead of the spans, and so in the progress's rows from the start: NVTX for the iterations (and its closed
    # ranges kept for the spans), the ops' keys
    return Stream(needs=dict.fromkeys(("runtime", *gpu_needs)), view=_view, fold=_fold, finish=done, prepare=prepare,
                  ahead=("nvtx", *gpu_needs))


def _prepare(ahead, options: dict, measure: Callable, with_mpi: bool, gpu_needs: tuple, whole_capture: bool
             ) -> Slices:
    # the launch keys are read on the side while the iterations are found, which keeps the main thread busy
    with ThreadPoolExecutor(1, thread_name_prefix="nsys-recipe-launch-keys") as pool:
        keys_read = pool.submit(launch_keys, ahead, gpu_needs)
        windows, kernels_read, ranges = iterations_ahead(ahead, options, keep=True)
        keys, remaining = keys_read.result()
    for it in windows.values():
        _check_whole_capture(it, options, whole_capture)
    mpi = read_mpi(ahead.src, ahead.strings) if with_mpi else None
    ranks = {}
    for pid, it in windows.items():
        own = None
        if mpi is not None and len(mpi):
            at = np.flatnonzero(mpi.values("pid") == pid)
            by_start = at[np.argsort(mpi.values("start_ns")[at], kind="stable")]
            own = Frame(mpi.table.take(arrow_of(by_start)), mpi.dtypes) if len(at) else None
        ranks[pid] = _Rank(pid, it, own)
    return Slices(ranks, kernels_read, has_cuda_trace(ahead.src), keys, remaining, options, measure, whole_capture,
                  ranges=ranges)


def _check_whole_capture(it, options: dict, whole_capture: bool) -> None:
    if whole_capture and isinstance(it, str) and not (options.get("iteration") or options.get("iteration_kernel")):
        raise ReadWhole("a process without iterations, measured as one window over its whole capture")


def _view(need: str, frame: Frame) -> pa.Table:
    """A span's rows: the whole frame, its dtypes in the schema's metadata."""
    return frame.table.replace_schema_metadata({"dtypes": json.dumps(frame.dtypes)})


def _ranges(state: Slices) -> Iterator[pa.Table]:
    """The spans' NVTX events: the closed ranges read ahead (the map's only NVTX rows), as `_view` gives a span's."""
    dtypes = {"dtypes": json.dumps(NVTX_DTYPES)}
    return (rows.replace_schema_metadata(dtypes) for rows in state.ranges.spans())


def _key(rows: pa.Table) -> np.ndarray:
    return call_key(Frame(rows, {}))


def _key_places(state: Slices, carried: dict, span_start: int, span_end: int, chunk: dict) -> dict:
    """A span's rows, with the place of each call's and op's launch key among the keys read ahead: what of a span
    needs only its rows and those keys, found a span ahead of the fold (Stream.prefold), which measures the
    iterations meanwhile."""
    places = {need: key_places(state.keys, _key(rows)) for need, rows in chunk.items()
              if (need == "runtime" or need in GPU_NEEDS) and rows is not None and rows.num_rows}
    return {"rows": chunk, "places": places}


def _fold(state: Slices, span_start: int, span_end: int, span: dict) -> None:
    chunk, places = span["rows"], span["places"]
    for need, rows in chunk.items():
        if rows is None or not rows.num_rows:
            continue
        if need == "runtime":
            call_at, hit = places[need]
            at = call_at[hit]
            if len(distinct(at)) < len(at) or state.called[at].any():
                raise ReadWhole("a launch key held by several calls")
            if (state.remaining[at] == 0).any():
                raise ReadWhole("a GPU op read before the call that launched it")
            state.called[at] = True
            call_at[~hit] = -1
        elif need in GPU_NEEDS:
            at, hit = places[need]
            if not hit.all():
                raise ReadWhole("GPU ops the first read did not give")  # the export changed under the read
            add_counts(state.remaining, at, -1)
        pid = numpy_of(rows.column("pid"))
        one = pid.min() == pid.max()
        for p in [int(pid[0])] if one else np.unique(pid).tolist():
            rank = state.ranks.get(p)
            if rank is None:
                if need == "nvtx":
                    continue  # NVTX events and no range: not a rank for that
                text = no_windows_text(state.options, state.kernels_read)
                _check_whole_capture(text, state.options, state.whole_capture)
                rank = state.ranks[p] = _Rank(p, text, None)
            if isinstance(rank.it, str):
                continue
            own = rows if one else rows.filter(arrow_of(pid == p))
            if need == "kernel" and state.nccl:
                rank.nccl.append(nccl_rows(Frame(own, json.loads(own.schema.metadata[b"dtypes"]))))
            attr = NEED_FRAMES[need][0]
            held = rank.rows.get(attr)  # one chunk: the map and the next span read its columns without copies
            rank.rows[attr] = own if held is None else pa.concat_tables([held, own]).combine_chunks()
            if need == "runtime":
                rank.call_at = np.r_[rank.call_at, call_at if one else call_at[pid == p]]
    for rank in state.ranks.values():
        if not isinstance(rank.it, str):
            _advance(state, rank, span_end)


def _advance(state: Slices, rank: _Rank, frontier: int) -> None:
    """Measure the iterations of a process that are ready once every event starting before `frontier` is read."""
    if rank.mpi is not None:  # the MPI calls starting before the frontier join the buffer
        upto = int(np.searchsorted(rank.mpi.values("start_ns"), frontier, side="left"))
        if upto > rank.mpi_at:
            rows = rank.mpi.table.slice(rank.mpi_at, upto - rank.mpi_at)
            rank.rows["mpi"] = rows if rank.rows.get("mpi") is None else pa.concat_tables([rank.rows["mpi"], rows])
            rank.mpi_at = upto
    it = rank.it
    n = len(it.start_ns)
    calls = rank.rows.get("runtime")
    pending = rank.call_at >= 0  # the calls whose ops are still to come
    pending[pending] = state.remaining[rank.call_at[pending]] > 0
    waiting = int(numpy_of(calls.column("start_ns"))[pending].min()) if pending.any() else END_OF_TIME
    ready = max(int(np.searchsorted(it.end_ns, min(frontier, waiting), side="right")), rank.next)
    # a call whose ops are still to come keeps what was around it, as the map may yet ask (outside iterations too)
    before = min(int(it.start_ns[ready]) if ready < n else END_OF_TIME, waiting)
    if ready == rank.next and before < frontier:
        return  # inside an iteration not ready yet, or a call's ops still to come: wait for more
    before = min(before, frontier)
    data = _rank_data(state, rank)
    subset = Iterations(it.delimiter, it.start_ns[rank.next:ready], it.end_ns[rank.next:ready], it.tid)
    first, previous = rank.next, rank.carried
    kept_ops = _let_go(rank, before, pending)

    def measure() -> tuple:
        carried = previous.result()[1] if previous is not None else {"key": np.zeros(0, np.int64)}
        piece, carry = state.measure(data, range_arrays(data.frame("nvtx")), subset, state.options, before, first,
                                     carried)
        kept = np.isin(carry["key"], kept_ops)
        return piece, {c: v[kept] for c, v in carry.items()}

    if state.measuring is None:
        state.measuring = ThreadPoolExecutor(1, thread_name_prefix="nsys-recipe-measure")
    rank.carried = state.measuring.submit(measure)
    rank.pieces.append(rank.carried)  # with no iteration too: what the map learnt of the process
    rank.next = ready
    state.in_flight.append(rank.carried)
    while len(state.in_flight) > MEASURES_AHEAD:  # what they hold is what the spans let go
        state.in_flight.popleft().result()


def _rank_data(state: Slices, rank: _Rank) -> RankData:
    frames = {}
    for attr, rows in rank.rows.items():
        if rows is not None:
            dtypes = rank.mpi.dtypes if attr == "mpi" else json.loads(rows.schema.metadata[b"dtypes"])
            frames[attr] = Frame(rows, dtypes)
    return RankData(file="", pid=rank.pid, session_start_ns=0, has_cuda=state.has_cuda, **frames)


def _let_go(rank: _Rank, before: int, pending: np.ndarray) -> np.ndarray:
    """Keep only the events that may bear on iterations from `before` on (pending: the buffered calls whose ops are
    still to come); the launch keys of the ops kept, whose carry the map keeps."""
    kept_ops = []
    for attr in ("nvtx", "mpi", *GPU_FRAMES):
        rows = rank.rows.get(attr)
        if rows is None:
            continue
        keep = (numpy_of(rows.column("start_ns")) >= before) | (numpy_of(rows.column("end_ns"), 0) > before)
        if attr in GPU_FRAMES:
            kept_ops.append(_key(rows)[keep])
        rank.rows[attr] = _kept(rows, keep)
    kept_ops = np.concatenate(kept_ops) if kept_ops else np.zeros(0, np.int64)
    calls = rank.rows.get("runtime")
    if calls is not None:
        key = _key(calls)
        keep = (numpy_of(calls.column("start_ns")) >= before) | (numpy_of(calls.column("end_ns")) > before)
        keep |= pending | np.isin(key, kept_ops)
        rank.rows["runtime"] = _kept(calls, keep)
        rank.call_at = rank.call_at[keep]
    return kept_ops


def _kept(rows: pa.Table, keep: np.ndarray) -> pa.Table:
    """The rows kept: a slice where they are the last ones (as usual: those starting at `before` or later), which
    shares their columns until the next span's rows join them, where a filter copies every column."""
    first = int(np.argmax(keep)) if len(keep) and keep.any() else len(keep)
    return rows.slice(first) if keep[first:].all() else rows.filter(arrow_of(keep))
