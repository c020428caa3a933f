"""A run killed part-way leaves nothing behind; two runs at once both succeed and share the cache safely."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import CPU_SET, MPI_SET


def _as_in_a_terminal():
    # a job started in the background by a non-interactive shell (as CI may run the tests) inherits SIGINT
    # ignored, and Python then never raises KeyboardInterrupt; a user's Ctrl-C comes with the default action
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args, cwd, env=None):
    exe = Path(sys.executable).with_name("nsys-recipe")
    return subprocess.Popen([str(exe), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=_as_in_a_terminal)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_killed_run_leaves_no_output_folder(tmp_path, sig, nsys):
    out = tmp_path / "o"
    proc = start(["run", "--name", "straggler_heatmap", "--engine", "pack", "--mode", "none", "--report",
                  "--output", str(out), str(CPU_SET)], cwd=tmp_path)
    deadline = time.time() + 60
    while not list(tmp_path.glob(".o.partial-*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    time.sleep(1.0)  # well inside the work (the notebook alone takes seconds)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.")]


def test_killed_during_export_leaves_a_consistent_cache(tmp_path, nsys):
    import os

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = start(["run", "--name", "kernel_pace", "--engine", "pack", "--mode", "none", "--kernel", "jacobi_kernel",
                  "--output", str(tmp_path / "o"), str(MPI_SET)], cwd=tmp_path, env=env)
    exports = tmp_path / "cache" / "nsys-recipe-pack" / "exports"
    deadline = time.time() + 60
    while not (exports.exists() and any(p.is_dir() for p in exports.iterdir())) and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert not (tmp_path / "o").exists()
    leftovers = [p for p in exports.iterdir() if p.name.startswith(".export-")]
    assert not leftovers
    for entry in (p for p in exports.iterdir() if p.is_dir()):
        manifest = entry / "manifest.json"
        if manifest.exists():  # an entry is only trusted through its manifest, written last
            tables = json.loads(manifest.read_text())["requested"]
            assert "CUPTI_ACTIVITY_KIND_KERNEL" in tables
    # and the next run simply works
    res = subprocess.run([str(Path(sys.executable).with_name("nsys-recipe")), "run", "--name", "kernel_pace",
                          "--engine", "pack", "--kernel", "jacobi_kernel", "--output", str(tmp_path / "o2"),
                          str(MPI_SET)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr


def test_two_runs_at_once_share_the_cache(tmp_path, nsys):
    import os

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    args = ["run", "--name", "sync_summary", "--engine", "pack", str(MPI_SET)]
    procs = [start([*args, "--output", str(tmp_path / f"o{i}")], cwd=tmp_path, env=env) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    a = pd.read_parquet(tmp_path / "o0" / "sync_calls.parquet")
    b = pd.read_parquet(tmp_path / "o1" / "sync_calls.parquet")
    pd.testing.assert_frame_equal(a, b)
    exports = tmp_path / "cache" / "nsys-recipe-pack" / "exports"
    entries = [p for p in exports.iterdir() if p.is_dir()]
    assert len(entries) == 5  # one per report, not one per run
    for e in entries:
        manifest = json.loads((e / "manifest.json").read_text())
        assert {"CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"} <= set(manifest["requested"])
        assert (e / "CUPTI_ACTIVITY_KIND_RUNTIME.arrow").exists()


def _wait_for(condition, proc, seconds=120):
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"


@pytest.mark.parametrize("stage", ["loading", "analysis", "report"])
def test_ctrl_c_at_each_stage_of_several_recipes_leaves_nothing_and_a_rerun_just_works(tmp_path, stage, nsys):
    """Ctrl-C while reports are exported (loading), while the first recipe maps its ranks (analysis), and while
    its notebook runs (report, once its tables are written): no output folder, no half-made file, and the
    same command then succeeds without --force-overwrite."""
    import os

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / ("cold" if stage == "loading" else "warm")))
    interrupted_env = env
    if stage == "loading":  # exports of these small reports take a fraction of a second: each is made to last 2 s
        slow = tmp_path / "slow-nsys"
        slow.write_text(f'#!/bin/sh\n[ "$1" = export ] && sleep 2\nexec "{nsys.path}" "$@"\n')
        slow.chmod(0o755)
        interrupted_env = dict(env, NSYS=str(slow))
    out = tmp_path / "o"
    args = ["run", "--name", "straggler_heatmap,kernel_pace", "--engine", "pack", "--mode", "none", "--report",
            "--output", str(out), str(CPU_SET)]
    if stage != "loading":  # exports cached, so the run goes straight to the analysis
        warm = subprocess.run([str(Path(sys.executable).with_name("nsys-recipe")), *args[:-3], "--output",
                               str(tmp_path / "warmup"), str(CPU_SET)], env=env, capture_output=True, text=True)
        assert warm.returncode == 0, warm.stderr
    proc = start(args, cwd=tmp_path, env=interrupted_env)
    exports = tmp_path / "cold" / "nsys-recipe-pack" / "exports"

    def staged(name):  # the first recipe's folder, inside the run's own (several recipes are one output)
        return [p for p in tmp_path.glob(".o.partial-*/.straggler_heatmap.partial-*") if (p / name).exists()]

    if stage == "loading":
        _wait_for(lambda: exports.exists() and any(p.name.startswith(".export-") for p in exports.iterdir()), proc)
    elif stage == "analysis":
        _wait_for(lambda: any(tmp_path.glob(".o.partial-*/.straggler_heatmap.partial-*")), proc)
    else:
        _wait_for(lambda: staged("iterations.parquet"), proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.")]
    again = subprocess.run([str(Path(sys.executable).with_name("nsys-recipe")), *args], env=env, cwd=tmp_path,
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (out / "straggler_heatmap" / "report.html").exists() and (out / "kernel_pace" / "report.html").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_of_several_recipes_interrupted_between_them_leaves_nothing(tmp_path, sig):
    """Several recipes are one output: stopped after the first has finished, the run leaves no folder, so that
    running it again needs no --force-overwrite."""
    from conftest import SAMPLES

    out = tmp_path / "o"
    args = ["run", "--name", "straggler_heatmap,kernel_pace", "--mode", "none", "--report", "--output", str(out),
            str(SAMPLES / "h100_gloo_8rank")]
    proc = start(args, cwd=tmp_path)
    deadline = time.time() + 120
    while not list(tmp_path.glob(".o.partial-*/straggler_heatmap")) and time.time() < deadline \
            and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(sig)  # kernel_pace (and its notebook) still to come
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not out.exists() and not list(tmp_path.glob(".o.*"))
    again = start(args, cwd=tmp_path)
    res_out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert (out / "straggler_heatmap" / "report.html").exists() and (out / "kernel_pace" / "report.html").exists()
    assert f"output: {out / 'kernel_pace'}" in res_out and f"report: {out / 'kernel_pace' / 'report.html'}" in res_out
