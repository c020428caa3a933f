import os
import shutil
import socket
import uuid
from pathlib import Path

import pytest

from nsys_recipe_pack import nsys_tool
from nsys_recipe_pack.errors import BadInputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_reports"
CPU_SET = SAMPLES / "cpu_ddp"
MPI_SET = SAMPLES / "gpubootcamp_mpi_jacobi_v100"
AI_SET = SAMPLES / "ai_profiler_a100"
MEMCPY_SET = SAMPLES / "gpubootcamp_jacobi_memcpy"


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """Exports go to a fresh cache per test session; nsys itself is the one `make test` set up."""
    found = nsys_tool.find_nsys(required=False)
    old = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "NSYS")}
    if found is not None:
        os.environ["NSYS"] = str(found.path)
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def nsys():
    """The real Nsight Systems; `make test` fetches it, so a missing one is a failure, not a skip."""
    return nsys_tool.find_nsys(required=True)


@pytest.fixture()
def mpi_copy(tmp_path):
    """The MPI set copied with timestamps kept (for cache tests)."""
    dest = tmp_path / "mpi"
    shutil.copytree(MPI_SET, dest)
    return dest


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for schedulers and rendezvous the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_processes(env):
    """Kill whatever still runs with the marker of `env` (from the `reaped_env` fixture)."""
    import psutil

    marker = env["NSYS_RECIPE_TEST_RUN"]
    for _ in range(3):
        left = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.pid != os.getpid() and proc.environ().get("NSYS_RECIPE_TEST_RUN") == marker:
                    left.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not left:
            return
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)


@pytest.fixture()
def reaped_env():
    """An environment whose processes are all ended after the test: everything started with it carries a
    marker variable (children inherit it, daemons too), and whatever still runs with it is killed by pid."""
    env = dict(os.environ, NSYS_RECIPE_TEST_RUN=uuid.uuid4().hex)
    yield env
    end_processes(env)


def folded(spec, path, options: dict, needs: set | None = None, stream=None) -> list[tuple]:
    """Each rank of one export with its result of the recipe's stream, its tables read span by span of time however
    short the export (nsys_recipe_pack.driver.fold_ranks), or None for every rank where the driver reads it whole.
    stream: in place of the recipe's."""
    from nsys_recipe_pack import driver
    from nsys_recipe_pack.inputs import rank_data

    with pytest.MonkeyPatch.context() as m, driver.reading_for(spec, path, options, needs=needs) as reading:
        m.setattr(rank_data, "STREAM_MIN_ROWS", 0)
        stream = stream or spec.stream
        found = driver.fold_ranks(reading, stream, options) if reading.long(stream) else None
        return [(r, r.streamed) for r in found] if found is not None else [(r, None) for r in reading.ranks()]


def rank_maps(spec, path, options: dict, spans: bool, needs: set | None = None) -> list:
    """A recipe's map of each rank of one export, from whole tables or (spans) from its stream's fold (`folded`);
    an error's text in place of a map."""
    from nsys_recipe_pack.inputs import load_file

    if spans:
        pairs = folded(spec, path, options, needs)
    else:
        pairs = [(r, None) for r in load_file(path, needs or set(spec.needs))]
    assert all((result is not None) == spans for _, result in pairs), path
    out = []
    for r, _ in pairs:
        try:
            out.append(spec.map_rank(r, options))
        except BadInputError as e:
            out.append(str(e))
    return out
