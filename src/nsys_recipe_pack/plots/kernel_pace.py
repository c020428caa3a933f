"""kernel_pace figures: progress per rank, consistency across ranks, lag."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from . import scatter_class

MAX_LINES = 16


def progress(pace: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    trace = scatter_class(len(pace))
    ranks = sorted(pace["rank"].unique())
    if len(ranks) <= MAX_LINES:
        for r in ranks:
            p = pace[pace["rank"] == r]
            fig.add_trace(trace(x=p["iteration"], y=p["duration_ns"] / 1e6, mode="lines", name=f"rank {r}",
                                       hovertemplate=f"rank {r}<br>iteration %{{x}}<br>%{{y:.3f}} ms<extra></extra>"))
        title = "Duration of each iteration, per rank"
    else:
        q = pace.groupby("iteration")["duration_ns"].quantile([0.05, 0.5, 0.95]).unstack() / 1e6
        for col, name in [(0.95, "95th percentile"), (0.5, "median"), (0.05, "5th percentile")]:
            fig.add_trace(trace(x=q.index, y=q[col], mode="lines", name=name,
                                       hovertemplate=f"{name}<br>iteration %{{x}}<br>%{{y:.3f}} ms<extra></extra>"))
        title = f"Duration of each iteration across {len(ranks)} ranks (percentiles over ranks)"
    fig.update_layout(title=title, xaxis_title="iteration", yaxis_title="duration (ms)")
    return warmup_off_axis(fig, pace, "duration_ns")


def warmup_off_axis(fig: go.Figure, rows: pd.DataFrame, column: str) -> go.Figure:
    """The y axis fitted to the steady iterations, with a note on the warm-up ones above it: a first step of
    0.7 s among 30 ms steps would otherwise flatten every line."""
    warm = rows["is_warmup"].to_numpy(bool) if "is_warmup" in rows else None
    if warm is None or not warm.any() or warm.all():
        return fig
    steady_top, warm_top = rows.loc[~warm, column].max() / 1e6, rows.loc[warm, column].max() / 1e6
    if warm_top <= steady_top:
        return fig
    iterations = sorted(rows.loc[warm, "iteration"].unique())
    shown = ", ".join(map(str, iterations[:5])) + (", …" if len(iterations) > 5 else "")
    fig.update_yaxes(range=[0, 1.1 * steady_top])
    fig.add_annotation(text=f"warm-up iteration(s) {shown} above the axis, up to {warm_top:,.1f} ms",
                       xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom", showarrow=False)
    return fig


def consistency(pace: pd.DataFrame) -> go.Figure:
    if "is_warmup" in pace and pace["is_warmup"].any() and not pace["is_warmup"].all():
        pace = pace[~pace["is_warmup"]]  # the spread of the steady iterations
    ranks = sorted(pace["rank"].unique())
    fig = go.Figure()
    if len(ranks) <= 64:
        for r in ranks:
            fig.add_trace(go.Box(y=pace.loc[pace["rank"] == r, "duration_ns"] / 1e6, name=str(r), boxpoints=False))
        title = "Spread of iteration durations per rank"
    else:
        s = pace.groupby("rank")["duration_ns"].median() / 1e6
        fig.add_trace(scatter_class(len(s))(x=s.index, y=s, mode="markers", name="median",
                                   hovertemplate="rank %{x}<br>median %{y:.3f} ms<extra></extra>"))
        title = f"Median iteration duration per rank ({len(ranks)} ranks)"
    fig.update_layout(title=title, xaxis_title="rank", yaxis_title="duration (ms)", showlegend=False)
    return fig


def lag(pace: pd.DataFrame) -> go.Figure:
    trace = scatter_class(2 * pace["iteration"].nunique())
    worst = pace.sort_values("lag_ns").groupby("iteration").tail(1).set_index("iteration").sort_index()
    med = pace.groupby("iteration")["lag_ns"].median()
    fig = go.Figure()
    fig.add_trace(trace(x=worst.index, y=worst["lag_ns"] / 1e6, mode="lines", name="latest rank",
                               customdata=worst["rank"],
                               hovertemplate="iteration %{x}<br>%{y:.3f} ms behind<br>rank %{customdata}"
                                             "<extra></extra>"))
    fig.add_trace(trace(x=med.index, y=med / 1e6, mode="lines", name="median rank",
                               hovertemplate="iteration %{x}<br>median %{y:.3f} ms<extra></extra>"))
    fig.update_layout(title="Start of each iteration after the earliest rank (aligned clocks)",
                      xaxis_title="iteration", yaxis_title="lag (ms)")
    return fig


def overview(out) -> list:
    """This recipe's figures on the run overview page (`nsys-recipe report`)."""
    return [progress(pd.read_parquet(out / "pace.parquet"))]
