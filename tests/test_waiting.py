"""Communication split into waiting for the last member and transfer (waiting.py), in compute_memory_share's and
comm_overlap's tables and headlines: on a SYNTHETIC data-parallel job with a planted GPU straggler, against the same
split computed straight from the exports' NCCL kernels by SQL (each rank's n-th all-reduce is the n-th collective;
its members wait from their own start to the last one's, on clocks aligned by the session starts)."""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd
import pytest

from nsys_recipe_pack import recipes, run_recipe
from nsys_recipe_pack.synth import parse_straggler, write_synthetic

RANKS, STRAGGLER = 6, 4


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("waiting") / "job"
    write_synthetic(out, RANKS, 12, "sqlite", [parse_straggler(f"rank={STRAGGLER},iterations=3-8,cause=gpu,"
                                                               "slowdown=2")])
    starts, ends = [], []
    for r in range(RANKS):
        with sqlite3.connect(out / f"rank{r}.sqlite") as db:
            rows = db.execute("SELECT k.start + t.utcEpochNs, k.end + t.utcEpochNs FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                              "JOIN StringIds s ON s.id = k.shortName, TARGET_INFO_SESSION_START_TIME t "
                              "WHERE s.value LIKE 'nccl%' ORDER BY k.start").fetchall()
        starts.append([s for s, _ in rows])
        ends.append([e for _, e in rows])
    starts, ends = np.array(starts, np.int64), np.array(ends, np.int64)  # (rank, collective)
    waits = starts.max(axis=0) - starts
    last = starts.argmax(axis=0)
    expected = pd.DataFrame({"rank": range(RANKS), "comm_kernel_ns": (ends - starts).sum(axis=1),
                             "waiting_ns": waits.sum(axis=1),
                             "waited_for_ns": [int(waits[:, last == r].sum()) for r in range(RANKS)]})
    return out, expected


def _phrase(expected: pd.DataFrame) -> str:
    share = 100 * expected["waiting_ns"].sum() / expected["comm_kernel_ns"].sum()
    top = expected["waited_for_ns"].idxmax()
    of_that = 100 * expected.at[top, "waited_for_ns"] / expected["waited_for_ns"].sum()
    return f"{share:.0f} % of it waiting for the last member, {of_that:.0f} % of that for rank {top}"


def test_the_share_of_communication_that_was_waiting_equals_sql(job, tmp_path):
    out, expected = job
    res = run_recipe("compute_memory_share", [str(out)], str(tmp_path / "cm"), mode="none")
    got = res.tables["communication"].set_index("rank")
    for c in ("comm_kernel_ns", "waiting_ns", "waited_for_ns"):
        assert got[c].tolist() == expected[c].tolist(), c
    assert got["waited_for_ns"].idxmax() == STRAGGLER and expected.at[STRAGGLER, "waiting_ns"] < \
        expected["waiting_ns"].median() / 5  # the straggler itself hardly waits
    assert _phrase(expected) in recipes.get("compute_memory_share").headline(res.output_dir)


def test_exposure_is_split_into_waiting_and_transfer(job, tmp_path):
    """The job's all-reduces never run beside compute: every bit of their waiting is exposed, and the exposed transfer
    is their time from the last member's start to their end."""
    out, expected = job
    res = run_recipe("comm_overlap", [str(out)], str(tmp_path / "co"), mode="none")
    ranks = res.tables["ranks"].set_index("rank")
    assert (ranks["overlapped_ns"] == 0).all()
    for c in ("waiting_ns", "waited_for_ns"):
        assert ranks[c].tolist() == expected[c].tolist(), c
    assert ranks["exposed_waiting_ns"].tolist() == expected["waiting_ns"].tolist()
    assert ranks["exposed_transfer_ns"].tolist() == (expected["comm_kernel_ns"] - expected["waiting_ns"]).tolist()
    headline = recipes.get("comm_overlap").headline(res.output_dir)
    assert _phrase(expected) in headline
    assert f"exposed transfer {100 * ranks['exposed_transfer_ns'].sum() / ranks['wall_ns'].sum():.1f} %" in headline
