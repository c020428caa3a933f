"""Reading only the rows a recipe uses, a batch at a time (inputs.selection): the same frames, rank identity and
sync_summary results as reading every table whole, however the tables are cut into batches."""

from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from nsys_recipe_pack import synth
from nsys_recipe_pack.inputs import load_file, rank_data, readers
from nsys_recipe_pack.inputs.export import open_source
from nsys_recipe_pack.intervals import touching
from nsys_recipe_pack.recipes import sync_summary

REAL_NCCL = ROOT / "tests" / "data" / "nccl_2gpu_h100" / "mfu_2gpu_before.sqlite"  # real, MIT (its README)
REAL_GLOO = ROOT / "sample_reports" / "h100_gloo_8rank" / "rank3.sqlite"  # real, beside its report
SELECTION = sync_summary.SELECTION
NEEDS = set(sync_summary.NEEDS)
ATTR = {"nvtx": "nvtx", "kernel": "kernels", "memcpy": "memcpy", "memset": "memset", "runtime": "runtime"}


def test_touching_by_hand():
    seg_start, seg_end = np.array([0, 20]), np.array([10, 30])
    start = np.array([10, 11, 15, -5, 31, 30, -1])
    end = np.array([15, 19, 25, -1, 40, 30, 0])
    assert touching(seg_start, seg_end, start, end).tolist() == [True, False, True, False, False, True, True]
    assert touching(np.zeros(0, np.int64), np.zeros(0, np.int64), start, end).tolist() == [False] * 7


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A SYNTHETIC four-rank NCCL job with a GPU straggler, as one SQLite export per rank and as Parquet."""
    out = {}
    for fmt in ("sqlite", "parquetdir"):
        dest = tmp_path_factory.mktemp(f"synthetic-{fmt}")
        synth.write_synthetic(dest, ranks=4, iterations=6, fmt=fmt, job="nccl", seed=5,
                              stragglers=[synth.parse_straggler("rank=1,iterations=3-4,cause=gpu,slowdown=2")])
        out[fmt] = sorted(p for p in dest.iterdir() if p.suffix == ".sqlite" or p.name.endswith("_pqtdir")
                          or p.suffix == ".parquetdir")
    return out


def _inputs(synthetic):
    return [REAL_NCCL, REAL_GLOO, synthetic["sqlite"][1], synthetic["parquetdir"][1]]


def _loaded(synthetic):
    """(input, a rank read whole, the same rank read through the selection), for every rank of every input."""
    for path in _inputs(synthetic):
        wholes, selected = load_file(path, NEEDS), load_file(path, NEEDS, selection=SELECTION)
        assert [r.pid for r in wholes] == [r.pid for r in selected]
        yield from ((path, a, b) for a, b in zip(wholes, selected, strict=True))


def _file_frames(path: Path, selection=None) -> dict:
    """Every frame of one input, before it is split into ranks."""
    src = open_source(path, NEEDS, None)
    try:
        return rank_data._read_frames(src, NEEDS, path, selection=selection)[0]
    finally:
        src.close()


def _expected_rows(frame, need: str, kept: dict) -> np.ndarray:
    """The rows of a whole read the selection keeps, chosen on the whole frame at once."""
    keep = SELECTION.keep(need, kept)
    rows = np.ones(len(frame), bool) if keep is None else keep(frame)
    if need == "nvtx":  # every read keeps the ranges never closed and the names that may give the rank
        codes, words = frame.codes("name")
        rows |= np.array([isinstance(w, str) and "RANK" in w.upper() for w in words], bool)[codes]
        rows |= np.isin(frame.values("event_type"), [59, 60]) & frame.is_null("end_ns")
    return rows


@pytest.mark.parametrize("batch_rows", [7, 1 << 18])
def test_selected_frames_are_the_whole_frames_rows(synthetic, monkeypatch, batch_rows):
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    for path in _inputs(synthetic):
        whole, selected = _file_frames(path), _file_frames(path, SELECTION)
        kept = {}
        for need in SELECTION.order:
            attr = ATTR[need]
            expected = whole[attr].filter(_expected_rows(whole[attr], need, kept))
            got = selected[attr]
            columns = [c for c in expected.dtypes if c in got.dtypes]
            assert got.dtypes == {c: expected.dtypes[c] for c in columns}, (path, need)
            # values, names and the dictionaries they are codes into (outputs keep every name of the table)
            assert got.table.select(columns).equals(expected.table.select(columns)), (path, need)
            kept[need] = expected
        assert 0 < len(selected["runtime"]) < len(whole["runtime"]), path
    for path, whole_rank, selected_rank in _loaded(synthetic):
        for attr in ("gpu", "pid", "unclosed_ranges", "rank_candidates", "host", "has_cuda"):
            assert getattr(selected_rank, attr) == getattr(whole_rank, attr), (path, attr)
        assert selected_rank.extent("runtime") == whole_rank.extent("runtime")


def test_a_long_table_is_read_a_batch_at_a_time(synthetic, monkeypatch):
    """Read in batches of 7 rows, no batch holds more (the selection never sees a whole table)."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 7)
    src = readers.ExportSource(REAL_NCCL, "sqlite")
    try:
        sizes = [b.num_rows for b in src.read_batches("CUPTI_ACTIVITY_KIND_KERNEL", ["start", "end"])]
        whole = src.read_arrow("CUPTI_ACTIVITY_KIND_KERNEL", ["start", "end"])
    finally:
        src.close()
    assert sum(sizes) == whole.num_rows > 7 * 100
    assert set(sizes[:-1]) == {7} and 0 < sizes[-1] <= 7


def test_sync_summary_is_the_same_from_a_selected_read(synthetic, monkeypatch):
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 50)
    compared = 0
    for path, whole, selected in _loaded(synthetic):
        a, b = sync_summary.map_rank(whole, {}), sync_summary.map_rank(selected, {})
        assert b["calls"].equals(a["calls"]), path
        assert b["wall_ns"] == a["wall_ns"] and b["findings"] == a["findings"], path
        for column, values in a["summary"].items():
            assert np.array_equal(b["summary"][column], values), (path, column)
        compared += len(a["calls"])
    assert compared > 0


def test_first_rows_of_each_value_across_batches_by_hand():
    """The first row of every distinct id (a null and -1 apart) and word (a null apart), over three batches."""
    import pyarrow as pa

    from nsys_recipe_pack.inputs.selection import FirstRows

    firsts = FirstRows(["textId", "text"], ["end"])
    batches = [pa.table({"textId": pa.array([5, 5, None, 7], pa.int64()), "text": ["a", None, "a", "b"],
                         "end": pa.array([1, 2, 3, 4], pa.int64())}),
               pa.table({"textId": pa.array([7, -1, None, 5], pa.int64()), "text": ["b", "b", None, "c"],
                         "end": pa.array([1, None, 3, None], pa.int64())}),
               pa.table({"textId": pa.array([-1, 9, 9, None], pa.int64()), "text": ["c", "a", "d", "d"],
                         "end": pa.array([None, 2, 3, 4], pa.int64())})]
    got = [np.flatnonzero(firsts.of(b)).tolist() for b in batches]
    # batch 1: 5 and "a" at 0, "null" text at 1, null id at 2, 7 and "b" at 3; batch 2: -1 at 1, the first null
    # end at 1, "c" at 3; batch 3: 9 at 1, "d" at 2
    assert got == [[0, 1, 2, 3], [1, 3], [1, 2]]
