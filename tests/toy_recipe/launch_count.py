"""launch_count: how many kernels each rank launched, and for how long they ran.

A toy recipe, whole in this one file and the notebook beside it: tests/test_toy_recipe.py registers it and runs
every command with it, and CONTRIBUTING.md walks through it. Its map is a fold over time (`STREAM`): a rank read
whole is one span of it, a long capture is read span by span and never held whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from nsys_recipe_pack.driver import fold_rank
from nsys_recipe_pack.inputs import arrow_of, numpy_of
from nsys_recipe_pack.inputs.chunks import Stream
from nsys_recipe_pack.recipes import Metric, Recipe, indented, register


def add_options(add, framework: bool = False) -> None:
    add("--min-duration-us", type=float, default=0.0, help="count only kernels that ran at least this long")


def _prepare(ahead, options: dict) -> dict:
    """The state before the first span: nothing read ahead, only the option the fold needs."""
    return {"min_ns": options["min_duration_us"] * 1000, "count": {}, "total": {}}


def _view(need: str, frame) -> pa.Table:
    """What a span's kernels carry: their times and process."""
    return pa.table({c: arrow_of(frame.values(c)) for c in ("start_ns", "end_ns", "pid")})


def _fold(state: dict, span_start: int, span_end: int, chunk: dict) -> None:
    """One span's kernels added to each process's count and time."""
    rows = chunk["kernel"]
    if rows is None:
        return
    duration = numpy_of(rows.column("end_ns")) - numpy_of(rows.column("start_ns"))
    pid = numpy_of(rows.column("pid"))
    kept = duration >= state["min_ns"]
    for p in np.unique(pid[kept]).tolist():  # a rank's few processes
        mine = kept & (pid == p)
        state["count"][p] = state["count"].get(p, 0) + int(mine.sum())
        state["total"][p] = state["total"].get(p, 0) + int(duration[mine].sum())


def _finish(state: dict, names: list) -> dict:
    return {p: {"launches": n, "kernel_ns": state["total"][p]} for p, n in state["count"].items()}


STREAM = Stream(needs={"kernel": ["start", "end", "globalPid"]}, view=_view, fold=_fold, finish=_finish,
                prepare=_prepare)


def map_rank(rank, options: dict) -> dict:
    """One rank: its kernels' count and total time (pure: no files, no printing), from the stream's fold."""
    rank.require("kernel", "launch_count")
    return fold_rank(STREAM, rank, options) or {"launches": 0, "kernel_ns": 0}


def reduce(per_rank: list[dict], options: dict) -> dict:
    """All ranks: one table, written as launches.parquet."""
    return {"launches": pd.DataFrame({"rank": [r["rank"] for r in per_rank],
                                      "launches": [r["launches"] for r in per_rank],
                                      "kernel_ns": [r["kernel_ns"] for r in per_rank]}).sort_values("rank")}


def summary(out: Path) -> list[str]:
    return indented("kernel launches by rank:", pd.read_parquet(out / "launches.parquet").to_string(index=False))


def headline(out: Path) -> str:
    t = pd.read_parquet(out / "launches.parquet")
    return f"{int(t['launches'].sum())} kernel launches on {len(t)} ranks"


def diff_metrics(ranks) -> pd.DataFrame | None:
    kernels = [rank.kernels for rank in ranks if rank.kernels is not None]
    if not kernels:
        return None
    return pd.DataFrame({"metric": "kernel_launches", "key": "all ranks", "value": [float(sum(map(len, kernels)))]})


RECIPE = register(Recipe(
    name="launch_count",
    display_name="Launch count",
    description="How many kernels each rank launched, and for how long they ran.",
    needs=frozenset({"kernel"}),
    map_rank=map_rank,
    reduce=reduce,
    add_options=add_options,
    stream=STREAM,
    summary=summary,
    headline=headline,
    diff_metrics=diff_metrics,
    diff_needs=frozenset({"kernel"}),
    metrics=(Metric("kernel_launches", "kernel launches"),),
    notebook=Path(__file__).with_name("launch_count.ipynb"),
))
