"""sync_summary figures: blocking time by kind, by NVTX range, and over time."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..escape import plotly_text
from . import rank_bins, scatter_class, table

MAX_POINTS = 20000


def by_kind(summary: pd.DataFrame) -> go.Figure:
    t = summary.groupby(["rank", "kind"])["total_ns"].sum().unstack(fill_value=0) / 1e6
    labels, binned = rank_bins(t.index)
    if binned:  # worst rank of each bin
        t = t.groupby(t.index.map(labels), sort=False).max()
    fig = go.Figure([go.Bar(x=t.index.astype(str), y=t[k], name=k,
                            hovertemplate=f"rank %{{x}}<br>{k}: %{{y:.2f}} ms<extra></extra>") for k in t.columns])
    title = "Time the host spent blocked, by kind of call"
    if binned:
        title += f"<br><sup>{len(labels)} ranks in {len(t)} bins: each bar is the largest value in its bin</sup>"
    fig.update_layout(barmode="stack", title=title, xaxis_title="rank",
                      yaxis_title="blocked time (ms)", xaxis_type="category")
    return fig


def by_range(calls: pd.DataFrame, top: int = 20) -> go.Figure:
    t = calls.assign(nvtx_range=calls["nvtx_range"].fillna("(no NVTX range)")).groupby("nvtx_range").agg(
        total_ms=("duration_ns", lambda s: s.sum() / 1e6), count=("duration_ns", "size"),
        idle_ms=("gpu_idle_ns", lambda s: s.sum() / 1e6)).sort_values("total_ms").tail(top)
    fig = go.Figure([
        go.Bar(y=plotly_text(t.index), x=t["total_ms"], orientation="h", name="blocked", customdata=t["count"],
               hovertemplate="%{y}<br>%{x:.2f} ms blocked in %{customdata} calls<extra></extra>"),
        go.Bar(y=plotly_text(t.index), x=t["idle_ms"], orientation="h", name="of which the GPU was idle",
               hovertemplate="%{y}<br>GPU idle %{x:.2f} ms<extra></extra>"),
    ])
    fig.update_layout(barmode="overlay", title=f"Blocking calls by innermost NVTX range (top {len(t)})",
                      xaxis_title="time (ms)", height=250 + 22 * len(t))
    return fig


def timeline(calls: pd.DataFrame) -> go.Figure:
    c = calls if len(calls) <= MAX_POINTS else calls.nlargest(MAX_POINTS, "duration_ns")
    fig = go.Figure()
    t0 = c["start_ns"].min() if len(c) else 0
    for kind, g in c.groupby("kind"):
        fig.add_trace(scatter_class(len(c))(
            x=(g["start_ns"] - t0) / 1e9, y=g["duration_ns"] / 1e3, mode="markers", name=kind,
            customdata=g[["rank", "api", "nvtx_range"]].astype(str).apply(plotly_text).to_numpy(),
            hovertemplate=("%{customdata[1]}<br>rank %{customdata[0]}, in %{customdata[2]}<br>at %{x:.3f} s"
                           "<br>%{y:.1f} us<extra></extra>")))
    title = "Each blocking call over time"
    if len(calls) > MAX_POINTS:
        title += f" (the {MAX_POINTS} longest of {len(calls)})"
    fig.update_layout(title=title, xaxis_title="time since the first call (s, each rank's own clock)",
                      yaxis_title="duration (us)", yaxis_type="log")
    return fig


def overview(out) -> list:
    """This recipe's figures and findings on the run overview page (`nsys-recipe report`)."""
    by_api = pd.read_parquet(out / "summary.parquet")
    findings = pd.read_parquet(out / "findings.parquet")
    return ([by_kind(by_api)] if len(by_api) else []) + (
        [table(findings[["rank", "severity", "finding", "evidence"]])] if len(findings) else [])
