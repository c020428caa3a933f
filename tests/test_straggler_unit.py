"""straggler_heatmap's analysis on small hand-built ranks, checked against hand calculations."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsys_recipe_pack import order_statistics, spill, straggler_noise
from nsys_recipe_pack.errors import BadInputError
from nsys_recipe_pack.inputs import RankData
from nsys_recipe_pack.iterations import Delimiter, Iterations, Ranges
from nsys_recipe_pack.phases import child_ranges
from nsys_recipe_pack.recipes import straggler_heatmap as straggler

MS = 1_000_000
TID = 42


def nvtx_rows(rows):
    return pd.DataFrame({
        "start_ns": pd.Series([r[1] for r in rows], dtype="int64"),
        "end_ns": pd.Series([r[2] for r in rows], dtype="Int64"),
        "event_type": 59,
        "name": [r[0] for r in rows],
        "domain": "",
        "tid": TID,
        "pid": 1,
    })


def cpu_rank(extra_loader_ms: dict, iterations=8, late_ms=None, offset=0):
    """Steps of 100 ms: dataloader 10, forward 30, backward 40, allreduce until the common end, optimizer 5.

    A rank with extra dataloader time arrives late at allreduce; everyone's allreduce ends at the
    common barrier time, so the others wait.
    """
    rows = []
    t = offset
    for i in range(iterations):
        extra = extra_loader_ms.get(i, 0) * MS
        worst = max(late_ms.get(i, 0) if late_ms else 0, 0) * MS
        dl_end = t + 10 * MS + extra
        fw_end = dl_end + 30 * MS
        bw_end = fw_end + 40 * MS
        barrier = t + 80 * MS + worst + 2 * MS  # everyone leaves allreduce at the same instant
        opt_end = barrier + 5 * MS
        rows += [("step", t, opt_end), ("dataloader", t, dl_end), ("forward", dl_end, fw_end),
                 ("backward", fw_end, bw_end), ("allreduce", bw_end, barrier), ("optimizer", barrier, opt_end)]
        t = opt_end + 1 * MS
    return rows


def make(rank_rows, session=0):
    return RankData(file="x", pid=1, session_start_ns=session, nvtx=nvtx_rows(rank_rows))


def run(ranks, **opts):
    per_rank = []
    for r, rd in enumerate(ranks):
        res = straggler.map_rank(rd, opts)
        per_rank.append({**res, "rank": r, "offset_ns": 0})
    out = straggler.reduce(per_rank, opts)
    return per_rank, {**out, "iterations": out["iterations"].to_pandas()}  # the rows as iterations.parquet holds them


def test_busy_wait_and_flags_by_hand():
    slow = {3: 50, 4: 50}  # rank 2 loads 50 ms longer in iterations 3 and 4
    late = {3: 50, 4: 50}
    ranks = [make(cpu_rank(slow if r == 2 else {}, late_ms=late)) for r in range(4)]
    per_rank, out = run(ranks)
    assert per_rank[0]["delimiter"] == {"kind": "nvtx", "name": "step", "domain": None, "source": "auto"}
    it = out["iterations"].set_index(["rank", "iteration"])
    # iteration 3, victim rank 0: duration 80+50+2+5 = 137 ms, wait = allreduce = 52 ms, busy = 85 ms
    assert it.loc[(0, 3), "duration_ns"] == 137 * MS
    assert it.loc[(0, 3), "wait_ns"] == 52 * MS
    assert it.loc[(0, 3), "busy_ns"] == 85 * MS
    # the straggler waits only 2 ms and is busy 135 ms
    assert it.loc[(2, 3), "wait_ns"] == 2 * MS and it.loc[(2, 3), "busy_ns"] == 135 * MS
    assert it.loc[(2, 3), "excess_ns"] == 50 * MS
    assert it.loc[(2, 3), "score"] == pytest.approx(135 / 85)
    # arrival skew: the straggler reaches allreduce 50 ms after the others
    assert it.loc[(2, 3), "arrival_skew_ns"] == 50 * MS and it.loc[(0, 3), "arrival_skew_ns"] == 0
    flagged = set(out["stragglers"][["rank", "iteration"]].itertuples(index=False, name=None))
    assert flagged == {(2, 3), (2, 4)}
    assert set(out["stragglers"]["cause"]) == {"dataloader"}
    ranks_table = out["ranks"]
    assert ranks_table.iloc[0]["rank"] == 2 and ranks_table.iloc[0]["straggler_iterations"] == 2
    assert ranks_table.iloc[0]["top_cause"] == "dataloader"
    assert ranks_table.iloc[0]["excess_total_ns"] == 100 * MS
    # recoverable: 135 ms busy over the busiest other rank's 85 ms, no more than the others waited beyond its 2 ms
    # (52 ms): 50 ms in each of its two iterations, none in any cell not flagged
    assert it.loc[(2, 3), "recoverable_ns"] == it.loc[(2, 4), "recoverable_ns"] == 50 * MS
    assert it["recoverable_ns"].sum() == ranks_table.iloc[0]["recoverable_ns"] == 100 * MS


def test_victims_are_not_flagged_even_though_their_iterations_are_long():
    slow = {i: 30 for i in range(8)}
    ranks = [make(cpu_rank(slow if r == 1 else {}, late_ms=slow)) for r in range(4)]
    _, out = run(ranks)
    assert set(out["stragglers"]["rank"]) == {1}
    assert len(out["stragglers"]) == 8


def test_small_excess_below_threshold_is_not_flagged():
    ranks = [make(cpu_rank({2: 5} if r == 3 else {}, late_ms={2: 5})) for r in range(4)]
    _, out = run(ranks)  # 5 ms over a 90 ms busy median is below 10 %
    assert out["stragglers"].empty
    _, out = run(ranks, threshold=0.02)
    assert set(out["stragglers"][["rank", "iteration"]].itertuples(index=False, name=None)) == {(3, 2)}


def test_noise_scale_keeps_jitter_unflagged():
    rng = np.random.default_rng(0)
    ranks = []
    for r in range(6):
        jitter = {i: int(rng.integers(0, 12)) for i in range(40)}  # up to 12 ms of noise in the dataloader
        if r == 4:
            jitter[20] = 60
        ranks.append(make(cpu_rank(jitter, iterations=40, late_ms={i: 60 if i == 20 else 12 for i in range(40)})))
    _, out = run(ranks, threshold=0.05)
    flagged = set(out["stragglers"][["rank", "iteration"]].itertuples(index=False, name=None))
    assert (4, 20) in flagged
    assert len(flagged) <= 2  # of 240 cells


def test_explicit_iteration_name_and_missing_name():
    ranks = [make(cpu_rank({})) for _ in range(2)]
    per_rank, _ = run(ranks, iteration="step")
    assert per_rank[0]["delimiter"]["source"] == "--iteration"
    assert len(per_rank[0]["iterations"]) == 8
    with pytest.raises(BadInputError, match="closest names: 'step'"):
        straggler.map_rank(ranks[0], {"iteration": "stepp"})


def test_host_gap_is_time_outside_child_ranges():
    rows = [("step", 0, 100 * MS), ("forward", 0, 30 * MS), ("allreduce", 60 * MS, 100 * MS)]
    rows = [(n, s + k * 200 * MS, e + k * 200 * MS) for k in range(5) for n, s, e in rows]
    res = straggler.map_rank(make(rows), {})
    comps = res["components"].to_pandas().set_index(["iteration", "component"])["ns"]
    assert comps.loc[(0, "host_gap")] == 30 * MS  # 30..60 ms is covered by nothing
    assert comps.loc[(0, "forward")] == 30 * MS


def op_rank(slow_op: tuple | None, iterations=8, ops=20):
    """Steps of `ops` 4 ms ranges named as torch's emit_nvtx names them (each op's sequence number, so no
    name repeats across iterations), then an allreduce until the common barrier. slow_op: (iteration,
    op) that takes 40 ms more on one rank; every rank's barrier in iteration 3 waits for it."""
    rows, t = [], 0
    for i in range(iterations):
        start = t
        for k in range(ops):
            extra = 40 * MS if slow_op == (i, k) else 0
            rows.append((f"aten::mm, seq = {i * ops + k}", t, t + 4 * MS + extra))
            t += 4 * MS + extra
        barrier = start + ops * 4 * MS + (40 * MS if i == 3 else 0) + 2 * MS
        rows += [("allreduce", t, barrier), ("step", start, barrier)]
        t = barrier + MS
    return rows


def test_child_ranges_named_once_per_op_point_at_the_slow_op():
    # 160 child range names for 32 cells: only the components each cell has are held
    ranks = [make(op_rank((3, 5) if r == 2 else None)) for r in range(4)]
    _, out = run(ranks, iteration="step")
    flagged = out["stragglers"]
    assert list(zip(flagged["rank"], flagged["iteration"], strict=True)) == [(2, 3)]
    assert flagged["cause"].tolist() == ["aten::mm, seq = 65"]  # iteration 3, op 5
    assert flagged["excess_ns"].tolist() == [40 * MS]


def _tail_scale(x: pd.Series) -> float:
    """The noise scale of one component over the whole cell x component table, by its definition."""
    dev = np.abs(x - np.median(x))
    return max(float(straggler_noise.MAD_TO_SIGMA * np.median(dev)),
               float(np.quantile(dev, 0.90) / straggler_noise.Q90_TO_SIGMA))


def _component_parts(cell_col: np.ndarray, ns: np.ndarray, n_names: int, counts: np.ndarray, stages: np.ndarray,
                     halved: np.ndarray | None = None) -> list:
    """The rows as ranks' `components` tables (rank r: the next counts[r] cells, its iterations 0 on), named in an
    order of their own per rank (c00, c01, ...: in name order), on the host side; halved: rows given as two, a word
    named twice in the tables' words (as a child range named like a fixed component is)."""
    import pyarrow as pa

    parts = []
    for low, count, stage in zip((np.cumsum(counts) - counts).tolist(), counts.tolist(), stages.tolist(),
                                 strict=True):
        rows = np.flatnonzero((cell_col // n_names >= low) & (cell_col // n_names < low + count))[::-1]
        words = [f"c{i:02d}" for i in range(n_names)][::-1]
        code, value = n_names - 1 - cell_col[rows] % n_names, ns[rows].astype(np.int64)
        if halved is not None and halved[rows].any():
            two = rows[halved[rows]]
            words.append(f"c{int(cell_col[two[0]] % n_names):02d}")  # its second code: only the rows of that word
            two = two[cell_col[two] % n_names == cell_col[two[0]] % n_names]
            half = ns[two].astype(np.int64) // 2
            value[np.isin(rows, two)] -= half  # `two` in the order of `rows`
            code, value = np.r_[code, np.full(len(two), n_names)], np.r_[value, half]
            rows = np.r_[rows, two]
        table = pa.table({"iteration": pa.array(cell_col[rows] // n_names - low, pa.int64()),
                          "component": pa.DictionaryArray.from_arrays(pa.array(code, pa.int32()), pa.array(words)),
                          "ns": pa.array(value), "on_gpu": pa.array(np.zeros(len(rows), np.int64))})
        parts.append((table, low, stage))
    return parts


def _causes(parts: list, width: int, counts: np.ndarray, cell_excess: np.ndarray, typical: float, sigma: float):
    """Every cell's findings as the reduce gets them, a run of iterations at a time: whether a component explains its
    excess, its cause's code, the names, their sides and the components' noise scales."""
    comps = straggler_noise.ComponentRows(parts, width)
    codes, names, on_gpu = comps.columns(set())
    cell_iteration = np.concatenate([np.arange(c) for c in counts])
    cohort = cell_iteration * width + np.repeat([p[2] for p in parts], counts)
    rows = np.bincount(cell_iteration, minlength=len(comps.iteration_rows))
    rows[:len(comps.iteration_rows)] += comps.iteration_rows
    blocks = straggler_noise.Blocks(rows, comps.counts[codes])
    noise_ok, code = np.zeros(len(cohort), bool), np.full(len(cohort), len(names), np.int32)
    causes = straggler_noise.ComponentCauses(comps, codes, blocks, np.bincount(cohort), len(cohort), None)
    try:
        for i, (low, high) in enumerate(blocks.iterations):
            cells = np.flatnonzero((cell_iteration >= low) & (cell_iteration < high))
            noise_ok[cells], code[cells] = causes.of_run(i, cells, cell_excess[cells], typical, sigma)
    finally:
        causes.close()
    return noise_ok, code, names, on_gpu, causes.scale


@pytest.mark.parametrize(("block_rows", "flush_bytes", "hold_rows", "bins", "rounds"), [
    (3, 200, 2, 16, 40), (straggler_noise.BLOCK_ROWS, spill.COLUMN_FLUSH_BYTES, order_statistics.HOLD_ROWS,
                        order_statistics.HISTOGRAM_BINS, 200), (1, 10**9, 1, 16, 20), (10**9, 1, 3, 16, 200)])
def test_component_excess_noise_and_causes_from_the_cells_own_components_match_the_whole_table(
        monkeypatch, block_rows, flush_bytes, hold_rows, bins, rounds):
    # the cells' own components against the whole table: each component's noise scale (_tail_scale over every cell,
    # the cells lacking it at 0, over each cell's excess over its cohort's median: its iteration's cells of its
    # stage); then each cell's cause (its largest excess above 0, the first name among equals) and whether a
    # component explains it, from ranks' tables regrouped a few iterations and components at a time, the scales
    # found in passes over them (a few values sorted at once)
    monkeypatch.setattr(straggler_noise, "BLOCK_ROWS", block_rows)
    monkeypatch.setattr(spill, "COLUMN_FLUSH_BYTES", flush_bytes)
    monkeypatch.setattr(order_statistics, "HOLD_ROWS", hold_rows)
    monkeypatch.setattr(order_statistics, "HISTOGRAM_BINS", bins)
    rng = np.random.default_rng(8)
    for _ in range(rounds):
        n_ranks, n_names = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        counts = rng.integers(1, 6, n_ranks)
        stages = rng.integers(0, 2, n_ranks) if rng.random() < 0.5 else np.zeros(n_ranks, np.int64)
        width = int(stages.max()) + 1
        n_cells = int(counts.sum())
        cohort = np.concatenate([np.arange(c) for c in counts]) * width + np.repeat(stages, counts)
        cell_col = rng.choice(n_cells * n_names, int(rng.integers(1, n_cells * n_names + 1)), replace=False)
        ns = rng.integers(0, 50, len(cell_col)).astype(np.float64) * rng.choice([1, 1000])
        table = np.zeros(n_cells * n_names)
        table[cell_col] = ns
        table = pd.DataFrame(table.reshape(n_cells, n_names))
        want = table - table.groupby(cohort).transform("median")
        scales = want.apply(_tail_scale).to_numpy()

        halved = rng.random(len(cell_col)) < 0.3 if rng.random() < 0.3 else None
        parts = _component_parts(cell_col, ns, n_names, counts, stages, halved)
        cell_excess = rng.integers(-20, 40, n_cells).astype(np.float64) * 1000
        noise_ok, code, names, on_gpu, found = _causes(parts, width, counts, cell_excess, 0.0, 2.0)
        np.testing.assert_array_equal(found, scales[[int(w[1:]) for w in names]])  # the components present
        cause = [names[c] if c < len(names) else None for c in code]
        side = [None if c >= len(names) else "gpu" if on_gpu[c] else "host" for c in code]
        has = np.zeros((n_cells, n_names), bool)
        has.flat[cell_col] = True
        x = np.where(has, want.to_numpy(), -np.inf)
        scales = np.maximum(scales, 1000.0)
        explains = has & (x >= 0.5 * cell_excess[:, None]) & (x / scales > 2.0)
        np.testing.assert_array_equal(noise_ok, explains.any(axis=1))
        top = np.where(x > 0, x, -np.inf)
        named = [f"c{int(np.argmax(t)):02d}" if (t > 0).any() else None for t in top]
        assert cause == named
        assert side == [None if c is None else "host" for c in named]


def test_one_long_capture_skips_the_component_work_whose_causes_it_cannot_have(monkeypatch):
    # with one rank, each iteration's only cell is every component's median: the component work, given what the
    # reduce would give it, finds no cause and no component beyond its noise; the reduce then does not do it and
    # says the same (no cause, nothing flagged), while two ranks still go through it
    rank = make(cpu_rank({2: 30, 5: 40}, iterations=8))
    res = straggler.map_rank(rank, {})
    n = res["iterations"].num_rows
    assert res["components"].num_rows > n  # several components per iteration
    noise_ok, cause, names, _, _ = _causes([(res["components"], 0, 0)], 1, np.array([n]), np.zeros(n), 100.0 * MS,
                                           straggler.DEFAULT_SIGMA)
    assert not noise_ok.any() and len(names) and (cause == len(names)).all()  # no cause: the count of names

    calls = []
    real = straggler.ComponentCauses
    monkeypatch.setattr(straggler, "ComponentCauses", lambda *a: calls.append(1) or real(*a))
    _, out = run([make(cpu_rank({2: 30, 5: 40}, iterations=8))])
    assert not calls
    it = out["iterations"]
    assert len(it) == n and it["cause"].isna().all() and it["cause_side"].isna().all()
    assert not it["is_straggler"].any()
    _, two = run([make(cpu_rank({2: 30, 5: 40}, iterations=8)), make(cpu_rank({}, iterations=8))])
    assert calls == [1]
    assert two["iterations"].query("rank == 0 and iteration == 2")["cause"].item() == "dataloader"


def test_verdicts_say_the_answer_first_and_call_one_off_flags_incidental():
    from nsys_recipe_pack.recipes.straggler_heatmap import incidental, verdicts

    cells = [(2, i, 30e6) for i in range(20, 30)] + [(2, 35, 20e6)]  # a run of 10 and one more
    cells += [(1, 2, 9e6), (1, 34, 9e6), (1, 40, 9e6)]  # three scattered iterations
    cells += [(0, 7, 5e6)]
    stragglers = pd.DataFrame(cells, columns=["rank", "iteration", "excess_ns"])
    ranks = pd.DataFrame({"rank": [2, 1, 0, 3], "iterations": 60, "straggler_iterations": [11, 3, 1, 0],
                          "top_cause": ["dataloader", "backward", "forward", None],
                          "top_cause_side": ["host", "host", "host", None]})
    assert incidental(ranks, stragglers).tolist() == [False, True, True, False]
    said = verdicts(ranks, stragglers)
    assert said == ["rank 2 holds the others back in 11 of 60 iterations (20–29, 35): 320.0 ms of excess busy "
                    "time; host time in dataloader, +30.0 ms per iteration",
                    "incidental: rank 1 in 3 iterations, rank 0 in 1 iteration (one-off delays, not a rank that "
                    "holds the job back)"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 120), st.integers(0, 12), st.sampled_from(["step", "a"])),
                max_size=40),
       st.lists(st.tuples(st.integers(0, 10), st.integers(1, 50)), max_size=4), st.booleans())
def test_child_ranges_are_the_outermost_ranges_inside_each_iteration(ranges, windows, one_at_a_time):
    """Against their definition, range by range: on the delimiter's thread, inside an iteration (the last to start
    by the range's start) and not its delimiting range, and no range before it there (by start, the longer first)
    still open at its start; in order of start. Ranges that start one at a time (the quick way) or several at once."""
    if one_at_a_time:
        ranges = list({r[1]: r for r in ranges}.values())
    edges = np.cumsum([w for pair in windows for w in pair], dtype=np.int64)
    win_start, win_end = edges[0::2], edges[1::2]
    rows = sorted(ranges, key=lambda r: r[1])  # the table's order, by start
    words = np.array(["step", "a", None], object)
    start, length, thread = (np.array([x[i] for x in rows], np.int64) for i in (1, 2, 0))
    name = np.array([0 if x[3] == "step" else 1 for x in rows], np.int64)
    r = Ranges(start, start + length, TID + thread, name, np.zeros(len(rows), np.int64), words,
               np.array(["", None], object))
    it = Iterations(Delimiter("nvtx", "step", "", "--iteration"), win_start, win_end, TID)
    inside = {}
    for i in range(len(rows)):
        k = int(np.searchsorted(win_start, r.start_ns[i], side="right")) - 1
        if r.tid[i] == TID and k >= 0 and r.end_ns[i] <= win_end[k] and not (
                r.start_ns[i] == win_start[k] and words[r.name[i]] == "step"):
            inside.setdefault(k, []).append(i)
    want = []
    for k, kids in inside.items():
        reach = None
        for i in sorted(kids, key=lambda i: (r.start_ns[i], -r.end_ns[i], i)):
            if reach is None or r.start_ns[i] >= reach:
                want.append((int(r.start_ns[i]), int(r.end_ns[i]), int(r.name[i]), k))
            reach = r.end_ns[i] if reach is None else max(reach, r.end_ns[i])
    want.sort(key=lambda w: w[0])
    got = list(zip(*(a.tolist() for a in child_ranges(r, it)), strict=True))
    assert got == want


def test_flagged_cells_that_no_component_explains_have_no_cause(monkeypatch, tmp_path):
    """Where no component of a flagged cell stands above the other ranks' (per-op NVTX names that no other rank
    shares), the cell has no cause: the rank's top cause is None and its verdict speaks of busy time."""
    from conftest import SAMPLES

    from nsys_recipe_pack import runner
    from nsys_recipe_pack.recipes import straggler_heatmap as sh

    class Unexplained:  # every cell beyond its components' noise, and none the cause
        def __init__(self, comps, codes, *_):
            self.none = len(codes)

        def of_run(self, i, cells, *_):
            return np.ones(len(cells), bool), np.full(len(cells), self.none, np.int32)

        def close(self):
            pass

    monkeypatch.setattr(sh, "ComponentCauses", Unexplained)
    out = runner.run("straggler_heatmap", [str(SAMPLES / "h100_gloo_8rank")], str(tmp_path / "o"), engine="pack",
                     mode="none")
    ranks = pd.read_parquet(out / "ranks.parquet").set_index("rank")
    assert ranks.loc[3, "straggler_iterations"] == 10 and ranks.loc[3, "top_cause"] is None
    assert ranks["top_cause_side"].isna().all()
    assert sh.headline(out).startswith("rank ") and "busy time" in sh.headline(out)


def pipeline_rank(compute_ms: dict, iterations: int = 8) -> RankData:
    """Steps of 100 ms, as a pipeline stage that syncs the device after its exchange: `forward` [0, 5) launches a
    kernel at 1 ms that runs from 2 ms for 40 ms (compute_ms[i] in iteration i); `batch-p2p` [5, kernel end + 1)
    holds a cudaDeviceSynchronize from 6 ms until the kernel ends; every rank then meets in `allreduce` until 90 ms
    (the latest rank's kernel ends before it) and runs `optimizer` to 100 ms."""
    nvtx, runtime, kernels = [], [], []
    for i in range(iterations):
        t = i * 100 * MS
        k_end = t + (2 + compute_ms.get(i, 40)) * MS
        nvtx += [("step", t, t + 100 * MS), ("forward", t, t + 5 * MS), ("batch-p2p", t + 5 * MS, k_end + 1 * MS),
                 ("allreduce", k_end + 1 * MS, t + 90 * MS), ("optimizer", t + 90 * MS, t + 100 * MS)]
        runtime += [(t + 1 * MS, t + 1 * MS + 10_000, 2 * i + 1, "cudaLaunchKernel_v7000"),
                    (t + 6 * MS, k_end, 2 * i + 2, "cudaDeviceSynchronize_v3020")]
        kernels += [(t + 2 * MS, k_end, 2 * i + 1)]
    rt = pd.DataFrame({"start_ns": [r[0] for r in runtime], "end_ns": [r[1] for r in runtime], "tid": TID, "pid": 1,
                       "correlation_id": pd.array([r[2] for r in runtime], dtype="Int64"),
                       "name": [r[3] for r in runtime]})
    k = pd.DataFrame({"start_ns": [r[0] for r in kernels], "end_ns": [r[1] for r in kernels], "device": 0,
                      "stream": 7, "correlation_id": pd.array([r[2] for r in kernels], dtype="Int64"), "pid": 1,
                      "name": "gemm", "full_name": "gemm"})
    return RankData(file="x", pid=1, session_start_ns=0, nvtx=nvtx_rows(nvtx), kernels=k, runtime=rt, has_cuda=True)


def test_a_slow_gpu_behind_a_device_sync_is_gpu_compute_not_host_time_in_the_sync_range():
    # rank 1's kernel takes 70 ms instead of 40 in iterations 3-5: its host sits 30 ms longer in cudaDeviceSynchronize
    # inside `batch-p2p` (sorted before `forward`: it would win a tie), which is its own GPU's time: the cause is the
    # GPU work launched in `forward`, by 30 ms
    slow = {i: 70 for i in (3, 4, 5)}
    _, out = run([pipeline_rank(slow if r == 1 else {}) for r in range(4)])
    flagged = out["stragglers"]
    assert set(zip(flagged["rank"], flagged["iteration"], strict=True)) == {(1, 3), (1, 4), (1, 5)}
    assert set(flagged["cause"]) == {"forward"} and set(flagged["cause_side"]) == {"gpu"}
    assert (flagged["excess_ns"] == 30 * MS).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(-50, 50)), max_size=60), st.booleans())
def test_group_medians_are_pandas_groupby_medians(rows, halves):
    from nsys_recipe_pack.straggler_cells import group_medians

    group = np.array([g for g, _ in rows], np.int64)
    values = np.array([v for _, v in rows], np.int64)
    values = values / 2 if halves else values  # whole and half nanoseconds, as medians of medians are
    got = group_medians(group, values, 8)
    want = pd.Series(values, dtype=float).groupby(group).median().reindex(range(8)).to_numpy()
    np.testing.assert_array_equal(got, want)  # NaN where a group has no value
