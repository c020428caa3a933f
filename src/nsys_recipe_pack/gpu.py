"""GPU operations of one rank in one frame, each with its category (shared by the GPU recipes)."""

from __future__ import annotations

import numpy as np

from .iterations import NCCL_KERNEL_RE
from .lazy import pd
from .loader import Frame

# ENUM_CUDA_MEMCPY_OPER -> category; array and unified-memory copies count with their direction.
MEMCPY_CATEGORY = {
    1: "memcpy_htod", 3: "memcpy_htod", 11: "memcpy_htod",
    2: "memcpy_dtoh", 4: "memcpy_dtoh", 12: "memcpy_dtoh",
    5: "memcpy_dtod", 6: "memcpy_dtod", 7: "memcpy_dtod", 8: "memcpy_dtod", 13: "memcpy_dtod",
    10: "memcpy_peer",
}
PAGEABLE = 0  # ENUM_CUDA_MEM_KIND
# Exclusive (union) time is given to the first category in this order that covers an instant.
PRIORITY = ["compute", "communication", "memcpy_htod", "memcpy_dtoh", "memcpy_dtod", "memcpy_peer",
            "memcpy_other", "memset"]


def call_key(df: pd.DataFrame) -> np.ndarray:
    """(process, correlation id) as one integer, to join GPU work with the call that launched it.

    pid < 2**24 and correlation ids < 2**32; a missing correlation id becomes -1 on both sides.
    """
    if isinstance(df, Frame):
        return df.values("pid") * (1 << 33) + df.values("correlation_id", fill=-1)
    corr = pd.to_numeric(df["correlation_id"]).fillna(-1).to_numpy(np.int64)
    return df["pid"].to_numpy(np.int64) * (1 << 33) + corr


def gpu_frames(rd) -> list:
    """The rank's non-empty kernel, copy and memset tables (loader Frames), in that order."""
    return [f for f in (rd.frame("kernels"), rd.frame("memcpy"), rd.frame("memset")) if f is not None and len(f)]


def gpu_intervals(rd) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every kernel, copy and memset (in `gpu_frames` order), for when only the GPU's busy
    time matters."""
    frames = gpu_frames(rd)
    if not frames:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return (np.concatenate([f.values("start_ns") for f in frames]),
            np.concatenate([f.values("end_ns") for f in frames]))


def gpu_ops(rd) -> pd.DataFrame:
    """Columns: start_ns, end_ns, device, stream, correlation_id, pid, category, name, bytes, pageable."""
    frames = []
    if rd.kernels is not None and len(rd.kernels):
        k = rd.kernels
        nccl = k["name"].str.contains(NCCL_KERNEL_RE, na=False).to_numpy()
        frames.append(pd.DataFrame({
            "start_ns": k["start_ns"], "end_ns": k["end_ns"], "device": k["device"], "stream": k["stream"],
            "correlation_id": k["correlation_id"], "pid": k["pid"],
            "category": np.where(nccl, "communication", "compute"), "name": k["name"],
            "bytes": pd.array([pd.NA] * len(k), dtype="Int64"), "pageable": False,
        }))
    if rd.memcpy is not None and len(rd.memcpy):
        m = rd.memcpy
        kind = m["copy_kind"].fillna(0).astype("int64")
        cat = kind.map(MEMCPY_CATEGORY).fillna("memcpy_other")
        pageable = (m["src_kind"].fillna(-1).to_numpy() == PAGEABLE) | (m["dst_kind"].fillna(-1).to_numpy() == PAGEABLE)
        frames.append(pd.DataFrame({
            "start_ns": m["start_ns"], "end_ns": m["end_ns"], "device": m["device"], "stream": m["stream"],
            "correlation_id": m["correlation_id"], "pid": m["pid"], "category": cat.to_numpy(),
            "name": cat.to_numpy(), "bytes": m["bytes"].astype("Int64"), "pageable": pageable,
        }))
    if rd.memset is not None and len(rd.memset):
        s = rd.memset
        frames.append(pd.DataFrame({
            "start_ns": s["start_ns"], "end_ns": s["end_ns"], "device": s["device"], "stream": s["stream"],
            "correlation_id": s["correlation_id"], "pid": s["pid"], "category": "memset", "name": "memset",
            "bytes": s["bytes"].astype("Int64") if "bytes" in s else pd.array([pd.NA] * len(s), dtype="Int64"),
            "pageable": False,
        }))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
            ("start_ns", "int64"), ("end_ns", "int64"), ("device", "Int64"), ("stream", "Int64"),
            ("correlation_id", "Int64"), ("pid", "int64"), ("category", object), ("name", object),
            ("bytes", "Int64"), ("pageable", bool)]})
    ops = pd.concat(frames, ignore_index=True)
    ops["start_ns"] = ops["start_ns"].astype("int64")
    ops["end_ns"] = ops["end_ns"].astype("int64")
    return ops
