"""`nsys-recipe diff` figures: the biggest changes per metric, and the GPU time shares side by side."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..diff import by_time_moved
from ..escape import plotly_text

COLORS = {"regressed": "#E45756", "improved": "#54A24B", "unchanged": "#BBBBBB"}


def biggest_changes(d: pd.DataFrame, metric: str, top: int = 20) -> go.Figure:
    t = by_time_moved(d[(d["metric"] == metric) & d["change_pct"].notna()], top).iloc[::-1]
    fig = go.Figure(go.Bar(
        x=t["change_pct"], y=plotly_text(t["key"].astype(str).str.slice(0, 60)), orientation="h",
        marker_color=[COLORS.get(v, "#888") for v in t["verdict"]],
        customdata=t[["base", "new", "verdict"]].assign(base=t["base"] / 1e6, new=t["new"] / 1e6).to_numpy(),
        hovertemplate="%{y}<br>%{x:+.1f} %<br>%{customdata[0]:,.3f} → %{customdata[1]:,.3f} ms"
                      "<br>%{customdata[2]}<extra></extra>"))
    fig.update_layout(title=f"{metric}: the {len(t)} keys whose time moved most (red: slower, green: faster)",
                      xaxis_title="change (%)", height=300 + 24 * len(t))
    return fig


def shares(d: pd.DataFrame) -> go.Figure:
    t = d[d["metric"] == "share_pct"].set_index("key")
    fig = go.Figure([go.Bar(x=plotly_text(t.index), y=t["base"], name="base"),
                     go.Bar(x=plotly_text(t.index), y=t["new"], name="new")])
    fig.update_layout(barmode="group", title="Share of GPU wall time by category, base vs new",
                      xaxis_title="category", yaxis_title="% of GPU wall time")
    return fig
