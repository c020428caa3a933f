"""Iteration delimiters and sync points, shared by every recipe (SPEC: "Iteration", "Collectives")."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import numpy as np

from .errors import BadInputError
from .lazy import pd

MIN_REPEATS = 5
DEFAULT_SYNC_RE = re.compile(r"allreduce|all_reduce|allgather|all_gather|reduce_scatter|reducescatter|barrier",
                             re.IGNORECASE)
NCCL_KERNEL_RE = re.compile(r"^(?:ncclKernel|ncclDevKernel)")


@dataclass(frozen=True)
class Delimiter:
    kind: str  # "nvtx" or "kernel"
    name: str
    domain: str | None
    source: str  # "--iteration", "--iteration-kernel" or "auto"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "domain": self.domain, "source": self.source}


@dataclass
class Iterations:
    delimiter: Delimiter
    start_ns: np.ndarray
    end_ns: np.ndarray
    tid: int | None  # thread of the NVTX delimiter


def closed_ranges(nvtx: pd.DataFrame | None) -> pd.DataFrame:
    if nvtx is None or nvtx.empty:
        return pd.DataFrame(columns=["start_ns", "end_ns", "name", "domain", "tid", "pid"])
    r = nvtx[nvtx["event_type"].isin([59, 60]) & nvtx["end_ns"].notna()]
    r = r[r["end_ns"] >= r["start_ns"]].copy()
    r["end_ns"] = r["end_ns"].astype("int64")
    return r


def closed_range_mask(nvtx) -> np.ndarray:
    """Which rows of a loader Frame of NVTX events are the ranges `closed_ranges` keeps, without pandas."""
    start, end = nvtx.values("start_ns"), nvtx.values("end_ns")
    return np.isin(nvtx.values("event_type"), [59, 60]) & ~nvtx.is_null("end_ns") & (end >= start)


def parse_name_domain(text: str) -> tuple[str, str | None]:
    name, sep, domain = text.rpartition("@")
    return (name, domain) if sep and name else (text, None)


def closest_names(wanted: str, names, n: int = 5) -> str:
    pool = sorted({str(x) for x in names if str(x)})
    close = difflib.get_close_matches(wanted, pool, n=n, cutoff=0.3) or pool[:n]
    return ", ".join(repr(c) for c in close) if close else "none"


def _non_overlapping(df: pd.DataFrame) -> pd.DataFrame:
    """Keep instances that start after the previous kept one ended (outermost of nested repeats)."""
    df = df.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="mergesort")
    prev_reach = df["end_ns"].cummax().shift(1)
    return df[prev_reach.isna() | (df["start_ns"] >= prev_reach)]


def _auto_nvtx(ranges: pd.DataFrame) -> tuple[str, str] | None:
    if ranges.empty:
        return None
    busiest = ranges["tid"].value_counts().index[0]
    on_thread = ranges[ranges["tid"] == busiest].sort_values("start_ns", kind="mergesort")
    cand = []
    for (name, domain), grp in on_thread.groupby(["name", "domain"], sort=False):
        if len(grp) < MIN_REPEATS or name == "":
            continue
        overlaps = (grp["start_ns"].to_numpy()[1:] < grp["end_ns"].to_numpy()[:-1]).any()
        if not overlaps:
            cand.append((name, domain, len(grp), grp))
    if not cand:
        return None
    # Drop candidates whose instances sit inside another candidate's: the delimiter is the outermost.
    keep = []
    for name, domain, count, grp in cand:
        nested = False
        for other_name, other_domain, _, other in cand:
            if (other_name, other_domain) == (name, domain):
                continue
            idx = np.searchsorted(other["start_ns"].to_numpy(), grp["start_ns"].to_numpy(), side="right") - 1
            ok = idx >= 0
            inside = np.zeros(len(grp), bool)
            inside[ok] = grp["end_ns"].to_numpy()[ok] <= other["end_ns"].to_numpy()[idx[ok]]
            if inside.mean() > 0.5:
                nested = True
                break
        if not nested:
            keep.append((count, int((grp["end_ns"] - grp["start_ns"]).sum()), name, domain))
    # The delimiter covers the most time: "most frequent" alone picks per-op ranges such as aten::zeros
    # in reports made with torch's emit_nvtx.
    keep.sort(key=lambda k: (k[1], k[0]), reverse=True)
    return (keep[0][2], keep[0][3]) if keep else None


def find_iterations(nvtx: pd.DataFrame | None, kernels: pd.DataFrame | None, iteration: str | None = None,
                    iteration_kernel: str | None = None, file: str = "") -> Iterations:
    ranges = closed_ranges(nvtx)
    if iteration_kernel:
        return _kernel_iterations(kernels, iteration_kernel, "--iteration-kernel", file)
    if iteration:
        name, domain = parse_name_domain(iteration)
        sel = ranges[ranges["name"] == name]
        if domain is not None:
            sel = sel[sel["domain"] == domain]
        if sel.empty:
            raise BadInputError(f"{file}: no NVTX range named {iteration!r}; closest names: "
                                f"{closest_names(name, ranges['name'])}")
        delim = Delimiter("nvtx", name, domain, "--iteration")
    else:
        found = _auto_nvtx(ranges)
        if found is None:
            if kernels is not None and len(kernels):
                counts = kernels["name"].value_counts()
                if counts.iloc[0] >= MIN_REPEATS:
                    return _kernel_iterations(kernels, str(counts.index[0]), "auto", file)
            what = "has no NVTX ranges or CUDA kernels (profile with `nsys profile -t cuda,nvtx`)" if (
                ranges.empty and (kernels is None or kernels.empty)) else \
                "has no NVTX range or kernel that repeats at least 5 times"
            raise BadInputError(f"{file}: cannot find iterations: the report {what}; or pass --iteration NAME "
                                "(an NVTX range) or --iteration-kernel NAME")
        name, domain = found
        sel = ranges[(ranges["name"] == name) & (ranges["domain"] == domain)]
        delim = Delimiter("nvtx", name, domain or None, "auto")
    tid = int(sel["tid"].value_counts().index[0])
    sel = _non_overlapping(sel[sel["tid"] == tid])
    return Iterations(delim, sel["start_ns"].to_numpy(np.int64), sel["end_ns"].to_numpy(np.int64), tid)


def _kernel_iterations(kernels: pd.DataFrame | None, name: str, source: str, file: str) -> Iterations:
    if kernels is None or kernels.empty:
        raise BadInputError(f"{file}: --iteration-kernel needs CUDA kernels and this report has none; profile "
                            "with `nsys profile -t cuda` (add cuda to the -t list) or use --iteration")
    match = (kernels["name"] == name) | (kernels["full_name"] == name) | \
        kernels["full_name"].str.startswith(name + "(", na=False)
    sel = kernels[match].sort_values("start_ns", kind="mergesort")
    if sel.empty:
        raise BadInputError(f"{file}: no kernel named {name!r}; closest names: "
                            f"{closest_names(name, kernels['name'])}")
    starts = sel["start_ns"].to_numpy(np.int64)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    period = int(np.median(np.diff(starts))) if len(starts) > 1 else 0
    ends[-1] = max(int(sel["end_ns"].iloc[-1]), starts[-1] + period)
    return Iterations(Delimiter("kernel", name, None, source), starts, ends, None)


def sync_points(rd, sync_names: list[str] | None = None) -> pd.DataFrame:
    """Intervals where this rank sits in a collective or sync point: NCCL kernels, NVTX ranges of the
    NCCL domain or with collective names, and MPI calls. Columns start_ns, end_ns, origin."""
    frames = []
    ranges = closed_ranges(rd.nvtx)
    if len(ranges):
        is_sync = ranges["name"].str.contains(DEFAULT_SYNC_RE, na=False) | (ranges["domain"] == "NCCL")
        if sync_names:
            is_sync |= ranges["name"].isin(sync_names)
        frames.append(ranges.loc[is_sync, ["start_ns", "end_ns"]].assign(origin="nvtx"))
    if rd.kernels is not None and len(rd.kernels):
        nccl = rd.kernels["name"].str.contains(NCCL_KERNEL_RE, na=False)
        frames.append(rd.kernels.loc[nccl, ["start_ns", "end_ns"]].assign(origin="nccl"))
    if rd.mpi is not None and len(rd.mpi):
        frames.append(rd.mpi[["start_ns", "end_ns"]].assign(origin="mpi"))
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({"start_ns": pd.Series(dtype="int64"), "end_ns": pd.Series(dtype="int64"),
                             "origin": pd.Series(dtype=object)})
    out = pd.concat(frames, ignore_index=True)
    out["start_ns"] = out["start_ns"].astype("int64")
    out["end_ns"] = out["end_ns"].astype("int64")
    return out
