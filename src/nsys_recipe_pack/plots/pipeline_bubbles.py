"""Figures of pipeline_bubbles: one step of each stage on a timeline, and the bubble per stage and iteration."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from ..iterations import steady_rows
from . import table

MAX_TIMELINE_RANKS = 16
COLOURS = {"forward": "#4c78a8", "backward": "#f58518"}


def typical_iteration(bubbles: pd.DataFrame) -> int:
    """The steady iteration whose pipeline phase is the median one."""
    steady = steady_rows(bubbles)
    phase = steady.groupby("iteration")["window_ns"].median()
    return int((phase - phase.median()).abs().idxmin())


def timeline(passes: pd.DataFrame, iteration: int, max_ranks: int = MAX_TIMELINE_RANKS) -> go.Figure:
    """One iteration's forward and backward passes of each rank (the first pipeline's ranks, stage by stage) on the
    aligned clock, from the phase's start: the gaps are the bubble."""
    p = passes[passes["iteration"] == iteration]
    ranks = p.drop_duplicates("rank").sort_values(["pp_stage", "rank"])
    ranks = ranks.groupby("pp_stage").head(1).head(max_ranks)  # one rank per stage
    p = p[p["rank"].isin(ranks["rank"])]
    zero = int(p["start_aligned_ns"].min()) if len(p) else 0
    label = {int(r.rank): f"stage {int(r.pp_stage)} (rank {int(r.rank)})" for r in ranks.itertuples()}
    fig = go.Figure()
    for kind, rows in p.groupby("kind"):
        fig.add_trace(go.Bar(
            y=rows["rank"].map(label), x=(rows["end_aligned_ns"] - rows["start_aligned_ns"]) / 1e6,
            base=(rows["start_aligned_ns"] - zero) / 1e6, orientation="h", name=str(kind),
            marker_color=COLOURS.get(str(kind)),
            hovertemplate=f"{kind}<br>%{{base:.1f}} to %{{x:.1f}} ms long<extra></extra>"))
    fig.update_layout(title=f"Iteration {iteration}: each stage's passes (gaps: bubble)", barmode="overlay",
                      xaxis_title="ms from the pipeline phase's start",
                      yaxis={"categoryorder": "array", "categoryarray": list(label.values())[::-1]})
    return fig


def bubble_heatmap(bubbles: pd.DataFrame) -> go.Figure:
    """The bubble (% of the pipeline phase) of each stage (its median rank) in each iteration."""
    z = bubbles.groupby(["pp_stage", "iteration"])["bubble_pct"].median().unstack("iteration")
    fig = go.Figure(go.Heatmap(z=z.to_numpy(), x=list(z.columns), y=[f"stage {s}" for s in z.index],
                               colorscale="Reds", colorbar={"title": "bubble %"},
                               hovertemplate="%{y}<br>iteration %{x}<br>%{z:.1f} %<extra></extra>"))
    fig.update_layout(title="Pipeline bubble per stage and iteration", xaxis_title="iteration")
    return fig


def stages_table(stages: pd.DataFrame):
    return table(stages.assign(ranks=stages["ranks"].map(lambda r: ", ".join(map(str, r))),
                               busy_ms=(stages["busy_ns"] / 1e6).round(1))[
        ["pp_stage", "ranks", "busy_ms", "busy_vs_median_pct", "bubble_pct"]])


def overview(out) -> list:
    """This recipe's figures on the run overview page (`nsys-recipe report`)."""
    out = Path(out)
    bubbles = pd.read_parquet(out / "bubbles.parquet")
    passes = pd.read_parquet(out / "passes.parquet")
    figures = [bubble_heatmap(bubbles), stages_table(pd.read_parquet(out / "stages.parquet"))]
    if len(passes):
        figures.append(timeline(passes, typical_iteration(bubbles)))
    return figures
