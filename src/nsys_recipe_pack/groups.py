"""Grouping helpers over NumPy arrays.

`np.unique` without `return_inverse` takes a hash-table path in NumPy 2.3+ that is tens of times slower than
sorting on millions of distinct integers (10 M random int64: 9.8 s against 0.12 s on a 2-core machine with
NumPy 2.4), so distinct values of large arrays are taken by sorting here.
"""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values, as np.unique(values) gives them."""
    s = np.sort(np.asarray(values), kind="quicksort")
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s
