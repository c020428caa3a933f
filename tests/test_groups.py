"""Grouped reductions over NumPy arrays (nsys_recipe_pack.groups), against hand-worked cases and pandas."""

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from nsys_recipe_pack.groups import SortedGroups, distinct


def test_groups_of_a_small_case_by_hand():
    key = np.array([3, 1, 3, 2, 1, 3])
    values = np.array([10, 20, 30, 40, 50, 60])
    g = SortedGroups(key)
    assert g.keys.tolist() == [1, 2, 3] and g.size.tolist() == [2, 1, 3]
    assert g.lead.tolist() == [1, 3, 0]  # each group's first row in input order
    assert g.sum(values).tolist() == [70, 40, 100]
    assert g.min(values).tolist() == [20, 40, 10] and g.max(values).tolist() == [50, 40, 60]
    empty = SortedGroups(np.zeros(0, np.int64))
    assert len(empty) == 0 and empty.sum(np.zeros(0, np.int64)).dtype == np.int64 and empty.size.tolist() == []


@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(-10**12, 10**12)), max_size=60))
def test_groups_agree_with_pandas(rows):
    key = np.array([k for k, _ in rows], np.int64)
    values = np.array([v for _, v in rows], np.int64)
    g = SortedGroups(key)
    expected = pd.Series(values, dtype="int64").groupby(key).agg(["sum", "min", "max", "size", "first"])
    assert g.keys.tolist() == expected.index.tolist()
    assert g.sum(values).tolist() == expected["sum"].tolist()
    assert g.min(values).tolist() == expected["min"].tolist() and g.max(values).tolist() == expected["max"].tolist()
    assert g.size.tolist() == expected["size"].tolist() and values[g.lead].tolist() == expected["first"].tolist()
    assert distinct(key).tolist() == sorted(set(key.tolist()))
