"""GPU operations of one rank: their categories, the call that launched each, and their intervals (shared
by the GPU recipes)."""

from __future__ import annotations

import numpy as np

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
