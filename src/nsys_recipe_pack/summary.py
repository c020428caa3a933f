"""What `nsys-recipe run` prints when a recipe is done: the headline table and where things are."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def _ms(ns) -> str:
    return "" if pd.isna(ns) else f"{ns / 1e6:,.1f}"


def straggler_lines(out: Path, top: int = 5) -> list[str]:
    ranks = pd.read_parquet(out / "ranks.parquet")
    analysis = json.loads((out / "analysis.json").read_text())
    d = analysis.get("delimiter") or {}
    lines = [f"iterations delimited by {d.get('kind')} {d.get('name')!r} ({d.get('source')}); "
             f"{analysis.get('ranks')} ranks"]
    flagged = ranks[ranks["straggler_iterations"] > 0].head(top)
    if flagged.empty:
        lines.append("no straggler found")
        return lines
    table = pd.DataFrame({
        "rank": flagged["rank"],
        "straggler iterations": flagged["straggler_iterations"].astype(str) + "/" + flagged["iterations"].astype(str),
        "excess ms": flagged["excess_total_ns"].map(_ms),
        "worst score": flagged["worst_score"].map(lambda v: f"{v:.2f}"),
        "top cause": flagged["top_cause"].fillna(""),
    })
    lines.append("top stragglers:")
    lines.extend("  " + ln for ln in table.to_string(index=False).splitlines())
    return lines


SUMMARIES = {"straggler_heatmap": straggler_lines}


def print_summary(recipe: str, out: Path) -> None:
    fn = SUMMARIES.get(recipe)
    if fn is not None:
        for line in fn(out):
            print(line)
    print(f"output: {out}")
    html = out / "report.html"
    if html.exists():
        print(f"report: {html}")
