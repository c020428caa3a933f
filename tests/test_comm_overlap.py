"""comm_overlap: a hand-worked case, the SYNTHETIC NCCL job against a reference computed in plain Python from
its SQLite export, and a real two-GPU NCCL export against SQL."""

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nsys_recipe_pack import runner
from nsys_recipe_pack.recipes.comm_overlap import KINDS, collective_kind, overlap_by_window
from nsys_recipe_pack.synth import write_synthetic

REAL = Path(__file__).resolve().parent / "data" / "nccl_2gpu_h100" / "mfu_2gpu_before.sqlite"


@pytest.mark.parametrize("name, kind", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "all_reduce"), ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "send_recv"),
    ("ncclDevKernel_Broadcast_RING_LL", "broadcast"), ("ncclDevKernel_Reduce_Sum_f32_RING_LL", "reduce"),
    ("ncclDevKernel_Generic", "other"), ("vectorized_elementwise_kernel", None), ("my_ncclKernel_copy", None)])
def test_collective_kind_from_the_kernel_name(name, kind):
    assert collective_kind(name) == (-1 if kind is None else KINDS.index(kind))


def test_a_hand_worked_window():
    # compute A [0,10), B [20,30), C [25,40) (B and C overlap); all_reduce X [5,22); send_recv Y [38,50)
    start = np.array([0, 20, 25, 5, 38])
    end = np.array([10, 30, 40, 22, 50])
    kind = np.array([-1, -1, -1, KINDS.index("all_reduce"), KINDS.index("send_recv")])
    totals, per_kind = overlap_by_window(np.zeros(5, np.int64), kind, start, end, 1)
    # busy [0,50); compute [0,10) + [20,40) = 30; comm [5,22) + [38,50) = 29; X beside compute: [5,10) + [20,22),
    # Y: [38,40): 9 overlapped; exposed comm [10,20) + [40,50) = 20; compute alone [0,5) + [22,38) = 21
    assert {k: int(v[0]) for k, v in totals.items()} == {
        "busy_ns": 50, "compute_ns": 30, "comm_ns": 29, "overlapped_ns": 9, "exposed_comm_ns": 20,
        "exposed_compute_ns": 21}
    rows = pd.DataFrame(per_kind).assign(kind=lambda d: np.array(KINDS)[d["kind"]]).set_index("kind")
    assert rows.loc["all_reduce", ["kernels", "comm_ns", "overlapped_ns", "exposed_ns"]].tolist() == [1, 17, 7, 10]
    assert rows.loc["send_recv", ["kernels", "comm_ns", "overlapped_ns", "exposed_ns"]].tolist() == [1, 12, 2, 10]
    # a collective beside two compute kernels that overlap each other: [26,29) is overlapped for 3 ns, where a
    # sum over the compute kernels (nccl_gpu_overlap_trace's "Compute Sum") would count 6
    totals, _ = overlap_by_window(np.zeros(3, np.int64), np.array([-1, -1, 0]), np.array([20, 25, 26]),
                                  np.array([30, 40, 29]), 1)
    assert int(totals["overlapped_ns"][0]) == 3 and int(totals["exposed_comm_ns"][0]) == 0


def _merged(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _reference(export: Path) -> dict:
    """Per iteration (the NVTX "step" ranges), from the export by SQL and plain Python: communication (NCCL
    kernels merged), the part of it that lies inside merged compute kernels, and the rest."""
    with sqlite3.connect(export) as db:
        steps = db.execute("SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                           "WHERE COALESCE(e.text, s.value) = 'step' ORDER BY e.start").fetchall()
        kernels = db.execute("SELECT k.start, k.end, s.value LIKE 'nccl%' FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                             "JOIN StringIds s ON s.id = k.shortName").fetchall()
    out = {}
    for i, (w0, w1) in enumerate(steps):
        clipped = [(max(s, w0), min(e, w1), nccl) for s, e, nccl in kernels if s < w1 and e > w0]
        comm = _merged([(s, e) for s, e, nccl in clipped if nccl])
        compute = _merged([(s, e) for s, e, nccl in clipped if not nccl])
        both = sum(max(0, min(ce, pe) - max(cs, ps)) for cs, ce in comm for ps, pe in compute)
        total = sum(e - s for s, e in comm)
        out[i] = (total, both, total - both)
    return out


def test_synthetic_nccl_job_matches_a_plain_reference(tmp_path):
    data = write_synthetic(tmp_path / "syn", ranks=3, iterations=6, fmt="sqlite")
    # the generator's all-reduce starts once the backward kernels are done; moved earlier by a different amount
    # on each rank, part of it runs beside them (the compute kernels on two streams overlap one another too)
    for rank, export in enumerate(sorted(data.glob("rank*.sqlite"))):
        with sqlite3.connect(export) as db:
            db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start - ?1, end = end - ?1 WHERE shortName IN "
                       "(SELECT id FROM StringIds WHERE value LIKE 'nccl%')", ((rank + 2) * 1_000_000,))
    out = runner.run("comm_overlap", [str(data)], str(tmp_path / "o"), mode="none", engine="pack", options={})
    windows = pd.read_parquet(out / "windows.parquet")
    files = pd.read_parquet(out / "files.parquet").set_index("rank")["file"]
    assert json.loads((out / "analysis.json").read_text())["delimiter"]["name"] == "step"
    for rank, rows in windows.groupby("rank"):
        want = _reference(Path(files[rank]))
        got = {int(r.iteration): (r.comm_ns, r.overlapped_ns, r.exposed_comm_ns) for r in rows.itertuples()}
        assert got == want, rank
        assert rows["overlapped_ns"].gt(0).all() and rows["exposed_comm_ns"].gt(0).any()
    ranks = pd.read_parquet(out / "ranks.parquet")
    assert (ranks["comm_ns"] == windows.groupby("rank")["comm_ns"].sum().to_numpy()).all()
    kinds = pd.read_parquet(out / "collectives.parquet")
    assert set(kinds["kind"]) == {"all_reduce"} and (kinds["kernels"] == 1).all()  # one all-reduce per step


def test_real_two_gpu_nccl_export_against_sql(tmp_path):
    out = runner.run("comm_overlap", [str(REAL)], str(tmp_path / "o"), mode="none", engine="pack", options={})
    windows = pd.read_parquet(out / "windows.parquet")
    files = pd.read_parquet(out / "files.parquet").set_index("rank")
    delimiter = json.loads((out / "analysis.json").read_text())["delimiter"]
    assert not delimiter["name"].startswith("nccl")  # NCCL's own API ranges never delimit iterations
    with sqlite3.connect(REAL) as db:
        for rank, rows in windows.groupby("rank"):
            device = int(files.loc[rank, "gpu"])
            w0, w1 = int(rows["start_ns"].min()), int(rows["end_ns"].max())  # the windows tile this span
            assert (rows["start_ns"].to_numpy()[1:] == rows["end_ns"].to_numpy()[:-1]).all()
            comm, overlapping = db.execute(
                "SELECT SUM(MIN(k.end, ?2) - MAX(k.start, ?1)), "
                "(SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL c JOIN StringIds cs ON cs.id = c.shortName "
                " WHERE c.deviceId = ?3 AND cs.value NOT LIKE 'nccl%' AND c.start < ?2 AND c.end > ?1 "
                " AND EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL n JOIN StringIds ns ON ns.id = n.shortName "
                "  WHERE n.deviceId = ?3 AND ns.value LIKE 'nccl%' AND n.start < c.end AND c.start < n.end)) "
                "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                "WHERE k.deviceId = ?3 AND s.value LIKE 'nccl%' AND k.start < ?2 AND k.end > ?1",
                (w0, w1, device)).fetchone()
            assert overlapping == 0  # one stream per GPU: nothing runs beside a collective
            assert rows["comm_ns"].sum() == comm and rows["exposed_comm_ns"].sum() == comm
            assert rows["overlapped_ns"].sum() == 0
    kinds = pd.read_parquet(out / "collectives.parquet")
    assert set(kinds["kind"]) == {"send_recv"}
