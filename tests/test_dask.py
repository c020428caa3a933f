"""A real Dask cluster on 127.0.0.1: one `dask scheduler`, two `nsys-recipe dask-worker` processes.

Both execution paths (the pack's runner and `nsys recipe --mode dask-futures`) must give the same tables
as a local run, and everything the test started must be gone afterwards.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import distributed
import pytest
from conftest import MPI_SET, free_port
from test_cli import assert_same_tables, cli

ARGS = ["--iteration-kernel", "jacobi_kernel"]



def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.fixture()
def cluster(tmp_path):
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    exe = Path(sys.executable).with_name("nsys-recipe")
    scheduler = _start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                        "--port", str(port), "--no-dashboard"], tmp_path / "scheduler.log")
    workers = [_start([str(exe), "dask-worker", address, "--", "--no-dashboard", "--name", f"w{i}"],
                      tmp_path / f"worker{i}.log") for i in range(2)]
    procs = [scheduler, *workers]
    try:
        deadline = time.time() + 90
        while True:
            try:
                with distributed.Client(address, timeout="5s") as client:
                    client.wait_for_workers(2, timeout=max(1.0, deadline - time.time()))
                    break
            except (OSError, TimeoutError):
                if time.time() > deadline or any(p.poll() is not None for p in procs):
                    logs = "\n".join(f.read_text()[-1500:] for f in sorted(tmp_path.glob("*.log")))
                    pytest.fail(f"the Dask cluster did not come up:\n{logs}")
                time.sleep(0.5)
        yield address, procs
    finally:
        _stop(procs)


def test_straggler_heatmap_on_a_real_dask_cluster(nsys, cluster, tmp_path):
    address, procs = cluster
    mpi = tmp_path / "mpi"  # `nsys recipe` writes exports beside the reports: use a copy
    shutil.copytree(MPI_SET, mpi)
    local = tmp_path / "local"
    res = cli("run", "--name", "straggler_heatmap", "--engine", "pack", "--mode", "none", "--output", str(local),
              *ARGS, str(mpi))
    assert res.returncode == 0, res.stderr
    for engine in ("pack", "nsys"):
        out = tmp_path / f"dask-{engine}"
        res = cli("run", "--name", "straggler_heatmap", "--engine", engine, "--mode", "dask-futures",
                  "--dask-scheduler", address, "--output", str(out), *ARGS, str(mpi))
        assert res.returncode == 0, res.stderr[-3000:]
        assert_same_tables(local, out)

    # the work really ran on the cluster: one map task per report per engine, on both workers
    with distributed.Client(address, timeout="10s") as client:
        finished = client.run_on_scheduler(lambda dask_scheduler: [
            str(t.key) for t in dask_scheduler.transition_log if t.finish == "memory"])
        assert sum("map_file" in k for k in finished) >= 2 * len(list(mpi.glob("*.nsys-rep")))
        assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == ["w0", "w1"]
        counters = client.run(lambda dask_worker: dask_worker.state.transition_counter)
        assert len(counters) == 2 and min(counters.values()) > 0
        names = client.run(lambda: __import__("nsys_recipe").__name__)  # NVIDIA's package importable there
        assert set(names.values()) == {"nsys_recipe"}

    _stop(procs)
    assert all(p.poll() is not None for p in procs)


def test_unreachable_scheduler_is_one_line_exit_4(tmp_path):
    port = free_port()
    res = cli("run", "--name", "straggler_heatmap", "--engine", "pack", "--mode", "dask-futures", "--dask-scheduler",
              f"tcp://127.0.0.1:{port}", "--output", str(tmp_path / "o"), *ARGS, str(MPI_SET))
    assert res.returncode == 4, res.stderr
    assert "Dask scheduler" in res.stderr.strip().splitlines()[-1] and "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()
