"""pipeline_bubbles: how long each pipeline stage's GPU idles in each step while the pipeline fills, drains and waits
on neighbours, against what the schedule itself leaves idle.

A micro-batch pass is an NVTX range whose name says forward or backward (`forward`, `forward-compute`, `fwd`, ...;
not one that sends, receives or reduces); its GPU work is the kernels launched while it was open on the iteration's
thread. A pipeline (the ranks of one pp group, from NCCL's payloads, the NCCL kernels or `--parallel`) runs its
passes in each iteration between the first pass's start and the last pass's end on any of its stages: that is the
pipeline phase. A stage's bubble is the part of the phase its GPU spends on no pass: before its first pass (the
pipeline filling, `warmup_ns`), after its last (draining, `cooldown_ns`) and between them, waiting on a neighbour.
The SendRecv kernels of its pp group inside the phase are split into waiting for the peer and transfer (the peer's
kernel start to the end). The schedule is read from the order of the passes (1F1B: a stage runs p - stage forward
passes before its first backward, then alternates; interleaved 1F1B over v model chunks per stage: more forwards
first, as Megatron orders them; GPipe: every forward first), the micro-batches from the number of forward passes (v
per micro-batch), and the schedule's own bubble, (p - 1) / (v m + p - 1), is shown beside the measured one.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from .. import collective_match, parallel
from ..errors import NotApplicableError
from ..gpu import launched_ops
from ..inputs.frames import arrow_of
from ..intervals import overlay_lengths, union_segments_by_group
from ..iteration_scan import find_iterations
from ..iterations import range_arrays, steady_rows, warmup
from ..lazy import pd
from ..nvtx import innermost_of
from . import Metric, Recipe, indented, iteration_and_parallel_options, ms_cell, ranked_times

NEEDS = {"nvtx", "kernel", "runtime", "payload"}
FORWARD_RE = re.compile(r"forward|fwd", re.IGNORECASE)
BACKWARD_RE = re.compile(r"backward|bwd", re.IGNORECASE)
NOT_A_PASS_RE = re.compile(r"send|recv|reduce|gather|scatter|sync|comm|p2p|broadcast|all-?to-?all", re.IGNORECASE)
PASS_COLUMNS = ["iteration", "kind", "start_ns", "end_ns"]  # kind: 0 forward, 1 backward
BUBBLE_COLUMNS = ["rank", "pp_stage", "iteration", "microbatches", "schedule", "virtual_stages", "window_ns", "busy_ns",
                  "bubble_ns", "bubble_pct", "ideal_pct", "warmup_ns", "cooldown_ns", "p2p_wait_ns", "p2p_transfer_ns",
                  "is_warmup"]


def pass_kind(names) -> np.ndarray:
    """Per NVTX range name: 0 a forward pass, 1 a backward pass, -1 neither."""
    out = np.full(len(names), -1, np.int64)
    for i, name in enumerate(names):  # a rank's few distinct names
        if name is None or NOT_A_PASS_RE.search(str(name)):
            continue
        forward, backward = FORWARD_RE.search(str(name)), BACKWARD_RE.search(str(name))
        if forward and not backward:
            out[i] = 0
        elif backward and not forward:
            out[i] = 1
    return out


def map_rank(rank_data, options: dict) -> dict:
    """The rank's micro-batch passes (their GPU spans) and the union of their GPU work per iteration, with its NCCL
    kernels for the groups and the exchanges."""
    rank_data.require("kernel", "pipeline_bubbles")
    ranges = range_arrays(rank_data.frame("nvtx"))
    it = find_iterations(rank_data, options.get("iteration"), options.get("iteration_kernel"))
    kind = pass_kind(ranges.names[:-1]) if len(ranges) else np.zeros(0, np.int64)
    passes = np.flatnonzero((ranges.name >= 0) & (kind[np.maximum(ranges.name, 0)] >= 0)) if len(ranges) else \
        np.zeros(0, np.int64)
    if it.tid is not None:
        passes = passes[ranges.tid[passes] == it.tid]
    ops = launched_ops(rank_data)
    # the pass open on the iteration's thread when each op was launched (PyTorch's autograd thread has none of its own)
    inside = innermost_of(ranges.tid[passes], ranges.start_ns[passes], ranges.end_ns[passes],
                          np.full(len(ops.op), it.tid if it.tid is not None else -1, np.int64), ops.call_start_ns,
                          ops.call_end_ns) if len(passes) and len(ops.op) else np.zeros(len(ops.op), np.int64) - 1
    hit = inside >= 0
    start = np.full(len(passes), np.iinfo(np.int64).max)
    end = np.full(len(passes), np.iinfo(np.int64).min)
    np.minimum.at(start, inside[hit], ops.start_ns[hit])
    np.maximum.at(end, inside[hit], ops.end_ns[hit])
    used = np.flatnonzero(end >= start)  # the passes that launched GPU work
    at = passes[used]
    iteration = it.of(ranges.start_ns[at])
    ok = iteration >= 0
    table = {"iteration": iteration[ok], "kind": kind[ranges.name[at]][ok], "start_ns": start[used][ok],
             "end_ns": end[used][ok]}
    op_iteration = np.searchsorted(it.start_ns, ops.start_ns[hit], side="right") - 1
    busy = union_segments_by_group(op_iteration, ops.start_ns[hit], ops.end_ns[hit])
    return {"passes": pa.table({c: arrow_of(np.asarray(v, np.int64)) for c, v in table.items()}),
            "busy": pa.table({c: arrow_of(v) for c, v in zip(("iteration", "start_ns", "end_ns"), busy, strict=True)}),
            "delimiter": it.delimiter.as_dict(), **collective_match.nccl_kernels(rank_data, it)}


def reduce(per_rank: list[dict], options: dict) -> dict:
    matched = collective_match.match(per_rank, options)
    groups = matched.groups
    stages = int(groups["pp"].max()) + 1 if len(groups) and groups["pp"].notna().any() else 1
    if not parallel.is_parallel(groups) or stages < 2:
        raise NotApplicableError(
            f"pipeline_bubbles does not apply: the {len(per_rank)} rank(s) form no pipeline (no pipeline-parallel "
            "group in NCCL's payloads or kernels; pass --parallel tp=T,pp=P,dp=D where the trace does not show it)")
    passes = ranked_times(per_rank, "passes", matched.shifts(per_rank))
    if passes.empty:
        raise NotApplicableError("pipeline_bubbles does not apply: no NVTX range names a forward or backward pass "
                                 "(`forward`, `backward-compute`, ...) with GPU work launched inside it")
    stage_of = groups.set_index("rank")["pp"].astype("int64")
    pipeline_of = groups.set_index("rank")["pp_group"].map(lambda m: min(m) if len(m) else -1)
    passes["pipeline"] = passes["rank"].map(pipeline_of)
    phase = passes.groupby(["pipeline", "iteration"]).agg(phase_start=("start_ns", "min"), phase_end=("end_ns", "max"))
    cells = passes.groupby(["rank", "iteration"]).agg(first=("start_ns", "min"), last=("end_ns", "max"),
                                                      microbatches=("kind", lambda k: int((k == 0).sum())))
    cells = cells.reset_index()
    cells["pipeline"] = cells["rank"].map(pipeline_of)
    cells = cells.join(phase, on=["pipeline", "iteration"])
    cells["pp_stage"] = cells["rank"].map(stage_of)
    cells["window_ns"] = cells["phase_end"] - cells["phase_start"]
    cells["busy_ns"] = _busy(ranked_times(per_rank, "busy", matched.shifts(per_rank)), cells)
    cells["bubble_ns"] = (cells["window_ns"] - cells["busy_ns"]).clip(lower=0)
    cells["bubble_pct"] = 100.0 * cells["bubble_ns"] / cells["window_ns"].where(cells["window_ns"] > 0)
    cells["warmup_ns"] = cells["first"] - cells["phase_start"]
    cells["cooldown_ns"] = cells["phase_end"] - cells["last"]
    cells["schedule"], cells["virtual_stages"] = _schedules(passes, cells, stages)
    # (p - 1) / (v m + p - 1): v m is the forward passes a stage runs
    forwards = cells["microbatches"].astype(float)
    cells["ideal_pct"] = np.where(cells["schedule"] != "other", 100.0 * (stages - 1) / (forwards + stages - 1),
                                  np.nan)
    cells["microbatches"] = cells["microbatches"] // cells["virtual_stages"].fillna(1).astype("int64")
    wait, transfer = _p2p(matched, cells)
    cells["p2p_wait_ns"], cells["p2p_transfer_ns"] = wait, transfer
    cells["is_warmup"] = warmup(cells["rank"].to_numpy(), cells["iteration"].to_numpy(),
                                cells["window_ns"].to_numpy())
    bubbles = cells[BUBBLE_COLUMNS].sort_values(["rank", "iteration"], kind="stable").reset_index(drop=True)
    bubbles["microbatches"] = bubbles["microbatches"].astype("int64")
    steady = steady_rows(bubbles)
    per_stage = steady.groupby("pp_stage").agg(ranks=("rank", lambda r: sorted({int(x) for x in r})),
                                               busy_ns=("busy_ns", "median"), bubble_pct=("bubble_pct", "median"))
    per_stage["busy_ns"] = per_stage["busy_ns"].round().astype("int64")
    typical = float(per_stage["busy_ns"].median())
    per_stage["busy_vs_median_pct"] = 100.0 * (per_stage["busy_ns"] - typical) / max(typical, 1.0)
    schedule = steady["schedule"].mode().iat[0]
    microbatches = int(steady["microbatches"].mode().iat[0])
    chunks = steady.loc[steady["schedule"] == schedule, "virtual_stages"]
    virtual = int(chunks.mode().iat[0]) if chunks.notna().any() else None
    passes_out = passes.assign(pp_stage=passes["rank"].map(stage_of),
                               kind=np.where(passes["kind"] == 0, "forward", "backward"))
    passes_out = passes_out.rename(columns={"start_ns": "start_aligned_ns", "end_ns": "end_aligned_ns"})[
        ["rank", "pp_stage", "iteration", "kind", "start_aligned_ns", "end_aligned_ns"]]
    ideal = 100.0 * (stages - 1) / (virtual * microbatches + stages - 1) if virtual is not None else None
    found = findings(float(steady["bubble_pct"].median()), ideal, per_stage.reset_index(), stages, microbatches,
                     virtual)
    return {"bubbles": bubbles, "stages": per_stage.reset_index(), "passes": passes_out, "groups": groups,
            "findings": found,
            "settings": {"groups_source": matched.source, "notes": matched.notes, "stages": stages,
                         "schedule": schedule, "virtual_stages": virtual, "microbatches": microbatches,
                         "ideal_pct": ideal}}


ABOVE_IDEAL_POINTS = 5.0  # a measured bubble this far above the schedule's own is the stages waiting on each other
HIGH_IDEAL_PCT = 20.0  # a schedule that idles this much by itself is worth changing
UNEVEN_STAGE_PCT = 10.0  # a stage computing this much more than the median stage is stage imbalance


def findings(bubble_pct: float, ideal_pct: float | None, stages: pd.DataFrame, p: int, m: int,
             virtual: int | None = 1) -> pd.DataFrame:
    """findings.parquet: kind, evidence, advice (Megatron-LM flags and NeMo's names), only where the evidence holds."""
    rows = []
    if ideal_pct is not None and ideal_pct >= HIGH_IDEAL_PCT:
        chunks = f", {virtual} model chunks per stage" if virtual and virtual > 1 else ""
        formula = "(p - 1) / (v m + p - 1)" if virtual and virtual > 1 else "(p - 1) / (m + p - 1)"
        more_chunks = "more" if virtual and virtual > 1 else "interleaved"
        rows.append(("high_schedule_bubble", f"the schedule itself idles {ideal_pct:.1f} % of the pipeline phase "
                     f"({formula} with {p} stages and {m} micro-batches{chunks})",
                     "more micro-batches per step (a larger global batch or smaller micro-batches: NeMo "
                     f"global_batch_size, micro_batch_size) or {more_chunks} virtual pipeline stages "
                     "(--num-layers-per-virtual-pipeline-stage; NeMo virtual_pipeline_model_parallel_size) shrink it"))
    if ideal_pct is not None and bubble_pct - ideal_pct > ABOVE_IDEAL_POINTS:
        rows.append(("bubble_above_schedule", f"the pipeline idles {bubble_pct:.1f} % of its phase, "
                     f"{bubble_pct - ideal_pct:.1f} points above its schedule's {ideal_pct:.1f} %",
                     "the stages wait on each other beyond the schedule: even out their work (stage imbalance) and "
                     "look for slow ranks (straggler_heatmap, critical_path)"))
    for row in stages[stages["busy_vs_median_pct"] > UNEVEN_STAGE_PCT].itertuples():
        rows.append(("stage_imbalance", f"stage {int(row.pp_stage)} computes {row.busy_vs_median_pct:.0f} % more per "
                     f"step than the median stage ({row.busy_ns / 1e6:,.1f} ms)",
                     "move layers off this stage: --decoder-first-pipeline-num-layers or "
                     "--decoder-last-pipeline-num-layers (NeMo num_layers_in_first_pipeline_stage, "
                     "num_layers_in_last_pipeline_stage) for the first and last stages"))
    return pd.DataFrame(rows, columns=["kind", "evidence", "advice"])


def _busy(busy: pd.DataFrame, cells: pd.DataFrame) -> np.ndarray:
    """Per cell, the time inside its pipeline phase its GPU ran pass work (the union of it, from the map)."""
    key = pd.MultiIndex.from_frame(cells[["rank", "iteration"]])
    at = pd.Series(np.arange(len(cells)), index=key)
    cell = at.reindex(pd.MultiIndex.from_frame(busy[["rank", "iteration"]].astype("int64"))).to_numpy()
    kept = ~np.isnan(cell)
    cell = cell[kept].astype(np.int64)
    mine = (cell, busy["start_ns"].to_numpy(np.int64)[kept], busy["end_ns"].to_numpy(np.int64)[kept])
    windows = union_segments_by_group(np.arange(len(cells)), cells["phase_start"].to_numpy(np.int64),
                                      cells["phase_end"].to_numpy(np.int64))
    return overlay_lengths(union_segments_by_group(*mine), windows, len(cells), both=True)


def _schedules(passes: pd.DataFrame, cells: pd.DataFrame, stages: int) -> tuple[np.ndarray, object]:
    """Per cell, the schedule its pipeline's passes show in that iteration, and the model chunks each stage holds.
    A stage of 1F1B runs p - stage forward passes before its first backward (or all of them where there are no
    more), then forward and backward in turn; of Megatron's interleaved 1F1B over v chunks, 2 (p - stage - 1) +
    (v - 1) p + 1 forwards first (or all), then in turn, v m forward passes in all; of GPipe every forward first. The
    first of these that every stage of the pipeline fits is its schedule, else other (chunks unknown); a stage that
    runs every forward first fits any."""
    p = passes.sort_values(["rank", "iteration", "start_ns"], kind="stable")
    g = p.groupby(["rank", "iteration"])["kind"]
    before_first_backward = g.agg(lambda k: int(np.argmax(k.to_numpy() == 1)) if (k == 1).any() else len(k))
    alternates = g.agg(lambda k: _alternates(k.to_numpy()))
    key = pd.MultiIndex.from_frame(cells[["rank", "iteration"]])
    lead, turns = before_first_backward.reindex(key).to_numpy(), alternates.reindex(key).to_numpy().astype(bool)
    forwards = cells["microbatches"].to_numpy()
    stage = cells["pp_stage"].to_numpy()
    all_first = lead == forwards
    chunks = (lead - 1 - 2 * (stages - stage - 1)) // stages + 1  # what an interleaved stage's lead says
    said = turns & ~all_first & (chunks >= 2) & (lead == 2 * (stages - stage - 1) + (chunks - 1) * stages + 1)
    fit = pd.DataFrame({"pipeline": cells["pipeline"] if "pipeline" in cells else cells["rank"],
                        "iteration": cells["iteration"], "one_f_one_b": (lead == np.minimum(stages - stage, forwards))
                        & turns, "all_first": all_first, "fits": said | all_first,
                        "chunks": np.where(said, chunks, np.nan), "forwards": forwards})
    per = fit.groupby(["pipeline", "iteration"]).agg(one_f_one_b=("one_f_one_b", "all"), gpipe=("all_first", "all"),
                                                     fits=("fits", "all"), low=("chunks", "min"),
                                                     high=("chunks", "max"))
    v = per["low"].fillna(0).astype(np.int64)
    per["interleaved"] = per["fits"] & (v >= 2) & (per["low"] == per["high"])
    at = pd.MultiIndex.from_frame(fit[["pipeline", "iteration"]])
    pipe = per.reindex(at)
    v_cell = v.reindex(at).to_numpy()
    interleaved = pipe["interleaved"].to_numpy() & (forwards % np.maximum(v_cell, 1) == 0)
    # a pipeline is interleaved only if every stage's passes divide into its chunks
    interleaved = pd.Series(interleaved).groupby([fit["pipeline"].to_numpy(), fit["iteration"].to_numpy()]
                                                 ).transform("all").to_numpy()
    one_f_one_b = pipe["one_f_one_b"].to_numpy()
    out = np.where(one_f_one_b, "1F1B", np.where(interleaved, "interleaved 1F1B",
                                                 np.where(pipe["gpipe"].to_numpy(), "GPipe", "other")))
    virtual = pd.array(np.where(interleaved & ~one_f_one_b, v_cell, 1), dtype="Int64")
    virtual[out == "other"] = pd.NA
    return out.astype(object), virtual


def _alternates(kind: np.ndarray) -> bool:
    """After the first backward, forward and backward passes take turns until the forwards run out."""
    rest = kind[int(np.argmax(kind == 1)):] if (kind == 1).any() else kind[:0]
    forwards = np.flatnonzero(rest == 0)
    return bool(len(forwards) == 0 or (np.diff(np.r_[-1, forwards]) == 2).all())


def _p2p(matched, cells: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, the time inside its phase its pipeline exchanges (SendRecv kernels of its pp group) spent waiting for
    the peer (a kernel's start to the pair's last start), and the rest of their time (transfer): unions, as a send
    and a receive may wait at once."""
    k = matched.kernels
    if k is None or not len(k):
        return np.zeros(len(cells), np.int64), np.zeros(len(cells), np.int64)
    k = k[(k["group"] == "pp") & (k["iteration"] >= 0)]
    key = pd.MultiIndex.from_frame(cells[["rank", "iteration"]])
    cell = pd.Series(np.arange(len(cells)), index=key).reindex(
        pd.MultiIndex.from_frame(k[["rank", "iteration"]].astype("int64"))).to_numpy()
    kept = ~np.isnan(cell)
    k, cell = k[kept], cell[kept].astype(np.int64)
    last = k.groupby("instance")["start_aligned_ns"].transform("max").where(k["instance"] >= 0, k["start_aligned_ns"])
    lo, hi = cells["phase_start"].to_numpy()[cell], cells["phase_end"].to_numpy()[cell]
    start = np.clip(k["start_aligned_ns"].to_numpy(np.int64), lo, hi)
    until = np.clip(last.to_numpy(np.int64), start, hi)
    end = np.clip(k["end_aligned_ns"].to_numpy(np.int64), start, hi)
    waiting = union_segments_by_group(cell, start, until)
    exchanging = union_segments_by_group(cell, start, end)
    wait = np.zeros(len(cells), np.int64)
    np.add.at(wait, waiting[0], waiting[2] - waiting[1])
    return wait, overlay_lengths(exchanging, waiting, len(cells), both=False)


def summary(out) -> list[str]:
    import json

    settings = json.loads((out / "analysis.json").read_text())
    stages = pd.read_parquet(out / "stages.parquet")
    table = pd.DataFrame({"stage": stages["pp_stage"], "ranks": stages["ranks"].map(lambda r: ", ".join(map(str, r))),
                          "busy ms": stages["busy_ns"].map(ms_cell),
                          "vs median stage %": stages["busy_vs_median_pct"].map(lambda v: f"{v:+.1f}"),
                          "bubble %": stages["bubble_pct"].map(lambda v: f"{v:.1f}")})
    found = pd.read_parquet(out / "findings.parquet") if (out / "findings.parquet").exists() else pd.DataFrame()
    return [headline(out), f"schedule {_schedule_words(settings)}, {settings.get('microbatches')} micro-batches, "
            f"{settings.get('stages')} stages"] + indented("per stage (median of the steady iterations):",
                                                         table.to_string(index=False)) + [
        f"{f.evidence}: {f.advice}" for f in found.itertuples()]


def headline(out) -> str:
    import json

    settings = json.loads((out / "analysis.json").read_text())
    b = pd.read_parquet(out / "bubbles.parquet")
    steady = steady_rows(b)
    worst = steady.groupby("pp_stage")["bubble_pct"].median()
    ideal = settings.get("ideal_pct")
    return (f"pipeline bubble {steady['bubble_pct'].median():.1f} % of the pipeline phase "
            f"({_schedule_words(settings)}, "
            f"{settings.get('stages')} stages, {settings.get('microbatches')} micro-batches"
            + (f": the schedule's own {ideal:.1f} %" if ideal is not None else "")
            + f"); most at stage {int(worst.idxmax())} ({worst.max():.1f} %)")


def _schedule_words(settings: dict) -> str:
    chunks = settings.get("virtual_stages") or 1
    return f"{settings.get('schedule')}" + (f" over {chunks} model chunks per stage" if chunks > 1 else "")


def diff_metrics(ranks) -> pd.DataFrame | None:
    """The median bubble over a run's steady iterations (a run with no pipeline has none)."""
    from ..runner import analysed

    tables = analysed("pipeline_bubbles", ranks)
    if tables is None:
        return None
    b = tables["bubbles"]
    steady = steady_rows(b)
    return pd.DataFrame({"metric": "bubble_pct", "key": "median", "value": [float(steady["bubble_pct"].median())]})


RECIPE = Recipe(
    name="pipeline_bubbles",
    display_name="Pipeline bubbles",
    description="How long each pipeline stage idles per step (filling, draining, waiting on neighbours) against the "
                "schedule's own bubble, with the exchanges split into waiting and transfer.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=iteration_and_parallel_options,
    per_iteration=True,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.pipeline_bubbles",
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("bubble_pct", "pipeline bubble", share=True),),
)
