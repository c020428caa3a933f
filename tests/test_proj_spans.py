"""nvtx_gpu_proj on a long capture, projected span by span of time as its tables are read (inputs.chunks) with its
ranges written to a file as they are finished (spill.py): the same output folder as the map over whole tables,
however the tables are cut, and the whole read wherever spans cannot give the same answer."""

import gc
import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import folded
from test_batches import REAL_GLOO, REAL_NCCL, synthetic  # noqa: F401 (a fixture)

from nsys_recipe_pack import recipes, runner
from nsys_recipe_pack.inputs import RankData, rank_data, read_progress, readers
from nsys_recipe_pack.recipes import nvtx_gpu_proj as proj
from nsys_recipe_pack.spill import SpilledRows, SpillWriter

SPEC = recipes.get("nvtx_gpu_proj")


@pytest.fixture()
def spill_dir(tmp_path, monkeypatch):
    """TMPDIR during a test, where a map outside `run` writes its ranges (a run writes them in its output folder):
    empty again after each."""
    folder = tmp_path / "spill"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _run(path, out, attribution, spans, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(rank_data, "STREAM_MIN_ROWS", 0 if spans else 1 << 62)
        runner.run("nvtx_gpu_proj", [str(path)], str(out), force=True, mode="none",
                   options={"attribution": attribution}, log=lambda msg: None)


def _streamed(path, attribution="process"):
    results = [result for _, result in folded(SPEC, path, {"attribution": attribution})]
    for r in results:
        if r is not None:
            r["ranges"].remove()
    return results


def _same_output(path, tmp_path, monkeypatch, attribution="process"):
    written = []

    class Recorded(SpillWriter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            written.append(Path(self.path))

    monkeypatch.setattr(proj, "SpillWriter", Recorded)
    _run(path, tmp_path / "whole", attribution, False, monkeypatch)
    _run(path, tmp_path / "spans", attribution, True, monkeypatch)
    # the ranges were written into the output folder as it was made, and are gone from it
    assert written and all(f.parent.parent == tmp_path and f.parent.name.startswith(".spans.partial-") for f in written)
    assert not any(f.exists() for f in written) and not list((tmp_path / "spans").glob(".*"))
    for table in ("ranges", "summary", "files"):
        want = pd.read_parquet(tmp_path / "whole" / f"{table}.parquet")
        got = pd.read_parquet(tmp_path / "spans" / f"{table}.parquet")
        pdt.assert_frame_equal(got, want)  # values and dtypes
    analysis = [(tmp_path / run / "analysis.json").read_text() for run in ("whole", "spans")]
    assert analysis[0] == analysis[1]
    return pd.read_parquet(tmp_path / "whole" / "ranges.parquet")


@pytest.mark.parametrize("batch_rows", [7, 1000])
@pytest.mark.parametrize("attribution", ["process", "thread"])
def test_spans_give_the_whole_reads_output(synthetic, spill_dir, tmp_path, monkeypatch,  # noqa: F811
                                           batch_rows, attribution):
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    for i, path in enumerate([REAL_GLOO, synthetic["sqlite"][2], synthetic["parquetdir"][2]]):
        with monkeypatch.context() as m:
            m.setattr(rank_data, "STREAM_MIN_ROWS", 0)
            assert all(r is not None for r in _streamed(path, attribution)), path
        ranges = _same_output(path, tmp_path / str(i), monkeypatch, attribution)
        assert ranges["gpu_ops"].sum() > 0 and ranges["stack_level"].max() > 0, path
        assert not list(spill_dir.iterdir())


def test_a_rank_without_ranges_leaves_nothing_in_the_output(synthetic, spill_dir, tmp_path, monkeypatch):  # noqa: F811
    """A long capture without NVTX ranges beside one with them: what its map wrote as it went, unused (the rank says
    nothing), is gone from the output folder with the rest."""
    bare = tmp_path / "bare.sqlite"
    shutil.copy(synthetic["sqlite"][1], bare)
    con = sqlite3.connect(bare)
    con.execute("DELETE FROM NVTX_EVENTS")
    con.commit()
    con.close()
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    runner.run("nvtx_gpu_proj", [str(synthetic["sqlite"][0]), str(bare)], str(tmp_path / "out"), force=True,
               mode="none", log=lambda msg: None)
    assert len(pd.read_parquet(tmp_path / "out" / "files.parquet")) == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "analysis.json", "files.parquet", "nvtx_gpu_proj.ipynb", "out.nsys-analysis", "ranges.parquet",
        "summary.parquet"]
    assert not list(spill_dir.iterdir())


def test_ranges_finished_late_are_put_back_in_their_places(spill_dir, tmp_path, monkeypatch):
    """With few finished ranges held back behind unfinished ones, most are written aside and merged back in."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 20)
    monkeypatch.setattr(proj, "HOLD_ROWS", 4)
    monkeypatch.setattr(proj, "SUMS_ROWS", 5)  # the sums added up as they go, too
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    streamed, = _streamed(REAL_GLOO)
    assert streamed["ranges"].late.num_rows > 10
    _same_output(REAL_GLOO, tmp_path, monkeypatch)
    assert not list(spill_dir.iterdir())


def test_several_processes_in_one_file_are_read_whole(spill_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 50)
    with monkeypatch.context() as m:
        m.setattr(rank_data, "STREAM_MIN_ROWS", 0)
        assert _streamed(REAL_NCCL) == [None, None]
    _same_output(REAL_NCCL, tmp_path, monkeypatch)
    assert not list(spill_dir.iterdir())


def test_ranges_that_cross_on_one_thread_are_read_whole(spill_dir, tmp_path, monkeypatch):
    """Start/end ranges may cross (the ranges a span carries to the next must nest): the whole read, one span, and the
    same output."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 50)
    path = tmp_path / "crossing.sqlite"
    shutil.copy(REAL_GLOO, path)
    con = sqlite3.connect(path)
    # every fifth closed range made to end a little after the range that follows it on its thread has started
    con.execute("""UPDATE NVTX_EVENTS SET end = end + 1000 + (SELECT MIN(n.start) - NVTX_EVENTS.start FROM NVTX_EVENTS n
                   WHERE n.globalTid = NVTX_EVENTS.globalTid AND n.start > NVTX_EVENTS.start)
                   WHERE end IS NOT NULL AND eventType IN (59, 60) AND rowid % 5 = 0""")
    con.commit()
    con.close()
    with monkeypatch.context() as m:
        m.setattr(rank_data, "STREAM_MIN_ROWS", 0)
        assert _streamed(path) == [None]
    _same_output(path, tmp_path, monkeypatch)
    assert not list(spill_dir.iterdir())


def test_ops_of_one_key_called_in_two_ranges_of_one_thread_count_once(spill_dir, tmp_path, monkeypatch):
    """Two launching calls of one thread given one correlation id, each in another NVTX range, before the first's
    ops come: its ops count once in each range around either call, also in the ranges around both (where adding a
    key's ops up from each innermost range would count them twice). Spans give the whole read's output, and both
    give what SQL counts over the export."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 50)
    path = tmp_path / "one_key_two_ranges.sqlite"
    shutil.copy(REAL_GLOO, path)
    con = sqlite3.connect(path)
    first_call = """
        WITH calls AS (
            SELECT r.rowid AS id, r.start, r.correlationId AS corr, r.globalTid AS tid,
                   (SELECT MIN(k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.correlationId = r.correlationId)
                       AS op_start,
                   (SELECT n.rowid FROM NVTX_EVENTS n WHERE n.globalTid = r.globalTid AND n.start <= r.start
                       AND n.end >= r.end ORDER BY n.start DESC LIMIT 1) AS range
            FROM CUPTI_ACTIVITY_KIND_RUNTIME r
            WHERE r.correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL))
        SELECT a.corr, b.id FROM calls a JOIN calls b ON a.tid = b.tid AND b.start > a.start AND b.start < a.op_start
        WHERE a.range IS NOT NULL AND b.range IS NOT NULL AND a.range != b.range ORDER BY a.start LIMIT 1"""
    corr, second = con.execute(first_call).fetchone()
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = ? WHERE rowid = ?", (corr, second))
    con.commit()
    con.close()
    taken = []

    def take_back(live, where, op):
        before = int(live["ops"].sum())
        proj_take_back(live, where, op)
        taken.append(before - int(live["ops"].sum()))

    proj_take_back = proj._take_back_repeats
    with monkeypatch.context() as m:
        m.setattr(rank_data, "STREAM_MIN_ROWS", 0)
        m.setattr(proj, "_take_back_repeats", take_back)
        assert all(r is not None for r in _streamed(path, "thread"))
        assert sum(taken) > 0  # the op of two calls was counted again, and taken back
    _same_as_sql(_same_output(path, tmp_path, monkeypatch, "thread"), path)
    assert not list(spill_dir.iterdir())


def _same_as_sql(ranges: pd.DataFrame, path) -> None:
    """The ranges with GPU ops of a single-process export projected with `--attribution thread` (their ops, first
    start and last end), as SQL gives them: each closed range's distinct ops launched by a call inside it on its
    thread."""
    with sqlite3.connect(path) as con:
        truth = pd.read_sql("""
            WITH ops AS (SELECT 'k' || rowid AS op, correlationId AS corr, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL
                         UNION ALL SELECT 'c' || rowid, correlationId, start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY
                         UNION ALL SELECT 's' || rowid, correlationId, start, end FROM CUPTI_ACTIVITY_KIND_MEMSET)
            SELECT n.start AS cpu_start_ns, n.end AS cpu_end_ns, n.globalTid AS tid, COUNT(DISTINCT o.op) AS gpu_ops,
                   MIN(o.start) AS gpu_start_ns, MAX(o.end) AS gpu_end_ns
            FROM NVTX_EVENTS n
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.globalTid = n.globalTid AND r.start >= n.start AND r.end <= n.end
            JOIN ops o ON o.corr = r.correlationId
            WHERE n.end > n.start AND n.eventType IN (59, 60)
            GROUP BY n.rowid""", con)
    got = ranges[ranges["gpu_ops"] > 0][list(truth.columns)].astype("int64")
    key = ["cpu_start_ns", "cpu_end_ns", "tid"]
    pdt.assert_frame_equal(got.sort_values(key).reset_index(drop=True), truth.sort_values(key).reset_index(drop=True))


def test_an_op_of_calls_in_two_ranges_counts_once_in_each_by_hand():
    """B [0, 50) inside A [0, 100) on one thread: correlation id 20 is called in B (at 10) and again in A (at 70), id
    10 in A (at 60); their kernels run at [120, 130) and [100, 110). B: the one op of id 20; A: two ops, not three."""
    nvtx = pd.DataFrame({"start_ns": [0, 0], "end_ns": pd.array([100, 50], dtype="Int64"), "event_type": [59, 59],
                         "name": ["A", "B"], "domain": ["", ""], "tid": [5, 5], "pid": [1, 1]})
    rt = pd.DataFrame({"start_ns": [10, 60, 70], "end_ns": [11, 61, 71], "tid": [5, 5, 5], "pid": [1, 1, 1],
                       "correlation_id": pd.array([20, 10, 20], dtype="Int64"), "name": ["cudaLaunchKernel"] * 3})
    k = pd.DataFrame({"start_ns": [100, 120], "end_ns": [110, 130], "device": [0, 0], "stream": [7, 7],
                      "correlation_id": pd.array([10, 20], dtype="Int64"), "pid": [1, 1], "name": ["k10", "k20"],
                      "full_name": ["k10", "k20"]})
    rd = RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx, kernels=k, runtime=rt, has_cuda=True)
    r = proj.map_rank(rd, {})["ranges"].to_pandas().set_index("name")
    assert r.loc["B", ["gpu_ops", "gpu_start_ns", "gpu_end_ns", "gpu_busy_ns"]].tolist() == [1, 120, 130, 10]
    assert r.loc["A", ["gpu_ops", "gpu_start_ns", "gpu_end_ns", "gpu_busy_ns"]].tolist() == [2, 100, 130, 20]


def test_spilled_rows_come_back_in_key_order(spill_dir):
    """Rows written in pieces in key order, and late rows (finished after greater keys were written) put back."""
    schema = pa.schema([("range_id", pa.int64()), ("name", pa.large_string())])
    writer = SpillWriter(schema, "range_id")
    writer.write(pa.table({"range_id": [0, 2, 3], "name": ["a", "c", "d"]}))
    writer.write(pa.table({"range_id": [6, 7], "name": ["g", "h"]}))
    writer.write(pa.table({"range_id": [9], "name": ["j"]}))
    spilled = writer.close(pa.table({"range_id": [10, 5, 1, 8], "name": ["k", "f", "b", "i"]}))
    assert isinstance(spilled, SpilledRows) and spilled.num_rows == 10
    back = pa.concat_tables(list(spilled.batches()))
    assert back.column("range_id").to_pylist() == [0, 1, 2, 3, 5, 6, 7, 8, 9, 10]
    assert back.column("name").to_pylist() == list("abcdfghijk")
    spilled.remove()
    assert not list(spill_dir.iterdir())
    SpillWriter(schema, "range_id").write(pa.table({"range_id": [0], "name": ["a"]}))  # given up: never closed
    gc.collect()
    assert not list(spill_dir.iterdir())
    assert not [t for t in threading.enumerate() if t.name.startswith("nsys-recipe-spill")]  # its writing thread


def test_a_spill_that_cannot_be_written_is_an_error(spill_dir):
    """A piece is written in a thread of its own: what that raises comes out of a later write or the close."""
    class Full:
        def write_table(self, rows):
            raise OSError(28, "No space left on device")

        def close(self):
            pass

    writer = SpillWriter(pa.schema([("range_id", pa.int64())]), "range_id")
    writer._writer = Full()
    with pytest.raises(OSError, match="No space left"):
        for first in range(0, 10, 2):
            writer.write(pa.table({"range_id": np.arange(first, first + 2)}))
        writer.close()
    del writer
    gc.collect()
    assert not list(spill_dir.iterdir())


def test_a_spilled_table_is_written_in_row_groups(spill_dir, tmp_path, monkeypatch):
    """A ranges table longer than a row group comes out whole and in order."""
    from nsys_recipe_pack import spill

    monkeypatch.setattr(spill, "ROW_GROUP_ROWS", 3)
    schema = pa.schema([("rank", pa.int64()), ("range_id", pa.int64())])
    writer = SpillWriter(pa.schema([("range_id", pa.int64())]), "range_id")
    for first in range(0, 10, 2):
        writer.write(pa.table({"range_id": np.arange(first, first + 2)}))
    rows = spill.RankedRows(schema, [(0, pa.table({"range_id": [0, 1]})), (1, writer.close())])
    rows.write_parquet(tmp_path / "t.parquet")
    got = pd.read_parquet(tmp_path / "t.parquet")
    assert got["rank"].tolist() == [0, 0] + [1] * 10 and got["range_id"].tolist() == [0, 1, *range(10)]


def test_a_spill_written_as_the_output_is_the_file_of_a_run_whose_only_rank_it_is(spill_dir, tmp_path, monkeypatch):
    """Rows spilled as the output itself (rank 0, row groups of 4 here) become the file as they are. For rank 1, or
    beside another rank's rows, or with rows finished late, they are read back and written again, in key order."""
    from nsys_recipe_pack import spill

    monkeypatch.setattr(spill, "SPILLED_GROUP_ROWS", 4)
    monkeypatch.setattr(spill, "ROW_GROUP_ROWS", 5)
    output = pa.schema([("rank", pa.int64()), ("range_id", pa.int64()), ("name", pa.large_string())])
    names = pa.dictionary(pa.int32(), pa.large_string())

    def spilled(late=None):
        writer = SpillWriter(pa.schema([("range_id", pa.int64()), ("name", names)]), "range_id", output=output)
        for first in range(0, 10, 2):
            writer.write(pa.table({"range_id": np.arange(first, first + 2), "name": pa.array(["a", "b"]).cast(names)}))
        return writer.close(late)

    late = pa.table({"range_id": [11, 10], "name": pa.array(["d", "c"]).cast(names)})
    cases = [([(0, spilled())], [0] * 10, list(range(10)), True),
             ([(1, spilled())], [1] * 10, list(range(10)), False),
             ([(0, spilled()), (1, pa.table({"range_id": [0], "name": ["x"]}))], [0] * 10 + [1], [*range(10), 0],
              False),
             ([(0, spilled(late))], [0] * 12, list(range(12)), False)]
    for i, (parts, ranks, ids, moved) in enumerate(cases):
        path = tmp_path / f"{i}.parquet"
        spill.RankedRows(output, parts).write_parquet(path)
        got = pd.read_parquet(path)
        assert got["rank"].tolist() == ranks and got["range_id"].tolist() == ids, i
        assert got["name"].tolist()[:10] == ["a", "b"] * 5 and got["name"].dtype == "str"
        meta = pq.ParquetFile(path).metadata
        groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        assert os.path.exists(parts[0][1].path) != moved and (groups == [4, 4, 2]) == moved, (i, groups)
        assert os.stat(path).st_mode == os.stat(tmp_path / "0.parquet").st_mode  # not a temporary file's
        parts[0][1].remove()
    assert got["name"].tolist()[10:] == ["c", "d"]
    assert not list(spill_dir.iterdir())
    SpillWriter(pa.schema([("range_id", pa.int64())]), "range_id", output=output.remove(2)).write(
        pa.table({"range_id": [0]}))  # given up: never closed
    gc.collect()
    assert not list(spill_dir.iterdir())


def test_output_columns_are_encoded_by_what_they_hold(spill_dir, tmp_path):
    """Names by dictionary; integer times and ids (as many as rows) delta-encoded; a float time as it is. The values
    come back as written."""
    from nsys_recipe_pack import spill

    schema = pa.schema([("rank", pa.int64()), ("name", pa.large_string()), ("cpu_start_ns", pa.int64()),
                        ("range_id", pa.int64()), ("mean_ns", pa.float64())])
    rows = pa.table({"name": ["a", "b", "a"], "cpu_start_ns": [10, 12, 15], "range_id": [0, 1, 2],
                     "mean_ns": [1.5, 2.5, 3.5]})
    spill.RankedRows(schema, [(3, rows)]).write_parquet(tmp_path / "t.parquet")
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in encodings["cpu_start_ns"] and "DELTA_BINARY_PACKED" in encodings["range_id"]
    assert "RLE_DICTIONARY" in encodings["name"] and "RLE_DICTIONARY" in encodings["rank"]
    assert not encodings["mean_ns"] & {"DELTA_BINARY_PACKED", "RLE_DICTIONARY"}
    back = pd.read_parquet(tmp_path / "t.parquet")
    assert back.to_dict("list") == {"rank": [3] * 3, **rows.to_pydict()}


def test_a_spilled_table_another_machine_wrote_is_a_clear_error(spill_dir):
    from nsys_recipe_pack.errors import PackError

    spilled = SpillWriter(pa.schema([("range_id", pa.int64())]), "range_id").close()
    spilled.remove()
    with pytest.raises(PackError, match="every node sees"):
        list(spilled.batches())


def test_a_long_projection_tells_its_progress_first_read_included(spill_dir, monkeypatch):
    """The first read (every GPU op's launch key) counts in the rows to read and read, so that the time left is
    estimated over all of them and the last line says every row was read."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 200)
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    seen = []
    monkeypatch.setattr(read_progress.ReadProgress, "_say", lambda self: seen.append((self.read, self.total,
                                                                                   dict(self.table_read))))
    _streamed(REAL_GLOO)
    con = sqlite3.connect(REAL_GLOO)
    count = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
             for t in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
                       "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")}
    con.close()
    ahead = {f"{t} (first read)": n for t, n in count.items() if "ACTIVITY_KIND_M" in t or t.endswith("KERNEL")}
    read, total, by_table = seen[-1]
    assert read == total == sum(count.values()) + sum(ahead.values())
    assert {t: by_table[t] for t in ahead} == ahead and count["CUPTI_ACTIVITY_KIND_KERNEL"] > 1000


@pytest.mark.parametrize("named_first", [True, False])
def test_ranges_of_a_named_domain_come_out_as_from_the_whole_read(spill_dir, tmp_path, monkeypatch, named_first):
    """Ranges of one name in two domains: two rows of the summary, from spans as from the whole read. The event that
    names the domain comes first (spans after it name the domain), or after the ranges (read whole)."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 30)
    path = tmp_path / "domains.sqlite"
    shutil.copy(REAL_GLOO, path)
    con = sqlite3.connect(path)
    tid = con.execute("SELECT globalTid FROM NVTX_EVENTS LIMIT 1").fetchone()[0]
    con.execute("UPDATE NVTX_EVENTS SET domainId = 5 WHERE eventType IN (59, 60) AND start % 2 = 0")
    con.execute("CREATE TABLE later AS SELECT * FROM NVTX_EVENTS")
    if named_first:
        con.execute("DELETE FROM NVTX_EVENTS")
    con.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (0, 75, 'Mine', ?, 5)",
                (tid,))
    if named_first:
        con.execute("INSERT INTO NVTX_EVENTS SELECT * FROM later")
    con.execute("DROP TABLE later")
    con.commit()
    con.close()
    with monkeypatch.context() as m:
        m.setattr(rank_data, "STREAM_MIN_ROWS", 0)
        assert (_streamed(path) != [None]) == named_first
    _same_output(path, tmp_path, monkeypatch)
    summary = pd.read_parquet(tmp_path / "spans" / "summary.parquet")
    both = summary.groupby("name")["domain"].nunique()
    assert set(summary["domain"]) == {"", "Mine"} and (both == 2).sum() >= 3


def test_an_nvtx_table_without_domains_reads_in_spans(spill_dir, tmp_path, monkeypatch):
    """An export whose NVTX table has no domainId column (as some exports' tables lack columns)."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 30)
    path = tmp_path / "no_domain_column.sqlite"
    shutil.copy(REAL_GLOO, path)
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE NVTX_EVENTS DROP COLUMN domainId")
    con.commit()
    con.close()
    with monkeypatch.context() as m:
        m.setattr(rank_data, "STREAM_MIN_ROWS", 0)
        assert _streamed(path) != [None]
    _same_output(path, tmp_path, monkeypatch)


@pytest.mark.parametrize("kept_bytes", [1 << 18, 0])
def test_a_spill_written_as_the_output_writes_its_names_as_codes(spill_dir, tmp_path, monkeypatch, kept_bytes):
    """Names given as codes into the words met so far (each piece's dictionary longer, with words no row of it uses,
    and nulls) are written as codes, several pieces to a row group: read back as the plain text a write of the output
    itself gives, the file's metadata the same. Each row group's dictionary is its pieces' longest, or past
    WORDS_KEPT_BYTES, only the words its rows use."""
    from nsys_recipe_pack import spill

    monkeypatch.setattr(spill, "SPILLED_GROUP_ROWS", 5)
    monkeypatch.setattr(spill, "WORDS_KEPT_BYTES", kept_bytes)
    output = pa.schema([("rank", pa.int64()), ("range_id", pa.int64()), ("name", pa.large_string())],
                       metadata={"pandas": '{"note": "kept"}'})
    names = pa.dictionary(pa.int32(), pa.large_string())
    words = ["w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"]
    pieces = [([0, 1, 2], [1, None, 1], 3), ([3, 4], [0, 4], 6), ([5, 6, 7], [5, 5, None], 8), ([8], [7], 8)]
    writer = SpillWriter(pa.schema([("range_id", pa.int64()), ("name", names)]), "range_id", output=output)
    for ids, codes, known in pieces:
        writer.write(pa.table({"range_id": ids, "name": pa.DictionaryArray.from_arrays(
            pa.array(codes, pa.int32()), pa.array(words[:known], pa.large_string()))}))
    spilled = writer.close()
    plain = pa.table({"rank": [0] * 9, "range_id": list(range(9)),
                      "name": ["w1", None, "w1", "w0", "w4", "w5", "w5", None, "w7"]}, schema=output)
    pq.write_table(plain, tmp_path / "plain.parquet")
    got = pq.ParquetFile(spilled.path)
    assert got.read().equals(plain) and got.schema_arrow.equals(output, check_metadata=True)
    assert got.metadata.metadata == pq.ParquetFile(tmp_path / "plain.parquet").metadata.metadata
    first = got.metadata.row_group(0)
    assert [first.column(i).is_stats_set for i in range(3)] == [True, True, False]  # a name's orders nothing
    groups = [got.read_row_group(g, columns=["name"]).column(0).to_pylist() for g in range(got.num_row_groups)]
    assert groups == [["w1", None, "w1", "w0", "w4"], ["w5", "w5", None, "w7"]]
    coded = pq.read_table(spilled.path, read_dictionary=["name"])
    kept = [words[:6], words] if kept_bytes else [["w0", "w1", "w4"], ["w5", "w7"]]
    assert [sorted(c.dictionary.to_pylist()) for c in coded.column("name").chunks] == kept
    spilled.remove()


def test_a_row_groups_names_come_to_one_dictionary_of_distinct_words():
    """Chunks whose dictionaries are the starts of one, or are not, or repeat a word, or whose rows are all null: one
    dictionary, each word once, the same words row by row."""
    from nsys_recipe_pack.spill import _used_words

    def chunk(codes, words):
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(words, pa.large_string()))

    cases = [[chunk([0, None, 1], ["a", "b"]), chunk([2, 0], ["a", "b", "c"])],
             [chunk([0, None, 1], ["a", "b"]), chunk([1, 0], ["c", "a"])],
             [chunk([0, 2, 1], ["a", "b", "a"])],
             [chunk([None, None], ["a"])], []]
    for chunks in cases:
        column = pa.chunked_array(chunks, pa.dictionary(pa.int32(), pa.large_string()))
        one = _used_words(column)
        words = one.dictionary.to_pylist()
        assert one.to_pylist() == column.to_pylist() and len(set(words)) == len(words), chunks


def test_a_spans_ops_roll_up_to_every_range_around_them():
    """Each range's figures over the ops launched in it or below it, worked out by hand on a small tree: a range with
    ops of its own and ops of its children counts both; a range with no op in or below it is not among them."""
    # ranges in range order: 0 > (1 > 2), (0 > 3); 4 > 5 without ops
    live = {"id": np.arange(10, 16), "parent_at": np.array([-1, 0, 1, 0, -1, 4]), "level": np.array([0, 1, 2, 1, 0, 1])}
    where = np.array([2, 0, 3, 2, 1])  # each op's innermost range
    place = np.array([10, 5, 30, 40, 50])
    end = np.array([100, 900, 300, 400, 500])
    values = {"first": (place, np.minimum, 99), "last": (place, np.maximum, -1),
              "count": (np.ones(5, np.int64), np.add, 0), "reach": (end, np.maximum, -1)}
    ranges, figures = proj._rolled_up(live, where, values)
    assert ranges.tolist() == [0, 1, 2, 3]
    assert figures["count"].tolist() == [5, 3, 2, 1]
    assert figures["first"].tolist() == [5, 10, 10, 30]
    assert figures["last"].tolist() == [50, 50, 40, 30]
    assert figures["reach"].tolist() == [900, 500, 400, 300]


def test_a_call_of_another_process_pairs_with_none_of_the_ranks_work():
    """The one rank of a file may hold rows of a process with no GPU work: its call with the correlation id of one of
    the rank's kernels launched nothing, so its range has no GPU op and the rank's range has the kernel once."""
    nvtx = pd.DataFrame({"start_ns": [0, 0], "end_ns": pd.array([100, 100], dtype="Int64"), "event_type": [59, 59],
                         "name": ["mine", "helper"], "domain": ["", ""], "tid": [5, 9], "pid": [1, 2]})
    rt = pd.DataFrame({"start_ns": [10, 20], "end_ns": [11, 21], "tid": [5, 9], "pid": [1, 2],
                       "correlation_id": pd.array([7, 7], dtype="Int64"), "name": ["cudaLaunchKernel"] * 2})
    k = pd.DataFrame({"start_ns": [30], "end_ns": [40], "device": [0], "stream": [7],
                      "correlation_id": pd.array([7], dtype="Int64"), "pid": [1], "name": ["k"], "full_name": ["k"]})
    rd = RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx, kernels=k, runtime=rt, has_cuda=True)
    r = proj.map_rank(rd, {})["ranges"].to_pandas().set_index("name")
    assert r.loc["mine", "gpu_ops"] == 1 and r.loc["helper", "gpu_ops"] == 0
    assert r.loc["helper", "pid"] == 2  # each range keeps its process
    # the other streams count such rows as the rank's process's, without their correlation ids
    runtime = rank_data.RankAhead(rd, 1).frame("runtime")
    assert runtime.values("pid").tolist() == [1, 1] and runtime.is_null("correlation_id").tolist() == [False, True]
