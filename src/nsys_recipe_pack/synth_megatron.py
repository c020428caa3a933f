"""SYNTHETIC exports of a Megatron-style job (`nsys-recipe synth --job megatron`): tensor, pipeline and data
parallel groups in Megatron Core's rank order, a 1F1B pipeline schedule, and NCCL's kernels and NVTX payloads per
communicator, with known stragglers and stage weights. Labelled synthetic as `synth.py`'s jobs are.

The model, per step, on the common clock:
- each stage runs its micro-batches' forward and backward passes in 1F1B order (`pipeline_order`): warm-up
  forwards, then one forward and one backward in turn, then the remaining backwards; with `virtual` v > 1, in
  Megatron's interleaved order over v model chunks per stage, each pass 1 / v of the stage's work, the last stage's
  chunk handing on to the first stage's next;
- a pass is two compute kernels, each followed, with tp > 1, by an all-reduce of the tensor-parallel group (its
  members' kernels start as each arrives and end together, the last arrival plus a transfer: each collective's
  transfer within 10 % of its nominal time);
- a stage's output goes to its neighbour as a SendRecv kernel on both sides, on the pipeline group's stream: the
  sender's starts after its pass, the receiver's when it is ready to receive; both end at the later start plus a
  transfer, and the receiver's pass starts then;
- after its last backward a rank all-reduces its gradients with its data-parallel replicas (tp and pp alike), then
  runs its optimizer; its next step starts right after.
The host launches every kernel 5 us before it starts, inside the NVTX range of its phase (`step`; `forward`,
`backward`, `forward-recv`, `backward-recv`, `forward-send`, `backward-send`, `grads-all-reduce`, `optimizer`), and
every NCCL call is an NVTX range of NCCL's own domain carrying its payload (communicator id, message size, peer) laid
out by the payload schemas a real NCCL registers; each communicator's creation is one too (id, size, rank, device).
With `p2p_sync` (Megatron's `batch_p2p_sync`) the GPU's timeline is the same but the host runs ahead: it launches a
pass's kernels 20 us apart as soon as it may, and blocks in `cudaDeviceSynchronize` after posting each receive until
the exchange is done, and at the step's end until its optimizer is; its phase ranges are the host's own.
With `uneven` (P, X), each micro-batch of each data-parallel replica in each step is, with chance P, X times as long
to compute on every rank of its replica (a long sequence), drawn apart from every other random draw: the same job
without them, simulated again, gives the truth of what they cost.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict
from pathlib import Path

import numpy as np

from . import synth, synth_export
from .errors import UsageError
from .lazy import pd
from .parallel import Layout
from .staging import staged_output
from .synth import MS, US

FWD_MS, BWD_MS, OPT_MS = 6.0, 12.0, 3.0
JITTER = 0.03
TRANSFER_JITTER = 0.1  # each collective's transfer takes its nominal time within this share: no two end at one instant
TP_TRANSFER_NS, P2P_TRANSFER_NS, DP_TRANSFER_NS = 150 * US, 250 * US, 3 * MS
TP_BYTES, P2P_BYTES, DP_BYTES = 8 << 20, 4 << 20, 256 << 20
LAG = 5 * US  # a kernel starts this long after its launch
STEP_GAP_NS = 200 * US
HOST_SEND_NS = 20 * US  # the host's time to post a send before it goes on
LAUNCH_NS = 20 * US  # --p2p-sync: the host's time to launch a kernel, running ahead of its GPU
SYNC_API = "cudaDeviceSynchronize_v3020"
COMPUTE_STREAM, TP_STREAM, DP_STREAM, PP_STREAM = 7, 13, 17, 21
NCCL_DOMAIN_ID = 1
COMPUTE = {"F": ("sm90_gemm_bf16_fprop_a", "sm90_gemm_bf16_fprop_b"),
           "B": ("sm90_gemm_bf16_dgrad", "sm90_gemm_bf16_wgrad")}
OPTIMIZER_KERNEL = "multi_tensor_apply_kernel"
TP_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
DP_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
P2P_KERNEL = "ncclDevKernel_SendRecv"
RANGES = ["step", "forward", "backward", "forward-recv", "backward-recv", "forward-send", "backward-send",
          "grads-all-reduce", "optimizer"]
NCCL_CALLS = ["ncclCommInitRank", "ncclAllReduce", "ncclSend", "ncclRecv"]
# NCCL 2.2x's payload schemas as a real export records them (NSYS_NOTES.md): id -> (payload size, entries of
# (name, NVTX entry type, offset))
SCHEMAS = {
    16777218: (24, [("NCCL communicator ID", 18, 0), ("No. of ranks", 5, 8), ("Rank", 5, 12), ("CUDA device", 5, 16)]),
    16777230: (8, [("NCCL communicator ID", 18, 0)]),
    16777223: (24, [("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8),
                    ("Reduction operation", 16777232, 16)]),
    16777220: (16, [("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8)]),
    16777226: (24, [("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8), ("Peer rank", 5, 16)]),
    16777225: (24, [("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8), ("Peer rank", 5, 16)]),
    16777222: (24, [("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8), ("Root", 5, 16)]),
}
PAYLOAD_TABLES = {
    "NVTX_PAYLOAD_SCHEMAS": synth_export.spec("domainId:int64 schemaId:int64 name:string type:int64 flags:int64 "
                                              "numEntries:int64 payloadSize:int64 alignTo:int64"),
    "NVTX_PAYLOAD_SCHEMA_ENTRIES": synth_export.spec("domainId:int64! schemaId:int64! idx:int64! flags:int64 "
                                                     "type:int64 name:string description:string "
                                                     "arrayOrUnionDetail:int64 offset:int64"),
}


def pipeline_order(stages: int, microbatches: int, virtual: int = 1) -> list[list[tuple[str, int, int]]]:
    """Each stage's passes in Megatron's order: ("F" or "B", model chunk, micro-batch). virtual 1 is 1F1B: stage s
    runs p - s - 1 warm-up forwards, then one forward and one backward in turn, then the remaining backwards. With v
    model chunks per stage (interleaved 1F1B) the warm-up is 2 (p - s - 1) + (v - 1) p forwards, and the k-th forward
    is of chunk (k mod pv) // p and micro-batch (k // pv) p + k mod p, the k-th backward of the chunks in reverse."""
    total = microbatches * virtual

    def pass_of(kind: str, k: int) -> tuple[str, int, int]:
        chunk = (k % (stages * virtual)) // stages
        return kind, chunk if kind == "F" else virtual - 1 - chunk, (k // (stages * virtual)) * stages + k % stages

    out = []
    for s in range(stages):
        warmup = min(stages - s - 1 if virtual == 1 else 2 * (stages - s - 1) + (virtual - 1) * stages, total)
        order = [pass_of("F", k) for k in range(warmup)]
        for i in range(total - warmup):
            order += [pass_of("F", warmup + i), pass_of("B", i)]
        order += [pass_of("B", k) for k in range(total - warmup, total)]
        out.append(order)
    return out


def one_f_one_b(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Each stage's passes in 1F1B order: ("F" or "B", micro-batch)."""
    return [[(kind, m) for kind, _, m in order] for order in pipeline_order(stages, microbatches)]


def neighbour(kind: str, stage: int, chunk: int, stages: int, virtual: int, to: bool) -> tuple[int, int] | None:
    """The (stage, chunk) a pass sends its output to (to) or takes its input from: a forward's goes on to the next
    model chunk in the model's order (virtual stage chunk * p + stage), a backward's back to the one before; the
    last stage's chunk hands on to the first stage's next one. None: the model's first or last chunk."""
    at = chunk * stages + stage
    other = at + 1 if (kind == "F") == to else at - 1
    if not 0 <= other < stages * virtual:
        return None
    return other % stages, other // stages


def _in_dependency_order(stages: int, microbatches: int, virtual: int = 1) -> list[tuple[int, str, int, int]]:
    """Every stage's passes (stage, kind, chunk, micro-batch) in one order in which each pass comes after the pass
    whose output it takes."""
    per_stage = pipeline_order(stages, microbatches, virtual)
    done, at, order = set(), [0] * stages, []
    while len(order) < 2 * stages * microbatches * virtual:
        moved = False
        for s in range(stages):
            while at[s] < len(per_stage[s]):
                kind, c, m = per_stage[s][at[s]]
                src = neighbour(kind, s, c, stages, virtual, to=False)
                source = (src[0], kind, src[1], m) if src is not None else (s, "F", c, m) if kind == "B" else None
                if source is None or source in done:
                    done.add((s, kind, c, m))
                    order.append((s, kind, c, m))
                    at[s] += 1
                    moved = True
                else:
                    break
        if not moved:
            raise AssertionError("the pipeline schedule has a pass waiting on itself")
    return order


def _each(value, n: int) -> np.ndarray:
    """A value per event: one for all (None: -1), or an array of one per event."""
    value = np.asarray(-1 if value is None else value, np.int64).ravel()
    return np.broadcast_to(value, (n,)) if len(value) == 1 else value


class _Events:
    """Events of every rank, gathered as arrays of a batch each, on the common clock."""

    def __init__(self):
        self.kernels: list[dict] = []
        self.ranges: list[dict] = []
        self.calls: list[dict] = []

    def kernel(self, rank, start, end, name: str, stream: int, call: str | None = None, comm=None, nbytes: int = 0,
               peer=None, launch=None):
        """Kernels; launched LAG before they start unless `launch` says when."""
        shape = np.shape(start)
        rank, start, end = (np.array(a, np.int64).ravel() for a in (rank, start, end))  # copies
        launch = start - LAG if launch is None else np.array(np.broadcast_to(launch, shape), np.int64).ravel()
        n = len(rank)
        self.kernels.append({"rank": rank, "start": start, "end": end, "launch": launch,
                             "name": np.full(n, name, object), "stream": np.full(n, stream),
                             "call": np.full(n, call, object), "comm": _each(comm, n),
                             "bytes": np.full(n, nbytes, np.int64), "peer": _each(peer, n)})

    def sync(self, rank, start, end):
        """The host blocked in a device synchronisation."""
        rank, start, end = (np.array(a, np.int64).ravel() for a in (rank, start, end))  # copies
        self.calls.append({"rank": rank, "start": start, "end": end})

    def range(self, rank, start, end, name: str):
        rank, start, end = (np.array(a, np.int64).ravel() for a in (rank, start, end))  # copies
        self.ranges.append({"rank": rank, "start": start, "end": end, "name": np.full(len(rank), name, object)})

    @staticmethod
    def joined(parts: list[dict]) -> dict:
        return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}


def simulate(layout: Layout, steps: int, microbatches: int, stragglers, heavy_last_stage: float, seed: int,
             p2p_sync: bool = False, uneven: tuple[float, float] = (0.0, 1.0), virtual: int = 1) -> dict:
    """Every rank's kernels and NVTX ranges on the common clock (first step at 0), and the communicators. p2p_sync:
    the host launches ahead of its GPU and syncs the device after every exchange and at the step's end, as Megatron
    does (`batch_p2p_sync`): the GPU's timeline is the same, the host's ranges are its own. uneven: (chance, factor)
    of a replica's micro-batch computing `factor` times as long. virtual: model chunks per stage (interleaved 1F1B),
    each a pass of 1 / virtual of the stage's work."""
    rng = np.random.default_rng(seed)
    P, D, T = layout.pp, layout.dp, layout.tp
    s_, d_, t_ = np.meshgrid(np.arange(P), np.arange(D), np.arange(T), indexing="ij")
    zeros = {"cp": np.zeros_like(s_), "ep": np.zeros_like(s_)}
    rank = layout.rank_of({"tp": t_, "dp": d_, "pp": s_, **zeros})  # (P, D, T)
    comm_ids = rng.integers(1, 1 << 62, size=P * D + D * T + P * T, dtype=np.int64)
    tp_comm = np.arange(P * D).reshape(P, D)[:, :, None].repeat(T, axis=2)
    pp_comm = (P * D + np.arange(D * T).reshape(D, T))[None].repeat(P, axis=0)
    dp_comm = (P * D + D * T + np.arange(P * T).reshape(P, T))[:, None, :].repeat(D, axis=1)
    slow = np.ones((steps, P, D, T))
    where = {int(r): tuple(int(x) for x in np.argwhere(rank == r)[0]) for r in rank.ravel()}
    for st in stragglers:
        last = steps - 1 if st.last == -1 else st.last
        slow[(slice(st.first, last + 1), *where[st.rank])] *= st.slowdown
    slow[:, P - 1] *= heavy_last_stage
    chance, factor = uneven
    long_batch = np.random.default_rng(seed + 2).random((steps, D, microbatches)) < chance  # (step, replica, batch)
    batch_slow = np.where(long_batch, factor, 1.0)
    ev = _Events()
    order = _in_dependency_order(P, microbatches, virtual)
    start = np.zeros((P, D, T), np.int64)
    step_bounds = []
    for k in range(steps):
        free = start.copy()
        host = start.copy()  # p2p_sync: where each rank's host is, ahead of its GPU but for its syncs
        posted: dict[tuple[int, str, int], tuple] = {}

        for s, kind, c, m in order:
            ready = free[s]
            label = "forward" if kind == "F" else "backward"
            taken = neighbour(kind, s, c, P, virtual, to=False)
            if taken is not None:
                src = taken[0]
                send_start, send_launch = posted.pop((s, kind, c, m))
                recv_start = ready + 2 * LAG
                arrival = np.maximum(send_start, recv_start) + _transfer(rng, P2P_TRANSFER_NS, (D, T))
                ev.kernel(rank[src], send_start, arrival, P2P_KERNEL, PP_STREAM, "ncclSend", pp_comm[src], P2P_BYTES,
                          s, launch=send_launch)
                posted_at = host[s].copy()
                recv_launch = _launched(host, s, p2p_sync, recv_start)
                ev.kernel(rank[s], recv_start, arrival, P2P_KERNEL, PP_STREAM, "ncclRecv", pp_comm[s], P2P_BYTES, src,
                          launch=recv_launch)
                if p2p_sync:  # the host waits until the exchange is done, its GPU's work before it too
                    ev.sync(rank[s], recv_launch + 3 * US, arrival)
                    ev.range(rank[s], np.minimum(posted_at, recv_launch), arrival + US, f"{label}-recv")
                    host[s] = arrival + 2 * US
                else:
                    ev.range(rank[s], ready, arrival + LAG, f"{label}-recv")
                ready = arrival + LAG
            nominal = (FWD_MS if kind == "F" else BWD_MS) * MS / 2 / virtual
            now = ready
            pass_at = host[s].copy()
            for half in range(2):
                jitter = rng.uniform(1 - JITTER, 1 + JITTER, (D, T))
                work = np.round(nominal * slow[k, s] * batch_slow[k, :, m, None] * jitter).astype(np.int64)
                ev.kernel(rank[s], now + LAG, now + LAG + work, COMPUTE[kind][half], COMPUTE_STREAM,
                          launch=_launched(host, s, p2p_sync, now + LAG))
                now = now + LAG + work
                if T > 1:
                    done = now.max(axis=1, keepdims=True) + _transfer(rng, TP_TRANSFER_NS, (D, 1))
                    ev.kernel(rank[s], now + LAG, np.broadcast_to(done + LAG, now.shape), TP_KERNEL, TP_STREAM,
                              "ncclAllReduce", tp_comm[s], TP_BYTES, launch=_launched(host, s, p2p_sync, now + LAG))
                    now = np.broadcast_to(done + LAG, now.shape).copy()
            ev.range(rank[s], np.minimum(pass_at, host[s] - LAUNCH_NS) if p2p_sync else ready,
                     host[s] if p2p_sync else now, label)
            free[s] = now
            given = neighbour(kind, s, c, P, virtual, to=True)
            if given is not None:
                send_at = host[s].copy()
                posted[(given[0], kind, given[1], m)] = (now + 2 * LAG, _launched(host, s, p2p_sync, now + 2 * LAG))
                if p2p_sync:
                    ev.range(rank[s], np.minimum(send_at, host[s] - LAUNCH_NS), host[s], f"{label}-send")
                else:
                    ev.range(rank[s], now, now + HOST_SEND_NS, f"{label}-send")
                free[s] = now + HOST_SEND_NS
        arrive = free + 2 * LAG
        if D > 1:
            done = np.broadcast_to(arrive.max(axis=1, keepdims=True) + _transfer(rng, DP_TRANSFER_NS, (P, 1, T)),
                                   arrive.shape)
            reduce_at = host.copy()
            dp_launch = _launched(host, slice(None), p2p_sync, arrive)
            ev.kernel(rank, arrive, done, DP_KERNEL, DP_STREAM, "ncclAllReduce", dp_comm, DP_BYTES, launch=dp_launch)
            ev.range(rank, np.minimum(reduce_at, dp_launch) if p2p_sync else free, host if p2p_sync else done + LAG,
                     "grads-all-reduce")
            reduced = done + LAG
        else:
            reduced = free
        opt = np.round(OPT_MS * MS * rng.uniform(1 - JITTER, 1 + JITTER, (P, D, T))).astype(np.int64)
        opt_at = host.copy()
        opt_launch = _launched(host, slice(None), p2p_sync, reduced + LAG)
        ev.kernel(rank, reduced + LAG, reduced + LAG + opt, OPTIMIZER_KERNEL, COMPUTE_STREAM, launch=opt_launch)
        end = reduced + LAG + opt + 10 * US
        if p2p_sync:  # the step ends once the host has synced with its GPU (the loss read back)
            ev.sync(rank, opt_launch + LAUNCH_NS, end - 5 * US)
            ev.range(rank, np.minimum(opt_at, opt_launch), end, "optimizer")
        else:
            ev.range(rank, end - opt - LAG - 10 * US, end, "optimizer")
        ev.range(rank, start, end, "step")
        step_bounds.append((start.copy(), end.copy()))
        start = end + STEP_GAP_NS
    comms = []
    for table, kind, axis in ((tp_comm, "tp", 2), (pp_comm, "pp", 0), (dp_comm, "dp", 1)):
        for c in np.unique(table):
            at = np.argwhere(table == c)
            at = at[np.argsort(at[:, axis])]
            comms.append({"index": int(c), "id": int(comm_ids[c]), "kind": kind,
                          "members": [int(rank[tuple(a)]) for a in at]})
    calls = _Events.joined(ev.calls) if ev.calls else {c: np.zeros(0, np.int64) for c in ("rank", "start", "end")}
    return {"rank": rank, "kernels": _Events.joined(ev.kernels), "ranges": _Events.joined(ev.ranges),
            "calls": calls, "comms": comms, "comm_ids": comm_ids, "steps": step_bounds,
            "long_microbatches": [{"iteration": int(k), "replica": int(d), "microbatch": int(m)}
                                  for k, d, m in np.argwhere(long_batch)]}


def _launched(host: np.ndarray, s, p2p_sync: bool, gpu_start: np.ndarray) -> np.ndarray | None:
    """p2p_sync: when the host of stage s (host[s]) launches a kernel that starts at gpu_start, LAG after its launch
    at the latest; its host goes on (None without p2p_sync: LAG before the start)."""
    if not p2p_sync:
        return None
    at = np.minimum(host[s], gpu_start - LAG)
    host[s] = np.maximum(host[s], at) + LAUNCH_NS
    return at


def _transfer(rng, nominal_ns: int, shape: tuple) -> np.ndarray:
    """Each collective's transfer time (one per instance: its members end together, other instances at other
    instants, as on real clocks)."""
    return np.round(nominal_ns * rng.uniform(1 - TRANSFER_JITTER, 1 + TRANSFER_JITTER, shape)).astype(np.int64)


def _payload(values: list[tuple[int, str]], size: int) -> bytes:
    """Little-endian fields at their offsets in a payload of `size` bytes: (value, struct code) in offset order."""
    out = bytearray(size)
    offset = 0
    for value, code in values:
        struct.pack_into("<" + code, out, offset, value)
        offset += struct.calcsize(code)
    return bytes(out)


def _rank_events(r: int, sim: dict, shift: int, device: int, strings: dict, payloads: bool, init_at: int) -> dict:
    """One rank's NVTX, kernel and runtime tables, on its own clock (common + shift)."""
    pid = synth.PID_BASE + r
    gpid = synth._global_pid(pid)
    gtid = gpid | pid
    k = sim["kernels"]
    mine = np.flatnonzero(k["rank"] == r)
    mine = mine[np.argsort(k["start"][mine], kind="stable")]
    start, end = k["start"][mine] + shift, k["end"][mine] + shift
    corr = 1000 + np.arange(len(mine), dtype=np.int64)
    launch = k["launch"][mine] + shift
    names = k["name"][mine]
    ids = pd.Series(names).map(strings).to_numpy(np.int64)
    kernels = pd.DataFrame({
        "start": start, "end": end, "deviceId": device, "contextId": 1, "streamId": k["stream"][mine],
        "correlationId": corr, "globalPid": np.uint64(gpid), "demangledName": ids, "shortName": ids,
        "mangledName": ids, "launchType": 0, "cacheConfig": 0, "registersPerThread": 64, "gridX": 64, "gridY": 1,
        "gridZ": 1, "blockX": 256, "blockY": 1, "blockZ": 1, "staticSharedMemory": 0, "dynamicSharedMemory": 0,
        "localMemoryPerThread": 0, "localMemoryTotal": 0, "gridId": corr, "sharedMemoryExecuted": 0,
        "sharedMemoryLimitConfig": 0})
    c = sim["calls"]
    syncs = np.flatnonzero(c["rank"] == r)
    runtime = pd.DataFrame({"start": np.r_[launch + 1 * US, c["start"][syncs] + shift],
                            "end": np.r_[launch + 3 * US, c["end"][syncs] + shift], "eventClass": 0,
                            "globalTid": np.uint64(gtid),
                            "correlationId": np.r_[corr, 1000 + len(mine) + np.arange(len(syncs), dtype=np.int64)],
                            "nameId": np.r_[np.full(len(mine), strings[synth.LAUNCH_API], np.uint64),
                                            np.full(len(syncs), strings[SYNC_API], np.uint64)], "returnValue": 0})
    runtime = runtime.sort_values("start", kind="stable").reset_index(drop=True)
    g = sim["ranges"]
    at = np.flatnonzero(g["rank"] == r)
    ranges = pd.DataFrame({"start": g["start"][at] + shift, "end": g["end"][at] + shift, "text": g["name"][at],
                           "domainId": 0, "binaryData": None})
    calls = k["call"][mine]
    nccl = np.flatnonzero(pd.notna(calls))
    comm_id = sim["comm_ids"][k["comm"][mine][nccl]]
    blobs = [None] * len(nccl)
    if payloads:
        peers, sizes = k["peer"][mine][nccl], k["bytes"][mine][nccl]
        blobs = [_payload([(int(c), "q"), (int(b), "Q"), (int(p), "i")], 24) if call in ("ncclSend", "ncclRecv")
                 else _payload([(int(c), "q"), (int(b), "Q"), (0, "i")], 24)
                 for c, b, p, call in zip(comm_id, sizes, peers, calls[nccl], strict=True)]
    nccl_ranges = pd.DataFrame({"start": launch[nccl] - 3 * US, "end": launch[nccl] + 4 * US, "text": calls[nccl],
                                "domainId": NCCL_DOMAIN_ID, "binaryData": blobs})
    inits = [c for c in sim["comms"] if r in c["members"]]
    init_start = init_at + shift + 2 * MS * np.arange(len(inits))
    init_blobs = [_payload([(c["id"], "q"), (len(c["members"]), "i"), (c["members"].index(r), "i"), (device, "i")],
                           24) if payloads else None for c in inits]
    init_ranges = pd.DataFrame({"start": init_start, "end": init_start + 1 * MS, "text": "ncclCommInitRank",
                                "domainId": NCCL_DOMAIN_ID, "binaryData": init_blobs})
    create = pd.DataFrame({"start": [init_at + shift - 1 * MS], "end": [None], "eventType": [75], "text": ["NCCL"],
                           "domainId": [NCCL_DOMAIN_ID], "binaryData": [None]})
    nvtx = pd.concat([create, init_ranges, ranges, nccl_ranges], ignore_index=True)
    nvtx["eventType"] = nvtx["eventType"].fillna(59).astype(np.int64)
    nvtx["globalTid"] = np.uint64(gtid)
    nvtx = nvtx.sort_values("start", kind="stable").reset_index(drop=True)
    return {"NVTX_EVENTS": nvtx, "CUPTI_ACTIVITY_KIND_KERNEL": kernels, "CUPTI_ACTIVITY_KIND_RUNTIME": runtime}


def _schema_tables() -> dict[str, pd.DataFrame]:
    schemas = pd.DataFrame({"domainId": NCCL_DOMAIN_ID, "schemaId": list(SCHEMAS), "type": 1,
                            "numEntries": [len(e) for _, e in SCHEMAS.values()],
                            "payloadSize": [size for size, _ in SCHEMAS.values()]})
    entries = pd.DataFrame([{"domainId": NCCL_DOMAIN_ID, "schemaId": sid, "idx": i, "type": typ, "name": name,
                             "offset": offset}
                            for sid, (_, rows) in SCHEMAS.items() for i, (name, typ, offset) in enumerate(rows)])
    return {"NVTX_PAYLOAD_SCHEMAS": schemas, "NVTX_PAYLOAD_SCHEMA_ENTRIES": entries}


def write_megatron(output_dir, layout: Layout, steps: int = 20, microbatches: int = 8, fmt: str = "parquetdir",
                   stragglers=(), heavy_last_stage: float = 1.0, payloads: bool = True, seed: int = 0,
                   gpus_per_node: int = 8, overwrite: bool = False, p2p_sync: bool = False,
                   uneven: tuple[float, float] = (0.0, 1.0), virtual: int = 1) -> Path:
    """Write one SYNTHETIC export per rank of a Megatron-style job, truth.json and README.md into output_dir."""
    if layout.cp != 1 or layout.ep != 1:
        raise UsageError("--job megatron models tp, pp and dp: leave cp and ep at 1")
    if fmt not in ("sqlite", "parquetdir"):
        raise UsageError(f"--format {fmt}: use sqlite or parquetdir")
    if steps < 1 or microbatches < 1 or gpus_per_node < 1:
        raise UsageError("--iterations, --microbatches and --gpus-per-node must be at least 1")
    if virtual < 1 or (virtual > 1 and (layout.pp < 2 or microbatches % layout.pp)):
        raise UsageError("--virtual-stages V: at least 1; above 1 with at least two stages and a number of "
                         "micro-batches that is a multiple of them (Megatron's interleaved schedule)")
    if not heavy_last_stage >= 1.0:
        raise UsageError("--heavy-last-stage X: X is the last stage's compute against the others', at least 1")
    if not (0.0 <= uneven[0] <= 1.0 and uneven[1] >= 1.0):
        raise UsageError("--uneven-microbatches P:X: P a chance from 0 to 1, X a factor of at least 1")
    world = layout.world
    if any(s.cause not in ("compute", "gpu") for s in stragglers):
        raise UsageError("--job megatron: a straggler's compute is slower (cause=compute or cause=gpu)")
    stragglers = synth._check_stragglers(stragglers, world, steps)
    out = Path(output_dir)
    synth_export.check_output(out, overwrite)
    sim = simulate(layout, steps, microbatches, stragglers, heavy_last_stage, seed, p2p_sync, uneven, virtual)
    if uneven[0] > 0:  # the same job with every micro-batch even: what the long ones cost
        even = simulate(layout, steps, microbatches, stragglers, heavy_last_stage, seed, p2p_sync, virtual=virtual)
        sim["uneven_cost_ns"] = [int(a[1].max() - b[1].max()) for a, b in zip(sim["steps"], even["steps"], strict=True)]
    schema = synth_export.schema_of("newer")
    schema["tables"].update(PAYLOAD_TABLES)
    names = list(dict.fromkeys([*COMPUTE["F"], *COMPUTE["B"], OPTIMIZER_KERNEL, TP_KERNEL, DP_KERNEL, P2P_KERNEL,
                                synth.LAUNCH_API, SYNC_API, synth.MAIN_THREAD_NAME, synth.WORKER_THREAD_NAME]))
    strings = {n: i for i, n in enumerate(names)}
    rng = np.random.default_rng(seed + 1)
    offsets = np.round(rng.uniform(0, 5 * MS, size=world)).astype(np.int64)
    first_step = int(offsets.max()) + synth.FIRST_STEP_NS
    shared = {**synth_export.shared_tables(strings, schema),
              **{t: synth_export.typed(t, df, schema) for t, df in _schema_tables().items()}}
    with staged_output(out, replace=True) as tmp:
        for r in range(world):
            shift = first_step - int(offsets[r])
            frames = synth._rank_info_tables(r, synth.BASE_UTC_NS + int(offsets[r]), world, gpus_per_node, strings)
            events = _rank_events(r, sim, shift, r % gpus_per_node, strings, payloads, -800 * MS)
            path = tmp / (f"rank{r}.sqlite" if fmt == "sqlite" else f"rank{r}_pqtdir")
            with synth_export.export_writer(path, fmt, schema) as write:
                write({**shared, **{t: synth_export.typed(t, df, schema) for t, df in {**frames, **events}.items()}})
        truth = _truth(layout, sim, steps, microbatches, stragglers, heavy_last_stage, payloads, seed, fmt,
                       gpus_per_node, offsets, first_step, p2p_sync, uneven, virtual)
        (tmp / "truth.json").write_text(json.dumps(truth, indent=1))
        (tmp / "README.md").write_text(_readme(truth))
    return out


def _truth(layout, sim, steps, microbatches, stragglers, heavy, payloads, seed, fmt, gpus_per_node, offsets,
           first_step, p2p_sync: bool = False, uneven: tuple[float, float] = (0.0, 1.0), virtual: int = 1) -> dict:
    earliest = int(offsets.min())
    P = layout.pp
    return {
        "synthetic": True,
        "note": "SYNTHETIC data written by nsys-recipe-pack's generator; not a real profile",
        "generator": "nsys-recipe-pack synth --job megatron",
        "job": "megatron", "ranks": layout.world, "iterations": steps, "format": fmt, "seed": seed,
        "gpus_per_node": gpus_per_node, "parallel": asdict(layout), "microbatches": microbatches,
        "schedule": "interleaved 1F1B" if virtual > 1 else "1F1B", "virtual_stages": virtual,
        "nvtx_payload": payloads, "iteration_delimiter": "step", "p2p_sync": p2p_sync,
        "heavy_last_stage": heavy, "heavy_stage": P - 1 if heavy > 1 and P > 1 else None,
        "nominal_ms": {"forward": FWD_MS, "backward": BWD_MS, "optimizer": OPT_MS},
        "transfer_ns": {"tp": TP_TRANSFER_NS, "pp": P2P_TRANSFER_NS, "dp": DP_TRANSFER_NS},
        "bytes": {"tp": TP_BYTES, "pp": P2P_BYTES, "dp": DP_BYTES},
        "kernels": {"tp": TP_KERNEL, "pp": P2P_KERNEL, "dp": DP_KERNEL},
        "streams": {"compute": COMPUTE_STREAM, "tp": TP_STREAM, "pp": PP_STREAM, "dp": DP_STREAM},
        "communicators": [{"id": c["id"], "group": c["kind"], "members": c["members"]} for c in sim["comms"]],
        "stragglers": [asdict(s) for s in stragglers],
        "cells": [{"rank": s.rank, "iteration": i} for s in stragglers
                  for i in range(s.first, (steps - 1 if s.last == -1 else s.last) + 1)],
        # the long micro-batches, and how much later each step ended than the same job's with every one even (its
        # last rank's end): the steps before it count too, as the whole job ran later
        "uneven_microbatches": {"chance": uneven[0], "factor": uneven[1], "long": sim["long_microbatches"],
                                "cost_until_step_end_ns": sim.get("uneven_cost_ns", [0] * steps)},
        "session_start_utc_ns": [synth.BASE_UTC_NS + int(o) for o in offsets],
        "session_offsets_ns": offsets.tolist(),
        # each rank's step on the common clock of the pack's outputs (ns since the earliest session start)
        "step_end_aligned_ns": [(end + first_step - earliest).ravel().tolist() for _, end in sim["steps"]],
    }


def _readme(truth: dict) -> str:
    p = truth["parallel"]
    ext = "rank{R}.sqlite" if truth["format"] == "sqlite" else "rank{R}_pqtdir/"
    return (
        "# SYNTHETIC exports of a Megatron-style job\n\n"
        "Written by nsys-recipe-pack's generator (`nsys-recipe synth --job megatron`), not by a profiler: these are "
        f"**not real profiles**. Each rank's export (`{ext}`) has the shape of a newer Nsight Systems export and a "
        "`SYNTHETIC` row in `META_DATA_EXPORT`.\n\n"
        f"- tp={p['tp']}, pp={p['pp']}, dp={p['dp']} ({truth['ranks']} ranks, Megatron Core's rank order), "
        f"{truth['iterations']} steps of {truth['microbatches']} micro-batches in a {truth['schedule']} schedule"
        + (f" of {truth['virtual_stages']} model chunks per stage" if truth["virtual_stages"] > 1 else "") + ", seed "
        f"{truth['seed']}.\n"
        "- NCCL kernels per communicator (tensor-parallel all-reduces, pipeline SendRecv, the data-parallel gradient "
        "all-reduce) with NCCL's NVTX ranges" + (" and their payloads" if truth["nvtx_payload"] else
                                                 " (payload schemas, but no event carries a payload)") + ".\n"
        "- Every rank's coordinates, the communicators and the injected stragglers are in `truth.json`.\n")


def add_arguments(parser) -> None:
    """The megatron job's own flags on `nsys-recipe synth`."""
    parser.add_argument("--parallel", default=None, metavar="tp=T,pp=P,dp=D",
                        help="--job megatron: the parallel sizes (Megatron Core's rank order)")
    parser.add_argument("--microbatches", type=int, default=8, help="--job megatron: micro-batches per step")
    parser.add_argument("--virtual-stages", type=int, default=1, metavar="V",
                        help="--job megatron: V model chunks per stage in Megatron's interleaved 1F1B schedule "
                             "(--num-layers-per-virtual-pipeline-stage; micro-batches a multiple of pp)")
    parser.add_argument("--heavy-last-stage", type=float, default=1.0, metavar="X",
                        help="--job megatron: the last pipeline stage computes X times as long as the others")
    parser.add_argument("--p2p-sync", action="store_true",
                        help="--job megatron: the host launches ahead of its GPU and syncs the device after every "
                             "pipeline exchange and at the step's end (Megatron's batch_p2p_sync)")
    parser.add_argument("--uneven-microbatches", default=None, metavar="P:X",
                        help="--job megatron: each micro-batch of each data-parallel replica computes X times as long "
                             "with chance P (uneven sequence lengths)")
    parser.add_argument("--no-nvtx-payload", action="store_true",
                        help="--job megatron: NCCL's NVTX ranges without payloads (as most exports have them)")


def main(args) -> int:
    """`nsys-recipe synth --job megatron`."""
    from .parallel import parse_parallel

    if not args.parallel:
        raise UsageError("--job megatron needs --parallel tp=T,pp=P,dp=D")
    layout = parse_parallel(args.parallel)
    try:
        stragglers = [synth.parse_straggler(s if "cause=" in s else s + ",cause=compute") for s in args.straggler]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = write_megatron(args.output, layout, args.iterations, args.microbatches, args.format, stragglers,
                         args.heavy_last_stage, not args.no_nvtx_payload, args.seed, args.gpus_per_node,
                         overwrite=args.force_overwrite, p2p_sync=args.p2p_sync,
                         uneven=_uneven(args.uneven_microbatches), virtual=args.virtual_stages)
    print(f"wrote SYNTHETIC exports of a Megatron-style job ({layout.world} ranks: tp={layout.tp}, pp={layout.pp}, "
          f"dp={layout.dp}; {args.iterations} steps of {args.microbatches} micro-batches, {args.format}) to {out} "
          f"(truth in {out / 'truth.json'})")
    return 0


def _uneven(text: str | None) -> tuple[float, float]:
    """--uneven-microbatches P:X as (chance, factor); none: every micro-batch even."""
    if not text:
        return 0.0, 1.0
    try:
        chance, factor = (float(v) for v in text.split(":"))
    except ValueError:
        raise UsageError(f"--uneven-microbatches {text}: give P:X, e.g. 0.1:2 (a micro-batch in ten twice as long)") \
            from None
    return chance, factor
