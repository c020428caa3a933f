"""Uneven micro-batches (straggler_heatmap's microbatch_imbalance): the re-timing checked on a hand-built pair of
ranks and on a hand calculation of a small 1F1B schedule, and the finding on SYNTHETIC Megatron-style jobs against the
long micro-batches the generator injected and what they cost it (the same job simulated without them)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from nsys_recipe_pack import microbatches, parallel, run_recipe
from nsys_recipe_pack.synth_megatron import write_megatron

MS = 1_000_000


def test_retiming_a_hand_built_exchange():
    """Rank 0 computes 10 ms, then sends (1 ms of transfer); rank 1 posts its receive at 2 ms and waits, then computes
    5 ms, runs a 1 ms kernel, and meanwhile a 13 ms kernel on another stream from 12 ms. Had rank 0 computed 4 ms:
    the exchange ends at 5, rank 1's kernels follow it by the same gaps (the short one at 10-11, the long one at
    6-19), and each rank's iteration ends as long after its last kernel as before (rank 0: 9 ms, rank 1: 5 ms)."""
    members = pd.DataFrame({
        "rank": [0, 1, 1, 1], "iteration": 0,
        "start_aligned_ns": np.array([10, 2, 16, 12]) * MS, "end_aligned_ns": np.array([11, 11, 17, 25]) * MS,
        "group": ["pp", "pp", "other", "other"], "instance": [0, 0, -1, -1]})
    cells = pd.DataFrame({"rank": [0, 1], "iteration": 0, "start_aligned_ns": 0,
                          "end_aligned_ns": np.array([20, 30]) * MS})
    ch = microbatches.chains(members, cells)
    assert ch.pred.tolist() == [-1, -1, 1, 1]  # rank 1's short kernel follows the receive, not the long kernel
    assert (microbatches.retimed_ends(ch, ch.gap, ch.final_gap) == cells["end_aligned_ns"]).all()  # as it ran
    shorter = np.where(ch.cell == 0, ch.gap - 6 * MS, ch.gap)
    assert microbatches.retimed_ends(ch, shorter, ch.final_gap).tolist() == [14 * MS, 24 * MS]


@pytest.fixture(scope="module")
def one_long(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_long") / "job"
    write_megatron(out, parallel.Layout(tp=1, pp=2, dp=1), steps=16, microbatches=4, fmt="sqlite",
                   uneven=(0.1, 2.0), seed=0)
    res = run_recipe("straggler_heatmap", [str(out)], str(out.parent / "sh"), mode="none")
    return json.loads((out / "truth.json").read_text()), res


def test_one_long_microbatch_costs_what_the_1f1b_schedule_gives_by_hand(one_long):
    """Two stages, four micro-batches, forward 6 ms and backward 12 ms: a step takes (4 + 2 - 1) x 18 = 90 ms. With
    micro-batch m twice as long on both stages, walking the 1F1B order by hand, the step takes 126, 120, 120 and
    126 ms for m = 0..3: the pack's cost of each step with one long micro-batch is that (transfers and jitter aside)."""
    truth, res = one_long
    by_hand = {0: 36 * MS, 1: 30 * MS, 2: 30 * MS, 3: 36 * MS}
    long = pd.DataFrame(truth["uneven_microbatches"]["long"])
    alone = long.groupby("iteration").filter(lambda g: len(g) == 1).set_index("iteration")["microbatch"]
    steps = res.tables["microbatch_steps"].set_index("iteration")
    checked = [i for i in alone.index if i in steps.index]
    assert len(checked) >= 2
    for i in checked:
        assert steps.at[i, "cost_ns"] == pytest.approx(by_hand[alone[i]], rel=0.1), (i, alone[i])
    quiet = [i for i in steps.index if i not in set(long["iteration"])]
    assert quiet and (steps.loc[quiet, "cost_ns"] < 0.5 * MS).all()  # no long micro-batch, no cost


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    out = tmp_path_factory.mktemp("uneven") / "job"
    write_megatron(out, parallel.Layout(tp=2, pp=4, dp=2), steps=12, microbatches=8, fmt="parquetdir",
                   p2p_sync=True, uneven=(0.1, 2.0), seed=1)
    res = run_recipe("straggler_heatmap", [str(out)], str(out.parent / "sh"), mode="none")
    return json.loads((out / "truth.json").read_text()), res


def test_uneven_microbatches_are_found_with_their_cost_and_no_straggler(uneven):
    """Micro-batches twice as long at random (one in ten per data-parallel replica), the host syncing the device
    after every exchange: microbatch_imbalance, its cost within 10 % of what they cost the generator's job, on the
    ranks of the replicas that had them (Megatron's order: rank = t + tp (d + dp p)), and no rank flagged."""
    truth, res = uneven
    findings = res.tables["findings"]
    assert findings["kind"].tolist() == ["microbatch_imbalance"]
    row = findings.iloc[0]
    steps = res.tables["microbatch_steps"]
    cost = np.diff(np.r_[0, truth["uneven_microbatches"]["cost_until_step_end_ns"]])  # per step
    assert row["cost_total_ns"] == pytest.approx(cost[steps["iteration"]].sum(), rel=0.1)
    assert row["cost_ns"] == pytest.approx(cost[steps["iteration"]].mean(), rel=0.1)
    long = pd.DataFrame(truth["uneven_microbatches"]["long"])
    long = long[long["iteration"].isin(steps["iteration"])]
    replicas = set(long["replica"])
    assert set(row["ranks"]) == {t + 2 * (d + 2 * p) for t in range(2) for d in replicas for p in range(4)}
    assert res.tables["stragglers"].empty
    spread = res.tables["microbatches"]
    assert spread["max_ratio"].to_numpy() == pytest.approx(2.0, rel=0.1)
    assert (spread["long_passes"] > 0).all()


def test_a_heavier_last_stage_behind_device_syncs_is_stage_imbalance_alone(tmp_path):
    """The host syncing the device after every exchange, the last of four stages computing 1.5 times as long, no rank
    otherwise slow: stage imbalance of that stage, about 0.5 x 18 ms x 8 micro-batches by hand, no straggler and no
    uneven micro-batches."""
    out = tmp_path / "job"
    write_megatron(out, parallel.Layout(tp=2, pp=4, dp=2), steps=10, microbatches=8, fmt="parquetdir",
                   p2p_sync=True, heavy_last_stage=1.5, seed=2)
    res = run_recipe("straggler_heatmap", [str(out)], str(tmp_path / "sh"), mode="none")
    findings = res.tables["findings"]
    assert findings["kind"].tolist() == ["stage_imbalance"] and findings.at[0, "stage"] == 3
    assert findings.at[0, "cost_ns"] == pytest.approx(0.5 * 18 * MS * 8, rel=0.1)
    assert res.tables["stragglers"].empty
    assert (res.tables["microbatches"]["long_passes"] == 0).all()
