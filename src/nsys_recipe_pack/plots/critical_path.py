"""Figures of critical_path: each iteration's root rank and what-if, and what its critical path is made of."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from ..iterations import steady_rows
from . import table

KINDS = ["compute", "host", "communication", "p2p"]


def roots(iterations: pd.DataFrame) -> go.Figure:
    """Each iteration's length, what it would have been had its root rank worked as its peers, and the root."""
    it = iterations.sort_values("iteration")
    fig = go.Figure([
        go.Bar(x=it["iteration"], y=it["duration_ns"] / 1e6, name="iteration", customdata=it["root_rank"],
               hovertemplate="iteration %{x}<br>%{y:.1f} ms<br>root rank %{customdata}<extra></extra>"),
        go.Scatter(x=it["iteration"], y=(it["duration_ns"] - it["what_if_ns"]) / 1e6, mode="markers",
                   name="had the root matched its peers",
                   hovertemplate="iteration %{x}<br>%{y:.1f} ms<extra></extra>")])
    fig.update_layout(title="Iteration length and its root rank's what-if", xaxis_title="iteration",
                      yaxis_title="ms")
    return fig


def composition(path: pd.DataFrame) -> go.Figure:
    """The time on each iteration's critical path by kind of segment."""
    t = path.groupby(["iteration", "kind"])["duration_ns"].sum().unstack("kind", fill_value=0)
    fig = go.Figure([go.Bar(x=t.index, y=t[k] / 1e6, name=k) for k in KINDS if k in t])
    fig.update_layout(barmode="stack", title="What each iteration's critical path is made of",
                      xaxis_title="iteration", yaxis_title="ms")
    return fig


def root_table(iterations: pd.DataFrame):
    steady = steady_rows(iterations)
    t = steady.groupby("root_rank").agg(iterations=("iteration", "size"), work_ms=("root_work_ns", "sum"),
                                        what_if_ms=("what_if_ns", "sum"))
    return table((t.assign(work_ms=t["work_ms"] / 1e6, what_if_ms=t["what_if_ms"] / 1e6)).reset_index())


def overview(out) -> list:
    """This recipe's figures on the run overview page (`nsys-recipe report`)."""
    out = Path(out)
    iterations = pd.read_parquet(out / "iterations.parquet")
    return [roots(iterations), composition(pd.read_parquet(out / "critical_path.parquet"))]
