"""The command line: exit codes, one-line errors, both engines giving the same tables."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pandas.testing as pdt
import pytest
from conftest import MPI_SET, ROOT

from nsys_recipe_pack import resources
from nsys_recipe_pack.cli import main

NEWER = ROOT / "tests/data/newer_nsys_format/pdl_2p2c.nsys-rep"
TABLES = ["iterations", "ranks", "stragglers", "files"]


def cli(*args, cwd=None):
    exe = Path(sys.executable).with_name("nsys-recipe")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd)


def one_line_error(res):
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert lines and "Traceback" not in res.stderr, res.stderr
    return lines[-1]


def test_list_shows_recipes():
    res = cli("list")
    assert res.returncode == 0 and "straggler_heatmap" in res.stdout


def test_the_command_runs_numpy_on_one_blas_thread_and_leaves_the_environment_as_it_was():
    code = "\n".join([
        "import ctypes, os, re",
        "import nsys_recipe_pack.cli",
        "libs = sorted(set(re.findall(r'/\\S*openblas\\S*\\.so[.\\d]*', open('/proc/self/maps').read())))",
        "lib = ctypes.CDLL(libs[0]) if libs else None",
        "count = next((getattr(lib, f) for f in ('scipy_openblas_get_num_threads64_', 'openblas_get_num_threads')",
        "              if lib is not None and hasattr(lib, f)), None)",
        "print(count() if count else 'none', os.environ.get('OPENBLAS_NUM_THREADS'))",
    ])
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    ours = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    if ours.stdout.split()[0] == "none":
        pytest.skip("NumPy here is not built on OpenBLAS")
    assert ours.stdout.split() == ["1", "None"]  # the processes it starts see no setting it made
    told = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**env, "OPENBLAS_NUM_THREADS": "2"})
    assert told.stdout.split() == ["2", "2"]


def test_a_reader_that_goes_away_is_not_an_error():
    # `nsys-recipe list | head -1`: the pipe is closed before the command writes
    exe = Path(sys.executable).with_name("nsys-recipe")
    read, write = os.pipe()
    os.close(read)
    res = subprocess.run([str(exe), "list"], stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    assert res.stderr == "" and res.returncode == 141


def test_no_inputs_is_a_usage_error(tmp_path):
    res = cli("run", "--name", "straggler_heatmap", "--output", str(tmp_path / "o"))
    assert res.returncode == 2
    assert "no inputs" in one_line_error(res)
    assert not (tmp_path / "o").exists()


def test_unknown_recipe_is_a_usage_error():
    res = cli("run", "--name", "no_such_recipe", str(MPI_SET))
    assert res.returncode == 2 and "unknown recipe" in one_line_error(res)


def test_a_flag_of_another_recipe_is_a_usage_error_naming_the_recipe_that_takes_it(tmp_path):
    res = cli("run", "--name", "kernel_pace", "--threshold", "3", "--output", str(tmp_path / "o"), str(MPI_SET))
    assert res.returncode == 2 and not (tmp_path / "o").exists()
    assert one_line_error(res).endswith("--threshold is not an option of kernel_pace; it is an option of "
                                        "straggler_heatmap")
    shared = cli("run", "--name", "kernel_pace,sync_summary", "--iteration", "x", "--sigma", "2", str(MPI_SET))
    assert shared.returncode == 2
    assert one_line_error(shared).endswith("--sigma is not an option of kernel_pace, sync_summary; it is an option "
                                           "of straggler_heatmap")
    listed = cli("list").stdout.splitlines()
    options = listed[listed.index(next(ln for ln in listed if ln.startswith("straggler_heatmap"))) + 1]
    assert options.split() == ["options:", "--iteration", "--iteration-kernel", "--sync", "--threshold", "--sigma",
                               "--keep-warmup", "--parallel"]


def test_the_packs_own_error_inside_nsys_recipe_is_the_same_error(nsys, tmp_path):
    res = cli("run", "--name", "kernel_pace", "--engine", "nsys", "--kernel", "jacobi_kernal", "--output",
              str(tmp_path / "o"), str(MPI_SET))
    assert res.returncode == 3 and not (tmp_path / "o").exists()
    assert one_line_error(res).endswith("no kernel named 'jacobi_kernal'; closest names: 'jacobi_kernel'")
    assert "nsys recipe kernel_pace` failed" not in res.stderr


def test_existing_output_folder_is_not_touched(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = cli("run", "--name", "straggler_heatmap", "--iteration-kernel", "jacobi_kernel", "--output", str(out),
              str(MPI_SET))
    assert res.returncode == 2
    msg = one_line_error(res)
    assert str(out) in msg and "--force-overwrite" in msg
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_report_from_newer_nsys_names_both_versions(nsys, tmp_path):
    rep = tmp_path / NEWER.name
    shutil.copy2(NEWER, rep)
    res = cli("run", "--name", "straggler_heatmap", "--engine", "pack", "--output", str(tmp_path / "o"), str(rep))
    assert res.returncode == 3
    msg = one_line_error(res)
    assert str(rep) in msg and "2025.5" in msg and nsys.version in msg and "--nsys" in msg
    assert not (tmp_path / "o").exists()


def read_tables(out: Path) -> dict:
    return {t: pd.read_parquet(out / f"{t}.parquet") for t in TABLES}


def assert_same_tables(a: Path, b: Path):
    ta, tb = read_tables(a), read_tables(b)
    for t in TABLES:
        x, y = ta[t], tb[t]
        if t == "files":  # same ranks and files; paths may be spelled differently
            x = x.assign(file=x["file"].map(lambda p: Path(p).name))
            y = y.assign(file=y["file"].map(lambda p: Path(p).name))
        pdt.assert_frame_equal(x, y)


def test_pack_engine_nsys_engine_and_plain_nsys_recipe_agree(nsys, tmp_path):
    args = ["--iteration-kernel", "jacobi_kernel"]
    pack, fw = tmp_path / "pack", tmp_path / "fw"
    res = cli("run", "--name", "straggler_heatmap", "--engine", "pack", "--output", str(pack), *args, str(MPI_SET))
    assert res.returncode == 0, res.stderr
    res = cli("run", "--name", "straggler_heatmap", "--engine", "nsys", "--output", str(fw), *args, str(MPI_SET))
    assert res.returncode == 0, res.stderr
    assert_same_tables(pack, fw)
    assert list(fw.glob("*.nsys-analysis")) and list(pack.glob("*.nsys-analysis"))

    # NVIDIA's own command with the pack's recipes on NSYS_RECIPE_PATH
    env = dict(os.environ, NSYS_RECIPE_PATH=str(resources.recipes_dir()),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    plain = tmp_path / "plain"
    res = subprocess.run([str(nsys.path), "recipe", "straggler_heatmap", "--input", str(MPI_SET), "--output",
                          str(plain), *args], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert_same_tables(pack, plain)


def test_main_returns_exit_code_without_traceback(capsys):
    assert main(["run", "--name", "straggler_heatmap"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_synth_command_and_default_output_name(tmp_path):
    res = cli("synth", "--ranks", "3", "--iterations", "8", "--straggler",
              "rank=1,iterations=2-4,cause=compute,slowdown=1.6",
              "--output", str(tmp_path / "syn"))
    assert res.returncode == 0, res.stderr
    assert "SYNTHETIC" in res.stdout
    res = cli("synth", "--ranks", "3", "--straggler", "rank=1,iterations=2-4,cause=disk", "--output",
              str(tmp_path / "x"))
    assert res.returncode == 2 and "cause must be one of" in one_line_error(res)
    first = cli("run", "--name", "straggler_heatmap", str(tmp_path / "syn"), cwd=tmp_path)
    second = cli("run", "--name", "straggler_heatmap", str(tmp_path / "syn"), cwd=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert (tmp_path / "straggler_heatmap-1" / "iterations.parquet").exists()
    assert (tmp_path / "straggler_heatmap-2" / "iterations.parquet").exists()
    assert "top stragglers" in first.stdout and "   1 " in first.stdout


def test_gpu_recipes_same_tables_from_both_engines_and_nsys_recipe(nsys, tmp_path):
    mpi = tmp_path / "mpi"  # `nsys recipe` may write exports beside the reports: use a copy
    shutil.copytree(MPI_SET, mpi)
    env = dict(os.environ, NSYS_RECIPE_PATH=str(resources.recipes_dir()),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    for recipe, args, tables in [("kernel_pace", ["--kernel", "jacobi_kernel"], ["pace", "stats"]),
                                 ("compute_memory_share", [], ["share", "by_range"]),
                                 ("sync_summary", [], ["sync_calls", "summary", "findings"]),
                                 ("nvtx_gpu_proj", [], ["ranges", "summary"])]:
        pack = tmp_path / f"{recipe}-pack"
        res = cli("run", "--name", recipe, "--engine", "pack", "--output", str(pack), *args, str(mpi))
        assert res.returncode == 0, res.stderr
        plain = tmp_path / f"{recipe}-plain"
        alias = ["--name", "jacobi_kernel"] if recipe == "kernel_pace" else []  # like cuda_gpu_kern_pace
        res = subprocess.run([str(nsys.path), "recipe", recipe, "--input", str(mpi), "--output", str(plain), *alias],
                             capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        for t in tables:
            pdt.assert_frame_equal(pd.read_parquet(pack / f"{t}.parquet"), pd.read_parquet(plain / f"{t}.parquet"))


def test_builtin_and_pack_recipes_in_one_run(nsys, tmp_path):
    mpi = tmp_path / "mpi"  # the built-ins write exports beside the reports
    shutil.copytree(MPI_SET, mpi)
    listed = cli("list")
    assert "[nsys built-in]" in listed.stdout and "cuda_api_sum" in listed.stdout
    out = tmp_path / "three"
    res = cli("run", "--name", "cuda_api_sum,nvtx_sum,straggler_heatmap", "--iteration-kernel", "jacobi_kernel",
              "--output", str(out), str(mpi))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["cuda_api_sum", "nvtx_sum", "straggler_heatmap"]
    # NVIDIA's nvtx_sum and the pack's inputs agree on the instances of each range
    from nsys_recipe_pack import inputs
    from nsys_recipe_pack.iterations import closed_ranges

    stats = pd.read_parquet(out / "nvtx_sum" / "all_stats.parquet")  # index: the range text
    mine = sum(int((closed_ranges(rd.nvtx)["name"] == "MPI").sum())
               for f in sorted(mpi.glob("*.qdrep")) for rd in inputs.load_file(f, {"nvtx"}))
    assert int(stats.loc["MPI", "Count"]) == mine == 5 * 1000
    assert (out / "cuda_api_sum" / "cuda_api_sum.nsys-analysis").exists()
    assert (out / "straggler_heatmap" / "iterations.parquet").exists()
    res = cli("run", "--name", "cuda_api_sum", "--output", str(tmp_path / "x"),
              str(tmp_path / "mpi" / "report1_pqtdir"))
    assert res.returncode == 2 and "reads .nsys-rep/.qdrep reports only" in one_line_error(res)


def test_several_recipes_run_every_one_that_applies_and_say_why_the_others_did_not(tmp_path):
    from nsys_recipe_pack.synth import write_synthetic

    data = write_synthetic(tmp_path / "mpi", ranks=3, iterations=8, fmt="sqlite", job="mpi")  # no NVTX at all
    out = tmp_path / "out"
    res = cli("run", "--name", "nvtx_gpu_proj,kernel_pace,sync_summary", str(data), "--output", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["kernel_pace", "sync_summary"]
    assert len(pd.read_parquet(out / "kernel_pace" / "pace.parquet")) == 3 * 8
    table = res.stdout[res.stdout.index("recipes:"):].splitlines()
    assert [ln.split()[:2] for ln in table[1:]] == [["nvtx_gpu_proj", "skipped"], ["kernel_pace", "done"],
                                                    ["sync_summary", "done"]]
    # the advice fits a report with no NVTX at all: how to add ranges, and what works without them
    assert "add ranges around its phases" in table[1] and "kernel_pace, sync_summary" in table[1]
    # when no recipe applies: exit 3 and no output folder
    res = cli("run", "--name", "nvtx_gpu_proj,compute_memory_share", str(ROOT / "sample_reports/cpu_ddp"),
              "--output", str(tmp_path / "none"))
    assert res.returncode == 3 and not (tmp_path / "none").exists(), res.stdout + res.stderr
    assert "skipped" in res.stdout and "needs CUDA" in res.stdout


def test_long_steps_say_when_they_start_while_they_run_and_when_they_end():
    import io
    import time

    from nsys_recipe_pack import progress

    out = io.StringIO()
    with progress.step("notebook", stream=out, every=0.05):
        time.sleep(0.18)
    lines = out.getvalue().splitlines()
    assert lines[0] == "notebook ..." and lines[-1].startswith("notebook: done in ")
    assert 2 <= sum(ln.endswith("s so far") for ln in lines) <= 4
    out = io.StringIO()
    try:
        with progress.step("export", stream=out, every=10):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert out.getvalue().splitlines()[-1].startswith("export: stopped after ")


def test_a_run_with_a_report_says_how_long_the_notebook_took(tmp_path):
    from nsys_recipe_pack.synth import write_synthetic

    data = write_synthetic(tmp_path / "s", ranks=2, iterations=6, fmt="sqlite")
    res = cli("run", "--name", "kernel_pace", str(data), "--output", str(tmp_path / "o"), "--report")
    assert res.returncode == 0, res.stderr
    assert "kernel_pace: report (notebook and HTML) ..." in res.stderr
    assert "kernel_pace: report (notebook and HTML): done in " in res.stderr
