"""Peers in a parallel job: which ranks a rank is compared with, a pipeline stage slower than the others throughout,
and who waited for a straggler (straggler_heatmap's reduce, from collective_match's groups and collectives).

The stages of a pipeline do different work by design (the last one carries the loss and the output layer), so a
rank is compared only with the ranks of its own stage (its `stage`: its pipeline coordinate, whether NCCL's payloads,
the NCCL kernels or `--parallel` gave it). A stage whose ranks are busier than the other stages' in most iterations,
by more than the straggler threshold, is stage imbalance: its size is its median rank's busy time above the median of
the other stages' median ranks, per iteration. A straggler's cost is named by who waited for it: in each of its
flagged iterations, the waits of the collectives it arrived last at, per group kind (its tensor-parallel peers, its
pipeline neighbours, its data-parallel replicas).
"""

from __future__ import annotations

import numpy as np

from .lazy import pd
from .recipes import ms

STAGE_SHARE = 0.8  # of the compared iterations in which a stage must be the busier to be stage imbalance
WAITED = {"tp": "its TP peers", "pp": "its pipeline neighbours", "dp": "its DP replicas"}
WAITED_COLUMNS = [f"waited_{kind}_ns" for kind in WAITED]
# findings.parquet: what was found and its evidence, its cost per iteration (ns, % of the iteration) and in all, and
# what to do
FINDING_COLUMNS = ["kind", "stage", "ranks", "evidence", "cost_ns", "advice", "cost_pct", "cost_total_ns",
                   "iterations", "busier_iterations"]
FINDING_DTYPES = {"stage": "Int64", "cost_ns": "int64", "cost_pct": "float64", "cost_total_ns": "int64",
                  "iterations": "int64", "busier_iterations": "int64"}


def stages(groups: pd.DataFrame, ranks: np.ndarray) -> np.ndarray:
    """Each rank's pipeline stage (0 where it is in no pipeline group)."""
    return groups.set_index("rank")["pp"].reindex(np.asarray(ranks)).fillna(0).to_numpy(np.int64)


def cohorts(iteration: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """A code per (iteration, stage): the cells compared with one another. With one stage, the iteration itself."""
    width = int(stage.max()) + 1 if len(stage) else 1
    return np.asarray(iteration, np.int64) * width + stage


def peerless_note(groups: pd.DataFrame) -> list[str]:
    """What to say where no stage has two ranks: no rank has a peer to be compared with."""
    per_stage = groups.groupby("pp")["rank"].size()
    if len(per_stage) < 2 or per_stage.max() > 1:
        return []
    return [f"each of the {len(per_stage)} pipeline stages has one rank: no rank has a peer doing the same work, so "
            "none is flagged as a straggler; the stages are compared as stages (stage imbalance)"]


def stage_imbalance(iters: pd.DataFrame, compared: np.ndarray, groups: pd.DataFrame, threshold: float
                    ) -> pd.DataFrame:
    """findings.parquet's stage_imbalance rows: each stage whose median rank is busier than the median of the other
    stages' in at least STAGE_SHARE of the compared iterations, by more than `threshold` of the median iteration in
    the median such iteration. iters: iteration, stage, busy_ns, duration_ns per cell."""
    cells = iters.loc[compared]
    busy = cells.groupby(["iteration", "stage"])["busy_ns"].median().unstack("stage").dropna()  # every stage's
    if busy.shape[1] < 2 or not len(busy):
        return findings_table([])
    duration = float(cells.groupby("iteration")["duration_ns"].median().median())
    values = busy.to_numpy(float)
    rows = []
    for at, stage in enumerate(busy.columns):  # a few stages
        others = np.delete(values, at, axis=1)
        excess = values[:, at] - np.median(others, axis=1)
        busier = int((excess > 0).sum())
        if not len(excess) or busier < STAGE_SHARE * len(excess):
            continue
        size = float(np.median(excess))
        if size <= threshold * duration:
            continue
        ranks = sorted(int(r) for r in groups.loc[groups["pp"] == stage, "rank"])
        pct = 100.0 * size / max(duration, 1.0)
        evidence = (f"pipeline stage {stage} (ranks {_listed(ranks)}) is busier than the other stages throughout: "
                    f"+{ms(size)} per iteration ({pct:.0f} % of the iteration) in {busier} of {len(excess)} "
                    "iterations; stage imbalance, not a straggler")
        rows.append(("stage_imbalance", int(stage), ranks, evidence, int(round(size)),
                     "the layers are unevenly split across the stages: move layers off this stage", pct,
                     int(round(float(excess[excess > 0].sum()))), len(excess), busier))
    out = findings_table(rows)
    return out.sort_values("cost_ns", ascending=False, kind="stable").reset_index(drop=True)


def findings_table(rows: list) -> pd.DataFrame:
    """findings.parquet's rows (tuples or dicts of FINDING_COLUMNS) with its types."""
    return pd.DataFrame(rows, columns=FINDING_COLUMNS).astype(FINDING_DTYPES)


def sentence(finding) -> str:
    """A finding's evidence and advice as one sentence (a findings.parquet row)."""
    return f"{finding.evidence}: {finding.advice}"


def waited_for(collectives: pd.DataFrame, rank: np.ndarray, iteration: np.ndarray) -> pd.DataFrame:
    """Per (rank, iteration) asked: what its peers waited for it, per group kind (WAITED_COLUMNS): the waits of the
    collectives of that iteration at which it arrived last."""
    asked = pd.DataFrame({"rank": np.asarray(rank, np.int64), "iteration": np.asarray(iteration, np.int64)})
    c = collectives[(collectives["iteration"] >= 0) & collectives["group"].isin(list(WAITED))]
    waits = c.groupby(["last_rank", "iteration", "group"])["wait_ns"].sum().unstack("group", fill_value=0)
    waits = waits.reindex(columns=list(WAITED), fill_value=0)
    waits.columns = WAITED_COLUMNS
    waits.index = waits.index.set_names(["rank", "iteration"])
    out = asked.merge(waits.reset_index(), on=["rank", "iteration"], how="left")
    return out[WAITED_COLUMNS].fillna(0).astype("int64").set_index(asked.index)


def waited_text(row) -> str:
    """'its TP peers waited 3.0 ms, its pipeline neighbours 1.2 ms' from a row's WAITED_COLUMNS (totals)."""
    said = [(WAITED[k], getattr(row, f"waited_{k}_ns", 0) or 0) for k in WAITED]
    said = [(who, ns) for who, ns in said if ns > 0]
    if not said:
        return ""
    first, *rest = said
    return f"{first[0]} waited {ms(first[1])}" + "".join(f", {who} {ms(ns)}" for who, ns in rest)


def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (", …" if len(ranks) > 8 else "")
