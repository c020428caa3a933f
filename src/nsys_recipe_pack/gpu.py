"""GPU operations of one rank: their categories, the call that launched each, and their intervals (shared
by the GPU recipes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .inputs import Frame
from .iterations import NCCL_KERNEL_RE, matching
from .lazy import pd

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


def gpu_frames(rank_data) -> list:
    """The rank's non-empty kernel, copy and memset tables (inputs.Frame), in that order."""
    frames = (rank_data.frame("kernels"), rank_data.frame("memcpy"), rank_data.frame("memset"))
    return [f for f in frames if f is not None and len(f)]


def gpu_intervals(rank_data) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every kernel, copy and memset (in `gpu_frames` order), for when only the GPU's busy
    time matters."""
    frames = gpu_frames(rank_data)
    if not frames:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return (np.concatenate([f.values("start_ns") for f in frames]),
            np.concatenate([f.values("end_ns") for f in frames]))


@dataclass
class Launched:
    """GPU ops paired with the runtime call that launched each (an op whose key several calls hold is
    paired with each of them), and the count of ops with no call in the report."""
    op: np.ndarray  # position in `gpu_intervals` order
    start_ns: np.ndarray
    end_ns: np.ndarray
    collective: np.ndarray  # a communication kernel (NCCL), whose GPU time includes waiting for peers
    call_start_ns: np.ndarray
    call_end_ns: np.ndarray
    tid: np.ndarray  # of the launching call
    pid: np.ndarray
    unlinked: int


def launched_ops(rank_data) -> Launched:
    frames = gpu_frames(rank_data)
    op_start, op_end = gpu_intervals(rank_data)
    runtime = rank_data.frame("runtime")
    if not frames or runtime is None or not len(runtime):
        empty = np.zeros(0, np.int64)
        return Launched(empty, empty, empty, np.zeros(0, bool), empty, empty, empty, empty, len(op_start))
    op_key = np.concatenate([call_key(f) for f in frames])
    collective = collective_ops(rank_data)
    op, call = pair_launches(op_key, call_key(runtime))
    paired = int(np.count_nonzero(op[1:] != op[:-1])) + 1 if len(op) else 0  # ops with a call (`op` is in order)
    return Launched(op, op_start[op], op_end[op], collective[op], runtime.values("start_ns")[call],
                    runtime.values("end_ns")[call], runtime.values("tid")[call], runtime.values("pid")[call],
                    len(op_key) - paired)


def collective_ops(rank_data) -> np.ndarray:
    """Which ops, in `gpu_intervals` order, are communication kernels (NCCL): their GPU time includes the
    wait for the other ranks."""
    collective = np.zeros(sum(len(f) for f in gpu_frames(rank_data)), bool)
    kernels = rank_data.frame("kernels")
    if kernels is not None and len(kernels):
        codes, words = kernels.codes("name")
        collective[:len(kernels)] = matching(words, NCCL_KERNEL_RE)[codes]
    return collective


GPU_NEEDS = ("kernel", "memcpy", "memset")
KEY_COLUMNS = ["start", "end", "globalPid", "correlationId"]


def launch_keys(ahead, needs: tuple = GPU_NEEDS) -> tuple[np.ndarray, np.ndarray]:
    """Every launch key (`call_key`) of the GPU ops of `needs`, read ahead of the spans (inputs.chunks.Ahead): the
    distinct keys in order, and how many ops hold each (in the least signed integer type that holds the most: a byte
    per key as usual, held for the whole map with the key's 8). A span-by-span map then knows which calls launch
    work still to come."""
    keys = [call_key(frame) for need in needs for frame in ahead.frames(need, KEY_COLUMNS)]
    keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    keys.sort(kind="stable")  # in place; nearly sorted already, which the stable sort is quick on
    # a key per op of an hour-long capture: no more arrays of their length at once than needed (a third of the peak)
    new = np.ones(len(keys), bool)
    np.not_equal(keys[1:], keys[:-1], out=new[1:])
    if new.all():  # an op per key, as usual (a CUDA graph's kernels share their launch's)
        return keys, np.ones(len(keys), np.int8)
    first = np.flatnonzero(new)
    del new
    distinct = keys[first]
    ops = len(keys)
    del keys
    counts = np.diff(first, append=ops)
    del first
    return distinct, counts.astype(np.min_scalar_type(-int(counts.max()) - 1))


def key_places(keys: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each wanted key is (or would go, short of the end) among sorted keys, and whether it is there: a
    search, where np.isin would sort the keys again for every batch; within the keys between the least and the
    greatest wanted, few and close together for a span's calls or ops."""
    if not len(keys) or not len(wanted):
        return np.zeros(len(wanted), np.int64), np.zeros(len(wanted), bool)
    low = int(np.searchsorted(keys, wanted.min()))
    high = int(np.searchsorted(keys, wanted.max(), side="right"))
    at = np.minimum(low + np.searchsorted(keys[low:high], wanted), len(keys) - 1)
    return at, keys[at] == wanted


def pair_launches(op_key: np.ndarray, call_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(op, call) index pairs of each GPU op and the runtime call(s) with its key, in op order (ops without
    a call dropped; a key held by several calls pairs the op with each, in call order)."""
    by_key, sorted_keys = None, call_keys  # calls in order of key already, each once (as usual): no sort
    if not (len(call_keys) and (call_keys[1:] > call_keys[:-1]).all()):
        by_key = np.argsort(call_keys, kind="stable")
        sorted_keys = call_keys[by_key]
    lo = np.searchsorted(sorted_keys, op_key, side="left")
    if by_key is None or (len(sorted_keys) and (sorted_keys[1:] != sorted_keys[:-1]).all()):  # each key held once
        op = np.flatnonzero(sorted_keys.take(lo, mode="clip") == op_key)
        return op, lo[op] if by_key is None else by_key[lo[op]]
    hits = np.searchsorted(sorted_keys, op_key, side="right") - lo
    op = np.repeat(np.arange(len(op_key)), hits)
    within = np.arange(len(op)) - np.repeat(np.cumsum(hits) - hits, hits)
    return op, by_key[np.repeat(lo, hits) + within]
