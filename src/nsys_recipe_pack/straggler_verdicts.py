"""straggler_heatmap's answers in words: which ranks hold the others back, how often and in what, and how their
straggling recurs (persistent, intermittent, incidental)."""

from __future__ import annotations

import numpy as np

from .lazy import pd
from .peers import waited_text


def most_frequent(values: pd.Series):
    """The most frequent value that is not missing, None when every one is (a flagged cell that no component
    explains has no cause)."""
    counts = values.value_counts()
    return counts.index[0] if len(counts) else None


FIXED_CAUSES = {"gpu_compute": "GPU compute (kernels not launched inside an NVTX phase)",
                "memcpy": "copies (not launched inside an NVTX phase)",
                "host_gap": "host time outside every NVTX phase"}


def spans(values) -> str:
    """Sorted whole numbers as runs: 3, 5–7, 15–24."""
    v = np.unique(np.asarray(values, np.int64))
    if not len(v):
        return ""
    cut = np.flatnonzero(np.diff(v) != 1) + 1
    runs = [(int(r[0]), int(r[-1])) for r in np.split(v, cut)]
    text = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs[:8]]
    return ", ".join(text) + (", …" if len(runs) > 8 else "")


INCIDENTAL_CELLS = 3  # fewer flagged iterations than this, or as few as this apart from one another: incidental


PERSISTENT_RUN = 3  # consecutive flagged iterations that make a rank's straggling persistent


def recurrence(ranks: pd.DataFrame, stragglers: pd.DataFrame) -> pd.DataFrame:
    """Per rank: episodes (runs of consecutive flagged iterations), the longest, its share of all flagged cells,
    and whether its straggling is persistent (a run of 3 or more, or a fifth of the iterations) or
    intermittent; by rank."""
    out = pd.DataFrame(index=pd.Index(ranks["rank"], name="rank"))
    s = stragglers.sort_values(["rank", "iteration"])
    rank, it = s["rank"].to_numpy(), s["iteration"].to_numpy()
    new_run = np.r_[True, (rank[1:] != rank[:-1]) | (it[1:] != it[:-1] + 1)] if len(s) else np.zeros(0, bool)
    out["episodes"] = pd.Series(new_run.astype(np.int64), index=rank).groupby(level=0).sum()
    out["longest_run"] = longest_runs(stragglers)
    out = out.fillna(0).astype("int64")
    cells = ranks.set_index("rank")["straggler_iterations"]
    out["flagged_share"] = cells / max(int(cells.sum()), 1)
    persistent = (out["longest_run"] >= PERSISTENT_RUN) | (cells >= 0.2 * ranks.set_index("rank")["iterations"])
    out["recurrence"] = np.where(cells == 0, None, np.where(persistent, "persistent", "intermittent"))
    return out


def pattern(ranks: pd.DataFrame) -> str:
    """Whether one rank dominates the run's straggling, the culprit moves from rank to rank, or a few share it."""
    flagged = ranks[ranks["straggler_iterations"] > 0].sort_values("flagged_share", ascending=False)
    if flagged.empty:
        return "no rank straggles"
    top = flagged.iloc[0]
    if top["flagged_share"] > 0.6:
        return f"one rank dominates: rank {top['rank']} has {top['flagged_share']:.0%} of the flagged iterations"
    if len(flagged) >= 3 and top["flagged_share"] <= 1 / 3:
        return (f"the culprit moves: {len(flagged)} ranks share the {int(flagged['straggler_iterations'].sum())} "
                f"flagged iterations, none more than {int(flagged['straggler_iterations'].max())}")
    return "a few ranks share it: " + ", ".join(f"rank {r.rank} ({r.flagged_share:.0%})"
                                                   for r in flagged.head(5).itertuples())


def longest_runs(stragglers: pd.DataFrame) -> pd.Series:
    """Per rank, the most consecutive iterations it was flagged in."""
    if stragglers.empty:
        return pd.Series(dtype="int64")
    s = stragglers.sort_values(["rank", "iteration"])
    rank, it = s["rank"].to_numpy(), s["iteration"].to_numpy()
    new_run = np.r_[True, (rank[1:] != rank[:-1]) | (it[1:] != it[:-1] + 1)]
    run_id = np.cumsum(new_run)
    lengths = np.bincount(run_id)[run_id]
    return pd.Series(lengths, index=rank).groupby(level=0).max()


def incidental(ranks: pd.DataFrame, stragglers: pd.DataFrame) -> pd.Series:
    """Which flagged ranks were flagged only now and then: one-off delays, not a rank that holds the job back
    (fewer than 3 iterations, or a few scattered single iterations)."""
    n = ranks["straggler_iterations"]
    run = ranks["rank"].map(longest_runs(stragglers)).fillna(0)
    few = (n <= np.maximum(INCIDENTAL_CELLS, 0.05 * ranks["iterations"])) & (run <= 1)
    return (n > 0) & ((n < INCIDENTAL_CELLS) | few)


def verdicts(ranks: pd.DataFrame, stragglers: pd.DataFrame, top: int = 5) -> list[str]:
    """The answer first: one sentence per rank that holds the others back (the most flagged first), where,
    how much and in what; then one for the ranks flagged only incidentally. Names are as recorded: escape
    them where they are shown."""
    lines = []
    flagged = ranks[ranks["straggler_iterations"] > 0]
    odd = incidental(flagged, stragglers)
    for r in flagged[~odd].head(top).itertuples():
        cells = stragglers[stragglers["rank"] == r.rank]
        cause, side = r.top_cause, getattr(r, "top_cause_side", None)
        if cause is None:
            what = "busy time"
        elif cause in FIXED_CAUSES:
            what = FIXED_CAUSES[cause]
        else:
            what = f"{'GPU work launched in' if side == 'gpu' else 'host time in'} {cause}"
        recurring = getattr(r, "recurrence", None)
        if recurring == "intermittent":
            recurring = f"intermittent: {r.episodes} episodes"
        cost = (f"{r.recoverable_ns / 1e6:,.0f} ms recoverable, {r.recoverable_pct:.1f} % of the run"
                if hasattr(r, "recoverable_ns") else f"{cells['excess_ns'].sum() / 1e6:,.1f} ms of excess busy time")
        lines.append(f"rank {r.rank} holds the others back in {len(cells)} of {r.iterations} iterations "
                     f"({spans(cells['iteration'])}{', ' + recurring if isinstance(recurring, str) else ''}): "
                     f"{cost}; {what}, +{np.median(cells['excess_ns']) / 1e6:,.1f} ms per iteration"
                     + (f"; {waited}" if (waited := waited_text(r)) else ""))
    if odd.any():
        few = flagged[odd]
        lines.append("incidental: " + ", ".join(
            f"rank {r.rank} in {r.straggler_iterations} iteration{'s' if r.straggler_iterations > 1 else ''}"
            for r in few.head(8).itertuples()) + (", …" if len(few) > 8 else "")
            + " (one-off delays, not a rank that holds the job back)")
    return lines
