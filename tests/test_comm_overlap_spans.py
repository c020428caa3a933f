"""comm_overlap on a long capture, a few iterations at a time as its tables are read (iteration_slices): the same map
as over whole tables, however the tables are cut, and the whole read where slices cannot give it."""

import shutil
import sqlite3

import numpy as np
import pytest
from conftest import rank_maps
from test_comm_overlap import REAL
from test_selection import REAL_GLOO, synthetic  # noqa: F401 (a fixture)

from nsys_recipe_pack import iteration_slices, recipes, synth
from nsys_recipe_pack.inputs import load_file, rank_data, readers

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
    out = [k for k in ("delimiter",) if got[k] != want[k]]
    out += ["start_ns"] if not np.array_equal(got["start_ns"], want["start_ns"]) else []
    for table in ("windows", "by_kind", "by_phase"):
        out += [(table, c) for c in want[table] if not np.array_equal(got[table][c], want[table][c])]
    return out


@pytest.mark.parametrize("batch_rows", [7, 1000])
def test_slices_give_the_whole_reads_map(synthetic, monkeypatch, batch_rows):  # noqa: F811
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    for path in [REAL_GLOO, synthetic["sqlite"][1], synthetic["parquetdir"][2]]:
        for options in ({}, {"iteration": "step"}, {"iteration": "nope"}):
            whole = _same(path, options)
            if path != REAL_GLOO and not options:  # communication, beside compute, launched inside phases
                m = whole[0]
                assert len(m["windows"]["iteration"]) >= 6 and m["windows"]["comm_ns"].sum() > 0, path
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
        ranks = load_file(export, set(SPEC.needs), stream=SPEC.stream_given({}))
        assert all(r.streamed is None for r in ranks), export
        whole = [SPEC.map_rank(r, {}) for r in load_file(export, set(SPEC.needs))]
        assert [_differences(w, SPEC.map_rank(r, {})) for w, r in zip(whole, ranks, strict=True)] == [[]] * len(ranks)
    assert whole[0]["delimiter"]["kind"] != "capture" and len(whole[0]["windows"]["iteration"]) > 1
    flat = SPEC.map_rank(load_file(path, set(SPEC.needs))[0], {})
    assert flat["delimiter"]["kind"] == "capture" and len(flat["windows"]["iteration"]) == 1


def test_a_collective_queued_iterations_after_its_launch_keeps_its_kind_and_phase(tmp_path, monkeypatch):
    """A SYNTHETIC NCCL rank whose kernels are named only by NCCL's ranges (as fused kernels are), one all-reduce
    queued two iterations after its launch: by the time it runs, the ranges around its launch are let go; what they
    told of it (all_reduce, phase "allreduce") was carried, and the map is the whole read's."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 20)
    data = synth.write_synthetic(tmp_path / "syn", ranks=1, iterations=8, fmt="sqlite", job="nccl", seed=2)
    path = next(data.glob("*.sqlite"))
    it = SPEC.map_rank(load_file(path, set(SPEC.needs))[0], {})["start_ns"]
    with sqlite3.connect(path) as db:
        nccl_calls = ("FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IN (SELECT correlationId FROM "
                      "CUPTI_ACTIVITY_KIND_KERNEL WHERE shortName IN "
                      "(SELECT id FROM StringIds WHERE value LIKE 'nccl%'))")
        db.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) "
                   f"SELECT min(start) - 10, 75, 'NCCL', globalTid, 7 {nccl_calls}")
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                   f"SELECT start - 1000, end + 1000, 59, 'ncclAllReduce', globalTid, 7 {nccl_calls}")
        db.execute("UPDATE StringIds SET value = 'fused_' || id WHERE value LIKE 'nccl%'")
        late = db.execute("SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start > ? AND shortName IN (SELECT id "
                          "FROM StringIds WHERE value LIKE 'fused%') ORDER BY start LIMIT 1", (int(it[2]),)).fetchone()
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + ?1, end = end + ?1 WHERE rowid = ?2",
                   (int(it[4] - it[2]), late[0]))
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"):  # in time order again, as exports are
            db.execute(f"CREATE TABLE t AS SELECT * FROM {table} ORDER BY start")
            db.execute(f"DELETE FROM {table}")
            db.execute(f"INSERT INTO {table} SELECT * FROM t")
            db.execute("DROP TABLE t")
    whole = _same(path, {})[0]
    kinds, phases = whole["by_kind"], whole["by_phase"]
    assert kinds["kernels"][kinds["iteration"] == 4].tolist() == [2] and set(kinds["kind"]) == {"all_reduce"}
    assert phases["kernels"][phases["iteration"] == 4].tolist() == [2] and set(phases["phase"]) == {"allreduce"}
    # what was carried is what made it so: let go with the ranges, the late kernel is compute in another phase
    let_go = iteration_slices._let_go
    monkeypatch.setattr(iteration_slices, "_let_go", lambda rank, before, pending, carried: let_go(
        rank, before, pending, {c: v[:0] for c, v in carried.items()}))
    forgot = rank_maps(SPEC, path, {}, True)[0]
    assert forgot["by_kind"]["kernels"][forgot["by_kind"]["iteration"] == 4].tolist() == [1]
