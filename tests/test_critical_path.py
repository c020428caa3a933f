"""critical_path: the walk, the what-if and the findings on hand-built meeting points; on SYNTHETIC jobs (a pipeline
with one slow rank, an MPI job) against the slow rank and steps the generator injected; on the real H100 gloo job
against the stragglers straggler_heatmap finds; on the real MPI Jacobi job, the path's shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from nsys_recipe_pack import critical_path, parallel, run_recipe
from nsys_recipe_pack.microbatches import chains
from nsys_recipe_pack.synth import parse_straggler, write_synthetic
from nsys_recipe_pack.synth_megatron import write_megatron

SAMPLES = Path(__file__).resolve().parents[1] / "sample_reports"
MS = 1_000_000


def _hand(members: dict, cells: dict):
    members = pd.DataFrame(members).assign(iteration=0)
    for c in ("start_aligned_ns", "end_aligned_ns"):
        members[c] = members[c] * MS
    cells = pd.DataFrame(cells).assign(iteration=0, start_aligned_ns=0, stage=0)
    cells["end_aligned_ns"] = cells["end_aligned_ns"] * MS
    return chains(members, cells), cells


def test_the_walk_by_hand():
    """Rank 0 computes 10 ms and sends (1 ms of transfer); rank 1, whose receive started at 2 ms, computes 11-16,
    runs a 1 ms kernel, then works until 30 ms, the iteration's end. Back from the end: rank 1's work 17-30, its
    kernel 16-17, its work 11-16, the exchange's transfer 10-11 (rank 0 arrived last), rank 0's work 0-10. Rank 1 has
    the most work on the path (18 ms): the root."""
    ch, cells = _hand({"rank": [0, 1, 1], "start_aligned_ns": [10, 2, 16], "end_aligned_ns": [11, 11, 17],
                       "group": "pp", "instance": [0, 0, -1]}, {"rank": [0, 1], "end_aligned_ns": [20, 30]})
    path = critical_path.walk(ch, cells, pd.Series(["send_recv (pp)"]))
    got = [(r.rank, r.kind, r.start_aligned_ns // MS, r.end_aligned_ns // MS) for r in path.segments.itertuples()]
    assert got == [(1, "work", 17, 30), (1, "communication", 16, 17), (1, "work", 11, 16),
                   (0, "communication", 10, 11), (0, "work", 0, 10)]
    assert path.segments["name"].tolist()[3] == "send_recv (pp)"
    roots = critical_path.roots(path)
    assert roots.at[0, "root_rank"] == 1 and roots.at[0, "root_work_ns"] == 18 * MS
    assert roots.at[0, "duration_ns"] == 30 * MS


def test_the_what_if_by_hand():
    """Three peers compute, all-reduce (1 ms once the last arrives) and compute 2 ms more. Rank 2 computes 10 ms, the
    others 4: everyone ends at 13 ms and rank 2 is the root. Had it computed as its peers (4 ms), the all-reduce would
    end at 5 and the iteration at 7: 6 ms back."""
    ch, cells = _hand({"rank": [0, 1, 2], "start_aligned_ns": [4, 4, 10], "end_aligned_ns": [11, 11, 11],
                       "group": "dp", "instance": [0, 0, 0]}, {"rank": [0, 1, 2], "end_aligned_ns": [13, 13, 13]})
    path = critical_path.walk(ch, cells, pd.Series(["all_reduce (dp)"]))
    roots = critical_path.roots(path)
    assert roots.at[0, "root_rank"] == 2
    assert critical_path.what_if(ch, cells, roots["root_rank"]).at[0] == 6 * MS


def test_the_what_if_of_a_rank_without_peers_by_hand():
    """A two-stage pipeline of one rank each, three iterations 100 ms apart: rank 0 computes 4, 4 and 10 ms, then
    sends (1 ms of transfer) to rank 1, which had posted its receive at 1 ms and computes 2 ms after it. Rank 0 roots
    every iteration; it has no peer, so its work is matched to its own median (4 ms): the third iteration would end
    at 7 ms instead of 13, 6 ms back; the first two give nothing back."""
    work = [4, 4, 10]
    members = pd.DataFrame({"rank": [0, 1] * 3, "iteration": np.repeat([0, 1, 2], 2),
                            "start_aligned_ns": [(100 * k + s) * MS for k, g in enumerate(work) for s in (g, 1)],
                            "end_aligned_ns": [(100 * k + g + 1) * MS for k, g in enumerate(work) for _ in (0, 1)],
                            "group": "pp", "instance": np.repeat([0, 1, 2], 2)})
    cells = pd.DataFrame({"rank": [0, 1] * 3, "iteration": np.repeat([0, 1, 2], 2), "stage": [0, 1] * 3,
                          "start_aligned_ns": np.repeat([0, 100 * MS, 200 * MS], 2),
                          "end_aligned_ns": [(100 * k + g + d) * MS for k, g in enumerate(work) for d in (1, 3)]})
    ch = chains(members, cells)
    path = critical_path.walk(ch, cells, pd.Series(["send_recv (pp)"] * 3))
    roots = critical_path.roots(path)
    assert roots["root_rank"].tolist() == [0, 0, 0]
    assert critical_path.what_if(ch, cells, roots["root_rank"]).tolist() == [0, 0, 6 * MS]


def test_a_slow_pipeline_rank_roots_the_path_in_its_steps(tmp_path):
    """pp=4, dp=2, 8 micro-batches; rank 4 (stage 2) computes 1.5 times as long in steps 4-8: it roots the path in at
    least four of them, and matching its stage peer gives back most of what it added (its forward and backward
    passes take 0.5 x 18 ms x 8 micro-batches more); in the clean steps the what-if gives back little."""
    write_megatron(tmp_path / "job", parallel.Layout(tp=1, pp=4, dp=2), steps=12, microbatches=8, fmt="parquetdir",
                   stragglers=[parse_straggler("rank=4,iterations=4-8,cause=compute,slowdown=1.5")])
    res = run_recipe("critical_path", [str(tmp_path / "job")], str(tmp_path / "cp"), mode="none")
    it = res.tables["iterations"].set_index("iteration")
    slow = it.loc[4:8]
    assert (slow["root_rank"] == 4).sum() >= 4
    assert (slow["what_if_ns"] > 0.6 * 0.5 * 18 * MS * 8).all()
    clean = it.drop(index=range(4, 9))
    assert (clean["what_if_ns"] < 0.02 * clean["duration_ns"]).all()
    kinds = set(res.tables["critical_path"]["kind"])
    assert {"compute", "p2p"} <= kinds
    assert set(res.tables["critical_path"].loc[res.tables["critical_path"]["kind"] == "compute", "name"].dropna()) <= \
        {"forward", "backward", "optimizer"}


def test_host_collectives_of_an_mpi_job(tmp_path):
    """An MPI job meets in MPI_Allreduce on the host: rank 2, its kernel three times as long in steps 5-9, roots each
    of them."""
    write_synthetic(tmp_path / "job", 4, 20, "sqlite", [parse_straggler("rank=2,iterations=5-9,cause=gpu,slowdown=3")],
                    job="mpi")
    res = run_recipe("critical_path", [str(tmp_path / "job")], str(tmp_path / "cp"), mode="none")
    assert res.analysis["meeting_points"] == "host collectives"
    it = res.tables["iterations"].set_index("iteration")
    assert (it.loc[5:9, "root_rank"] == 2).all() and (it.loc[5:9, "what_if_ns"] > 0).all()


def test_the_root_is_the_straggler_on_the_real_h100_job(tmp_path):
    """h100_gloo_8rank meets in gloo's all-reduce ranges on the host: in every cell straggler_heatmap flags, the
    critical path's root is the flagged rank."""
    runs = {name: run_recipe(name, [str(SAMPLES / "h100_gloo_8rank")], str(tmp_path / name), mode="none")
            for name in ("critical_path", "straggler_heatmap")}
    flagged = runs["straggler_heatmap"].tables["stragglers"]
    roots = runs["critical_path"].tables["iterations"].set_index("iteration")["root_rank"]
    assert len(flagged) >= 5
    assert (roots.reindex(flagged["iteration"]).to_numpy() == flagged["rank"].to_numpy()).all()
    assert np.isin(runs["critical_path"].tables["critical_path"]["kind"], ["compute", "host", "communication"]).all()


def test_findings_by_hand():
    """One 100 ms iteration whose critical path holds 10 ms of data-parallel all-reduce, 6 ms of tensor-parallel
    all-reduce, 3 ms of pipeline exchange (under the 5 % that makes evidence), 25 ms of host work with the GPU idle
    (over 20 %) and 56 ms of compute, and no time to win back from its root: three findings, largest first."""
    segments = pd.DataFrame({
        "iteration": 0, "kind": ["communication", "communication", "p2p", "host", "compute"],
        "name": ["all_reduce (dp)", "all_reduce (tp)", "send_recv (pp)", None, "backward"],
        "duration_ns": np.array([10, 6, 3, 25, 56]) * MS})
    iterations = pd.DataFrame({"iteration": [0], "duration_ns": [100 * MS], "root_rank": [0], "what_if_ns": [0],
                               "is_warmup": [False]})
    found = critical_path.findings(segments, iterations)
    assert found["kind"].tolist() == ["host_bound", "exposed_gradient_reduce", "exposed_tp"]
    assert found["share_pct"].tolist() == [25.0, 10.0, 6.0]
    assert "--overlap-grad-reduce" in found.at[1, "advice"] and "--tp-comm-overlap" in found.at[2, "advice"]
    assert "CUDA graphs" not in found.at[0, "advice"]  # nothing says the host was launching
    iterations["what_if_ns"] = 12 * MS  # its root would give back 12 ms: a straggler worth finding
    assert "straggler" in critical_path.findings(segments, iterations)["kind"].tolist()


def test_launch_bound_by_hand():
    """The same host work on the path, on a rank launching 2,000 GPU operations an iteration: launch-bound, with CUDA
    graphs to try, where 1,600 of them (80 %) are under 10 us; host-bound where 600 are (30 %), or where it launches
    400 (under the 500 that make many)."""
    segments = pd.DataFrame({"iteration": 0, "rank": 3, "kind": ["host", "compute"], "name": [None, "forward"],
                             "duration_ns": np.array([30, 70]) * MS})
    iterations = pd.DataFrame({"iteration": [0], "duration_ns": [100 * MS], "root_rank": [3], "what_if_ns": [0],
                               "is_warmup": [False]})

    def kind(ops, short):
        launches = pd.DataFrame({"rank": [3, 5], "iteration": [0, 0], "gpu_ops": [ops, 9], "short_ops": [short, 9]})
        found = critical_path.findings(segments, iterations, launches)
        return found.at[0, "kind"], found.at[0, "evidence"], found.at[0, "advice"]

    got, evidence, advice = kind(2000, 1600)
    assert got == "launch_bound" and "2,000 GPU operations" in evidence and "80 %" in evidence
    assert "CUDA graphs" in advice
    assert kind(2000, 600)[0] == kind(400, 400)[0] == "host_bound"


def test_the_real_mpi_jacobi_job_meets_in_its_mpi_calls(tmp_path):
    """gpubootcamp_mpi_jacobi_v100 (five MPI ranks, no NCCL): the ranks meet in their MPI calls; straggler_heatmap
    flags nobody, so there is no straggler's step to agree with. Each iteration's path runs back without a gap from
    its end (the last rank's end of the iteration) through ranks of the job, and its root is the rank with the most
    work on it."""
    runs = {name: run_recipe(name, [str(SAMPLES / "gpubootcamp_mpi_jacobi_v100")], str(tmp_path / name), mode="none")
            for name in ("critical_path", "straggler_heatmap")}
    assert runs["straggler_heatmap"].tables["stragglers"].empty
    cp = runs["critical_path"]
    assert cp.analysis["meeting_points"] == "host collectives"
    it, path = cp.tables["iterations"].set_index("iteration"), cp.tables["critical_path"]
    assert len(it) == runs["straggler_heatmap"].tables["iterations"]["iteration"].nunique() > 100
    ranks = set(runs["straggler_heatmap"].tables["iterations"]["rank"])
    assert len(ranks) == 5 and set(path["rank"]) <= ranks
    assert set(path["kind"]) <= {"compute", "host", "communication"}
    for i, seg in path.groupby("iteration"):
        seg = seg.sort_values("order")
        assert (seg["start_aligned_ns"].to_numpy()[:-1] == seg["end_aligned_ns"].to_numpy()[1:]).all(), i
        work = seg[seg["kind"] != "communication"].groupby("rank")["duration_ns"].sum()
        assert it.at[i, "root_rank"] == work.idxmax() and it.at[i, "root_work_ns"] == work.max()
    # its host work on the path, advised in an MPI code's terms (its ranks' recorded environment says MPI)
    advice = cp.tables["findings"].set_index("kind").at["host_bound", "advice"]
    assert "MPI calls" in advice and "loader" not in advice
