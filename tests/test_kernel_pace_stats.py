import numpy as np
import pyarrow as pa
import pytest

from nsys_recipe_pack import order_statistics
from nsys_recipe_pack.iterations import WARMUP_FACTOR
from nsys_recipe_pack.recipes import kernel_pace


def _rank(rank: int, durations: np.ndarray) -> dict:
    start = np.cumsum(np.r_[0, durations[:-1] + 1000]).astype(np.int64) + 10**9
    return {"rank": rank, "offset_ns": 0, "delimiter": {"kind": "kernel", "name": "k"},
            "times": pa.table({"start_ns": start, "end_ns": start + durations})}


@pytest.mark.parametrize("hold", [order_statistics.HOLD_ROWS, 3])
def test_all_ranks_statistics_over_every_steady_iteration_as_numpy_gives_them(monkeypatch, hold):
    # the all-ranks row, found a rank at a time in passes (a few values held at once, or many), against NumPy over
    # every iteration the rule keeps: each rank's leading iterations over WARMUP_FACTOR x the run's median are left out
    monkeypatch.setattr(order_statistics, "HOLD_ROWS", hold)
    rng = np.random.default_rng(3)
    durations = [rng.integers(90, 110, int(n)) * 10**6 for n in rng.integers(0, 40, 7)]
    durations[2][:3] = 10**9  # warm-up: far beyond twice the median
    durations[4][:1] = 10**9
    out = kernel_pace.reduce([_rank(r, d) for r, d in enumerate(durations)], {})
    every = np.concatenate(durations)
    median = np.median(every)
    kept = np.concatenate([d[np.cumsum(d <= WARMUP_FACTOR * median) > 0] for d in durations])
    assert len(kept) == len(every) - 4
    row = out["stats"].set_index("rank").loc[-1]
    assert row["count"] == len(kept) and row["warmup_iterations"] == 4
    assert row["mean_ns"] == kept.mean() and row["median_ns"] == np.median(kept)
    assert row["min_ns"] == kept.min() and row["max_ns"] == kept.max()
    assert row["p95_ns"] == np.quantile(kept, 0.95)
    assert row["std_ns"] == pytest.approx(kept.std(ddof=1), rel=1e-12)  # its sum of squares added a rank at a time
    for r, d in enumerate(durations):  # a rank's own: exactly NumPy's
        steady = d[np.cumsum(d <= WARMUP_FACTOR * median) > 0]
        mine = out["stats"].set_index("rank").loc[r]
        assert mine["count"] == len(steady)
        if len(steady) > 1:
            assert mine["std_ns"] == steady.std(ddof=1) and mine["p95_ns"] == np.quantile(steady, 0.95)
