"""kernel_pace: how steadily each rank's iterations progress, and how far ranks drift apart.

With `--kernel NAME` an iteration is one launch of that kernel, as in Nsight Systems'
`cuda_gpu_kern_pace --name NAME`; otherwise iterations follow the shared rules and the pace is that of
the GPU work inside each iteration (or of the iteration itself when there is no GPU work).
Statistics are exact: quantiles over all rows, not approximations.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from ..driver import fold_rank
from ..errors import BadInputError
from ..gpu import GPU_NEEDS
from ..inputs import arrow_of, numpy_of
from ..inputs.chunks import Stream
from ..intervals import split_into_windows
from ..iteration_scan import find_iterations, iterations_ahead, no_windows_text
from ..iterations import WARMUP_RULE, closest_names, iteration_error, warmup, warmup_option
from ..lazy import pd
from ..spill import RankedRows, output_schema, table_of
from . import Metric, Recipe, indented, iteration_options, ms, ms_cell

NEEDS = {"nvtx", "kernel", "memcpy", "memset"}


def needs_for(options: dict) -> set:
    """Launches of one named kernel need nothing but the kernel table."""
    return {"kernel"} if options.get("kernel") else NEEDS


def rows_for(options: dict) -> dict | None:
    """With --kernel, only that kernel's launches are read."""
    return {"kernel": [options["kernel"]]} if options.get("kernel") else None


def map_rank(rank_data, options: dict) -> dict:
    kernel = options.get("kernel")
    if kernel:
        rank_data.require("kernel", "kernel_pace --kernel")
        k = rank_data.frame("kernels")
        codes, words = k.codes("name")
        hit = np.flatnonzero(words[:-1] == kernel)
        if not len(hit):
            raise BadInputError(f"{rank_data.file}: no kernel named {kernel!r}; closest names: "
                                f"{closest_names(kernel, words[:-1])}")
        sel = np.flatnonzero(codes == hit[0])
        start, end = k.values("start_ns")[sel], k.values("end_ns")[sel]
        order = np.argsort(start, kind="stable")
        delimiter = {"kind": "kernel", "name": kernel, "domain": None, "source": "--kernel"}
        return _result(start[order], end[order], delimiter)
    # the pace of the GPU work inside each iteration: the fold a long capture goes through span by span, over the
    # rank's tables as one span
    folded = fold_rank(STREAM, rank_data, options)
    if folded is None:  # no iterations, and no GPU work to say so of
        raise iteration_error(rank_data.file, no_windows_text(options, True))
    return _result(folded["start_ns"], folded["end_ns"], folded["delimiter"])


def _result(start: np.ndarray, end: np.ndarray, delimiter: dict) -> dict:
    """Each iteration's start and end as an Arrow table, which a worker writes to a file of its own and the reduce
    reads a rank at a time."""
    times = pa.Table.from_arrays([arrow_of(start.astype(np.int64)), arrow_of(end.astype(np.int64))],
                                 names=["start_ns", "end_ns"])
    return {"times": times, "delimiter": delimiter}


def _prepare(ahead, options: dict) -> dict:
    """The fold's state before the GPU work: per process, its iterations (or the error of finding none), found from its
    NVTX ranges (or its kernels) read ahead, and, per iteration, the earliest start and latest end of its GPU work (none
    yet)."""
    windows, kernels_read, _ = iterations_ahead(ahead, options)
    found = {p: len(w.start_ns) for p, w in windows.items() if not isinstance(w, str)}
    return {"windows": windows, "kernels_read": kernels_read, "options": options,
            "low": {p: np.full(n, np.iinfo(np.int64).max) for p, n in found.items()},
            "high": {p: np.full(n, np.iinfo(np.int64).min) for p, n in found.items()}}


def _view(need: str, frame) -> pa.Table:
    return pa.table({c: arrow_of(frame.values(c)) for c in ("start_ns", "end_ns", "pid")})


def _fold(state: dict, span_start: int, span_end: int, chunk: dict) -> None:
    """A span's GPU work into each process's iterations: the earliest start and latest end of the work in each."""
    ops = [t for t in chunk.values() if t is not None and t.num_rows]
    if not ops:
        return
    ops = pa.concat_tables(ops)
    pid, start, end = (numpy_of(ops.column(c)) for c in ("pid", "start_ns", "end_ns"))
    for p in np.unique(pid).tolist():
        if p not in state["windows"]:
            state["windows"][p] = no_windows_text(state["options"], state["kernels_read"])
        it = state["windows"][p]
        if isinstance(it, str):
            continue
        on = pid == p
        _, win, clipped_start, clipped_end = split_into_windows(start[on], end[on], it.start_ns, it.end_ns)
        np.minimum.at(state["low"][p], win, clipped_start)
        np.maximum.at(state["high"][p], win, clipped_end)


def _finish(state: dict, names: list) -> dict:
    out = {}
    for p, it in state["windows"].items():
        if isinstance(it, str):
            out[p] = {"error": it}
            continue
        start, end = it.start_ns.copy(), it.end_ns.copy()
        worked = state["low"][p] <= state["high"][p]
        start[worked], end[worked] = state["low"][p][worked], state["high"][p][worked]
        out[p] = {"start_ns": start, "end_ns": end, "delimiter": it.delimiter.as_dict()}
    return out


# its spans read times and processes (and the kernels' devices, which give the rank's GPU)
STREAM = Stream(needs=dict.fromkeys(GPU_NEEDS, ["start", "end", "globalPid", "deviceId"]), view=_view, fold=_fold,
                finish=_finish, prepare=_prepare, ahead=("nvtx",))


def _stats(d: np.ndarray, rank: int) -> dict:
    d = d.astype(np.int64, copy=False)
    mean = float(d.mean()) if len(d) else np.nan
    std = float(d.std(ddof=1)) if len(d) > 1 else np.nan
    return {
        "rank": rank, "count": len(d), "mean_ns": mean, "median_ns": float(np.median(d)) if len(d) else np.nan,
        "min_ns": int(d.min()) if len(d) else None, "max_ns": int(d.max()) if len(d) else None,
        "std_ns": std, "cv": std / mean if len(d) > 1 and mean > 0 else np.nan,
        "p95_ns": float(np.quantile(d, 0.95)) if len(d) else np.nan,
    }


PACE_DTYPES = {"rank": "int64", "iteration": "int64", "kernel": "str", "start_ns": "int64", "end_ns": "int64",
               "start_aligned_ns": "int64", "duration_ns": "int64", "delta_ns": "Int64", "lag_ns": "int64",
               "is_warmup": "bool"}


def _times(r: dict) -> tuple[np.ndarray, np.ndarray]:
    """A rank's iteration starts and ends, from its map's `times` (read from the worker's file where it is one)."""
    start, end = (numpy_of(c) for c in table_of(r["times"]).columns)
    return start, end


def reduce(per_rank: list[dict], options: dict) -> dict:
    """What needs every rank (each iteration's earliest start, the run's median iteration) from the ranks' times read
    first; pace.parquet, a row per rank and iteration, then made a rank at a time as it is written."""
    per_rank = sorted(per_rank, key=lambda r: r["rank"])  # rows by rank, then iteration
    earliest = np.full(max((r["times"].num_rows for r in per_rank), default=0), np.iinfo(np.int64).max)
    durations = []
    for r in per_rank:
        start, end = _times(r)
        durations.append(end - start)
        aligned = start + np.int64(r["offset_ns"])
        np.minimum(earliest[:len(aligned)], aligned, out=earliest[:len(aligned)])
    every = np.concatenate(durations) if durations else np.zeros(0, np.int64)
    median = float(np.median(every)) if len(every) else None
    warm = [warmup(np.zeros(len(d), np.int64), np.arange(len(d)), d, median) for d in durations]

    def pace(rank: int, at: int) -> pa.Table:
        r, duration, is_warmup = per_rank[at], durations[at], warm[at]
        start, end = _times(r)
        aligned = start + np.int64(r["offset_ns"])
        delta = start - np.r_[np.int64(0), end[:-1]]
        return pa.table({"iteration": np.arange(len(start), dtype=np.int64),
                         "kernel": pa.repeat(pa.scalar(r["delimiter"]["name"], pa.large_string()), len(start)),
                         "start_ns": start, "end_ns": end, "start_aligned_ns": aligned, "duration_ns": duration,
                         "delta_ns": arrow_of(delta, valid=np.arange(len(start)) > 0),  # none before the first
                         "lag_ns": aligned - earliest[:len(start)], "is_warmup": is_warmup})

    # steadiness without the start-up, unless asked (--keep-warmup); -1 is all ranks
    keep = options.get("keep_warmup")
    stats = [{**_stats(d if keep else d[~w], int(r["rank"])), "warmup_iterations": int(w.sum())}
             for r, d, w in zip(per_rank, durations, warm, strict=True)]
    is_warmup = np.concatenate(warm) if warm else np.zeros(0, bool)
    stats.append({**_stats(every if keep else every[~is_warmup], -1), "warmup_iterations": int(is_warmup.sum())})
    stats = pd.DataFrame(stats).astype({"rank": "int64", "count": "int64", "min_ns": "Int64", "max_ns": "Int64",
                                        "warmup_iterations": "int64"})
    settings = {"warmup": {"rule": WARMUP_RULE, "left_out": not keep, "iterations": int(is_warmup.sum())}}
    rows = RankedRows(output_schema(PACE_DTYPES), [(int(r["rank"]), at) for at, r in enumerate(per_rank)], pace)
    return {"pace": rows, "stats": stats, "settings": settings}


def add_options(add, framework: bool = False) -> None:
    # under `nsys recipe kernel_pace`, --name is accepted too, like the built-in cuda_gpu_kern_pace
    flags = ("--kernel", "--name") if framework else ("--kernel",)
    add(*flags, dest="kernel", metavar="KERNEL", default=None,
        help="one iteration per launch of this kernel (its short name), as cuda_gpu_kern_pace --name")
    iteration_options(add)
    warmup_option(add)


def summary(out, top: int = 5) -> list[str]:
    stats = pd.read_parquet(out / "stats.parquet")
    table = pd.DataFrame({
        "rank": stats["rank"].map(lambda r: "all" if r == -1 else str(r)),
        "count": stats["count"],
        "median ms": stats["median_ns"].map(ms_cell),
        "p95 ms": stats["p95_ns"].map(ms_cell),
        "cv": stats["cv"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}"),
    })
    worst = table.iloc[:-1].assign(_cv=stats["cv"].iloc[:-1]).sort_values("_cv", ascending=False).head(top)
    rows = pd.concat([worst.drop(columns="_cv"), table.iloc[[-1]]])
    return [*indented("least steady ranks (by coefficient of variation):", rows.to_string(index=False)),
            *([said] if (said := warmup_said(out)) else [])]


def warmup_said(out) -> str:
    """How many warm-up iterations there were and whether the statistics leave them out ("" for none)."""
    stats = pd.read_parquet(out / "stats.parquet").set_index("rank")
    if "warmup_iterations" not in stats or not stats.loc[-1, "warmup_iterations"]:
        return ""
    per_rank = stats.drop(index=-1)["warmup_iterations"]
    counts = per_rank.value_counts()
    spread = (f"{counts.index[0]} on each rank" if len(counts) == 1 else
              f"{per_rank.min()} to {per_rank.max()} per rank")
    return (f"warm-up: {int(stats.loc[-1, 'warmup_iterations'])} iteration(s), {spread}, "
            + ("counted (--keep-warmup)" if _kept(out) else "left out of these statistics (--keep-warmup counts them)"))


def headline(out) -> str:
    s = pd.read_parquet(out / "stats.parquet").set_index("rank").loc[-1]
    warm = int(s["warmup_iterations"]) if "warmup_iterations" in s else 0
    return (f"median iteration {ms(s['median_ns'])}, p95 {ms(s['p95_ns'])}, cv {s['cv']:.2f}"
            + (f" ({warm} warm-up iteration(s) {'counted' if _kept(out) else 'left out'})" if warm else ""))


def _kept(out) -> bool:
    return not json.loads((out / "analysis.json").read_text()).get("warmup", {}).get("left_out", True)


def diff_metrics(ranks) -> pd.DataFrame | None:
    """The median iteration over all ranks of a run (a run without iterations has none)."""
    durations = []
    for rank_data in ranks:
        try:
            it = find_iterations(rank_data)
        except Exception:  # noqa: BLE001 - a run without iterations simply has no such metric
            continue
        durations.append(it.end_ns - it.start_ns)
    if not durations:
        return None
    return pd.DataFrame({"metric": "median_iteration_ns", "key": "all ranks",
                         "value": [float(np.median(np.concatenate(durations)))]})


RECIPE = Recipe(
    name="kernel_pace",
    display_name="Kernel pace",
    description="How steadily each rank's iterations (or launches of one kernel) progress, and the lag "
                "between ranks.",
    needs=frozenset(NEEDS),
    map_rank=map_rank,
    reduce=reduce,
    add_options=add_options,
    per_iteration=True,
    lazy_tables=True,  # each iteration's start and end, read a rank at a time
    needs_for=needs_for,
    rows_for=rows_for,
    summary=summary,
    headline=headline,
    figures="nsys_recipe_pack.plots.kernel_pace",
    stream=STREAM,
    diff_metrics=diff_metrics,
    diff_needs=frozenset(NEEDS),
    metrics=(Metric("median_iteration_ns", "median iteration", always_tracked=True),),
)
