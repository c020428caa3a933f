"""comm_overlap on a long capture, a few iterations at a time as its tables are read (iteration_slices): the same map
as over whole tables, however the tables are cut, and the whole read where slices cannot give it."""

import shutil
import sqlite3

import numpy as np
import pytest
from conftest import folded, rank_maps
from test_batches import REAL_GLOO, synthetic  # noqa: F401 (a fixture)
from test_comm_overlap import REAL
from test_straggler_spans import mpi_job  # noqa: F401 (a fixture)

from nsys_recipe_pack import iteration_slices, recipes, synth
from nsys_recipe_pack.inputs import load_file, rank_data, readers
from nsys_recipe_pack.recipes import comm_overlap as co

SPEC = recipes.get("comm_overlap")


def _same(path, options) -> list:
    whole, sliced = rank_maps(SPEC, path, options, False), rank_maps(SPEC, path, options, True)
    assert len(whole) == len(sliced), path
    for want, got in zip(whole, sliced, strict=True):
        assert _differences(want, got) == [], (path, options)
    return whole


def _differences(want, got) -> list:
    if isinstance(want, str) or isinstance(got, str):
        return [] if got == want else [(want, got)]
    out = [k for k in ("delimiter", "totals") if got[k] != want[k]]
    out += ["start_ns"] if not np.array_equal(got["start_ns"], want["start_ns"]) else []
    for table in ("windows", "by_kind", "by_phase", "by_channel"):
        out += [(table, c) for c in want[table].column_names if not want[table][c].equals(got[table][c])]
    # the exposed communication as time and the NCCL kernels, whatever their order
    pairs = [np.sort(np.stack([m["exposed"]["start_ns"], m["exposed"]["end_ns"]]), axis=1) for m in (want, got)]
    out += ["exposed"] if not np.array_equal(*pairs) else []
    kernels = [m["nccl_kernels"].to_pandas().sort_values(["start_ns", "end_ns", "stream"]).reset_index(drop=True)
               for m in (want, got)]
    out += ["nccl_kernels"] if not kernels[0].equals(kernels[1]) else []
    return out


@pytest.mark.parametrize("batch_rows", [7, 1000])
def test_slices_give_the_whole_reads_map(synthetic, mpi_job, monkeypatch, batch_rows):  # noqa: F811
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    nccl = [synthetic["sqlite"][1], synthetic["parquetdir"][2]]
    for path in [REAL_GLOO, *nccl, mpi_job[1]]:  # the MPI job's iterations are a kernel's launches
        kernel = load_file(path, {"kernel"})[0].frame("kernels").codes("name")[1][0]
        for options in ({}, {"iteration": "step"}, {"iteration_kernel": kernel}, {"iteration": "nope"}):
            whole = _same(path, options)
            if path in nccl and not options:  # communication, beside compute, launched inside phases
                m = whole[0]
                assert len(m["windows"]["iteration"]) >= 6 and m["windows"]["comm_ns"].to_numpy().sum() > 0, path
                assert len(m["by_kind"]["kind"]) >= 6 and len(m["by_phase"]["phase"]) >= 6, path


def test_what_slices_cannot_answer_is_read_whole(tmp_path, monkeypatch):
    """A rank without iterations is one window over its whole capture; a real NCCL export whose runtime calls are not
    in time order; both read whole, with the whole read's answer."""
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    path = tmp_path / "flat.sqlite"
    shutil.copy(REAL_GLOO, path)
    with sqlite3.connect(path) as db:  # no NVTX: no iterations, and no kernel repeats enough
        db.execute("DELETE FROM NVTX_EVENTS")
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid NOT IN "
                   "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 3)")
    for export in (path, REAL):
        pairs = folded(SPEC, export, {})
        assert all(result is None for _, result in pairs), export
        ranks = [r for r, _ in pairs]
        whole = [SPEC.map_rank(r, {}) for r in load_file(export, set(SPEC.needs))]
        assert [_differences(w, SPEC.map_rank(r, {})) for w, r in zip(whole, ranks, strict=True)] == [[]] * len(ranks)
    assert whole[0]["delimiter"]["kind"] != "capture" and len(whole[0]["windows"]["iteration"]) > 1
    flat = SPEC.map_rank(load_file(path, set(SPEC.needs))[0], {})
    assert flat["delimiter"]["kind"] == "capture" and len(flat["windows"]["iteration"]) == 1


NCCL_CALLS = ("FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IN (SELECT correlationId FROM "
              "CUPTI_ACTIVITY_KIND_KERNEL WHERE shortName IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%'))")


def _fused_nccl_rank(tmp_path, move):
    """A SYNTHETIC NCCL rank whose collectives are named only by NCCL's NVTX ranges (as fused kernels are): its
    export after `move(db, iteration starts, (rowid, correlation id) of the first collective to run in the third)`
    has moved rows, NCCL's ranges then drawn around the collectives' calls, and its tables in time order again, as
    exports are."""
    data = synth.write_synthetic(tmp_path / "syn", ranks=1, iterations=8, fmt="sqlite", job="nccl", seed=2)
    path = next(data.glob("*.sqlite"))
    it = SPEC.map_rank(load_file(path, set(SPEC.needs))[0], {})["start_ns"]
    with sqlite3.connect(path) as db:
        late = db.execute("SELECT rowid, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start > ? AND shortName "
                          "IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%') ORDER BY start LIMIT 1",
                          (int(it[2]),)).fetchone()
        move(db, it, late)
        db.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) "
                   f"SELECT min(start) - 2000, 75, 'NCCL', globalTid, 7 {NCCL_CALLS}")
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                   f"SELECT start - 1000, end + 1000, 59, 'ncclAllReduce', globalTid, 7 {NCCL_CALLS}")
        db.execute("UPDATE StringIds SET value = 'fused_' || id WHERE value LIKE 'nccl%'")
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
            db.execute(f"CREATE TABLE t AS SELECT * FROM {table} ORDER BY start")
            db.execute(f"DELETE FROM {table}")
            db.execute(f"INSERT INTO {table} SELECT * FROM t")
            db.execute("DROP TABLE t")
    return path


def _late_by_two_iterations(db, it, late) -> None:
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + ?1, end = end + ?1 WHERE rowid = ?2",
               (int(it[4] - it[2]), late[0]))


def test_a_collective_queued_iterations_after_its_launch_keeps_its_kind_and_phase(tmp_path, monkeypatch):
    """One all-reduce queued two iterations after its launch: by the time it runs, the ranges around its launch are
    let go; what they told of it (all_reduce, phase "allreduce") was carried, and the map is the whole read's."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 20)
    path = _fused_nccl_rank(tmp_path, _late_by_two_iterations)
    whole = _same(path, {})[0]
    kinds, phases = whole["by_kind"].to_pandas(), whole["by_phase"].to_pandas()
    assert kinds["kernels"][kinds["iteration"] == 4].tolist() == [2] and set(kinds["kind"]) == {"all_reduce"}
    assert phases["kernels"][phases["iteration"] == 4].tolist() == [2] and set(phases["phase"]) == {"allreduce"}
    # what was carried is what made it so: let go with the ranges, the late kernel is compute in another phase
    let_go = iteration_slices._let_go
    monkeypatch.setattr(iteration_slices, "_let_go", lambda rank, before, pending: let_go(rank, before, pending)[:0])
    forgot = rank_maps(SPEC, path, {}, True)[0]["by_kind"].to_pandas()
    assert forgot["kernels"][forgot["iteration"] == 4].tolist() == [1]


@pytest.mark.parametrize("batch_rows", [1, 7])  # spans that end in the gap, past NCCL's range
def test_a_collective_launched_between_iterations_keeps_the_range_it_was_launched_in(tmp_path, monkeypatch,
                                                                                      batch_rows):
    """An all-reduce launched in the gap between two iterations, outside them, and run two iterations later: NCCL's
    range around its call is kept while the kernel is still to come, though no iteration holds the call."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)

    def between(db, it, late):
        end = db.execute("SELECT end FROM NVTX_EVENTS WHERE text = 'step' AND start = ?", (int(it[2]),)).fetchone()[0]
        assert end + 40_000 < it[3]  # the gap between the steps holds the call and NCCL's range around it
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = ?1, end = ?1 + 10000 WHERE correlationId = ?2",
                   (end + 20_000, late[1]))
        # and a call that launches nothing after it, still in the gap: a span may end there, past NCCL's range
        db.execute("CREATE TEMP TABLE idle AS SELECT * FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = ?",
                   (late[1],))
        db.execute("UPDATE idle SET start = start + 20000, end = end + 20000, "
                   "correlationId = (SELECT max(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME)")
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT * FROM idle")
        _late_by_two_iterations(db, it, late)

    path = _fused_nccl_rank(tmp_path, between)
    whole = _same(path, {})[0]
    kinds, phases = whole["by_kind"].to_pandas(), whole["by_phase"].to_pandas()
    assert kinds["kernels"][kinds["iteration"] == 4].tolist() == [2] and set(kinds["kind"]) == {"all_reduce"}
    assert phases["kernels"][phases["iteration"] == 4].tolist() == [1]  # the moved one launched in no phase


def test_carried_phase_names_become_codes_into_the_names_grown():
    # names an earlier piece carried: one among the piece's range names, one new (twice), none
    words, codes = co._coded(np.array(["forward", "backward", None], object),
                             np.array(["backward", None, "optimizer", "forward", "optimizer"], object))
    assert words.tolist() == ["forward", "backward", "optimizer", None]
    assert codes.tolist() == [1, -1, 2, 0, 2]


def test_a_long_capture_of_a_parallel_job_gives_the_whole_reads_tables(tmp_path, monkeypatch):
    """SYNTHETIC Megatron-style job (tp=2, pp=2, dp=2), its NCCL calls without payloads: read span by span, 7 rows a
    batch, its NCCL kernels kept as they pass give comm_overlap's and straggler_heatmap's tables as a whole read
    gives them: the groups inferred from the kernels, the exposure per group, the waiting split."""
    import pandas as pd

    from nsys_recipe_pack import parallel, run_recipe
    from nsys_recipe_pack.synth_megatron import write_megatron

    job = write_megatron(tmp_path / "job", parallel.Layout(tp=2, pp=2, dp=2), steps=4, microbatches=4, fmt="sqlite",
                         payloads=False)
    whole = {name: run_recipe(name, [str(job)], str(tmp_path / f"{name}-whole"), mode="none")
             for name in ("comm_overlap", "straggler_heatmap")}
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 7)
    for name, want in whole.items():
        got = run_recipe(name, [str(job)], str(tmp_path / f"{name}-spans"), mode="none")
        assert set(got.tables) == set(want.tables), name
        for table, frame in want.tables.items():
            if table == "files":
                continue
            pd.testing.assert_frame_equal(got.tables[table], frame, obj=f"{name} {table}")
    assert {"groups_exposure", "groups"} <= set(whole["comm_overlap"].tables)
    assert "waiting_ns" in whole["comm_overlap"].tables["ranks"]
