"""straggler_heatmap among peers: a rank compared with its own pipeline stage, a stage slower throughout reported as
stage imbalance with its size, and a straggler's cost named by who waited. Checked on SYNTHETIC Megatron-style jobs
against Megatron's rank order written out here, a hand calculation of the stage's extra work and a direct SQL pairing
of the kernels; and on the real pipeline job against the truth published with it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from nsys_recipe_pack import parallel, run_recipe
from nsys_recipe_pack.synth import parse_straggler
from nsys_recipe_pack.synth_megatron import write_megatron

SAMPLES = Path(__file__).resolve().parents[1] / "sample_reports"
WHATIF = SAMPLES / "whatif_pp4_dp2_long_last_stage"
T, P, D = 2, 2, 4
STEPS, MICROBATCHES, HEAVY = 8, 4, 1.5
STRAGGLER, SLOW_STEPS = 5, (3, 6)
MS = 1_000_000


@pytest.fixture(scope="module", params=[True, False], ids=["payload", "no_payload"])
def heavy(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("heavy") / "job"
    write_megatron(out, parallel.Layout(tp=T, pp=P, dp=D), steps=STEPS, microbatches=MICROBATCHES, fmt="sqlite",
                   heavy_last_stage=HEAVY, payloads=request.param,
                   stragglers=[parse_straggler(f"rank={STRAGGLER},iterations={SLOW_STEPS[0]}-{SLOW_STEPS[1]},"
                                               "cause=compute,slowdown=1.6")])
    res = run_recipe("straggler_heatmap", [str(out)], str(out.parent / "sh"), mode="none")
    return out, res


def _stage(rank: int) -> int:
    return rank // (T * D)  # rank = t + T (d + D p)


def test_a_heavier_last_stage_is_stage_imbalance_not_stragglers(heavy):
    _, res = heavy
    findings = res.tables["findings"]
    assert findings["kind"].tolist() == ["stage_imbalance"]
    row = findings.iloc[0]
    assert row["stage"] == P - 1
    assert list(row["ranks"]) == [r for r in range(T * P * D) if _stage(r) == P - 1]
    # by hand: a stage's busy time per step is its micro-batches' forward (6 ms) and backward (12 ms) compute; the
    # last stage's is 1.5 times as long: 0.5 x 18 ms x 4 micro-batches more
    assert row["cost_ns"] == pytest.approx(0.5 * 18 * MS * MICROBATCHES, rel=0.05)
    assert row["busier_iterations"] == row["iterations"]
    flagged = res.tables["stragglers"]
    assert not any(_stage(r) == P - 1 for r in flagged["rank"])
    assert "stage imbalance" in res.output_dir.joinpath("analysis.json").read_text()


def test_the_straggler_is_flagged_among_its_stage_in_its_steps(heavy):
    _, res = heavy
    flagged = res.tables["stragglers"]
    assert set(flagged["rank"]) == {STRAGGLER}
    assert set(flagged["iteration"]) == set(range(SLOW_STEPS[0], SLOW_STEPS[1] + 1))
    it = res.tables["iterations"]
    assert (it["stage"] == it["rank"].map(_stage)).all()
    groups = res.tables["groups"].set_index("rank")
    for r in range(T * P * D):  # Megatron's order, written out
        t, d, p = r % T, (r // T) % D, r // (T * D)
        assert sorted(groups.at[r, "tp_group"]) == [i + T * (d + D * p) for i in range(T)]
        assert sorted(groups.at[r, "pp_group"]) == [t + T * (d + D * i) for i in range(P)]
        assert sorted(groups.at[r, "dp_group"]) == [t + T * (i + D * p) for i in range(D)]
    line = res.tables["ranks"].set_index("rank").loc[STRAGGLER]
    assert line["waited_tp_ns"] > 0 and line["waited_pp_ns"] > 0 and line["waited_dp_ns"] > 0


def _steps(db) -> np.ndarray:
    """The rank's `step` ranges (start, end), on the common clock."""
    return np.array(db.execute(
        "SELECT e.start + t.utcEpochNs, e.end + t.utcEpochNs FROM NVTX_EVENTS e JOIN TARGET_INFO_SESSION_START_TIME t "
        "LEFT JOIN StringIds s ON s.id = e.textId WHERE coalesce(e.text, s.value) = 'step' ORDER BY e.start"
    ).fetchall(), np.int64)


def _starts(db, stream: int) -> np.ndarray:
    return np.array([s for (s,) in db.execute(
        "SELECT k.start + t.utcEpochNs FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN TARGET_INFO_SESSION_START_TIME t "
        "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel%' AND k.streamId = ? "
        "ORDER BY k.start", (stream,))], np.int64)


def test_who_waited_for_the_straggler_equals_sql(heavy):
    """Per flagged step, what the straggler's TP peer, pipeline neighbour and DP replicas waited for it: its kernels
    of each communicator paired in order with theirs, straight from the exports; the straggler arrived last where its
    kernel started later, and the others waited the gap."""
    out, res = heavy
    truth = json.loads((out / "truth.json").read_text())
    streams = {k: truth["streams"][k] for k in ("tp", "pp", "dp")}
    peers = {"tp": [STRAGGLER - 1], "pp": [STRAGGLER + T * D], "dp": [t for t in range(1, T * D, T) if t != STRAGGLER]}
    with sqlite3.connect(out / f"rank{STRAGGLER}.sqlite") as db:
        steps = _steps(db)
        mine = {k: _starts(db, s) for k, s in streams.items()}
    flagged = res.tables["stragglers"].set_index("iteration")
    for kind, others in peers.items():
        theirs = []
        for r in others:
            with sqlite3.connect(out / f"rank{r}.sqlite") as db:
                theirs.append(_starts(db, streams[kind]))
        late = np.stack([mine[kind] - t for t in theirs])  # the straggler's lateness to each peer, instance by instance
        last = (late > 0).all(axis=0)
        step = np.searchsorted(steps[:, 0], mine[kind], side="right") - 1
        for iteration in flagged.index:
            want = int(late[:, last & (step == iteration)].sum())
            assert flagged.at[iteration, f"waited_{kind}_ns"] == want, (kind, iteration)
        assert want > 0


def test_the_real_pipeline_job_shows_its_long_last_stage_and_no_straggler(tmp_path):
    """The What-if paper's job (pp 4 x dp 2): its groups are found from the kernels alone and equal the published
    coordinates; the last stage is stage imbalance, no worker straggles, and the imbalance is about what the paper's
    what-if analysis says removing it would save per step."""
    truth = json.loads((WHATIF / "truth.json").read_text())
    res = run_recipe("straggler_heatmap", [str(WHATIF)], str(tmp_path / "sh"), mode="none")
    groups = res.tables["groups"].set_index("rank")
    for r, where in truth["ranks"].items():
        assert (groups.at[int(r), "pp"], groups.at[int(r), "dp"]) == (where["pp"], where["dp"])
    assert res.tables["stragglers"].empty
    findings = res.tables["findings"]
    last = truth["parallel"]["pp"] - 1
    assert findings["stage"].tolist() == [last]
    assert list(findings.iloc[0]["ranks"]) == sorted(int(r) for r, w in truth["ranks"].items() if w["pp"] == last)
    saved_ns = (truth["paper"]["step_s_measured"] - truth["paper"]["step_s_without_stage_imbalance"]) * 1e9
    assert findings.iloc[0]["cost_ns"] == pytest.approx(saved_ns, rel=0.25)


def test_a_job_of_peers_keeps_its_outputs(tmp_path):
    """The H100 gloo job has no parallel groups: no stage column, no groups or findings tables, the flat comparison."""
    res = run_recipe("straggler_heatmap", [str(SAMPLES / "h100_gloo_8rank")], str(tmp_path / "sh"), mode="none")
    assert "stage" not in res.tables["iterations"] and "waited_tp_ns" not in res.tables["stragglers"]
    assert not (res.output_dir / "groups.parquet").exists() and not (res.output_dir / "findings.parquet").exists()


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(intervals) -> int:
    return sum(e - s for s, e in intervals)


def _clip(intervals, windows) -> list[tuple[int, int]]:
    return [(max(s, ws), min(e, we)) for s, e in intervals for ws, we in windows if min(e, we) > max(s, ws)]


def test_exposed_communication_per_group_equals_sql(heavy):
    """comm_overlap per group kind, against each rank's kernels read by SQL: a group's communication is the union of
    its kernels (its stream) inside the steps, its exposed part what no compute kernel runs beside."""
    out, _ = heavy
    truth = json.loads((out / "truth.json").read_text())
    res = run_recipe("comm_overlap", [str(out)], str(out.parent / "co"), mode="none")
    ranks = res.tables["ranks"].set_index("rank")
    by_stream = {truth["streams"][k]: k for k in ("tp", "pp", "dp")}
    for rank in (0, STRAGGLER, T * P * D - 1):
        with sqlite3.connect(out / f"rank{rank}.sqlite") as db:
            steps = [tuple(s) for s in _steps(db).tolist()]
            kernels = db.execute("SELECT k.start + t.utcEpochNs, k.end + t.utcEpochNs, k.streamId, s.value FROM "
                                 "CUPTI_ACTIVITY_KIND_KERNEL k JOIN TARGET_INFO_SESSION_START_TIME t JOIN StringIds s "
                                 "ON s.id = k.shortName").fetchall()
        compute = _union(_clip([(s, e) for s, e, _, name in kernels if not name.startswith("nccl")], steps))
        for stream, kind in by_stream.items():
            comm = _union(_clip([(s, e) for s, e, st, name in kernels if st == stream and name.startswith("nccl")],
                                steps))
            beside = _length(_union(comm + compute)) - _length(compute)  # comm time with no compute beside it
            assert ranks.at[rank, f"exposed_{kind}_ns"] == beside, (rank, kind)
    exposure = res.tables["groups_exposure"]
    assert set(exposure["group"]) == {"tp", "pp", "dp"}
    assert (exposure.groupby("rank")["exposed_ns"].sum() == ranks[["exposed_tp_ns", "exposed_pp_ns",
                                                                      "exposed_dp_ns"]].sum(axis=1)).all()


def test_a_gpu_bound_pipeline_straggler_behind_device_syncs_is_gpu_compute(tmp_path):
    """A SYNTHETIC job whose host launches ahead and syncs the device after every exchange (Megatron's
    batch_p2p_sync): rank 5 computing 2.5 times as long in steps 3-6 is flagged there, its cause the GPU work of its
    forward or backward passes, not the host time it spent blocked in the syncs; its excess is the extra compute by
    hand: 1.5 x (6 + 12) ms x 4 micro-batches."""
    out = tmp_path / "job"
    write_megatron(out, parallel.Layout(tp=T, pp=P, dp=D), steps=10, microbatches=MICROBATCHES, fmt="sqlite",
                   p2p_sync=True, stragglers=[parse_straggler(f"rank={STRAGGLER},iterations=3-6,cause=compute,"
                                                              "slowdown=2.5")])
    with sqlite3.connect(out / f"rank{STRAGGLER}.sqlite") as db:  # the host blocks in a device sync in every exchange
        (syncs,) = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                              "WHERE s.value LIKE 'cudaDeviceSynchronize%'").fetchone()
    assert syncs >= 10 * MICROBATCHES
    res = run_recipe("straggler_heatmap", [str(out)], str(tmp_path / "sh"), mode="none")
    flagged = res.tables["stragglers"]
    assert set(zip(flagged["rank"], flagged["iteration"], strict=True)) == {(STRAGGLER, i) for i in range(3, 7)}
    assert set(flagged["cause"]) <= {"forward", "backward"} and set(flagged["cause_side"]) == {"gpu"}
    assert flagged["excess_ns"].median() == pytest.approx(1.5 * 18 * MS * MICROBATCHES, rel=0.1)
    # one rank slow throughout its steps is a straggler, not uneven micro-batches
    assert "microbatch_imbalance" not in set(res.tables["findings"]["kind"])
    spread = res.tables["microbatches"].set_index("stage")
    assert spread.at[_stage(STRAGGLER), "max_ratio"] == pytest.approx(2.5, rel=0.1)  # its micro-batches, seen ...
    assert spread["long_passes"].sum() == 0  # ... as the rank's own slowness
