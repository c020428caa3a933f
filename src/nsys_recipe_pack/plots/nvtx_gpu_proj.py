"""nvtx_gpu_proj figures: top ranges by GPU time, CPU vs GPU time, spread across ranks."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..escape import plotly_text


def _by_name(summary: pd.DataFrame) -> pd.DataFrame:
    return summary.groupby("name").agg(count=("count", "sum"), cpu_ms=("cpu_total_ns", lambda s: s.sum() / 1e6),
                                       gpu_ms=("gpu_busy_total_ns", lambda s: s.sum() / 1e6),
                                       proj_ms=("gpu_proj_total_ns", lambda s: s.sum() / 1e6))


def top_ranges(summary: pd.DataFrame, top: int = 20) -> go.Figure:
    t = _by_name(summary).sort_values("gpu_ms").tail(top)
    fig = go.Figure([
        go.Bar(y=plotly_text(t.index), x=t["gpu_ms"], orientation="h", name="GPU busy (union of its ops)",
               customdata=t["count"],
               hovertemplate="%{y}<br>GPU busy %{x:,.2f} ms over %{customdata} instances<extra></extra>"),
        go.Bar(y=plotly_text(t.index), x=t["cpu_ms"], orientation="h", name="CPU (range duration)",
               hovertemplate="%{y}<br>CPU %{x:,.2f} ms<extra></extra>"),
    ])
    fig.update_layout(barmode="group", title=f"NVTX ranges with the most GPU time (top {len(t)}, all ranks)",
                      xaxis_title="time (ms)", height=300 + 28 * len(t))
    if spans_decades(pd.concat([t["gpu_ms"], t["cpu_ms"]])):  # short GPU bars stay visible beside long CPU ranges
        fig.update_layout(xaxis_type="log", xaxis_title="time (ms, log scale)")
    return fig


def spans_decades(values: pd.Series, decades: float = 2.0) -> bool:
    """Whether the positive values differ by more than a factor 10**decades (then a log axis shows them all)."""
    v = values[values > 0]
    return len(v) > 1 and float(v.max()) > 10 ** decades * float(v.min())


def cpu_vs_gpu(summary: pd.DataFrame, top: int = 200) -> go.Figure:
    t = _by_name(summary)
    t = t[(t["gpu_ms"] > 0) & (t["cpu_ms"] > 0)].sort_values("gpu_ms").tail(top)
    hi = float(max(t["cpu_ms"].max(), t["gpu_ms"].max())) if len(t) else 1.0
    lo = float(max(min(t["cpu_ms"].min(), t["gpu_ms"].min()), 1e-3)) if len(t) else 1e-3
    fig = go.Figure([
        go.Scatter(x=t["cpu_ms"], y=t["gpu_ms"], mode="markers", text=plotly_text(t.index), customdata=t["count"],
                   hovertemplate="%{text}<br>CPU %{x:,.3f} ms<br>GPU busy %{y:,.3f} ms<br>%{customdata} instances"
                                 "<extra></extra>", name="range"),
        go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "gray"}, name="GPU = CPU",
                   hoverinfo="skip"),
    ])
    fig.update_layout(title="CPU time vs GPU busy time per range name (below the line: the CPU side is longer)",
                      xaxis_title="CPU time (ms)", yaxis_title="GPU busy time (ms)", xaxis_type="log", yaxis_type="log")
    return fig


def rank_spread(summary: pd.DataFrame, top: int = 10) -> go.Figure:
    names = _by_name(summary).sort_values("gpu_ms").tail(top).index[::-1]
    fig = go.Figure()
    for n in names:
        v = summary.loc[summary["name"] == n, "gpu_busy_total_ns"].astype("float64") / 1e6
        fig.add_trace(go.Box(y=v, name=plotly_text(str(n)[:40]), meta=plotly_text(n),
                             boxpoints="all" if len(v) <= 64 else False,
                             hovertemplate="%{meta}<br>%{y:,.2f} ms<extra></extra>"))
    fig.update_layout(title="GPU busy time per rank for the top ranges (one point per rank)",
                      yaxis_title="GPU busy time (ms)", showlegend=False)
    return fig


def overview(out) -> list:
    """This recipe's figures on the run overview page (`nsys-recipe report`)."""
    return [top_ranges(pd.read_parquet(out / "summary.parquet"), top=10)]
