import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsys_recipe_pack import order_statistics
from nsys_recipe_pack.order_statistics import order_statistics as select


def _by_sorting(group, value, weight, n_groups, positions):
    """The same places found by sorting each group's values: the value whose repeats cover the place."""
    out = np.full(positions.shape, np.nan)
    for g in range(n_groups):
        order = np.argsort(value[group == g], kind="stable")
        values, ends = value[group == g][order], np.cumsum(weight[group == g][order])
        for j, p in enumerate(positions[g]):
            if len(ends) and p < ends[-1]:
                out[g, j] = values[np.searchsorted(ends, p, side="right")]
    return out


def _chunks(group, value, weight, pieces, unit_weights):
    def read():
        for at in np.array_split(np.arange(len(value)), pieces):
            yield group[at], value[at], None if unit_weights else weight[at]
    return read


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), hold=st.sampled_from([1, 2, 5, 1 << 20]), bins=st.sampled_from([16, 4096]),
       pieces=st.integers(1, 5), unit_weights=st.booleans(), bounds=st.sampled_from([None, "exact", "loose"]))
def test_places_as_sorting_the_repeated_values_gives(seed, hold, bins, pieces, unit_weights, bounds):
    # ties, a value of huge weight, whole and fractional values, negatives, a group with a single value or none: each
    # statistic as np.sort of the repeated values gives it, read in chunks, a few values held at once or many, the
    # groups' bounds found or given (as they are, or wider)
    rng = np.random.default_rng(seed)
    n_groups = int(rng.integers(1, 5))
    n = int(rng.integers(0, 400))
    group = rng.integers(0, n_groups, n)
    value = rng.choice([rng.integers(-5, 5, n).astype(float), rng.normal(0, 1e9, n).round(),
                        rng.normal(0, 1, n) / 3, np.full(n, 7.0)])
    weight = np.ones(n, np.int64) if unit_weights else rng.choice([1, 2, 3, 10**9], n, p=[0.5, 0.3, 0.19, 0.01])
    total = np.bincount(group, weights=weight, minlength=n_groups).astype(np.int64)
    positions = np.stack([rng.integers(0, np.maximum(total, 1)),
                          (total - 1) // 2, total // 2, np.maximum(total - 1, 0)], axis=1)
    given = None
    if bounds:
        least = np.array([value[group == g].min() if (group == g).any() else 0.0 for g in range(n_groups)])
        most = np.array([value[group == g].max() if (group == g).any() else 0.0 for g in range(n_groups)])
        widen = 0.0 if bounds == "exact" else 1.5
        given = (least - widen, most + widen, np.bincount(group, minlength=n_groups))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(order_statistics, "HOLD_ROWS", hold)
        patch.setattr(order_statistics, "HISTOGRAM_BINS", bins)
        got = select(_chunks(group, value, weight, pieces, unit_weights), n_groups, positions, given)
    np.testing.assert_array_equal(got, _by_sorting(group, value, weight, n_groups, positions))


def test_a_median_of_many_values_takes_a_few_passes_each_holding_few(monkeypatch):
    # a million values, held at most a thousand at a time: the median and the 90th percentile's places, exact, in
    # a handful of passes over them
    rng = np.random.default_rng(1)
    value = np.abs(rng.standard_t(2, 1_000_000) * 1e6).round()
    passes = []

    def read():
        passes.append(1)
        for at in range(0, len(value), 100_000):
            yield np.zeros(100_000, np.int64), value[at:at + 100_000], None

    places = np.array([[499_999, 500_000, 899_999]])
    monkeypatch.setattr(order_statistics, "HOLD_ROWS", 1000)
    got = select(read, 1, places)
    np.testing.assert_array_equal(got[0], np.sort(value)[places[0]])
    assert len(passes) <= 5
