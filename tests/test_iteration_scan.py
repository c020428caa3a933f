"""Iterations of a long capture found from its tables read span by span (iteration_scan), and kernel_pace's map on
such a capture (iterations read ahead, GPU work folded in span by span): the same as find_iterations and the map over
whole tables, on small ranks built by hand and on every sample input, however the tables are cut."""

import threading

import numpy as np
import pyarrow as pa
import pytest
from conftest import folded, rank_maps
from test_batches import REAL_GLOO, REAL_NCCL, synthetic  # noqa: F401 (a fixture)
from test_iterations import kernels, nvtx

from nsys_recipe_pack import iteration_scan, iterations
from nsys_recipe_pack.errors import BadInputError
from nsys_recipe_pack.inputs import RankData, load_file, rank_data, readers
from nsys_recipe_pack.recipes import kernel_pace


def _rank(rows, ks=None) -> RankData:
    """A rank of NVTX ranges (test_iterations.nvtx rows) in order of start, as an export holds them."""
    df = nvtx(rows).sort_values("start_ns", kind="stable").reset_index(drop=True)
    return RankData(file="x", pid=1, session_start_ns=0, nvtx=df, kernels=ks)


def _reader(rank: RankData, instants: int, table: str = "nvtx"):
    """read() -> spans of `instants` distinct starts each of the rank's closed ranges (or kernels), and the reads."""
    frame = rank.frame(table)
    view = iterations.closed_range_view if table == "nvtx" else iteration_scan.kernel_view
    rows = view(table, frame)
    start = rows.column("start_ns").to_numpy()
    instant = np.cumsum(np.r_[0, start[1:] != start[:-1]]) if len(start) else start
    cuts = np.searchsorted(instant, np.arange(0, int(instant[-1]) + 1 if len(start) else 0, instants))
    cuts = np.r_[cuts, len(start)]
    reads = []

    def read():
        reads.append(1)
        return (rows.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a)

    return read, reads


def _same(it, want: iterations.Iterations):
    assert it.delimiter == want.delimiter
    assert it.start_ns.tolist() == want.start_ns.tolist() and it.end_ns.tolist() == want.end_ns.tolist()
    assert it.tid == want.tid


NESTED = ([(n, 100 * i + a, 100 * i + b, 1) for i in range(6) for n, a, b in [("step", 0, 90), ("op", 10, 20),
                                                                             ("op", 30, 40)]]
          + [("lonely", 0, 5, 1)] + [("poll", 10 * i, 10 * i + 5, 2) for i in range(5)])
# "load" covers the most time, but four of its six ranges lie inside "step" ranges: "step" is the delimiter
INSIDE = ([("step", 100 * i, 100 * i + 50, 1) for i in range(5)] + [("load", 100 * i + 10, 100 * i + 20, 1)
                                                                       for i in range(4)]
          + [("load", 1000, 2000, 1), ("load", 3000, 4000, 1)] + [("tick", 5000 + 20 * i, 5005 + 20 * i, 1)
                                                                    for i in range(5)])
# as INSIDE, the "load" ranges that "step" ranges hold starting at the same instant, before them in the table
TIES = ([("load", 100 * i, 100 * i + 10, 1) for i in range(4)] + [("step", 100 * i, 100 * i + 50, 1) for i in range(5)]
        + [("load", 1000, 2000, 1), ("load", 3000, 4000, 1)])
# two threads: the delimiter found on the busiest (1) is taken on the thread where its name is most common (2)
THREADS = ([("step", 100 * i, 100 * i + 90, 1) for i in range(5)] + [("op", 100 * i + k, 100 * i + k + 1, 1)
                                                                       for i in range(5) for k in (10, 20)]
           + [("step", 1000 + 100 * i, 1000 + 100 * i + 50, 2) for i in range(7)])
# as THREADS, "step" as common on thread 3 as on 2, and seen there first: ties go to the first seen
TIED = THREADS + [("step", 950 + 100 * i, 1000 + 100 * i, 3) for i in range(7)]
FLAT = [(f"op{k}", 1000 * (5 * k + i), 1000 * (5 * k + i) + 10 + k, 1) for k in range(40) for i in range(5)]


@pytest.mark.parametrize("rows", [NESTED, INSIDE, TIES, THREADS, TIED, FLAT],
                         ids=["nested", "inside", "ties", "threads", "tied", "flat"])
@pytest.mark.parametrize("instants", [1, 3, 1000])
@pytest.mark.parametrize("tested", [1, 8])
@pytest.mark.parametrize("replay_rows", [0, 7, 10**9])
@pytest.mark.parametrize("queries", [10**6, 2])
def test_found_delimiter_is_the_whole_reads(monkeypatch, tmp_path, rows, instants, tested, replay_rows, queries):
    monkeypatch.setattr(iteration_scan, "INNER_CANDIDATES", tested)  # candidates tested by one read, at most
    monkeypatch.setattr(iteration_scan, "INNER_QUERIES", 0 if tested == 1 else 10**9)
    monkeypatch.setattr(iteration_scan, "QUERIES", queries)  # (range, candidate) pairs tested at once
    # the first read's rows replayed to the further reads from a file, from memory then a file, or from memory
    monkeypatch.setattr(iteration_scan, "REPLAY_ROWS", replay_rows)
    replays, files = [], []
    monkeypatch.setattr(iteration_scan._Replay, "__iter__", _counted(iteration_scan._Replay.__iter__, replays))
    monkeypatch.setattr(iteration_scan.SpillWriter, "__init__", _counted(iteration_scan.SpillWriter.__init__, files))
    rank = _rank(rows)
    want = iteration_scan.find_iterations(rank)  # the rank's ranges as one span
    replays.clear()
    files.clear()
    read, reads = _reader(rank, instants)
    found, _ = iteration_scan.nvtx_iterations(read, spill_dir=str(tmp_path))
    assert list(found) == [1]
    _same(found[1], want)
    assert len(reads) == 1  # the table is read once
    assert bool(files) == (replay_rows < len(rows))  # what does not fit is in a file...
    assert not list(tmp_path.iterdir())  # ...gone once the iterations are found
    if rows is INSIDE or rows is TIES:  # "load" is tried first; testing one candidate a read, "step" needs a third
        assert want.delimiter.name == "step" and len(replays) == (2 if tested == 1 else 1)


def test_a_further_read_that_fails_stops_reading_its_file(monkeypatch, tmp_path):
    """The file's part of a further read is read in a thread of its own: a test that raises stops it and removes the
    file, leaving no thread behind."""
    monkeypatch.setattr(iteration_scan, "REPLAY_ROWS", 0)  # every range replayed from the file
    tested = []

    def failing(self, start, end, at):
        tested.append(len(start))
        raise RuntimeError("a failing test")

    monkeypatch.setattr(iteration_scan._Plan, "add", failing)
    read, _ = _reader(_rank(FLAT), 1)  # a span an instant: 200 spans in the file, of which one is tested
    before = set(threading.enumerate())
    try:
        iteration_scan.nvtx_iterations(read, spill_dir=str(tmp_path))
    except RuntimeError as error:  # checked while the error, and so the frames it passed through, are still held
        assert str(error) == "a failing test"
        assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
    else:
        pytest.fail("the failing test was not raised")
    assert tested == [1]
    assert not list(tmp_path.iterdir())


def _counted(method, calls: list):
    def counted(self, *args):
        calls.append(1)
        return method(self, *args)
    return counted


def test_named_delimiter_and_its_error_read_once():
    rows = [("step", 100 * i, 100 * i + 50, 1, "train") for i in range(3)] + [("step", 20, 30, 1, "eval")]
    rank = _rank(rows)
    for name in ("step@train", "step"):
        read, reads = _reader(rank, 2)
        _same(iteration_scan.nvtx_iterations(read, name)[0][1], iteration_scan.find_iterations(rank, iteration=name))
        assert len(reads) == 1
    read, _ = _reader(rank, 2)
    with pytest.raises(BadInputError) as whole:
        iteration_scan.find_iterations(rank, iteration="stpe")
    assert f"x: {iteration_scan.nvtx_iterations(read, 'stpe')[0][1]}" == str(whole.value)


def test_without_a_delimiting_range_kernels_delimit():
    ks = kernels([("gemm", 0, 5), ("relu", 6, 8), ("gemm", 10, 15), ("gemm", 20, 26), ("gemm", 30, 34),
                  ("gemm", 42, 47)])
    rank = _rank([("once", 0, 50, 1)], ks)
    read, _ = _reader(rank, 1)
    assert iteration_scan.nvtx_iterations(read) == ({1: None}, None)
    for name in (None, "gemm", "relu"):
        read, reads = _reader(rank, 2, "kernels")
        found = iteration_scan.kernel_iterations(read, name, {1}, set())
        want = iteration_scan.find_iterations(rank, iteration_kernel=name)
        _same(found[1], iterations.Iterations(want.delimiter, want.start_ns, want.end_ns, None))
        assert len(reads) == (2 if name is None else 1)  # names counted, then launches collected
    read, _ = _reader(rank, 2, "kernels")
    with pytest.raises(BadInputError) as whole:
        iteration_scan.find_iterations(rank, iteration_kernel="gem")
    assert f"x: {iteration_scan.kernel_iterations(read, 'gem', {1}, set())[1]}" == str(whole.value)
    # a process with ranges and no kernel at all, and one whose kernels repeat too little
    found = iteration_scan.kernel_iterations(lambda: iter(()), None, {1}, set())
    assert found == {1: iterations.no_iterations_text(True, False)}
    few = _rank([("once", 0, 50, 1)], kernels([("gemm", 0, 5), ("relu", 6, 8)]))
    with pytest.raises(BadInputError) as whole:
        iteration_scan.find_iterations(few)
    read, _ = _reader(few, 1, "kernels")
    assert f"x: {iteration_scan.kernel_iterations(read, None, {1}, set())[1]}" == str(whole.value)


def _maps(path, options):
    """kernel_pace's map of each rank read whole and read as a long capture (its result or error, each)."""
    needs = kernel_pace.needs_for(options)
    return [rank_maps(kernel_pace.RECIPE, path, options, spans, needs) for spans in (False, True)]


@pytest.mark.parametrize(("batch_rows", "replay_rows"), [(40, 0), (100_000, 10**9)])
def test_kernel_pace_of_a_long_capture_is_the_whole_reads(synthetic, monkeypatch, batch_rows, replay_rows):  # noqa: F811
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    monkeypatch.setattr(iteration_scan, "REPLAY_ROWS", replay_rows)  # the first read replayed from a file, or memory
    for path in [REAL_NCCL, REAL_GLOO, synthetic["sqlite"][2], synthetic["parquetdir"][2]]:
        kernel = load_file(path, {"kernel"})[0].frame("kernels").codes("name")[1][0]
        for options in ({}, {"iteration": "step"}, {"iteration_kernel": kernel}, {"iteration": "nope"},
                        {"iteration_kernel": "nope"}):
            whole, spanned = _maps(path, options)
            assert options or isinstance(whole[0], dict), path  # iterations were found
            for want, got in zip(whole, spanned, strict=True):
                if isinstance(want, str):
                    assert got == want, (path, options)
                    continue
                assert got["delimiter"] == want["delimiter"], (path, options)
                assert got["times"].equals(want["times"]) and got["times"].num_rows, (path, options)


def test_a_table_out_of_order_is_read_whole(tmp_path, monkeypatch):
    import shutil
    import sqlite3

    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    path = tmp_path / "shuffled.sqlite"
    shutil.copy(REAL_GLOO, path)
    with sqlite3.connect(path) as db:  # the kernels' rows in reverse order of start
        db.execute("CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start DESC")
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM k")
        db.execute("DROP TABLE k")
    whole = load_file(path, kernel_pace.NEEDS)
    (spanned, result), = folded(kernel_pace.RECIPE, path, {})
    assert result is None
    assert kernel_pace.map_rank(spanned, {})["times"].equals(kernel_pace.map_rank(whole[0], {})["times"])


@pytest.mark.parametrize("replay_rows", [0, 300, 10**9])
@pytest.mark.parametrize("path", [REAL_GLOO, REAL_NCCL])
def test_the_ranges_a_first_read_keeps_are_those_a_read_again_gives(monkeypatch, tmp_path, replay_rows, path):
    """The closed ranges kept from the first read (iteration_scan.FirstRead), which a sliced map's spans take instead
    of reading NVTX again: every range, its process, thread, times, name and domain, in the table's order, each span's
    names and domains a dictionary of the words it holds; the file of those beyond KEPT_REPLAY_ROWS gone at the end."""
    from nsys_recipe_pack.inputs.batches import Extents
    from nsys_recipe_pack.inputs.chunks import time_chunks
    from nsys_recipe_pack.inputs.readers import ExportSource, string_table

    monkeypatch.setattr(iteration_scan, "KEPT_REPLAY_ROWS", replay_rows)
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 100)
    src = ExportSource(path, "sqlite")
    strings = string_table(src)

    def read():
        return (chunk["nvtx"] for _, _, chunk in time_chunks(src, ["nvtx"], strings, iterations.closed_range_view,
                                                               Extents(), lambda table, rows: None, None))

    try:
        windows, kept = iteration_scan.nvtx_iterations(read, spill_dir=str(tmp_path), keep=True)
        again, _ = iteration_scan.nvtx_iterations(read)
        assert list(windows) == list(again) and windows
        for pid, it in windows.items():  # None: no range delimits its iterations
            assert (it is None) == (again[pid] is None) and (it is None or _same(it, again[pid]) is None)
        spans = list(kept.spans())
        want = pa.concat_tables(read())
    finally:
        src.close()
    assert len(spans) > 3 and not list(tmp_path.iterdir())
    for column in ("name", "domain"):
        for rows in spans:
            col = rows.column(column).combine_chunks()
            assert sorted(col.dictionary.to_pylist()) == sorted(set(col.to_pylist()) - {None})
    got = pa.concat_tables(spans)
    assert got.num_rows == want.num_rows > 300
    for column in want.column_names:
        assert got.column(column).to_pylist() == want.column(column).to_pylist(), column
    assert set(got.column("event_type").to_pylist()) == {59}


def test_a_rank_read_whole_is_one_span_of_the_scan(monkeypatch):
    """find_iterations is the scan over the rank's closed ranges as one span: no other code finds iterations."""
    spans = []
    add = iteration_scan.RangeScan.add
    monkeypatch.setattr(iteration_scan.RangeScan, "add",
                        lambda self, rows: spans.append(rows.num_rows) or add(self, rows))
    it = iteration_scan.find_iterations(_rank(NESTED))
    assert spans == [len(NESTED)]
    # by hand: "op" repeats most but lies inside "step", which covers the most time on the busiest thread (1)
    assert (it.delimiter.name, it.tid) == ("step", 1)
    assert it.start_ns.tolist() == [100 * i for i in range(6)]
    assert it.end_ns.tolist() == [100 * i + 90 for i in range(6)]


def test_no_iterations_is_the_same_error_read_whole_or_in_spans():
    """A rank where nothing repeats has nothing to say (MissingTraceError: the run fails only if every rank is so), a
    delimiter the options name that is not there is a bad input, whether the rank was read whole or as spans."""
    from nsys_recipe_pack.errors import MissingTraceError

    def streamed(result: dict) -> dict:
        rank.streamed = result
        return kernel_pace.map_rank(rank, {})

    rank = _rank([("once", 0, 50, 1)], kernels([("gemm", 0, 5), ("relu", 6, 8)]))
    with pytest.raises(MissingTraceError):
        iteration_scan.find_iterations(rank)
    with pytest.raises(MissingTraceError):
        streamed({"error": iterations.no_iterations_text(True, True)})
    named = {"error": iterations.no_range_text("stpe", [])}
    for read in (lambda: iteration_scan.find_iterations(rank, iteration="stpe"),
                 lambda: streamed(named)):
        with pytest.raises(BadInputError) as error:
            read()
        assert not isinstance(error.value, MissingTraceError)
