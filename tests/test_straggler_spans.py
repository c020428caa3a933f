"""straggler_heatmap on a long capture, a few iterations at a time as its tables are read (iteration_slices): the same
map as over whole tables, however the tables are cut, and the whole read wherever slices cannot give it."""

import shutil
import sqlite3

import pytest
from conftest import folded, rank_maps
from test_batches import REAL_GLOO, synthetic  # noqa: F401 (a fixture)

from nsys_recipe_pack import recipes, synth
from nsys_recipe_pack.inputs import load_file, rank_data, read_progress, readers
from nsys_recipe_pack.recipes import straggler_heatmap as sh

SPEC = recipes.get("straggler_heatmap")


@pytest.fixture(scope="module")
def mpi_job(tmp_path_factory):
    """A SYNTHETIC MPI job (its iterations delimited by a kernel, its sync points MPI calls), one SQLite per rank."""
    dest = tmp_path_factory.mktemp("synthetic-mpi")
    synth.write_synthetic(dest, ranks=2, iterations=12, fmt="sqlite", job="mpi", seed=3,
                          stragglers=[synth.parse_straggler("rank=1,iterations=8-9,cause=gpu,slowdown=2")])
    return sorted(dest.glob("*.sqlite"))


def _same(path, options):
    whole, sliced = rank_maps(SPEC, path, options, False), rank_maps(SPEC, path, options, True)
    for want, got in zip(whole, sliced, strict=True):
        if isinstance(want, str):
            assert got == want, (path, options)
            continue
        for table in ("iterations", "components"):
            assert got[table].equals(want[table]), (path, options, table)
        assert got["delimiter"] == want["delimiter"] and got["sync_points"] == want["sync_points"], (path, options)
    return whole


@pytest.mark.parametrize("batch_rows", [7, 1000])
def test_slices_give_the_whole_reads_map(synthetic, mpi_job, monkeypatch, batch_rows):  # noqa: F811
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    for path in [REAL_GLOO, synthetic["sqlite"][1], synthetic["parquetdir"][2], mpi_job[1]]:
        kernel = load_file(path, {"kernel"})[0].frame("kernels").codes("name")[1][0]
        for options in ({}, {"iteration": "step", "sync": ["forward"]}, {"iteration_kernel": kernel},
                        {"iteration": "nope"}):
            whole = _same(path, options)
            if not options:  # iterations, child ranges or GPU work, and sync points were there to measure
                m = whole[0]
                assert m["iterations"].num_rows >= 6 and m["components"].num_rows > 0, path
                assert sum(m["sync_points"]) > 0, path


def test_a_real_report_is_measured_a_few_iterations_at_a_time(monkeypatch):
    """The real gloo rank: its 60 iterations measured in many pieces, never all its events held at once."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 500)
    pieces, held = [], []
    measure = sh.iteration_rows

    def counted(rank_data_, *args):
        held.append(sum(len(rank_data_.frame(a) or []) for a in ("nvtx", "runtime", "kernels", "memcpy", "memset")))
        piece = measure(rank_data_, *args)
        pieces.append(len(piece.start_ns))
        return piece

    monkeypatch.setattr(sh, "iteration_rows", counted)
    _same(REAL_GLOO, {})
    whole = load_file(REAL_GLOO, set(SPEC.needs))[0]
    total = sum(len(whole.frame(a)) for a in ("nvtx", "runtime", "kernels", "memcpy", "memset")
                if whole.frame(a) is not None)
    measured = pieces[1:]  # those of the sliced map (the whole one's came first)
    assert pieces[0] == sum(measured) == 60 and sum(1 for p in measured if p) >= 10
    assert held[0] == total and max(held[1:]) < total / 4


def test_what_slices_cannot_answer_is_read_whole(tmp_path, monkeypatch):
    """A launch key two calls hold: the whole read pairs an op with both, which slices cannot promise."""
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    path = tmp_path / "twice.sqlite"
    shutil.copy(REAL_GLOO, path)
    with sqlite3.connect(path) as db:
        first, second = db.execute("SELECT rowid FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IN "
                                   "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL) ORDER BY start LIMIT 2"
                                   ).fetchall()
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = (SELECT correlationId FROM "
                   "CUPTI_ACTIVITY_KIND_RUNTIME WHERE rowid = ?) WHERE rowid = ?", (first[0], second[0]))
    (rank, result), = folded(SPEC, path, {})
    assert result is None
    whole = load_file(path, set(SPEC.needs))[0]
    assert sh.map_rank(rank, {})["iterations"].equals(sh.map_rank(whole, {})["iterations"])


def test_an_op_that_runs_iterations_after_its_launch_holds_them_back(tmp_path, monkeypatch):
    """A kernel queued so long that it runs four iterations after its launch: the iterations from its launch on are
    measured together once it has come (the GPU time of the phase that launched it, and the host's waits before it,
    need it), and the map is the whole read's."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 200)
    it = sh.find_iterations(load_file(REAL_GLOO, set(SPEC.needs))[0])
    period = int(it.start_ns[6] - it.start_ns[5])
    path = tmp_path / "late.sqlite"
    shutil.copy(REAL_GLOO, path)
    with sqlite3.connect(path) as db:
        late = db.execute("SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start > ? ORDER BY start LIMIT 1",
                          (int(it.start_ns[5]),)).fetchone()[0]
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + ?, end = end + ? WHERE rowid = ?",
                   (4 * period, 4 * period, late))
        db.execute("CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start")
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM k")
        db.execute("DROP TABLE k")
    pieces = []
    measure = sh.iteration_rows

    def counted(*args):
        piece = measure(*args)
        pieces.append((piece.first, len(piece.start_ns)))
        return piece

    monkeypatch.setattr(sh, "iteration_rows", counted)
    _same(path, {})
    sliced = pieces[1:]  # after the whole map's one piece
    held = [p for p in sliced if p[0] <= 5 < p[0] + p[1]]
    assert held and held[0][0] + held[0][1] >= 10, sliced


def test_a_long_capture_tells_its_rows_to_read_from_the_start(monkeypatch):
    """The reads ahead of the spans (NVTX for the iterations, read once: the spans take its closed ranges from that
    read; every GPU op's launch key) count in the rows to read from the first line on, so that the time left is
    estimated over all of them and the last line says all were read."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 200)
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)
    seen = []
    monkeypatch.setattr(read_progress.ReadProgress, "_say", lambda self: seen.append((self.read, self.total)))
    (_, result), = folded(SPEC, REAL_GLOO, {})
    assert result["iterations"].num_rows >= 6
    con = sqlite3.connect(REAL_GLOO)
    count = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
             for t in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
                       "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")}
    con.close()
    twice = sum(n for t, n in count.items() if "RUNTIME" not in t and "NVTX" not in t)  # ahead, then in the spans
    assert len(seen) > 2 and {total for _, total in seen} == {sum(count.values()) + twice}
    assert seen[-1][0] == seen[-1][1]
