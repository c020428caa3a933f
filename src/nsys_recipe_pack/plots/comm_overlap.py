"""Figures of comm_overlap: overlapped and exposed communication per rank, per iteration and per collective."""

from __future__ import annotations

import json
from pathlib import Path

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


HOST_SOURCES = {"collective NVTX range": "collective NVTX ranges", "MPI call": "MPI calls"}


def host_communication(run: Path) -> str | None:
    """Where comm_overlap does not apply (no communication kernel on the GPU): how the ranks communicated and for how
    long, from straggler_heatmap's sync points inside its iterations (collective NVTX ranges, MPI calls) in the same
    run folder; None where it has none."""
    analysis = Path(run) / "straggler_heatmap" / "analysis.json"
    if not analysis.exists():
        return None
    times = json.loads(analysis.read_text()).get("sync_time_ns") or {}
    said = {HOST_SOURCES[k]: v for k, v in times.items() if k in HOST_SOURCES and v > 0}
    if not said:
        return None
    it = pd.read_parquet(analysis.parent / "iterations.parquet",
                         columns=["rank", "iteration", "duration_ns", "arrival_skew_ns"])
    ranks, steps = max(it["rank"].nunique(), 1), int(it["duration_ns"].sum())
    parts = ", ".join(f"{what} {ns / ranks / 1e9:,.2f} s ({100 * ns / max(steps, 1):.0f} %)"
                      for what, ns in said.items())
    return (f"communication on the host, not the GPU: {parts} of each rank's {steps / ranks / 1e9:,.2f} s of "
            f"iterations, on average{_waiting_at_last(it, ranks)} (straggler_heatmap's sync points)")


def _waiting_at_last(it: pd.DataFrame, ranks: int) -> str:
    """'; 0.40 s of it waiting for the last rank at each iteration's last collective, 80 % of that for rank 3': each
    rank's wait there is the latest arrival less its own ('' where no rank waited)."""
    arrived = it.dropna(subset=["arrival_skew_ns"])
    if not len(arrived):
        return ""
    skew = arrived["arrival_skew_ns"].astype("int64")
    wait = skew.groupby(arrived["iteration"]).transform("max") - skew
    if not wait.sum():
        return ""
    last = arrived.loc[skew.groupby(arrived["iteration"]).idxmax()].set_index("iteration")["rank"]
    charged = wait.groupby(arrived["iteration"]).sum().groupby(last).sum()
    top = charged.idxmax()
    return (f"; {wait.sum() / ranks / 1e9:,.2f} s of it waiting for the last rank at each iteration's last "
            f"collective, {100 * charged[top] / wait.sum():.0f} % of that for rank {int(top)}")
