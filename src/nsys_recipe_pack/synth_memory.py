"""SYNTHETIC CUDA memory usage events (`synth --memory`): the device memory each rank of a job allocates and frees,
a rank that leaks and one that holds more, and what that makes each rank hold (truth.json's `memory`)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

from .lazy import pd

MS = 1_000_000
US = 1_000


@dataclass(frozen=True)
class MemoryPlan:
    """Device memory every rank allocates (CUDA_GPU_MEMORY_USAGE_EVENTS, kind Device, as `nsys profile
    --cuda-memory-usage=true` records it): `held` bytes freed 2 ms before the first step though allocated before the
    capture, `weights` allocated 1 ms before it and kept, `activation` allocated at the start of each forward range and
    freed at the start of each optimizer range. Rank `big_rank` allocates `big_factor` times the activation; rank
    `leak_rank` also allocates `leak` bytes at the start of backward in iterations leak_first..leak_last (-1: to the
    end) and never frees them. Every event 5 us after the instant named."""
    held: int = 64 << 20
    weights: int = 1 << 30
    activation: int = 256 << 20
    leak_rank: int = -1
    leak: int = 16 << 20
    leak_first: int = 0
    leak_last: int = -1
    big_rank: int = -1
    big_factor: int = 2

    def activation_of(self, rank: int) -> int:
        return self.activation * (self.big_factor if rank == self.big_rank else 1)

    def leaks(self, rank: int, iterations: int) -> np.ndarray:
        """Whether the rank leaks in each iteration."""
        last = iterations - 1 if self.leak_last == -1 else self.leak_last
        i = np.arange(iterations)
        return (rank == self.leak_rank) & (i >= self.leak_first) & (i <= last)


def parse_memory(text: str) -> MemoryPlan:
    """`leak=R,iterations=A-B,big=R` (each optional; '' for every rank alike)."""
    usage = f"--memory {text!r}: give leak=R[,iterations=A-B][,big=R]"
    fields = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in ("leak", "iterations", "big") or not re.fullmatch(r"[\d-]+", value.strip()):
            raise ValueError(usage)
        fields[key.strip()] = value.strip()
    span = re.fullmatch(r"(\d+)-(\d+)", fields.get("iterations", "0-0"))
    if span is None or int(span.group(2)) < int(span.group(1)) or any(
            not fields[k].isdigit() for k in ("leak", "big") if k in fields):
        raise ValueError(usage)
    first, last = (int(span.group(1)), int(span.group(2))) if "iterations" in fields else (0, -1)
    return MemoryPlan(leak_rank=int(fields.get("leak", -1)), leak_first=first, leak_last=last,
                      big_rank=int(fields.get("big", -1)))


def memory_events(plan: MemoryPlan, r: int, spans: dict, first: int, total: int, gpid: int,
                   device: int) -> pd.DataFrame:
    """The rank's memory events of iterations first.. (MemoryPlan), in time order."""
    n = len(spans["step"][0])
    it = first + np.arange(n)
    base = 0x7F00_0000_0000
    rows = [(spans["forward"][0] + 5 * US, base + (it << 32), np.full(n, plan.activation_of(r)), 0),
            (spans["optimizer"][0] + 5 * US, base + (it << 32), np.full(n, plan.activation_of(r)), 1)]
    leaking = plan.leaks(r, total)[first:first + n]
    rows.append((spans["backward"][0][leaking] + 5 * US, base + (1 << 44) + (it[leaking] << 32),
                 np.full(int(leaking.sum()), plan.leak), 0))
    if first == 0:  # before the first step: memory held from before the capture is freed, the weights allocated
        s0 = int(spans["step"][0][0])
        rows.append((np.array([s0 - 2 * MS, s0 - MS]), np.array([base + (2 << 44), base + (3 << 44)]),
                     np.array([plan.held, plan.weights]), np.array([1, 0])))
    start = np.concatenate([np.asarray(t, np.int64) for t, *_ in rows])
    frame = pd.DataFrame({
        "start": start, "globalPid": np.uint64(gpid), "deviceId": device, "contextId": np.uint64(1),
        "address": np.concatenate([np.asarray(a, np.int64) for _, a, _, _ in rows]).astype(np.uint64),
        "pc": np.uint64(0), "bytes": np.concatenate([np.asarray(b, np.int64) for _, _, b, _ in rows]).astype(np.uint64),
        "memKind": 2,
        "memoryOperationType": np.concatenate([np.broadcast_to(o, len(t)) for t, _, _, o in rows]).astype(np.int64),
        "correlationId": 0, "localMemoryPoolAddress": np.uint64(0), "localMemoryPoolSize": np.uint64(0)})
    return frame.sort_values("start", kind="stable").reset_index(drop=True)


def memory_truth(plan: MemoryPlan, ranks: int, iterations: int) -> dict:
    """What the memory plan makes each rank hold (device memory, bytes): its peak and the iteration that first
    reaches it, what is held at the end, what leaks, and per iteration what is allocated."""
    per_rank = []
    for r in range(ranks):
        leaks = plan.leaks(r, iterations)
        leaked = np.cumsum(leaks) * plan.leak
        # in each iteration the activation, then any leak, are held on top of the weights and earlier leaks
        peaks = plan.weights + leaked + plan.activation_of(r)
        per_rank.append({"rank": r, "peak_bytes": int(peaks.max()), "peak_iteration": int(np.argmax(peaks)),
                         "held_before_bytes": plan.held, "held_at_end_bytes": int(plan.weights + leaked[-1]),
                         "leaked_bytes": int(leaked[-1]), "leaked_iterations": [int(i) for i in np.flatnonzero(leaks)],
                         "alloc_bytes_per_iteration": (plan.activation_of(r) + leaks * plan.leak).tolist()})
    return {"plan": asdict(plan), "ranks": per_rank, "kind": "Device"}
