"""sync_summary on a long capture: its blocking calls found ahead of the spans, their GPU time and NVTX range added up
span by span of time (inputs.chunks) instead of from every row touching a call: the same calls, summary and findings
as a whole read, however the tables are cut."""

import numpy as np
import pyarrow as pa
import pytest
from conftest import folded
from test_batches import REAL_GLOO, REAL_NCCL, synthetic  # noqa: F401 (a fixture)

from nsys_recipe_pack.inputs import load_file, rank_data, readers
from nsys_recipe_pack.inputs.chunks import END_OF_TIME
from nsys_recipe_pack.intervals import covered_length, union_segments
from nsys_recipe_pack.recipes import sync_summary

NEEDS = set(sync_summary.NEEDS)


def _decoded(calls: pa.Table) -> pa.Table:
    """Calls with their names as strings: a span-by-span map names only the APIs and ranges it meets."""
    return pa.table({c: calls.column(c).cast(pa.string()) if pa.types.is_dictionary(calls.column(c).type)
                     else calls.column(c) for c in calls.column_names})


@pytest.mark.parametrize("batch_rows", [7, 1000])
def test_spans_give_the_whole_reads_calls(synthetic, monkeypatch, batch_rows):  # noqa: F811
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    compared, kinds = 0, set()
    for path in [REAL_NCCL, REAL_GLOO, synthetic["sqlite"][1], synthetic["parquetdir"][2]]:
        whole = load_file(path, NEEDS)
        spanned = folded(sync_summary.RECIPE, path, {})
        assert [r.pid for r in whole] == [r.pid for r, _ in spanned]
        for a, (b, result) in zip(whole, spanned, strict=True):
            assert result is not None, path
            assert (b.gpu, b.unclosed_ranges, b.rank_candidates) == (a.gpu, a.unclosed_ranges, a.rank_candidates)
            want, got = sync_summary.map_rank(a, {}), sync_summary.map_rank(b, {})
            assert _decoded(got["calls"]).equals(_decoded(want["calls"])), path
            assert got["wall_ns"] == want["wall_ns"] and got["findings"] == want["findings"], path
            for column, values in want["summary"].items():
                assert np.array_equal(got["summary"][column], values), (path, column)
            compared += want["calls"].num_rows
            kinds |= set(want["calls"].column("kind").to_pylist())
            assert np.count_nonzero(want["calls"].column("nvtx_range").is_valid()) > 0 or path == REAL_NCCL
    assert compared > 0 and {"stream", "memcpy_sync", "memcpy_pageable"} <= kinds


def test_gpu_time_of_calls_across_spans_by_hand():
    """Calls [0, 100] and [150, 300]; ops [10, 20] and [15, 160] read in a span ending at 100, [200, 250] after one
    ending at 180: the union [10, 160] stays open past the first span and closes in the second. GPU time in the
    calls: 90 (10 to 100) and 10 + 50."""
    call_start, call_end = np.array([0, 150]), np.array([100, 300])
    busy = np.zeros(2, np.int64)
    gpu = sync_summary._GpuTime(np.arange(2), call_start, call_end)
    gpu.add(np.array([10, 15]), np.array([20, 160]), 100, busy)
    assert busy.tolist() == [0, 0] and gpu.open == (10, 160)
    gpu.add(np.zeros(0, np.int64), np.zeros(0, np.int64), 180, busy)
    assert busy.tolist() == [90, 10] and gpu.open is None and gpu.passed == 1  # the first call is done with
    gpu.add(np.array([200]), np.array([250]), END_OF_TIME, busy)
    assert busy.tolist() == [90, 60]
    whole = union_segments(np.array([10, 15, 200]), np.array([20, 160, 250]))
    assert busy.tolist() == covered_length(*whole, call_start, call_end).tolist()


def test_copies_added_up_per_launch_key_by_hand():
    """Copies of keys 5, 3, 5 (out of order, 5 twice: one pageable, one early) in two batches, a memset of key 3
    setting host memory, read before the calls: call keys 3, 5, 9 and 5 again get what their ops show, and the first
    op's start (key 3: the copy at 40 before the memset at 70; key 5: 10; key 9, no op: never)."""
    def rows(key, start, *flags):
        return pa.table({"start_ns": np.array(start, np.int64), "key": np.array(key, np.int64),
                         **{f: np.array(v, bool) for f, v in zip(sync_summary.FLAGS, flags, strict=True)}})

    copies = sync_summary._Copies()
    copies.add(rows([5, 3], [20, 40], [True, True], [False, False], [True, False], [False, False]))
    copies.add(rows([5], [10], [True], [True], [False], [False]))
    copies.done()
    copies.add(rows([3], [70], [False], [False], [False], [True]))
    copies.done()
    got = copies.of(np.array([3, 5, 9, 5]))
    assert got["memcpy"].tolist() == [True, True, False, True]
    assert got["early"].tolist() == [False, True, False, True]
    assert got["pageable"].tolist() == [False, True, False, True]
    assert got["host"].tolist() == [True, False, False, False]
    assert got["first_start"].tolist() == [40, 10, sync_summary._Copies.NEVER, 10]
    empty = sync_summary._Copies()  # a table whose batches hold no row
    empty.add(rows([], [], [], [], [], []))
    empty.done()
    assert not empty.of(np.array([3]))["memcpy"].any() and empty.of(np.array([3]))["first_start"][0] == empty.NEVER
