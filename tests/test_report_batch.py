"""`nsys-recipe report` over two runs, and every HTML it makes opened in headless Chromium with no network."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import CPU_SET, MEMCPY_SET

from nsys_recipe_pack import recipes

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]  # no network at all


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, nsys):
    out = tmp_path_factory.mktemp("rep") / "report"
    exe = Path(sys.executable).with_name("nsys-recipe")
    res = subprocess.run([str(exe), "report", str(CPU_SET), str(MEMCPY_SET / "jacobi_report.qdrep"), "--output",
                          str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return out


def test_index_runs_recipes_and_reasons(report_dir):
    index = pd.read_parquet(report_dir / "index.parquet")
    assert set(index["run"]) == {"cpu_ddp", "jacobi_report"} and len(index) == 2 * len(recipes.all_recipes())
    cpu = index[index["run"] == "cpu_ddp"].set_index("recipe")
    assert cpu.loc["straggler_heatmap", "status"] == "done"
    assert cpu.loc["straggler_heatmap", "headline"].startswith("rank 2 holds the others back in 11 of 60 iterations")
    assert cpu.loc["compute_memory_share", "status"] == "not applicable"
    assert "-t cuda" in cpu.loc["compute_memory_share", "headline"]
    gpu = index[index["run"] == "jacobi_report"].set_index("recipe")
    assert (gpu.drop(index=["comm_overlap", "gpu_memory", "collectives", "pipeline_bubbles", "critical_path"])[
        "status"] == "done").all()
    assert gpu.loc["critical_path", "status"] == "not applicable" and "never meet" in \
        gpu.loc["critical_path", "headline"]
    assert cpu.loc["critical_path", "status"] == "done"
    assert gpu.loc["collectives", "status"] == "not applicable" and "NCCL" in gpu.loc["collectives", "headline"]
    assert gpu.loc["pipeline_bubbles", "status"] == "not applicable" and "no pipeline" in \
        gpu.loc["pipeline_bubbles", "headline"]
    assert gpu.loc["gpu_memory", "status"] == "not applicable"
    assert "--cuda-memory-usage=true" in gpu.loc["gpu_memory", "headline"]
    # a single-GPU job has no NCCL kernels: comm_overlap says so instead of drawing an empty chart
    assert gpu.loc["comm_overlap", "status"] == "not applicable" and "NCCL" in gpu.loc["comm_overlap", "headline"]
    html = (report_dir / "index.html").read_text()
    for r in index[index["status"] == "done"].itertuples():
        assert f"{r.run}/{r.recipe}/report.html" in html
        assert (report_dir / r.run / r.recipe / "report.html").exists()
    for run in ("cpu_ddp", "jacobi_report"):
        assert (report_dir / run / "overview.html").exists()
    # gloo's all-reduce runs on the host: comm_overlap does not apply, and the overview says how the job communicated
    assert "Communication on the host, not the GPU: collective NVTX ranges" in \
        (report_dir / "cpu_ddp" / "overview.html").read_text()
    # one copy of plotly.js for the whole report folder: every page loads it by a relative path
    assert [p.relative_to(report_dir).as_posix() for p in report_dir.rglob("plotly.min.js")] == ["plotly.min.js"]
    for page in report_dir.rglob("*.html"):
        text = page.read_text()
        assert "plotly.js v" not in text
        if 'class="plotly-graph-div"' in text:
            depth = len(page.relative_to(report_dir).parts) - 1
            assert f'src="{"../" * depth}plotly.min.js"' in text, page


@pytest.mark.skipif(CHROMIUM is None, reason="make test installs Debian's chromium; it is not on PATH here")
def test_every_html_renders_its_figures_without_console_errors(report_dir, tmp_path):
    pages = sorted(report_dir.rglob("*.html"))
    shots = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    assert len(pages) >= 10
    for page in pages:
        expected = len(re.findall(r'class="plotly-graph-div"', page.read_text()))
        profile = tmp_path / f"profile-{page.parent.name}"
        res = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                              "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-1000:]
        rendered = len(re.findall(r'class="main-svg"', res.stdout))
        # each plotly figure draws at least one svg.main-svg (usually two layers)
        assert rendered >= expected, (page, expected, rendered)
        console = [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
        assert not console, (page, console)  # headless Chromium logs every console message, errors included
        name = "_".join(page.relative_to(report_dir).with_suffix(".png").parts)
        subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1280,2400",
                        "--virtual-time-budget=15000", f"--screenshot={shots / name}", page.as_uri()],
                       capture_output=True, timeout=120)
        assert (shots / name).exists()


def test_host_communication_time_equals_sql(tmp_path):
    """The H100 gloo job's time in its `allreduce` NVTX ranges inside its `step` ranges, all ranks, as straggler_heatmap
    counts it for the overview's communication line, against SQL over the shipped exports."""
    import json
    import sqlite3

    from nsys_recipe_pack import run_recipe
    from nsys_recipe_pack.plots.comm_overlap import host_communication

    h100 = Path(__file__).resolve().parents[1] / "sample_reports" / "h100_gloo_8rank"
    res = run_recipe("straggler_heatmap", [str(h100)], str(tmp_path / "straggler_heatmap"), mode="none")
    want = 0
    for export in sorted(h100.glob("rank*.sqlite")):
        with sqlite3.connect(export) as db:
            (ns,) = db.execute(
                "WITH r AS (SELECT coalesce(e.text, s.value) AS name, e.start, e.end, e.globalTid FROM NVTX_EVENTS e "
                "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.end IS NOT NULL) "
                "SELECT sum(min(a.end, b.end) - max(a.start, b.start)) FROM r a JOIN r b ON a.globalTid = b.globalTid "
                "AND b.name = 'step' AND a.start < b.end AND a.end > b.start WHERE a.name = 'allreduce'").fetchone()
            want += ns
    analysis = json.loads((res.output_dir / "analysis.json").read_text())
    assert analysis["sync_time_ns"]["collective NVTX range"] == want
    assert f"collective NVTX ranges {want / 8 / 1e9:,.2f} s" in host_communication(tmp_path)


def test_host_waiting_at_the_last_collective_by_hand(tmp_path):
    """Three ranks, two iterations: arrivals 0, 5, 20 ms after the first, then 0, 30, 10 ms (rank 0 without an arrival
    in the second). Waits for the last: 20 + 15 + 0, then 0 + 20 (rank 1 last): 55 ms in all, 18.3 ms per rank; rank 2
    was waited for 35 of them (64 %)."""
    import json

    from nsys_recipe_pack.plots.comm_overlap import host_communication

    out = tmp_path / "straggler_heatmap"
    out.mkdir()
    (out / "analysis.json").write_text(json.dumps({"sync_time_ns": {"collective NVTX range": 90_000_000}}))
    pd.DataFrame({"rank": [0, 1, 2, 0, 1, 2], "iteration": [0, 0, 0, 1, 1, 1], "duration_ns": 100_000_000,
                  "arrival_skew_ns": pd.array([0, 5, 20, None, 30, 10], "Int64") * 1_000_000}) \
        .to_parquet(out / "iterations.parquet")
    assert "; 0.02 s of it waiting for the last rank at each iteration's last collective, 64 % of that for rank 2" in \
        host_communication(tmp_path)
