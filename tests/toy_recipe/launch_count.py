"""launch_count: how many kernels each rank launched, and for how long they ran.

A toy recipe, whole in this one file and the notebook beside it: tests/test_toy_recipe.py registers it and runs
every command with it, and CONTRIBUTING.md walks through it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from nsys_recipe_pack.recipes import Metric, Recipe, indented, register


def add_options(add, framework: bool = False) -> None:
    add("--min-duration-us", type=float, default=0.0, help="count only kernels that ran at least this long")


def map_rank(rank, options: dict) -> dict:
    """One rank: its kernels' count and total time (pure: no files, no printing)."""
    rank.require("kernel", "launch_count")
    kernels = rank.kernels
    duration = kernels["end_ns"] - kernels["start_ns"]
    kept = duration[duration >= options["min_duration_us"] * 1000]
    return {"launches": len(kept), "kernel_ns": int(kept.sum())}


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
    summary=summary,
    headline=headline,
    diff_metrics=diff_metrics,
    diff_needs=frozenset({"kernel"}),
    metrics=(Metric("kernel_launches", "kernel launches"),),
    notebook=Path(__file__).with_name("launch_count.ipynb"),
))
