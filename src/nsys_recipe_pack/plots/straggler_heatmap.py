"""straggler_heatmap figures: rank x iteration heatmap, per-rank summary, causes, arrival skew."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.parquet as pq

from ..escape import plotly_text
from ..recipes.straggler_heatmap import GPU_COMPONENTS
from ..straggler_cells import group_medians
from . import table

MAX_HEATMAP_ROWS = 256
# the heatmap and the arrival-skew chart share their horizontal layout, so an iteration sits at the same place
# in both: the same margins, the colour bar and the legend in the right margin, the same iteration range
MARGIN = {"l": 70, "r": 150, "t": 70, "b": 50}


def _iteration_axis(iterations) -> dict:
    lo, hi = (int(np.min(iterations)), int(np.max(iterations))) if len(iterations) else (0, 0)
    return {"range": [lo - 0.5, hi + 0.5], "title": "iteration"}


def _ms(ns):
    return np.asarray(ns, dtype="float64") / 1e6


def _ms_cell(ns) -> float:
    """A heatmap cell's time in ms for its hover, to the microsecond: a page of many cells holds no more digits."""
    return round(ns / 1e6, 3)


def cause_labels(cause: pd.Series, side: pd.Series | None) -> pd.Series:
    """A cell's cause as shown: a child range's GPU work marked apart from its host time; "—" for none."""
    label = cause.astype(object).where(cause.notna(), "—").astype(str)
    if side is not None:
        on_gpu = (side == "gpu").fillna(False).astype(bool) & ~cause.isin(GPU_COMPONENTS)
        label = label.where(~on_gpu, label + " (GPU work)")
    return label


# what the figures show of iterations.parquet: a run of ten thousand ranks has tens of millions of cells
CELL_COLUMNS = ["rank", "iteration", "score", "duration_ns", "wait_ns", "busy_ns", "cause", "cause_side",
                "is_straggler", "is_warmup", "arrival_skew_ns", "stage"]


def read_cells(out) -> pd.DataFrame:
    """The columns of iterations.parquet the figures show (those the output has: `stage` only a pipeline job's)."""
    path = Path(out) / "iterations.parquet"
    have = set(pq.read_schema(path).names)
    # as pd.read_parquet reads it, each column's Arrow buffers let go of as it is converted, and handed back to the
    # system once all are: ten thousand ranks' cells are not held twice
    cells = pq.read_table(path, columns=[c for c in CELL_COLUMNS if c in have]).to_pandas(self_destruct=True,
                                                                                       split_blocks=True)
    pa.default_memory_pool().release_unused()
    return cells


def heatmap(it: pd.DataFrame, max_rows: int = MAX_HEATMAP_ROWS) -> go.Figure:
    """Score per (rank, iteration). Above `max_rows` ranks, every flagged rank keeps a row of its own (the most
    costly half of the rows at most) and the others are binned by their median busy time, a quantile of them a row,
    each cell the worst rank of its bin: a row of thousands of ranks stays readable, and no flagged rank hides."""
    ranks = np.sort(it["rank"].unique())
    binned = len(ranks) > max_rows
    if binned:  # the worst cell of each row and iteration first: ten thousand ranks' cells are never copied
        row, order, shown, bins = _binned_rows(it, max_rows)
        iteration = it["iteration"].to_numpy()
        key = row * (int(iteration.max()) + 1) + iteration
        first = np.lexsort((-it["score"].to_numpy(float), key))
        first = first[np.r_[True, key[first][1:] != key[first][:-1]]]
        df = it.iloc[first].assign(row=np.asarray(order, dtype=object)[row[first]])
    else:
        df = it.assign(row=it["rank"].astype(str))
        order = [str(r) for r in ranks]
    df["cause"] = plotly_text(cause_labels(df["cause"], df.get("cause_side")))
    z = df.pivot(index="row", columns="iteration", values="score").reindex(order)
    cols = z.columns
    def grid(col, fn=lambda v: v):
        return df.pivot(index="row", columns="iteration", values=col).reindex(order)[cols].map(fn).to_numpy()
    custom = np.stack([
        grid("rank"), grid("duration_ns", _ms_cell), grid("wait_ns", _ms_cell),
        grid("busy_ns", _ms_cell), grid("cause", lambda v: v if isinstance(v, str) else "—"),
        grid("is_straggler", lambda v: "yes" if v is True else "no"),
    ], axis=-1)
    fig = go.Figure(go.Heatmap(
        z=np.round(z.to_numpy(dtype=float), 3), x=list(cols), y=order, customdata=custom, colorscale="RdYlBu_r",
        zmin=0.0, zmax=2.0,
        colorbar={"title": "busy / median", "tickvals": [0, 0.5, 1, 1.5, 2],
                  "ticktext": ["0", "0.5", "1", "1.5", "≥2"]},
        hovertemplate=("rank %{customdata[0]}<br>iteration %{x}<br>score %{z:.2f}<br>duration %{customdata[1]:.2f} ms"
                       "<br>wait %{customdata[2]:.2f} ms<br>busy %{customdata[3]:.2f} ms<br>cause %{customdata[4]}"
                       "<br>straggler %{customdata[5]}<extra></extra>"),
    ))
    flagged = df[df["is_straggler"]]
    if len(flagged):
        fig.add_trace(go.Scatter(x=flagged["iteration"], y=flagged["row"], mode="markers", name="straggler",
                                 marker={"symbol": "x-thin", "size": 7, "line": {"width": 1.5, "color": "black"}},
                                 hoverinfo="skip"))
    title = ("Busy time relative to its pipeline stage's median in the iteration" if "stage" in df else
             "Busy time relative to the iteration's cross-rank median") + " (× marks flagged cells)"
    warm = np.unique(df.loc[df["is_warmup"].astype(bool), "iteration"]) if "is_warmup" in df else []
    for i in warm:  # start-up, not compared: shaded
        fig.add_vrect(x0=i - 0.5, x1=i + 0.5, fillcolor="grey", opacity=0.35, line_width=0)
    if len(warm):
        title += "<br><sup>shaded: warm-up iterations, not compared</sup>"
    if binned:
        title += (f"<br><sup>{len(ranks)} ranks: {shown} flagged in full, the other {len(ranks) - shown} in {bins} "
                  "rows by median busy time (least busy first); each cell is the worst rank of its row</sup>")
    fig.update_layout(title=title, xaxis=_iteration_axis(df["iteration"]), yaxis_title="rank", yaxis_type="category",
                      height=min(900, 250 + 14 * len(order)), showlegend=False, margin=MARGIN)
    fig.update_traces(colorbar={"x": 1.02, "xanchor": "left"}, selector={"type": "heatmap"})
    return fig


def _binned_rows(df: pd.DataFrame, max_rows: int) -> tuple[np.ndarray, list[str], int, int]:
    """Each cell's row (its place in the rows' order): its rank's own where the rank was flagged (the ranks with the
    most excess, up to half the rows), else its quantile of the other ranks by median busy time; the rows in order,
    how many ranks are shown whole, and how many rows the others share."""
    per_rank = df.groupby("rank").agg(flagged=("is_straggler", "any"), busy_ns=("busy_ns", "median"),
                                      worst=("score", "max"))
    flagged = per_rank[per_rank["flagged"]].sort_values("worst", ascending=False).index[:max_rows // 2]
    others = per_rank.drop(index=flagged).sort_values("busy_ns", kind="stable")
    bins = max(1, min(max_rows - len(flagged), len(others)))
    label = {r: str(r) for r in sorted(flagged)}
    order = list(label.values())
    for k, members in enumerate(np.array_split(others.index.to_numpy(), bins)):
        if not len(members):
            continue
        busy = others.loc[members, "busy_ns"] / 1e6
        name = f"q{k + 1}: {len(members)} ranks, {busy.min():,.1f}–{busy.max():,.1f} ms"
        label.update(dict.fromkeys(members.tolist(), name))
        order.append(name)
    place = {name: i for i, name in enumerate(order)}
    row = df["rank"].map(pd.Series({r: place[name] for r, name in label.items()})).to_numpy(np.int64)
    return row, order, len(flagged), bins


def straggler_bars(ranks: pd.DataFrame, top: int = 50) -> go.Figure:
    r = ranks[ranks["straggler_iterations"] > 0].head(top)
    fig = go.Figure(go.Bar(
        x=r["rank"].astype(str), y=r["straggler_iterations"], customdata=np.stack(
            [_ms(r["excess_total_ns"]), r["worst_score"],
             plotly_text(cause_labels(r["top_cause"], r.get("top_cause_side")))], axis=-1),
        hovertemplate=("rank %{x}<br>%{y} straggler iterations<br>excess %{customdata[0]:.1f} ms"
                       "<br>worst score %{customdata[1]:.2f}<br>top cause %{customdata[2]}<extra></extra>"),
    ))
    fig.update_layout(title=f"Straggler iterations per rank (top {len(r)} ranks)", xaxis_title="rank",
                      yaxis_title="flagged iterations", xaxis_type="category")
    return fig


def recoverable(stragglers: pd.DataFrame, top: int = 30) -> go.Figure:
    """Recoverable time per rank, split by cause: what fixing each straggling rank would give back."""
    c = stragglers.assign(label=cause_labels(stragglers["cause"], stragglers.get("cause_side")))
    t = c.groupby(["rank", "label"])["recoverable_ns"].sum().unstack(fill_value=0) / 1e6
    t = t.loc[t.sum(axis=1).sort_values(ascending=False).index[:top]]
    fig = go.Figure([go.Bar(x=t.index.astype(str), y=t[label], name=plotly_text(label), meta=plotly_text(label),
                            hovertemplate="rank %{x}<br>%{meta}: %{y:,.1f} ms recoverable<extra></extra>")
                     for label in t.columns])
    fig.update_layout(barmode="stack", title="Recoverable time per rank, by cause (had it matched the median rank)",
                      xaxis_title="rank", yaxis_title="recoverable (ms)", xaxis_type="category")
    return fig


def causes(stragglers: pd.DataFrame) -> go.Figure:
    c = stragglers.assign(cause=cause_labels(stragglers["cause"], stragglers.get("cause_side"))).groupby("cause").agg(
        cells=("rank", "size"), excess_ms=("excess_ns", lambda s: s.sum() / 1e6)).sort_values("excess_ms")
    fig = go.Figure(go.Bar(x=c["excess_ms"], y=plotly_text(c.index), orientation="h", customdata=c["cells"],
                           hovertemplate="%{y}<br>%{x:.1f} ms excess in %{customdata} cells<extra></extra>"))
    fig.update_layout(title="What the flagged cells spent their excess on", xaxis_title="excess busy time (ms)",
                      yaxis_title="cause", height=250 + 30 * len(c))
    return fig


def arrival_skew(it: pd.DataFrame) -> go.Figure:
    """Per iteration, the latest rank's arrival after the earliest (the last in rank order among ties) and the median
    rank's: from the cells' columns as arrays (ten thousand ranks have tens of millions of cells)."""
    skew = it["arrival_skew_ns"]
    arrived = skew.notna().to_numpy()
    arrived = slice(None) if arrived.all() else np.flatnonzero(arrived)  # every cell (most runs): no copies
    iteration = it["iteration"].to_numpy(np.int64)[arrived]
    value = skew.to_numpy(np.int64, na_value=0)[arrived]
    order = np.lexsort((value, iteration))  # by iteration, then skew, then rank: each iteration's latest rank last
    last = order[np.r_[iteration[order][1:] != iteration[order][:-1], True]] if len(order) else order
    del order
    worst = pd.DataFrame({"arrival_skew_ns": value[last], "rank": it["rank"].to_numpy()[arrived][last]},
                         index=pd.Index(iteration[last], name="iteration"))
    present = np.bincount(iteration) > 0 if len(iteration) else np.zeros(0, bool)
    med = pd.Series(group_medians(iteration, value, len(present))[present], index=np.flatnonzero(present))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=worst.index, y=_ms(worst["arrival_skew_ns"]), mode="lines+markers",
                             name="latest rank", customdata=worst["rank"],
                             hovertemplate="iteration %{x}<br>%{y:.2f} ms after the first<br>rank %{customdata}"
                                           "<extra></extra>"))
    fig.add_trace(go.Scatter(x=med.index, y=_ms(med), mode="lines", name="median rank",
                             hovertemplate="iteration %{x}<br>median %{y:.2f} ms<extra></extra>"))
    fig.update_layout(title="Arrival at the iteration's last collective, after the earliest rank",
                      xaxis=_iteration_axis(it["iteration"]), yaxis_title="arrival skew (ms)", margin=MARGIN,
                      legend={"x": 1.02, "xanchor": "left", "y": 1})
    return fig


def stage_busy(it: pd.DataFrame) -> go.Figure:
    """A pipeline job's busy time per stage (its median rank) in each iteration: a stage above the others throughout
    is stage imbalance, not a straggler."""
    per_stage = it.groupby(["stage", "iteration"])["busy_ns"].median().reset_index()
    fig = go.Figure([go.Scatter(x=g["iteration"], y=_ms(g["busy_ns"]), mode="lines+markers", name=f"stage {stage}",
                                hovertemplate=f"stage {stage}<br>iteration %{{x}}<br>busy %{{y:.1f}} ms<extra></extra>")
                     for stage, g in per_stage.groupby("stage")])
    fig.update_layout(title="Busy time per pipeline stage (its median rank): ranks are compared within their stage",
                      xaxis=_iteration_axis(it["iteration"]), yaxis_title="busy (ms)", margin=MARGIN,
                      legend={"x": 1.02, "xanchor": "left", "y": 1})
    return fig


def microbatch_cost(steps: pd.DataFrame) -> go.Figure:
    """What long micro-batches cost each iteration (it re-timed with each at its stage's median), and how many of the
    ranks' micro-batch passes were long."""
    fig = go.Figure([go.Bar(x=steps["iteration"], y=_ms(steps["cost_ns"]), customdata=steps["long_passes"],
                            hovertemplate="iteration %{x}<br>+%{y:.1f} ms<br>%{customdata} long passes"
                                          "<extra></extra>")])
    fig.update_layout(title="What uneven micro-batches cost each iteration", xaxis=_iteration_axis(steps["iteration"]),
                      yaxis_title="cost (ms)", margin=MARGIN)
    return fig


def findings_table(found: pd.DataFrame):
    """findings.parquet as shown: what was found, its cost and what to do (outputs of earlier versions: their
    columns)."""
    if "kind" not in found:
        return table(found)
    return table(found.assign(cost_ms=(found["cost_ns"] / 1e6).round(1), cost_pct=found["cost_pct"].round(1),
                              ranks=found["ranks"].map(lambda m: ", ".join(map(str, m))))[
        ["kind", "stage", "ranks", "cost_ms", "cost_pct", "busier_iterations", "iterations", "evidence", "advice"]])


def microbatch_spread(spread: pd.DataFrame):
    """microbatches.parquet as shown: each stage's micro-batch passes in ms, and against their place's median."""
    return table(spread.assign(**{f"{c}_ms": (spread[f"{c}_ns"] / 1e6).round(2) for c in ("median", "p95", "max")})[
        ["stage", "passes", "long_passes", "median_ms", "p95_ms", "max_ms", "p95_ratio", "max_ratio"]])


def overview(out) -> list:
    """This recipe's figures on the run overview page (`nsys-recipe report`): the heatmap, and for a pipeline job the
    stages' busy time, the findings (stage imbalance, uneven micro-batches) and what uneven micro-batches cost."""
    it = read_cells(out)
    figures = [heatmap(it)]
    if "stage" in it and it["stage"].nunique() > 1:
        figures.append(stage_busy(it))
    findings = out / "findings.parquet"
    if findings.exists():
        found = pd.read_parquet(findings)
        if len(found):
            figures.append(findings_table(found))
        if "kind" in found and (found["kind"] == "microbatch_imbalance").any():
            figures.append(microbatch_cost(pd.read_parquet(out / "microbatch_steps.parquet")))
    return figures
