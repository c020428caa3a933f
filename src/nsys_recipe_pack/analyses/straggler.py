"""Straggler heatmap: which rank makes the others wait, in which iterations, and why.

A straggler arrives last at the iteration's collective, so it *waits least*; the ranks that wait for
it are victims. So the measure is busy time (iteration duration minus time spent in collectives and
sync points), compared with the other ranks' busy time in the same iteration. A cell is flagged when
the excess is large relative to the iteration (`threshold`) and relative to the noise, estimated
robustly over the whole run, either for busy time as a whole or for one component (an NVTX child
range, GPU compute, memcpy, host sync) that accounts for at least half of the excess (`sigma`).
"""

from __future__ import annotations

import numpy as np

from ..gpu import gpu_intervals
from ..intervals import split_into_windows, union_length
from ..iterations import DEFAULT_SYNC_RE, NCCL_KERNEL_RE, closed_ranges, find_iterations, sync_points
from ..lazy import pd

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime", "mpi"}
DEFAULT_THRESHOLD = 0.10
DEFAULT_SIGMA = 4.0
MAD_TO_SIGMA = 1.4826
Q90_TO_SIGMA = 1.645  # the 90th percentile of |N(0, 1)|
SYNC_API_RE = r"Synchronize|cudaStreamWaitEvent"
EXPLAINS = 0.5  # a component must account for this share of the excess to flag on its own noise
COMPONENT_BUSY_SIGMA = 0.75  # ... and then the busy excess needs only this fraction of sigma


def _windowed_union(win_start, win_end, starts, ends, n) -> np.ndarray:
    ev, win, cs, ce = split_into_windows(starts, ends, win_start, win_end)
    out = np.zeros(n, np.int64)
    if len(ev):
        u = union_length(win, cs, ce)
        out[u.index.to_numpy()] = u.to_numpy()
    return out


def map_rank(rd, options: dict) -> dict:
    """Per-iteration busy/wait/GPU time and per-component times for one rank. No cross-rank logic."""
    it = find_iterations(rd.nvtx, rd.kernels, options.get("iteration"), options.get("iteration_kernel"),
                         rd.file)
    ws, we = it.start_ns, it.end_ns
    n = len(ws)
    sync = sync_points(rd, options.get("sync"))
    wait = _windowed_union(ws, we, sync["start_ns"].to_numpy(), sync["end_ns"].to_numpy(), n)

    # arrival: the start of the last collective that begins inside the iteration
    arrival = np.full(n, -1, np.int64)
    if len(sync):
        s = np.sort(sync["start_ns"].to_numpy())
        idx = np.searchsorted(s, we, side="left") - 1
        ok = idx >= 0
        ok[ok] = s[idx[ok]] >= ws[ok]
        arrival[ok] = s[idx[ok]]

    components = []  # (iteration, component, ns)
    gpu_busy = None
    if rd.has_cuda:
        op_start, op_end = gpu_intervals(rd)
        gpu_busy = _windowed_union(ws, we, op_start, op_end, n) if len(op_start) else np.zeros(n, np.int64)
        if rd.kernels is not None and len(rd.kernels):
            comp = rd.kernels[~rd.kernels["name"].str.contains(NCCL_KERNEL_RE, na=False)]
            components.append(("gpu_compute", _windowed_union(ws, we, comp["start_ns"].to_numpy(),
                                                              comp["end_ns"].to_numpy(), n)))
        if rd.memcpy is not None and len(rd.memcpy):
            components.append(("memcpy", _windowed_union(ws, we, rd.memcpy["start_ns"].to_numpy(),
                                                         rd.memcpy["end_ns"].to_numpy(), n)))
        if rd.runtime is not None and len(rd.runtime):
            rt = rd.runtime[rd.runtime["name"].str.contains(SYNC_API_RE, na=False)]
            components.append(("sync", _windowed_union(ws, we, rt["start_ns"].to_numpy(),
                                                       rt["end_ns"].to_numpy(), n)))

    child_rows = pd.DataFrame(columns=["iteration", "component", "ns"])
    if it.delimiter.kind == "nvtx":
        ranges = closed_ranges(rd.nvtx)
        ranges = ranges[ranges["tid"] == it.tid]
        # ranges strictly inside an iteration (not the iteration range itself)
        idx = np.searchsorted(ws, ranges["start_ns"].to_numpy(), side="right") - 1
        ok = idx >= 0
        inside = np.zeros(len(ranges), bool)
        inside[ok] = ranges["end_ns"].to_numpy()[ok] <= we[idx[ok]]
        is_delim = np.isin(ranges["start_ns"].to_numpy(), ws) & (ranges["name"].to_numpy() == it.delimiter.name)
        kids = ranges[inside & ~is_delim].assign(iteration=idx[inside & ~is_delim])
        if len(kids):
            kids = kids.sort_values(["iteration", "start_ns", "end_ns"], ascending=[True, True, False],
                                    kind="mergesort")
            reach = kids.groupby("iteration", sort=False)["end_ns"].cummax()
            prev = reach.groupby(kids["iteration"], sort=False).shift(1)
            top = kids[prev.isna() | (kids["start_ns"] >= prev)]
            child_rows = (top.assign(ns=top["end_ns"] - top["start_ns"])
                          .groupby(["iteration", "name"], as_index=False)["ns"].sum()
                          .rename(columns={"name": "component"}))
            covered = pd.concat([top[["start_ns", "end_ns"]], sync[["start_ns", "end_ns"]]], ignore_index=True)
            cov = _windowed_union(ws, we, covered["start_ns"].to_numpy(), covered["end_ns"].to_numpy(), n)
            components.append(("host_gap", (we - ws) - cov))

    comp_frames = [child_rows] + [pd.DataFrame({"iteration": np.arange(n), "component": name, "ns": vals})
                                  for name, vals in components]
    comps = pd.concat([c for c in comp_frames if len(c)], ignore_index=True) if any(
        len(c) for c in comp_frames) else pd.DataFrame(columns=["iteration", "component", "ns"])

    iters = pd.DataFrame({
        "iteration": np.arange(n, dtype=np.int64),
        "start_ns": ws,
        "end_ns": we,
        "duration_ns": we - ws,
        "wait_ns": wait,
        "busy_ns": (we - ws) - wait,
        "gpu_busy_ns": pd.array(gpu_busy if gpu_busy is not None else [None] * n, dtype="Int64"),
        "arrival_ns": pd.array(np.where(arrival >= 0, arrival, 0), dtype="Int64"),
    })
    iters.loc[arrival < 0, "arrival_ns"] = pd.NA
    return {"iterations": iters, "components": comps.astype({"iteration": "int64", "ns": "int64"}),
            "delimiter": it.delimiter.as_dict()}


def _robust_scale(x: pd.Series) -> float:
    x = x.dropna()
    if x.empty:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


def _tail_scale(x: pd.Series) -> float:
    """A noise scale that also respects heavy tails: the MAD scale, or the 90th percentile of the absolute
    deviation read as a normal quantile, whichever is larger. On a contended CPU a forward pass's time
    is heavy-tailed, and the MAD alone would call its ordinary slow iterations outliers."""
    x = x.dropna()
    if x.empty:
        return 0.0
    dev = np.abs(x - np.median(x))
    return max(float(MAD_TO_SIGMA * np.median(dev)), float(np.quantile(dev, 0.90) / Q90_TO_SIGMA))


def reduce(per_rank: list[dict], options: dict) -> dict:
    """Cross-rank comparison. per_rank items: the map output plus rank and offset_ns (clock alignment)."""
    threshold = float(options.get("threshold", DEFAULT_THRESHOLD))
    sigma = float(options.get("sigma", DEFAULT_SIGMA))
    sync_names = set(options.get("sync") or [])
    iters = pd.concat([r["iterations"].assign(rank=r["rank"], offset=r["offset_ns"]) for r in per_rank],
                      ignore_index=True)
    comps = pd.concat([r["components"].assign(rank=r["rank"]) for r in per_rank], ignore_index=True)

    iters["start_aligned_ns"] = iters["start_ns"] + iters["offset"]
    arrival_aligned = iters["arrival_ns"] + iters["offset"]
    iters["arrival_skew_ns"] = (arrival_aligned - arrival_aligned.groupby(iters["iteration"]).transform("min"))
    iters["arrival_skew_ns"] = iters["arrival_skew_ns"].astype("Int64")

    med_busy = iters.groupby("iteration")["busy_ns"].transform("median")
    iters["excess_ns"] = (iters["busy_ns"] - med_busy).round().astype("int64")
    iters["score"] = np.where(med_busy > 0, iters["busy_ns"] / med_busy.where(med_busy > 0, 1), 1.0)
    typical = float(np.median(med_busy)) if len(med_busy) else 0.0
    floor = max(1000.0, 0.005 * typical)
    busy_scale = max(_robust_scale(iters["excess_ns"]), floor)
    z_busy = iters["excess_ns"] / busy_scale

    key = ["rank", "iteration"]
    cells = iters[key]
    if len(comps):
        wide = comps.pivot_table(index=key, columns="component", values="ns", aggfunc="sum", fill_value=0)
        wide = wide.reindex(pd.MultiIndex.from_frame(cells), fill_value=0)
        comp_names = [c for c in wide.columns
                      if not (DEFAULT_SYNC_RE.search(str(c)) or c in sync_names)]
        wide = wide[comp_names].astype("float64")
        med = wide.groupby(level="iteration").transform("median")
        comp_excess = wide - med
        comp_floor = max(1000.0, 0.001 * typical)
        scales = comp_excess.apply(_tail_scale).clip(lower=comp_floor)
        comp_z = comp_excess / scales
        excess_vals = iters["excess_ns"].to_numpy(dtype=float)[:, None]
        explains = (comp_excess.to_numpy() >= EXPLAINS * excess_vals) & (comp_z.to_numpy() > sigma)
        noise_ok = explains.any(axis=1)
        ce = comp_excess.to_numpy()
        best = ce.argmax(axis=1) if len(comp_names) else np.zeros(len(cells), int)
        best_val = ce[np.arange(len(cells)), best] if len(comp_names) else np.zeros(len(cells))
        cause = np.where(best_val > 0, np.asarray(comp_names, dtype=object)[best] if comp_names else None, None)
    else:
        noise_ok = np.zeros(len(cells), bool)
        cause = np.full(len(cells), None, dtype=object)
    iters["cause"] = pd.Series(cause, index=iters.index, dtype=object)
    iters["noise_z"] = z_busy.astype("float64")
    med_duration = iters.groupby("iteration")["duration_ns"].transform("median")
    iters["is_straggler"] = (iters["excess_ns"] > threshold * med_duration) & (
        (z_busy > sigma) | (noise_ok & (z_busy > COMPONENT_BUSY_SIGMA * sigma)))
    n_ranks = iters.groupby("iteration")["rank"].transform("nunique")
    iters.loc[n_ranks < 2, "is_straggler"] = False

    cols = ["rank", "iteration", "start_ns", "start_aligned_ns", "duration_ns", "wait_ns", "busy_ns",
            "gpu_busy_ns", "arrival_skew_ns", "score", "is_straggler", "cause", "excess_ns", "noise_z"]
    iterations = iters[cols].sort_values(key, kind="mergesort").reset_index(drop=True)
    for c in ["rank", "iteration", "start_ns", "start_aligned_ns", "duration_ns", "wait_ns", "busy_ns",
              "excess_ns"]:
        iterations[c] = iterations[c].astype("int64")
    iterations["gpu_busy_ns"] = iterations["gpu_busy_ns"].astype("Int64")
    iterations["is_straggler"] = iterations["is_straggler"].astype(bool)

    stragglers = iterations[iterations["is_straggler"]].reset_index(drop=True)
    g = iterations.groupby("rank")
    ranks = pd.DataFrame({
        "iterations": g.size(),
        "straggler_iterations": g["is_straggler"].sum().astype("int64"),
        "median_score": g["score"].median(),
        "worst_score": g["score"].max(),
    })
    flagged = stragglers.groupby("rank")
    ranks["top_cause"] = flagged["cause"].agg(lambda s: s.value_counts().index[0] if s.notna().any() else None)
    ranks["excess_total_ns"] = flagged["excess_ns"].sum().reindex(ranks.index).fillna(0).astype("int64")
    ranks["top_cause"] = ranks["top_cause"].astype(object).where(ranks["top_cause"].notna(), None)
    ranks = ranks.reset_index().sort_values(
        ["straggler_iterations", "excess_total_ns", "median_score"], ascending=False, kind="mergesort"
    ).reset_index(drop=True)
    settings = {"threshold": threshold, "sigma": sigma, "busy_noise_ns": busy_scale}
    return {"iterations": iterations, "ranks": ranks, "stragglers": stragglers, "settings": settings}
