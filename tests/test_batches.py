"""Event tables read a batch at a time (inputs.batches), and the exports the tests of long captures share."""

import numpy as np
import pytest
from conftest import ROOT

from nsys_recipe_pack import synth
from nsys_recipe_pack.inputs import readers
from nsys_recipe_pack.intervals import touching

REAL_NCCL = ROOT / "tests" / "data" / "nccl_2gpu_h100" / "mfu_2gpu_before.sqlite"  # real, MIT (its README)
REAL_GLOO = ROOT / "sample_reports" / "h100_gloo_8rank" / "rank3.sqlite"  # real, beside its report


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


def test_a_long_table_is_read_a_batch_at_a_time(synthetic, monkeypatch):
    """Read in batches of 7 rows, no batch holds more."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 7)
    src = readers.ExportSource(REAL_NCCL, "sqlite")
    try:
        sizes = [b.num_rows for b in src.read_batches("CUPTI_ACTIVITY_KIND_KERNEL", ["start", "end"])]
        whole = src.read_arrow("CUPTI_ACTIVITY_KIND_KERNEL", ["start", "end"])
    finally:
        src.close()
    assert sum(sizes) == whole.num_rows > 7 * 100
    assert set(sizes[:-1]) == {7} and 0 < sizes[-1] <= 7


def test_first_rows_of_each_value_across_batches_by_hand():
    """The first row of every distinct id (a null and -1 apart) and word (a null apart), over three batches."""
    import pyarrow as pa

    from nsys_recipe_pack.inputs.batches import FirstRows

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
