"""What `nsys-recipe run` prints when a recipe is done: the headline table and where things are."""

from __future__ import annotations

import json
from pathlib import Path

from .analyses.straggler import verdicts
from .escape import terminal_text
from .lazy import pd


def _ms(ns) -> str:
    return "" if pd.isna(ns) else f"{ns / 1e6:,.1f}"


def straggler_lines(out: Path, top: int = 5) -> list[str]:
    ranks = pd.read_parquet(out / "ranks.parquet")
    analysis = json.loads((out / "analysis.json").read_text())
    d = analysis.get("delimiter") or {}
    lines = [f"iterations delimited by {d.get('kind')} {d.get('name')!r} ({d.get('source')}); "
             f"{analysis.get('ranks')} ranks"]
    holds_back = ~ranks["incidental"] if "incidental" in ranks else True  # outputs of earlier versions lack it
    flagged = ranks[(ranks["straggler_iterations"] > 0) & holds_back].head(top)
    if flagged.empty:
        lines.append("no rank holds the others back" if (ranks["straggler_iterations"] > 0).any()
                     else "no straggler found")
        lines.extend(verdicts(ranks, pd.read_parquet(out / "stragglers.parquet"), top))
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
    lines.extend(verdicts(ranks, pd.read_parquet(out / "stragglers.parquet"), top))
    if analysis.get("pattern"):
        lines.append(f"pattern: {analysis['pattern']}")
    return lines


def pace_lines(out: Path, top: int = 5) -> list[str]:
    stats = pd.read_parquet(out / "stats.parquet")
    table = pd.DataFrame({
        "rank": stats["rank"].map(lambda r: "all" if r == -1 else str(r)),
        "count": stats["count"],
        "median ms": stats["median_ns"].map(_ms),
        "p95 ms": stats["p95_ns"].map(_ms),
        "cv": stats["cv"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}"),
    })
    worst = table.iloc[:-1].assign(_cv=stats["cv"].iloc[:-1]).sort_values("_cv", ascending=False).head(top)
    rows = pd.concat([worst.drop(columns="_cv"), table.iloc[[-1]]])
    return ["least steady ranks (by coefficient of variation):"] + ["  " + ln for ln in rows.to_string(index=False).splitlines()]


def share_lines(out: Path) -> list[str]:
    share = pd.read_parquet(out / "share.parquet")
    t = share.groupby("category")[["sum_ns", "union_ns"]].sum()
    total = t["union_ns"].sum()
    t = t.assign(**{"sum ms": t["sum_ns"].map(_ms), "wall ms": t["union_ns"].map(_ms),
                    "wall %": (100 * t["union_ns"] / total).map(lambda v: f"{v:.1f}")})
    return ["GPU time by category, all ranks:"] + ["  " + ln for ln in
                                                  t[["sum ms", "wall ms", "wall %"]].to_string().splitlines()]


def sync_lines(out: Path, top: int = 5) -> list[str]:
    summary = pd.read_parquet(out / "summary.parquet")
    findings = pd.read_parquet(out / "findings.parquet")
    t = summary.groupby("kind").agg(count=("count", "sum"), total_ns=("total_ns", "sum"))
    lines = ["blocking calls by kind, all ranks:"]
    lines += ["  " + ln for ln in t.assign(total_ms=t["total_ns"].map(_ms))[["count", "total_ms"]]
              .to_string().splitlines()]
    lines.append(f"{len(findings)} finding(s)" + (":" if len(findings) else ""))
    lines += [f"  rank {r.rank} [{r.severity}] {r.finding}: {r.evidence}" for r in findings.head(top).itertuples()]
    return lines


def proj_lines(out: Path, top: int = 8) -> list[str]:
    s = pd.read_parquet(out / "summary.parquet")
    t = s.groupby("name")[["count", "cpu_total_ns", "gpu_busy_total_ns"]].sum()
    t = t.sort_values("gpu_busy_total_ns", ascending=False).head(top)
    table = pd.DataFrame({"count": t["count"], "cpu ms": t["cpu_total_ns"].map(_ms),
                          "gpu busy ms": t["gpu_busy_total_ns"].map(_ms),
                          "cpu/gpu": (t["cpu_total_ns"] / t["gpu_busy_total_ns"].where(t["gpu_busy_total_ns"] > 0))
                          .map(lambda v: "" if pd.isna(v) else f"{v:.2f}")})
    table.index = [str(i)[:40] for i in table.index]
    return ["ranges with the most GPU time, all ranks:"] + ["  " + ln for ln in table.to_string().splitlines()]


SUMMARIES = {"nvtx_gpu_proj": proj_lines, "straggler_heatmap": straggler_lines, "kernel_pace": pace_lines, "compute_memory_share": share_lines,
             "sync_summary": sync_lines}


def print_summary(recipe: str, out: Path) -> None:
    fn = SUMMARIES.get(recipe)
    if fn is not None:
        for line in fn(out):
            print(terminal_text(line))
    print(f"output: {out}")
    html = out / "report.html"
    if html.exists():
        print(f"report: {html}")


def print_recipe_table(results: list[tuple[str, str, str, int]]) -> int:
    """After several recipes: what ran, what was skipped and why; the exit status of the whole run.

    0 when every recipe ran, or some ran and the others do not apply (their reports lack a trace they
    need); else the first failing recipe's exit status (3 for bad input), also when none ran."""
    print("recipes:")
    width = max(len(name) for name, *_ in results)
    for name, status, detail, _ in results:
        print(terminal_text(f"  {name:<{width}}  {status:<7}  {detail}"))
    ran = any(status == "done" for _, status, _, _ in results)
    failed = [code for _, status, _, code in results if status == "failed"]
    if failed:
        return failed[0]
    return 0 if ran else 3
