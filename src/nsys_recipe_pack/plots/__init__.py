"""Figures for the notebooks (plotly), kept apart from the analyses that compute the tables.

`show(fig)` embeds plotly.js in the first figure's HTML output, so an exported HTML report opens on a
machine with no internet, and also hands JupyterLab plotly's own mimetype for interactive rendering.
Names from reports reach a page only escaped (`..escape`): figures escape them where they are built,
`table` renders cells and labels as text, and notes take names through `md_text` or `md_code`.
"""

from __future__ import annotations

import json

from ..escape import markdown_code as md_code
from ..escape import markdown_text as md_text

__all__ = ["md_code", "md_text", "note", "rank_bins", "scatter_class", "show", "table", "waiting_table"]

_state = {"plotlyjs_sent": False}
CONFIG = {"displaylogo": False, "responsive": True}


def show(fig) -> None:
    from IPython.display import display

    html = fig.to_html(full_html=False, include_plotlyjs=not _state["plotlyjs_sent"], include_mathjax=False,
                       config=CONFIG)
    _state["plotlyjs_sent"] = True
    display({"text/html": html, "application/vnd.plotly.v1+json": json.loads(fig.to_json())}, raw=True)


def note(text: str) -> None:
    """Markdown written by the notebook; any name inside it must come through md_text or md_code."""
    from IPython.display import Markdown, display

    display(Markdown(text))


UNITS = {"_ms": " (ms)", "_us": " (µs)", "_ns": " (ns)", "_pct": " (%)", "_gbps": " (GB/s)"}


def header(column) -> str:
    """A column name as a table header: words instead of underscores, the unit apart (`excess_ms` -> `excess (ms)`)."""
    text = str(column)
    unit = next((u for suffix, u in UNITS.items() if text.endswith(suffix)), "")
    if unit:
        text = text[: text.rfind("_")]
    return text.replace("_", " ") + unit


def three_digits(value) -> str:
    """A measured number to 3 significant digits without exponents: 254.5 -> 254, 3.14159 -> 3.14, 0.01234
    -> 0.0123; whole numbers as they are."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if value != value:  # NaN
        return "—"
    magnitude = abs(value)
    if magnitude >= 100 or value == int(value):
        return f"{value:,.0f}"
    if magnitude >= 1:
        return f"{value:.{3 - len(str(int(magnitude)))}f}"
    return f"{value:.3g}" if magnitude >= 1e-4 else f"{value:.1e}"


def table(df, index: bool = False):
    """A DataFrame as an HTML table whose cells and labels are text, never markup; readable headers, floats to
    3 significant digits, missing values as "—"."""
    floats = df.select_dtypes("floating").columns
    styler = (df.style.format(escape="html", na_rep="—").format(three_digits, subset=list(floats), na_rep="—")
              .format_index(escape="html", axis=0).format_index(header, escape="html", axis=1))
    return styler if index else styler.hide(axis="index")


WEBGL_ABOVE = 20000


def scatter_class(points: int):
    """SVG scatter for ordinary sizes (renders everywhere, headless included); WebGL only for big ones."""
    import plotly.graph_objects as go

    return go.Scattergl if points > WEBGL_ABOVE else go.Scatter


MAX_BARS = 256


def rank_bins(ranks, max_bins: int = MAX_BARS) -> tuple[dict, bool]:
    """Map each rank to a label; above `max_bins` ranks, to a bin label "lo–hi" (figures stay readable)."""
    import numpy as np

    ranks = np.sort(np.unique(np.asarray(ranks)))
    if len(ranks) <= max_bins:
        return {r: str(r) for r in ranks}, False
    return {r: f"{b[0]}–{b[-1]}" for b in np.array_split(ranks, max_bins) for r in b}, True


def waiting_table(ranks):
    """Each rank's NCCL kernel time split into waiting for the last member and transfer, and what the others waited
    for it (waiting.py's columns, in ms), the ranks waited for most first."""
    columns = ["comm_kernel_ns", "waiting_ns", "transfer_ns", "waited_for_ns"]
    shown = ranks.sort_values("waited_for_ns", ascending=False)[["rank", *columns]]
    return table(shown.assign(**{c: (shown[c] / 1e6).round(2) for c in columns}).rename(
        columns={c: c.replace("_ns", "_ms") for c in columns}))
