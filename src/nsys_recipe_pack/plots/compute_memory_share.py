"""compute_memory_share figures: shares per rank, the whole job, copy bandwidth, sum vs union."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..gpu import PRIORITY
from . import rank_bins

ORDER = [*PRIORITY, "idle"]
COLORS = {"compute": "#4C78A8", "communication": "#F58518", "memcpy_htod": "#54A24B", "memcpy_dtoh": "#88D27A",
          "memcpy_dtod": "#B79A20", "memcpy_peer": "#E45756", "memcpy_other": "#9D755D", "memset": "#B279A2",
          "idle": "#D3D3D3"}


def _per_rank(share: pd.DataFrame) -> pd.DataFrame:
    t = share.groupby(["rank", "category"])["union_ns"].sum().unstack(fill_value=0)
    return t.div(t.sum(axis=1), axis=0) * 100


def stacked(share: pd.DataFrame) -> go.Figure:
    t = _per_rank(share)
    labels, binned = rank_bins(t.index)
    if binned:  # mean share per bin of ranks
        t = t.groupby(t.index.map(labels), sort=False).mean()
    fig = go.Figure()
    for cat in [c for c in ORDER if c in t.columns]:
        fig.add_trace(go.Bar(x=t.index.astype(str), y=t[cat], name=cat, marker_color=COLORS[cat],
                             hovertemplate=f"rank %{{x}}<br>{cat}: %{{y:.1f}} %<extra></extra>"))
    title = "Share of GPU wall time per rank (exclusive, all devices of the rank)"
    if binned:
        title += f"<br><sup>{len(labels)} ranks in {len(t)} bins: each bar is the mean of its bin</sup>"
    fig.update_layout(barmode="stack", title=title,
                      xaxis_title="rank", yaxis_title="% of the active window", xaxis_type="category")
    return fig


def job_pie(share: pd.DataFrame) -> go.Figure:
    t = share.groupby("category")["union_ns"].sum().reindex([c for c in ORDER if c in set(share["category"])])
    fig = go.Figure(go.Pie(labels=t.index, values=t / 1e6, sort=False, marker_colors=[COLORS[c] for c in t.index],
                           hovertemplate="%{label}<br>%{value:,.1f} ms (%{percent})<extra></extra>"))
    fig.update_layout(title="The whole job: GPU wall time by category (ms)")
    return fig


def bandwidth(share: pd.DataFrame) -> go.Figure:
    c = share[share["category"].str.startswith("memcpy")].groupby("category")[["bytes", "sum_ns"]].sum()
    c = c[c["sum_ns"] > 0]
    gbps = c["bytes"].astype("float64") / c["sum_ns"]
    fig = go.Figure(go.Bar(x=c.index, y=gbps, customdata=c["bytes"] / 1e9, marker_color=[COLORS[k] for k in c.index],
                           hovertemplate="%{x}<br>%{y:.2f} GB/s<br>%{customdata:.3f} GB moved<extra></extra>"))
    fig.update_layout(title="Average copy bandwidth by kind (bytes / time in copies)", xaxis_title="copy kind",
                      yaxis_title="GB/s")
    return fig


def sum_vs_union(share: pd.DataFrame) -> go.Figure:
    t = share[share["category"] != "idle"].groupby("category")[["sum_ns", "union_ns"]].sum()
    t = t.reindex([c for c in ORDER if c in t.index])
    fig = go.Figure([
        go.Bar(x=t.index, y=t["sum_ns"] / 1e6, name="sum of op durations (nsys stats)",
               hovertemplate="%{x}<br>sum %{y:,.1f} ms<extra></extra>"),
        go.Bar(x=t.index, y=t["union_ns"] / 1e6, name="exclusive wall time",
               hovertemplate="%{x}<br>wall %{y:,.1f} ms<extra></extra>"),
    ])
    fig.update_layout(barmode="group", title="Two ways of counting: summed op time vs exclusive wall time",
                      xaxis_title="category", yaxis_title="time (ms)")
    return fig


def overview(out) -> list:
    """This recipe's figures on the run overview page (`nsys-recipe report`)."""
    return [stacked(pd.read_parquet(out / "share.parquet"))]
