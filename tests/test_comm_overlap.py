"""comm_overlap: a hand-worked case, the SYNTHETIC NCCL job against a reference computed in plain Python from
its SQLite export and against Nsight Systems' nccl_gpu_overlap_trace, and a real two-GPU NCCL export against SQL."""

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from nsys_recipe_pack import nsys_tool, runner
from nsys_recipe_pack.collective_match import KINDS, collective_kind
from nsys_recipe_pack.recipes.comm_overlap import overlap_by_window
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


def test_windows_of_compute_only_or_of_communication_only():
    # two windows: [0,10) and [5,12) overlapping in the first (union 12), [30,35) alone in the second (5)
    group, start, end = np.array([0, 0, 1]), np.array([0, 5, 30]), np.array([10, 12, 35])
    totals, per_kind = overlap_by_window(group, np.full(3, -1), start, end, 3)  # a third window without kernels
    assert {k: v.tolist() for k, v in totals.items()} == {
        "busy_ns": [12, 5, 0], "compute_ns": [12, 5, 0], "comm_ns": [0, 0, 0], "overlapped_ns": [0, 0, 0],
        "exposed_comm_ns": [0, 0, 0], "exposed_compute_ns": [12, 5, 0]}
    assert all(len(v) == 0 for v in per_kind.values())
    totals, per_kind = overlap_by_window(group, np.full(3, KINDS.index("all_reduce")), start, end, 3)
    assert {k: v.tolist() for k, v in totals.items()} == {
        "busy_ns": [12, 5, 0], "compute_ns": [0, 0, 0], "comm_ns": [12, 5, 0], "overlapped_ns": [0, 0, 0],
        "exposed_comm_ns": [12, 5, 0], "exposed_compute_ns": [0, 0, 0]}
    assert {k: v.tolist() for k, v in per_kind.items()} == {
        "group": [0, 1], "kind": [KINDS.index("all_reduce")] * 2, "kernels": [2, 1], "comm_ns": [12, 5],
        "overlapped_ns": [0, 0], "exposed_ns": [12, 5]}


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
    # each all-reduce is launched inside the step's "allreduce" range: that phase holds all the communication
    phases = pd.read_parquet(out / "phases.parquet")
    assert set(phases["phase"]) == {"allreduce"} and (phases["kernels"] == 1).all()
    columns = ["rank", "iteration", "comm_ns", "overlapped_ns"]
    pd.testing.assert_frame_equal(phases[columns].reset_index(drop=True), windows[columns].reset_index(drop=True))
    assert (phases["exposed_ns"].to_numpy() == windows["exposed_comm_ns"].to_numpy()).all()


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


NSYS_2024 = nsys_tool.cache_root() / "nsys" / "2024.2" / "target-linux-x64" / "nsys"  # read before the tests' cache
RECIPES_PYTHON = ROOT / ".venv-nsys-recipes" / "bin"  # make test sets it up (Makefile: nsys-recipes-env)
NCCL_DOMAIN = 7


def _as_nvidia_reads_it(data: Path, placeholder: Path) -> list[Path]:
    """The SYNTHETIC NCCL job as Nsight Systems' recipes read it: each rank's Parquet export beside a report of
    its name (a placeholder: the framework reads an export newer than the report instead of exporting again),
    ids as int64 as nsys writes them, and NCCL's NVTX ranges (domain "NCCL") around each NCCL launch, by which
    nccl_gpu_overlap_trace tells communication kernels; the all-reduce moved earlier, into backward's kernels."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    reports = []
    for export in sorted(data.glob("rank*_pqtdir")):
        report = export.with_name(export.name.replace("_pqtdir", ".nsys-rep"))
        shutil.copy(placeholder, report)
        reports.append(report)
    time.sleep(0.05)  # the exports' files are written after the placeholders
    for rank, export in enumerate(sorted(data.glob("rank*_pqtdir"))):
        strings = pq.read_table(export / "StringIds.parquet").to_pydict()
        nccl_ids = [i for i, v in zip(strings["id"], strings["value"], strict=True) if v.startswith("nccl")]
        kernels = pq.read_table(export / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
        nccl = np.isin(kernels["shortName"].to_numpy(), nccl_ids)
        for column in ("start", "end"):
            moved = kernels[column].to_numpy() - np.where(nccl, 1_000_000 + 400_000 * rank, 0)
            kernels = kernels.set_column(kernels.column_names.index(column), column,
                                         pa.array(moved, kernels.schema.field(column).type))
        pq.write_table(kernels, export / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
        calls = pq.read_table(export / "CUPTI_ACTIVITY_KIND_RUNTIME.parquet").to_pandas()
        calls = calls[calls["correlationId"].isin(kernels["correlationId"].to_numpy()[nccl])]
        nvtx = pq.read_table(export / "NVTX_EVENTS.parquet")
        rows = {"start": [int(calls["start"].min()) - 10, *(calls["start"] - 1000)],
                "end": [None, *(calls["end"] + 1000)], "eventType": [75] + [59] * len(calls),
                "text": ["NCCL"] + ["ncclAllReduce"] * len(calls),
                "globalTid": [int(calls["globalTid"].iloc[0]), *calls["globalTid"].astype("int64")],
                "domainId": [NCCL_DOMAIN] * (len(calls) + 1)}
        added = pa.table({f.name: pa.array(rows[f.name], f.type) if f.name in rows else pa.nulls(len(calls) + 1, f.type)
                          for f in nvtx.schema}, schema=nvtx.schema)
        pq.write_table(pa.concat_tables([nvtx, added]), export / "NVTX_EVENTS.parquet")
        for table in export.glob("*.parquet"):
            t = pq.read_table(table)
            for column in ("globalTid", "globalPid", "endGlobalTid"):
                if column in t.column_names:
                    t = t.set_column(t.column_names.index(column), column, t[column].cast(pa.int64()))
            pq.write_table(t, table)
    return reports


def test_overlap_equals_nccl_gpu_overlap_trace(tmp_path):
    assert NSYS_2024.exists(), "run `nsys-recipe setup-nsys --version 2024.2` (make test does)"
    assert (RECIPES_PYTHON / "python").exists(), "run `make nsys-recipes-env` (make test does)"
    data = write_synthetic(tmp_path / "syn", ranks=3, iterations=5, fmt="parquetdir")
    reports = _as_nvidia_reads_it(data, ROOT / "sample_reports" / "cpu_ddp" / "rank0.nsys-rep")
    env = dict(os.environ, PATH=f"{RECIPES_PYTHON}{os.pathsep}{os.environ['PATH']}")
    builtin = subprocess.run([str(NSYS_2024), "recipe", "nccl_gpu_overlap_trace", "--mode", "none", "--output",
                              str(tmp_path / "nvidia"), "--input", *map(str, reports)],
                             env=env, capture_output=True, text=True, timeout=600)
    assert builtin.returncode == 0, builtin.stderr[-3000:]
    theirs = pd.read_parquet(tmp_path / "nvidia" / "rank_trace.parquet").reset_index()
    theirs = theirs[theirs["Name"].str.startswith("nccl")].sort_values(["Rank", "Start"])
    out = runner.run("comm_overlap", [str(p) for p in sorted(data.glob("rank*_pqtdir"))], str(tmp_path / "o"),
                     mode="none", engine="pack", options={})
    ours = pd.read_parquet(out / "windows.parquet").sort_values(["rank", "iteration"])
    # one all-reduce per iteration, inside it: our window's communication is that kernel
    assert len(ours) == len(theirs) == 15
    assert ours["comm_ns"].tolist() == (theirs["End"] - theirs["Start"]).tolist()
    assert ours["overlapped_ns"].gt(0).all()
    # theirs: percent of the kernel, to one decimal
    pct = 100 * ours["overlapped_ns"].to_numpy() / ours["comm_ns"].to_numpy()
    np.testing.assert_allclose(pct, theirs["Compute Overlap"].to_numpy(), atol=0.05 + 1e-9)
    assert (theirs["Communication Overlap"] == 0).all()  # one all-reduce at a time


def test_kernels_launched_inside_nccl_ranges_are_communication_whatever_their_name(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = write_synthetic(tmp_path / "syn", ranks=2, iterations=4, fmt="parquetdir")
    _as_nvidia_reads_it(data, ROOT / "sample_reports" / "cpu_ddp" / "rank0.nsys-rep")
    exports = [str(p) for p in sorted(data.glob("rank*_pqtdir"))]
    by_name = runner.run("comm_overlap", exports, str(tmp_path / "a"), mode="none", engine="pack", options={})
    for export in sorted(data.glob("rank*_pqtdir")):  # the NCCL kernels renamed: only NCCL's ranges tell them
        strings = pq.read_table(export / "StringIds.parquet")
        renamed = [f"fused_collective_{i}" if v.startswith("nccl") else v
                   for i, v in enumerate(strings["value"].to_pylist())]
        strings = strings.set_column(strings.column_names.index("value"), "value",
                                     pa.array(renamed, strings.schema.field("value").type))
        pq.write_table(strings, export / "StringIds.parquet")
    by_range = runner.run("comm_overlap", exports, str(tmp_path / "b"), mode="none", engine="pack", options={})
    for table in ("windows", "collectives", "phases"):
        pd.testing.assert_frame_equal(pd.read_parquet(by_range / f"{table}.parquet"),
                                      pd.read_parquet(by_name / f"{table}.parquet"))
    assert pd.read_parquet(by_range / "windows.parquet")["comm_ns"].gt(0).all()
