"""Figures of comm_overlap: overlapped and exposed communication per rank, per iteration and per collective."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..escape import plotly_text
from . import rank_bins


def by_rank(ranks: pd.DataFrame) -> go.Figure:
    """Communication per rank, split into the part hidden behind compute and the exposed part (ms per iteration)."""
    labels, binned = rank_bins(ranks["rank"])
    per = ranks.assign(label=ranks["rank"].map(labels)).groupby("label", sort=False)[
        ["overlapped_ns", "exposed_comm_ns", "iterations"]].sum()
    iterations = per["iterations"].clip(lower=1)
    fig = go.Figure([go.Bar(x=per.index, y=per["overlapped_ns"] / iterations / 1e6, name="overlapped by compute"),
                     go.Bar(x=per.index, y=per["exposed_comm_ns"] / iterations / 1e6, name="exposed")])
    fig.update_layout(barmode="stack", title="Communication per iteration, by rank" + (" (bins of ranks)" if binned
                                                                                      else ""),
                      xaxis_title="rank", yaxis_title="ms per iteration", xaxis_type="category")
    return fig


def exposed_heatmap(windows: pd.DataFrame) -> go.Figure:
    """Exposed communication of each rank in each iteration (ms), all devices of a rank together."""
    z = windows.groupby(["rank", "iteration"])["exposed_comm_ns"].sum().unstack("iteration") / 1e6
    fig = go.Figure(go.Heatmap(z=z.to_numpy(), x=list(z.columns), y=[str(r) for r in z.index], colorscale="Reds",
                               colorbar={"title": "exposed ms"},
                               hovertemplate="rank %{y}<br>iteration %{x}<br>%{z:.3f} ms exposed<extra></extra>"))
    fig.update_layout(title="Exposed communication, rank x iteration", xaxis_title="iteration", yaxis_title="rank",
                      yaxis_type="category")
    return fig


def split_by(table: pd.DataFrame, column: str, title: str) -> go.Figure:
    """Communication overlapped and exposed per value of `column` (collective kind, NVTX phase), summed over
    ranks and iterations (ms)."""
    t = table.groupby(column)[["overlapped_ns", "exposed_ns"]].sum() / 1e6
    labels = plotly_text(t.index)
    fig = go.Figure([go.Bar(y=labels, x=t["overlapped_ns"], orientation="h", name="overlapped by compute"),
                     go.Bar(y=labels, x=t["exposed_ns"], orientation="h", name="exposed")])
    fig.update_layout(barmode="stack", title=title, xaxis_title="ms")
    return fig


def overview(out) -> list:
    """This recipe's figures on the run overview page (`nsys-recipe report`)."""
    return [by_rank(pd.read_parquet(out / "ranks.parquet"))]
