"""kernel_pace: how steadily each rank's iterations progress, and how far ranks drift apart.

With `--kernel NAME` an iteration is one launch of that kernel, as in Nsight Systems'
`cuda_gpu_kern_pace --name NAME`; otherwise iterations follow the shared rules and the pace is that of
the GPU work inside each iteration (or of the iteration itself when there is no GPU work).
Statistics are exact: quantiles over all rows, not approximations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import BadInputError
from ..gpu import gpu_ops
from ..intervals import split_into_windows
from ..iterations import closest_names, find_iterations

NEEDS = {"nvtx", "kernel", "memcpy", "memset"}


def needs_for(options: dict) -> set:
    """Launches of one named kernel need nothing but the kernel table."""
    return {"kernel"} if options.get("kernel") else NEEDS


def map_rank(rd, options: dict) -> dict:
    kernel = options.get("kernel")
    if kernel:
        rd.require("kernel", "kernel_pace --kernel")
        k = rd.kernels
        sel = k[k["name"] == kernel].sort_values("start_ns", kind="mergesort")
        if sel.empty:
            raise BadInputError(f"{rd.file}: no kernel named {kernel!r}; closest names: "
                                f"{closest_names(kernel, k['name'])}")
        start, end = sel["start_ns"].to_numpy(np.int64), sel["end_ns"].to_numpy(np.int64)
        delimiter = {"kind": "kernel", "name": kernel, "domain": None, "source": "--kernel"}
    else:
        it = find_iterations(rd.nvtx, rd.kernels, options.get("iteration"), options.get("iteration_kernel"),
                             rd.file)
        delimiter = it.delimiter.as_dict()
        start, end = it.start_ns.copy(), it.end_ns.copy()
        ops = gpu_ops(rd)
        if len(ops):
            ev, win, cs, ce = split_into_windows(ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy(), start, end)
            if len(win):
                span = pd.DataFrame({"w": win, "s": cs, "e": ce}).groupby("w").agg(s=("s", "min"), e=("e", "max"))
                idx = span.index.to_numpy()
                start[idx], end[idx] = span["s"].to_numpy(), span["e"].to_numpy()
    prev_end = np.concatenate([start[:1], end[:-1]])
    pace = pd.DataFrame({
        "iteration": np.arange(len(start), dtype=np.int64),
        "kernel": delimiter["name"],
        "start_ns": start,
        "end_ns": end,
        "duration_ns": end - start,
        "delta_ns": pd.array(start - prev_end, dtype="Int64"),
    })
    if len(pace):
        pace.loc[0, "delta_ns"] = pd.NA
    return {"pace": pace, "delimiter": delimiter, "stats": _stats(pace, -1)}


def _stats(df: pd.DataFrame, rank: int) -> dict:
    d = df["duration_ns"].to_numpy(dtype=np.int64)
    mean = float(d.mean()) if len(d) else np.nan
    std = float(d.std(ddof=1)) if len(d) > 1 else np.nan
    return {
        "rank": rank, "count": len(d), "mean_ns": mean, "median_ns": float(np.median(d)) if len(d) else np.nan,
        "min_ns": int(d.min()) if len(d) else None, "max_ns": int(d.max()) if len(d) else None,
        "std_ns": std, "cv": std / mean if len(d) > 1 and mean > 0 else np.nan,
        "p95_ns": float(np.quantile(d, 0.95)) if len(d) else np.nan,
    }


def reduce(per_rank: list[dict], options: dict) -> dict:
    pace = pd.concat([r["pace"].assign(rank=r["rank"], offset=r["offset_ns"]) for r in per_rank], ignore_index=True)
    pace["start_aligned_ns"] = pace["start_ns"] + pace["offset"]
    pace["lag_ns"] = pace["start_aligned_ns"] - pace.groupby("iteration")["start_aligned_ns"].transform("min")
    pace = pace[["rank", "iteration", "kernel", "start_ns", "end_ns", "start_aligned_ns", "duration_ns", "delta_ns",
                 "lag_ns"]].sort_values(["rank", "iteration"], kind="mergesort").reset_index(drop=True)
    # per-rank statistics come from the map step (computed where the rank's rows are); -1 is all ranks
    stats = sorted(({**r["stats"], "rank": int(r["rank"])} for r in per_rank), key=lambda d: d["rank"])
    stats.append(_stats(pace, -1))
    stats = pd.DataFrame(stats).astype({"rank": "int64", "count": "int64", "min_ns": "Int64", "max_ns": "Int64"})
    return {"pace": pace, "stats": stats}
