"""Notebooks executed with papermill and exported as self-contained HTML; figures on edge cases."""

import json
import re

import numpy as np
import pandas as pd

from nsys_recipe_pack import runner
from nsys_recipe_pack.notebook import render_report
from nsys_recipe_pack.plots import straggler_heatmap as plots
from nsys_recipe_pack.synth import Straggler, write_synthetic


def figures_in(html: str) -> int:
    return len(re.findall(r'class="plotly-graph-div"', html))


def check_html(html_path, figures: int):
    html = html_path.read_text()
    # plotly.js is not in the page but in one file beside it, loaded by a relative path
    assert "plotly.js v" not in html and '<script charset="utf-8" src="plotly.min.js"></script>' in html
    assert (html_path.parent / "plotly.min.js").read_text().count("plotly.js v") >= 1
    assert not re.search(r'<script[^>]+src="https?://', html)  # nothing loaded from the network
    assert figures_in(html) == figures
    assert "read_parquet" not in html  # code cells are hidden
    return html


def test_report_with_a_straggler(tmp_path):
    data = write_synthetic(tmp_path / "in", ranks=4, iterations=20, stragglers=[Straggler(2, 5, 9, "dataloader", 1.5)])
    out = runner.run("straggler_heatmap", [str(data)], str(tmp_path / "out"), mode="none", options={})
    html = check_html(render_report("straggler_heatmap", out), figures=5)  # with recoverable time per rank
    assert "SYNTHETIC DATA" in html
    assert (out / "straggler_heatmap.ipynb").exists()
    nb = json.loads((out / "straggler_heatmap.ipynb").read_text())
    assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"])


def test_report_without_stragglers_says_so(tmp_path):
    data = write_synthetic(tmp_path / "in", ranks=3, iterations=10)
    out = runner.run("straggler_heatmap", [str(data)], str(tmp_path / "out"), mode="none", options={})
    html = check_html(render_report("straggler_heatmap", out), figures=2)  # heatmap and arrival skew
    assert "No straggler found" in html


def test_heatmap_bins_ranks_beyond_256_and_keeps_the_worst():
    """1,200 ranks: the flagged rank 777 keeps its own row; the 1,199 others share the remaining 255 rows by median
    busy time (ranks' busy times shuffled against their numbers), each row a quantile of them, least busy first, each
    cell its row's worst. A rank scoring high but never flagged shows in its row's cell."""
    ranks, iters = 1200, 5
    it = pd.DataFrame({"rank": np.repeat(np.arange(ranks), iters), "iteration": np.tile(np.arange(iters), ranks)})
    it["score"] = 1.0
    it.loc[(it["rank"] == 777) & (it["iteration"] == 3), "score"] = 3.5
    it.loc[(it["rank"] == 5) & (it["iteration"] == 1), "score"] = 1.9  # high, not flagged
    busy = np.random.default_rng(0).permutation(ranks) * 10_000 + 1_000_000
    for c in ("duration_ns", "wait_ns"):
        it[c] = 1_000_000
    it["busy_ns"] = np.repeat(busy, iters)
    it["cause"] = None
    it["is_straggler"] = it["score"] > 2
    fig = plots.heatmap(it)
    z, rows = np.array(fig.data[0].z, dtype=float), list(fig.data[0].y)
    assert z.shape == (256, iters) and rows[0] == "777" and z[0, 3] == 3.5 and (z == 3.5).sum() == 1
    binned = rows[1:]
    assert len(binned) == 255 and sum(int(r.split(": ")[1].split(" ")[0]) for r in binned) == 1199
    lows = [float(r.split(", ")[1].split("–")[0]) for r in binned]
    highs = [float(r.split("–")[1].split(" ")[0]) for r in binned]
    assert lows == sorted(lows) and all(h <= lo for h, lo in zip(highs[:-1], lows[1:], strict=True))
    worst = np.array(fig.data[0].customdata)[:, 1, 0].astype(float)  # the rank in each row's cell of iteration 1
    row = int(np.flatnonzero(worst == 5)[0])
    assert z[row, 1] == 1.9 and z[row].max() == 1.9 and row > 0
    assert "1200 ranks: 1 flagged in full, the other 1199 in 255 rows" in fig.layout.title.text


def test_kernel_pace_and_share_reports(tmp_path, nsys):
    from conftest import MEMCPY_SET

    data = write_synthetic(tmp_path / "in", ranks=3, iterations=15, stragglers=[Straggler(1, 2, 4, "compute", 1.5)])
    out = runner.run("kernel_pace", [str(data)], str(tmp_path / "kp"), mode="none",
                     options={"kernel": "sgemm_128x64_nn"})
    check_html(render_report("kernel_pace", out), figures=3)
    out = runner.run("compute_memory_share", [str(MEMCPY_SET / "jacobi_report.qdrep")], str(tmp_path / "cms"),
                     engine="pack", mode="none")
    html = check_html(render_report("compute_memory_share", out), figures=4)
    assert "memcpy_dtoh" in html and "No memory copies" not in html


def test_sync_summary_report(tmp_path, nsys):
    from conftest import AI_SET

    out = runner.run("sync_summary", [str(AI_SET / "baseline_nvtx.nsys-rep")], str(tmp_path / "ss"), engine="pack",
                     mode="none")
    html = check_html(render_report("sync_summary", out), figures=3)
    assert "pageable memcpy" in html


def test_nvtx_gpu_proj_report(tmp_path, nsys):
    from conftest import AI_SET

    out = runner.run("nvtx_gpu_proj", [str(AI_SET / "thirdOptimization.nsys-rep")], str(tmp_path / "p"),
                     engine="pack", mode="none")
    html = check_html(render_report("nvtx_gpu_proj", out), figures=3)
    assert "Epoch" in html


def test_rank_figures_bin_beyond_256_ranks():
    from nsys_recipe_pack.plots import compute_memory_share as share_plots
    from nsys_recipe_pack.plots import sync_summary as sync_plots

    ranks = np.arange(1000)
    share = pd.DataFrame({"rank": np.repeat(ranks, 2), "category": np.tile(["compute", "idle"], 1000),
                          "union_ns": np.tile([3, 1], 1000)})
    fig = share_plots.stacked(share)
    assert len(fig.data[0].x) == 256 and "1000 ranks in 256 bins" in fig.layout.title.text
    assert np.allclose(fig.data[0].y, 75.0)
    summary = pd.DataFrame({"rank": ranks, "kind": "stream", "total_ns": ranks * 1_000_000})
    fig = sync_plots.by_kind(summary)
    assert len(fig.data[0].x) == 256 and max(fig.data[0].y) == 999.0


def test_a_report_notebook_runs_again_from_its_folder_after_a_move(tmp_path):
    """The executed notebook points at its output relative to itself: in a fresh kernel, from the folder it
    lies in (as JupyterLab runs it), after the folder was moved, it runs top to bottom."""
    import nbclient
    import nbformat

    data = write_synthetic(tmp_path / "in", ranks=3, iterations=10, stragglers=[Straggler(1, 2, 6, "dataloader", 1.5)])
    out = runner.run("straggler_heatmap", [str(data)], str(tmp_path / "out"), mode="none", options={}, report=True)
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    out.rename(moved)
    nb = nbformat.read(str(moved / "straggler_heatmap.ipynb"), as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "output_dir = \".\"" in injected[0].source
    nbclient.NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(moved)}}).execute()
    shown = "".join(o.get("data", {}).get("text/markdown", "") for c in nb.cells for o in c.get("outputs", []))
    assert "rank 1 holds the others back" in shown


def test_tables_read_well_and_long_ranges_do_not_hide_short_gpu_bars():
    from nsys_recipe_pack.plots import header, nvtx_gpu_proj, three_digits

    assert [three_digits(v) for v in (254.5, 31.24, 3.14159, 0.012345, 12.0, float("nan"))] == \
        ["254", "31.2", "3.14", "0.0123", "12", "—"]
    assert [header(c) for c in ("excess_ms", "straggler_iterations", "mean_us", "bandwidth_gbps")] == \
        ["excess (ms)", "straggler iterations", "mean (µs)", "bandwidth (GB/s)"]
    summary = pd.DataFrame({"name": ["step", "opt"], "count": [10, 10], "cpu_total_ns": [30_000e6, 1_500e6],
                            "gpu_busy_total_ns": [1_700e6, 20e6], "gpu_proj_total_ns": [1_800e6, 30e6]})
    assert nvtx_gpu_proj.top_ranges(summary).layout.xaxis.type == "log"  # 20 ms next to 30 s: decades apart
    even = summary.assign(cpu_total_ns=[30e6, 25e6], gpu_busy_total_ns=[20e6, 15e6])
    assert nvtx_gpu_proj.top_ranges(even).layout.xaxis.type is None


def test_heatmap_and_arrival_skew_put_each_iteration_at_the_same_place():
    it = pd.DataFrame({"rank": np.repeat([0, 1], 5), "iteration": np.tile(np.arange(3, 8), 2), "score": 1.0,
                       "duration_ns": 1e6, "wait_ns": 0, "busy_ns": 1e6, "cause": None, "is_straggler": False,
                       "arrival_skew_ns": np.arange(10) * 1000})
    a, b = plots.heatmap(it).layout, plots.arrival_skew(it).layout
    assert tuple(a.xaxis.range) == tuple(b.xaxis.range) == (2.5, 7.5)
    assert a.margin == b.margin


def test_arrival_skew_shows_each_iterations_latest_rank_and_median_by_hand():
    # three ranks, two iterations: iteration 0 arrivals 0, 5, 5 ms (a tie: the last rank of it shown), iteration 1
    # arrivals 2 ms, none (no sync point on rank 1), 0 ms
    ms = 1_000_000
    it = pd.DataFrame({"rank": np.repeat([0, 1, 2], 2), "iteration": np.tile([0, 1], 3),
                       "arrival_skew_ns": pd.array([0, 2 * ms, 5 * ms, None, 5 * ms, 0], dtype="Int64")})
    latest, median = plots.arrival_skew(it).data
    assert list(latest.x) == [0, 1] and list(latest.y) == [5.0, 2.0] and list(latest.customdata) == [2, 0]
    assert list(median.x) == [0, 1] and list(median.y) == [5.0, 1.0]  # medians of (0, 5, 5) and (2, 0)
