"""gpu_memory figures: device memory over time per rank with its peak, peak per rank and iteration, headroom."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..escape import plotly_text
from . import scatter_class

DEVICE = "Device"
MAX_LINES = 16
GIB = float(1 << 30)


def over_time(timeline: pd.DataFrame, ranks: pd.DataFrame) -> go.Figure:
    """Device memory in use over time (aligned clocks), a line per rank and device, each peak marked."""
    line = timeline[timeline["kind"] == DEVICE]
    fig = go.Figure()
    keys = line[["rank", "device"]].drop_duplicates().sort_values(["rank", "device"])
    trace = scatter_class(len(line))
    shown = keys.head(MAX_LINES)
    for r, d in shown.itertuples(index=False):
        rows = line[(line["rank"] == r) & (line["device"] == d)]
        name = f"rank {r}" + (f" GPU {d}" if keys["device"].nunique() > 1 else "")
        fig.add_trace(trace(x=rows["time_aligned_ns"] / 1e9, y=rows["bytes_in_use"] / GIB, mode="lines",
                            line_shape="hv", name=name,
                            hovertemplate=f"{name}<br>%{{x:.3f}} s<br>%{{y:.3f}} GiB<extra></extra>"))
    device = ranks[(ranks["kind"] == DEVICE) & ranks.set_index(["rank", "device"]).index.isin(
        list(shown.itertuples(index=False, name=None)))]
    if len(device):
        offset = line.groupby("rank").apply(lambda g: (g["time_aligned_ns"] - g["time_ns"]).iloc[0],
                                            include_groups=False)
        x = (device["peak_time_ns"] + device["rank"].map(offset).fillna(0)) / 1e9
        fig.add_trace(go.Scatter(x=x, y=device["peak_bytes"] / GIB, mode="markers", name="peak",
                                 marker={"symbol": "triangle-down", "size": 10, "color": "black"},
                                 customdata=np.stack([device["rank"], plotly_text(device["peak_range"].fillna("—"))],
                                                     axis=-1),
                                 hovertemplate="rank %{customdata[0]} peaks<br>%{y:.3f} GiB<br>in %{customdata[1]}"
                                               "<extra></extra>"))
    title = "Device memory in use (allocated through CUDA), per rank; ▼ marks each peak"
    if len(keys) > MAX_LINES:
        title += f"<br><sup>the first {MAX_LINES} of {len(keys)} rank and GPU pairs</sup>"
    fig.update_layout(title=title, xaxis_title="time since the earliest rank's start (s)", yaxis_title="GiB")
    return fig


def peak_heatmap(iterations: pd.DataFrame) -> go.Figure:
    """Peak device memory per rank and iteration, as the straggler heatmap draws its cells."""
    peak = iterations.groupby(["rank", "iteration"])["peak_bytes"].max().unstack() / GIB
    fig = go.Figure(go.Heatmap(z=peak.to_numpy(), x=list(peak.columns), y=[str(r) for r in peak.index],
                               colorscale="Viridis", colorbar={"title": "GiB"},
                               hovertemplate="rank %{y}<br>iteration %{x}<br>peak %{z:.3f} GiB<extra></extra>"))
    fig.update_layout(title="Peak device memory per rank and iteration", xaxis_title="iteration", yaxis_title="rank",
                      yaxis_type="category", height=min(900, 250 + 14 * len(peak)))
    return fig


def headroom(ranks: pd.DataFrame) -> go.Figure:
    """Each rank's peak against its GPU's memory."""
    device = ranks[ranks["kind"] == DEVICE].groupby("rank").agg(peak=("peak_bytes", "max"),
                                                                total=("total_bytes", "max"))
    fig = go.Figure(go.Bar(x=device.index.astype(str), y=device["peak"] / GIB, name="peak",
                           hovertemplate="rank %{x}<br>peak %{y:.2f} GiB<extra></extra>"))
    if (device["total"] > 0).any():
        fig.add_trace(go.Scatter(x=device.index.astype(str), y=device["total"] / GIB, mode="markers",
                                 name="GPU memory", marker={"symbol": "line-ew-open", "size": 30},
                                 hovertemplate="rank %{x}<br>GPU memory %{y:.1f} GiB<extra></extra>"))
    fig.update_layout(title="Peak device memory per rank, against the GPU's memory", xaxis_title="rank",
                      yaxis_title="GiB", xaxis_type="category")
    return fig


def overview(out) -> list:
    """This recipe's figures on the run overview page (`nsys-recipe report`)."""
    return [over_time(pd.read_parquet(out / "timeline.parquet"), pd.read_parquet(out / "ranks.parquet"))]
