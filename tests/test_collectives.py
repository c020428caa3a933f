"""collectives and parallel groups: Megatron's rank order computed here from its formula, SYNTHETIC Megatron-style
jobs (with and without NCCL's NVTX payloads) against the truth they were written with, and the real two-H100 NCCL
export against a direct SQL pairing of its SendRecv kernels."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from nsys_recipe_pack import parallel, run_recipe
from nsys_recipe_pack.errors import UsageError
from nsys_recipe_pack.inputs.payloads import _bytes_of
from nsys_recipe_pack.synth import parse_straggler
from nsys_recipe_pack.synth_megatron import one_f_one_b, pipeline_order, write_megatron

NCCL_EXPORT = Path(__file__).resolve().parent / "data" / "nccl_2gpu_h100" / "mfu_2gpu_before.sqlite"
SAMPLES = Path(__file__).resolve().parents[1] / "sample_reports"
T, P, D = 2, 2, 4
STRAGGLER, SLOW_STEPS = 5, (1, 2)


def megatron_groups(tp: int, pp: int, dp: int) -> dict[int, dict]:
    """Megatron Core's order (tp fastest, then dp, pp slowest), written out: rank = t + tp * (d + dp * p)."""
    out = {}
    for p in range(pp):
        for d in range(dp):
            for t in range(tp):
                r = t + tp * (d + dp * p)
                out[r] = {"tp": t, "dp": d, "pp": p,
                          "tp_group": [i + tp * (d + dp * p) for i in range(tp)],
                          "dp_group": [t + tp * (i + dp * p) for i in range(dp)],
                          "pp_group": [t + tp * (d + dp * i) for i in range(pp)]}
    return out


@pytest.mark.parametrize("sizes", [(2, 2, 4), (4, 2, 2), (1, 4, 2), (2, 1, 3)])
def test_layout_is_megatrons_rank_order(sizes):
    tp, pp, dp = sizes
    want = megatron_groups(tp, pp, dp)
    got = parallel.layout_groups(parallel.parse_parallel(f"tp={tp},pp={pp},dp={dp}"), np.arange(tp * pp * dp))
    for row in got.itertuples():
        assert {k: getattr(row, k) for k in want[row.rank]} == want[row.rank]


def test_parallel_option_errors_are_one_clear_line():
    for bad in ("tp=0", "tp=2,xx=3", "order=tp-dp", "tp=two", ""):
        with pytest.raises(UsageError, match="--parallel"):
            parallel.parse_parallel(bad)
    assert parallel.parse_parallel("tp=2,pp=4,dp=8,order=tp-cp-ep-pp-dp").order == "tp-cp-ep-pp-dp"


def test_one_f_one_b_by_hand():
    # 4 stages, 6 micro-batches: stage s warms up with 3 - s forwards, then alternates, then drains
    assert one_f_one_b(4, 6)[0] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1), ("F", 5),
                                    ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    assert one_f_one_b(4, 6)[3] == [x for m in range(6) for x in (("F", m), ("B", m))]


def test_interleaved_order_by_hand():
    # Megatron's interleaved 1F1B, 2 stages of 2 model chunks, 2 micro-batches: stage s warms up with 2 (p - s - 1) +
    # (v - 1) p forwards; the k-th forward is of chunk (k mod 4) // 2, micro-batch (k // 4) 2 + k mod 2, the backwards
    # take the chunks in reverse
    first, last = pipeline_order(2, 2, virtual=2)
    assert first == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1), ("B", 1, 0), ("B", 1, 1), ("B", 0, 0),
                     ("B", 0, 1)]
    assert last == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1), ("B", 0, 0),
                    ("B", 0, 1)]


def test_payload_bytes_read_from_hex_text_as_from_a_blob():
    blob = bytes(range(24))
    raw, starts, lengths = _bytes_of(pa.array([blob, blob[:16]], pa.binary()))
    hexed, hstarts, hlengths = _bytes_of(pa.array([blob.hex(), "0x" + blob[:16].hex().upper()], pa.string()))
    assert lengths.tolist() == hlengths.tolist() == [24, 16]
    for s, h, n in zip(starts, hstarts, lengths, strict=True):
        assert raw[s:s + n].tobytes() == hexed[h:h + n].tobytes()


@pytest.fixture(scope="module", params=[True, False], ids=["payload", "no_payload"])
def megatron(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron") / "job"
    write_megatron(out, parallel.Layout(tp=T, pp=P, dp=D), steps=5, microbatches=4, fmt="sqlite",
                   stragglers=[parse_straggler(f"rank={STRAGGLER},iterations={SLOW_STEPS[0]}-{SLOW_STEPS[1]},"
                                               "cause=compute,slowdown=2")], payloads=request.param)
    result = run_recipe("collectives", [str(out)], str(out.parent / "collectives"), mode="none")
    return request.param, out, result.tables, json.loads((out / "truth.json").read_text())


def test_groups_equal_megatrons_order(megatron):
    payload, _, tables, truth = megatron
    want = megatron_groups(T, P, D)
    groups = tables["groups"]
    assert len(groups) == T * P * D
    assert set(groups["source"]) == {"nvtx_payload" if payload else "inferred"}
    for row in groups.itertuples():
        assert {k: (list(getattr(row, k)) if k.endswith("group") else getattr(row, k)) for k in want[row.rank]} == \
            want[row.rank], row.rank
    assert truth["nvtx_payload"] is payload


def test_straggler_is_last_at_its_tp_collectives_in_its_steps(megatron):
    _, _, tables, _ = megatron
    c = tables["collectives"]
    tp = c[(c["group"] == "tp") & c["members"].map(lambda m: STRAGGLER in list(m))]
    slow = tp[tp["iteration"].between(*SLOW_STEPS)]
    other = tp[~tp["iteration"].between(*SLOW_STEPS)]
    assert len(slow) and (slow["last_rank"] == STRAGGLER).mean() > 0.95
    assert (other["last_rank"] == STRAGGLER).mean() < 0.8
    ranks = tables["ranks"]
    mine = ranks[(ranks["group"] == "tp")].set_index("rank")["waited_for_ns"]
    assert mine.idxmax() == STRAGGLER


def test_tp_wait_equals_the_kernels_own_starts(megatron):
    """The straggler's TP all-reduces, matched by order with its peer's straight from the exports by SQL: the wait is
    the gap between the two kernels' starts on aligned clocks."""
    _, out, tables, truth = megatron
    peer = STRAGGLER - 1
    starts = {}
    for r in (peer, STRAGGLER):
        with sqlite3.connect(out / f"rank{r}.sqlite") as db:
            starts[r] = np.array([s for (s,) in db.execute(
                "SELECT k.start + (SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME) FROM "
                "CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                "WHERE s.value = ? ORDER BY k.start", (truth["kernels"]["tp"],))], np.int64)
    want = np.sort(np.abs(starts[STRAGGLER] - starts[peer]))
    c = tables["collectives"]
    got = np.sort(c[(c["group"] == "tp") & c["members"].map(lambda m: list(m) == [peer, STRAGGLER])]["wait_ns"])
    assert len(got) == len(want) and (got == want).all()


def test_nccl_export_pairs_equal_sql(tmp_path):
    """The real two-H100 export: every SendRecv kernel of one process paired with the same-numbered one of the other
    by SQL; the recipe's pairs (by their ends) are the same, with the same arrivals."""
    res = run_recipe("collectives", [str(NCCL_EXPORT)], str(tmp_path / "out"), mode="none")
    with sqlite3.connect(NCCL_EXPORT) as db:
        rows = db.execute(
            "SELECT (k.globalPid >> 24) & 16777215, k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
            "ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel_SendRecv%' ORDER BY k.start").fetchall()
    by_pid = {}
    for pid, start in rows:
        by_pid.setdefault(pid, []).append(start)
    a, b = (np.array(v, np.int64) for _, v in sorted(by_pid.items()))
    assert len(a) == len(b) == 33
    c = res.tables["collectives"].sort_values("first_arrival_aligned_ns")
    assert set(c["op"]) == {"send_recv"} and len(c) == 33
    assert (c["first_arrival_aligned_ns"].to_numpy() == np.minimum(a, b)).all()
    assert (c["last_arrival_aligned_ns"].to_numpy() == np.maximum(a, b)).all()
    assert (c["wait_ns"].to_numpy() == np.abs(a - b)).all()


def test_a_missing_rank_is_named_and_the_rest_matched(megatron, tmp_path):
    payload, out, _, _ = megatron
    if not payload:
        pytest.skip("the communicators' sizes come from the payloads")
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    (partial / "rank3.sqlite").unlink()
    res = run_recipe("collectives", [str(partial)], str(tmp_path / "out"), mode="none")
    notes = " ".join(json.loads((res.output_dir / "analysis.json").read_text())["notes"])
    assert "3 of 4 ranks" in notes or "1 of 2 ranks" in notes
    assert len(res.tables["collectives"]) and 3 not in set(res.tables["groups"]["rank"])


def test_a_layout_that_contradicts_the_trace_is_an_error_naming_ranks_or_wins_over_a_guess(megatron, tmp_path):
    """Against NCCL's payloads a contradicting --parallel is an error naming ranks; against groups only inferred from
    the kernels' timing, the user's layout wins and a note names the ranks the timing put elsewhere."""
    payload, out, _, _ = megatron
    wrong = "tp=4,pp=2,dp=2"
    if payload:
        with pytest.raises(UsageError, match=r"--parallel tp=4,pp=2,dp=2 contradicts .*rank \d+"):
            run_recipe("collectives", [str(out)], str(tmp_path / "out"), mode="none", parallel=wrong)
    else:
        res = run_recipe("collectives", [str(out)], str(tmp_path / "out"), mode="none", parallel=wrong)
        groups = res.tables["groups"].set_index("rank")
        assert (groups["source"] == "--parallel").all()
        for r in range(16):  # rank = t + 4 (d + 2 p)
            t, d, p = r % 4, (r // 4) % 2, r // 8
            assert sorted(groups.at[r, "tp_group"]) == [i + 4 * (d + 2 * p) for i in range(4)]
            assert (groups.at[r, "tp"], groups.at[r, "dp"], groups.at[r, "pp"]) == (t, d, p)
        notes = " ".join(json.loads((res.output_dir / "analysis.json").read_text())["notes"])
        assert "timing suggested others for rank(s) 0," in notes
    same = run_recipe("collectives", [str(out)], str(tmp_path / "same"), mode="none", parallel=f"tp={T},pp={P},dp={D}")
    assert len(same.tables["groups"]) == T * P * D
    notes = json.loads((same.output_dir / "analysis.json").read_text())["notes"]
    assert not any("timing suggested" in n for n in notes)


def test_no_nccl_is_not_applicable_with_exit_3(tmp_path):
    res = subprocess.run([sys.executable, "-m", "nsys_recipe_pack.cli", "run", "--name", "collectives",
                          str(SAMPLES / "h100_gloo_8rank"), "--output", str(tmp_path / "out"), "--mode", "none"],
                         capture_output=True, text=True)
    assert res.returncode == 3, res.stderr
    assert "one group" in res.stderr and "NCCL" in res.stderr
    assert not (tmp_path / "out").exists()


def test_groups_table_columns(megatron):
    groups = megatron[2]["groups"]
    assert list(groups.columns) == parallel.GROUP_COLUMNS
    assert pd.api.types.is_integer_dtype(groups["rank"])
