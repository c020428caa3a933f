"""Reading inputs (nsys_recipe_pack.inputs) against Nsight Systems' own tools on real reports."""

import ctypes
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pyarrow as pa
import pytest
from conftest import MPI_SET, SAMPLES
from export_variants import plant_memory

from nsys_recipe_pack import allocator, inputs, nsys_tool, recipes, runner, spill, synth
from nsys_recipe_pack.errors import BadInputError, PackError, UsageError
from nsys_recipe_pack.inputs import export, frames, loaded, rank_data, read_progress, readers

NEEDS = {"nvtx", "kernel", "memcpy", "memset", "runtime", "sync", "mpi"}


def nsys_stats(nsys, report: Path, name: str) -> pd.DataFrame:
    """`nsys stats` on a copy in a folder of its own: it writes an .sqlite beside the report it reads, which the
    loader would then read instead of the report."""
    private = report.parent / "stats" / report.name
    if not private.exists():
        private.parent.mkdir(exist_ok=True)
        shutil.copy2(report, private)
    res = subprocess.run([str(nsys.path), "stats", "-q", "--report", name, "--format", "csv", "--output", "-",
                          str(private)], capture_output=True, text=True, check=True)
    text = res.stdout[res.stdout.index("Time (%)"):]
    return pd.read_csv(io.StringIO(text))


@pytest.fixture(scope="module")
def report_copy(tmp_path_factory):
    dest = tmp_path_factory.mktemp("rep") / "report4.qdrep"
    shutil.copy2(MPI_SET / "report4.qdrep", dest)
    return dest


def test_kernels_and_nvtx_match_nsys_stats(nsys, report_copy):
    (rd,) = inputs.load_file(report_copy, NEEDS)
    kern = nsys_stats(nsys, report_copy, "cuda_gpu_kern_sum")
    assert len(rd.kernels) == kern["Instances"].sum()
    assert (rd.kernels["end_ns"] - rd.kernels["start_ns"]).sum() == kern["Total Time (ns)"].sum()
    per_name = rd.kernels.assign(d=rd.kernels["end_ns"] - rd.kernels["start_ns"]).groupby("full_name")["d"].sum()
    assert per_name.sort_index().to_dict() == kern.set_index("Name")["Total Time (ns)"].sort_index().to_dict()

    nvtx = nsys_stats(nsys, report_copy, "nvtx_sum")
    ranges = rd.nvtx[rd.nvtx["event_type"].isin([59, 60])]
    mine = ranges.groupby("name").size().sort_index().to_dict()
    theirs = nvtx.groupby("Range")["Instances"].sum().sort_index().to_dict()
    assert mine == theirs


def test_report_sqlite_and_parquetdir_read_the_same(nsys, report_copy, tmp_path):
    sq = tmp_path / "r.sqlite"
    pqt = tmp_path / "r_pqtdir"
    for kind, out in (("sqlite", sq), ("parquetdir", pqt)):
        subprocess.run([str(nsys.path), "export", "-q", "true", "--type", kind, "-o", str(out), str(report_copy)],
                       check=True, capture_output=True)
    (a,) = inputs.load_file(report_copy, NEEDS)
    (b,) = inputs.load_file(sq, NEEDS)
    (c,) = inputs.load_file(pqt, NEEDS)
    for attr in ("nvtx", "kernels", "memcpy", "runtime", "sync", "mpi"):
        x, y, z = (getattr(r, attr).reset_index(drop=True) for r in (a, b, c))
        pdt.assert_frame_equal(x, z, check_dtype=False)
        pdt.assert_frame_equal(x, y, check_dtype=False)
    assert a.session_start_ns == b.session_start_ns == c.session_start_ns > 0
    assert a.env["OMPI_COMM_WORLD_RANK"] == "2"


def test_export_cache_is_reused_across_copies_and_renewed_on_change(nsys, mpi_copy, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))
    report = mpi_copy / "report1.qdrep"
    calls = []
    real = nsys_tool.run_nsys

    def counting(*a, **kw):
        calls.append(a[1][0])
        return real(*a, **kw)

    monkeypatch.setattr(nsys_tool, "run_nsys", counting)
    inputs.load_file(report, {"nvtx"})
    inputs.load_file(report, {"nvtx"})
    assert calls == ["export"]
    # a copy of the folder with timestamps kept (cp -a, rsync -a) reuses the export
    moved = mpi_copy.parent / "elsewhere"
    shutil.copytree(mpi_copy, moved)
    inputs.load_file(moved / "report1.qdrep", {"nvtx"})
    assert calls == ["export"]
    # needing another table adds it to the same entry
    inputs.load_file(report, {"nvtx", "kernel"})
    assert calls == ["export", "export"]
    # a changed report is exported again
    st = report.stat()
    os.utime(report, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    inputs.load_file(report, {"nvtx"})
    assert calls == ["export", "export", "export"]


def test_what_a_killed_export_left_is_cleared_by_the_next_one(nsys, mpi_copy, monkeypatch, tmp_path):
    report = mpi_copy / "report1.qdrep"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "clean-cache"))
    (clean,) = inputs.load_file(report, {"nvtx", "kernel"})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))
    entry = export.export_entry(report, nsys_tool.Nsys(nsys.path, nsys.version, "test"))
    half = export.staging_dir(entry) / "x"  # what a run killed (SIGKILL) while nsys wrote its tables leaves
    half.mkdir(parents=True)
    (half / "NVTX_EVENTS.arrow").write_bytes(b"cut short")
    (after,) = inputs.load_file(report, {"nvtx", "kernel"})
    assert not export.staging_dir(entry).exists()
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]
    pdt.assert_frame_equal(after.nvtx, clean.nvtx)
    pdt.assert_frame_equal(after.kernels, clean.kernels)


def test_a_warm_load_reads_back_exactly_what_the_first_load_made(nsys, report_copy, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))
    (cold,) = inputs.load_file(report_copy, NEEDS)
    (entry,) = [p for p in inputs.export_cache_dir().iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert not list(entry.glob("loaded-*"))  # the read that exported the report keeps no frames
    inputs.load_file(report_copy, NEEDS)  # the second read does
    (cache,) = entry.glob(f"loaded-v{loaded.LOADED_FORMAT}-*")
    assert {p.name for p in cache.iterdir()} == {"meta.json", loaded.LOADED_FILE}  # one file for all frames
    monkeypatch.setattr(rank_data.Reading, "frames", None)  # the warm load must not touch the export
    (warm,) = inputs.load_file(report_copy, NEEDS)
    for attr in ("nvtx", "kernels", "memcpy", "memset", "runtime", "sync", "mpi"):
        pdt.assert_frame_equal(getattr(warm, attr), getattr(cold, attr), obj=attr)  # dtypes included
    assert (warm.pid, warm.env, warm.rank_candidates, warm.session_start_ns) == \
        (cold.pid, cold.env, cold.rank_candidates, cold.session_start_ns)


def test_only_needed_tables_are_exported(nsys, mpi_copy, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))
    report = mpi_copy / "report3.qdrep"
    inputs.load_file(report, {"nvtx"})
    entries = [p for p in inputs.export_cache_dir().iterdir() if p.is_dir() and not p.name.startswith(".")]
    tables = {f.stem for e in entries for f in e.glob("*.arrow")}
    assert "NVTX_EVENTS" in tables and "StringIds" in tables
    assert not any(t.startswith("CUPTI") for t in tables)


def _cache_entry(report: Path, nsys) -> tuple[str, set[str]]:
    """The kind of files a report's cache entry holds, by its manifest, and the suffixes of the files there."""
    entry = export.export_entry(report, nsys_tool.Nsys(nsys.path, nsys.version, "test"))
    manifest = json.loads((entry / "manifest.json").read_text())
    return manifest["kind"], {f.suffix for f in entry.iterdir() if f.is_file() and f.name != "manifest.json"}


def test_a_report_is_exported_as_arrow_up_to_a_size_and_as_parquet_above_it(nsys, mpi_copy, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "arrow-cache"))
    report = mpi_copy / "report1.qdrep"
    (from_arrow,) = inputs.load_file(report, NEEDS)
    assert _cache_entry(report, nsys) == ("arrowdir", {".arrow"})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "parquet-cache"))
    monkeypatch.setattr(export, "ARROW_EXPORT_MAX_BYTES", report.stat().st_size - 1)
    inputs.load_file(report, {"nvtx"})
    assert _cache_entry(report, nsys) == ("parquetdir", {".parquet"})
    # tables a later recipe needs join the entry in its kind of files, whatever the size limit is now
    monkeypatch.setattr(export, "ARROW_EXPORT_MAX_BYTES", report.stat().st_size)
    (from_parquet,) = inputs.load_file(report, NEEDS)
    assert _cache_entry(report, nsys) == ("parquetdir", {".parquet"})
    for attr in ("nvtx", "kernels", "memcpy", "runtime", "sync", "mpi"):
        x, y = (getattr(r, attr).reset_index(drop=True) for r in (from_arrow, from_parquet))
        assert len(x)
        pdt.assert_frame_equal(x, y)
    assert (from_arrow.session_start_ns, from_arrow.env) == (from_parquet.session_start_ns, from_parquet.env)


def test_an_arrow_export_reads_as_the_parquet_export_of_the_same_report(nsys, report_copy, tmp_path):
    sources = {}
    for kind in ("arrowdir", "parquetdir"):
        out = tmp_path / kind
        subprocess.run([str(nsys.path), *export.export_args(report_copy, export.table_names(NEEDS), out, kind)],
                       check=True, capture_output=True)
        sources[kind] = readers.ExportSource(out, kind)
    arrow, parquet = sources["arrowdir"], sources["parquetdir"]
    assert arrow.tables == parquet.tables and {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"} <= arrow.tables
    for table in sorted(parquet.tables):
        cols = parquet.columns(table)
        assert (arrow.columns(table), arrow.count(table)) == (cols, parquet.count(table))
        assert arrow.read_arrow(table, cols).equals(parquet.read_arrow(table, cols)), table
    kernels, cols = "CUPTI_ACTIVITY_KIND_KERNEL", ["start", "end", "shortName"]
    whole = parquet.read_arrow(kernels, cols)
    names = np.unique(whole["shortName"].to_numpy())
    where = [("shortName", names[:1])]
    some = arrow.read_arrow(kernels, cols, where)
    assert some.num_rows == (whole["shortName"].to_numpy() == names[0]).sum() < whole.num_rows
    assert some.equals(parquet.read_arrow(kernels, cols, where))
    nvtx_where = [("text", "mpi")]
    ranges = arrow.read_arrow("NVTX_EVENTS", ["start", "text"], nvtx_where)
    assert ranges.num_rows and all("mpi" in t.lower() for t in ranges["text"].to_pylist())
    assert ranges.equals(parquet.read_arrow("NVTX_EVENTS", ["start", "text"], nvtx_where))
    batches = list(arrow.read_batches(kernels, cols, rows=500))
    assert [b.num_rows for b in batches[:-1]] == [500] * (len(batches) - 1) and len(batches) > 1
    assert pa.concat_tables(batches).equals(whole)


def test_expand_inputs_folders_globs_and_dedup(tmp_path):
    (tmp_path / "a.nsys-rep").write_bytes(b"x")
    (tmp_path / "a.sqlite").write_bytes(b"x")  # export beside its report: the report wins
    (tmp_path / "b_pqtdir").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    got = inputs.expand_inputs([str(tmp_path)])
    assert [p.name for p in got] == ["a.nsys-rep", "b_pqtdir"]
    assert [p.name for p in inputs.expand_inputs([str(tmp_path / "*.sqlite")])] == ["a.sqlite"]
    with pytest.raises(UsageError):
        inputs.expand_inputs([])
    with pytest.raises(BadInputError, match="notes.txt"):
        inputs.expand_inputs([str(tmp_path / "notes.txt")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInputError, match="no reports"):
        inputs.expand_inputs([str(empty)])


def test_rank_candidates_from_environment_and_nvtx():
    ranks = {}
    for f in sorted(MPI_SET.glob("*.qdrep")):
        (rd,) = inputs.load_file(f, {"nvtx", "kernel"})
        ranks[f.name] = (rd.rank_candidates["env"][0], rd.rank_candidates["nvtx"][0], rd.host)
    # the shipped set's README: report1=3, report2=7, report3=4, report4=2, report6=6
    assert {k: v[1] for k, v in ranks.items()} == {"report1.qdrep": 3, "report2.qdrep": 7, "report3.qdrep": 4,
                                                   "report4.qdrep": 2, "report6.qdrep": 6}
    assert all(v[0] == v[1] for v in ranks.values())
    assert {v[2] for v in ranks.values()} == {"prm-dgx-05"}


def test_one_report_with_several_processes_gives_one_rank_each(tmp_path):
    """`nsys profile torchrun ...` puts every local rank in one file: each process becomes a rank."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nsys_recipe_pack import runner
    from nsys_recipe_pack.synth import Straggler, write_synthetic

    data = write_synthetic(tmp_path / "in", ranks=2, iterations=12, stragglers=[Straggler(1, 3, 5, "dataloader", 1.6)])
    merged = tmp_path / "node_pqtdir"
    merged.mkdir()
    for f in (data / "rank0_pqtdir").glob("*.parquet"):
        parts = [pq.read_table(data / f"rank{r}_pqtdir" / f.name) for r in (0, 1)]
        table = parts[0] if f.stem in ("StringIds", "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME",
                                       "TARGET_INFO_SYSTEM_ENV") else pa.concat_tables(parts)
        pq.write_table(table, merged / f.name)
    ranks = inputs.load_file(merged, {"nvtx", "kernel"})
    assert [rd.pid for rd in ranks] == [4000, 4001]
    assert all("env" not in rd.rank_candidates for rd in ranks)  # one environment cannot name two ranks
    assert [len(rd.kernels) for rd in ranks] == [len(pq.read_table(data / f"rank{r}_pqtdir" /
                                                                   "CUPTI_ACTIVITY_KIND_KERNEL.parquet"))
                                                 for r in (0, 1)]
    out = runner.run("straggler_heatmap", [str(merged)], str(tmp_path / "o"), mode="none", options={})
    files = pd.read_parquet(out / "files.parquet")
    assert files["pid"].tolist() == [4000, 4001] and files["rank_source"].tolist() == ["position"] * 2
    it = pd.read_parquet(out / "iterations.parquet")
    # rank 1 (the second process) was slow in 3-5; with two ranks the median splits the excess evenly
    assert (it.loc[it["rank"] == 1].set_index("iteration").loc[[3, 4, 5], "excess_ns"] > 0).all()


def test_string_table_looks_up_distinct_ids_only_and_keeps_the_last_of_a_repeated_id():
    import pyarrow as pa

    from nsys_recipe_pack.inputs import StringTable

    table = StringTable(np.array([3, 1, 7, 3]), pa.array(["c-old", "a", "g", "c"]))
    words, at = table.distinct(pa.array([1, 3, None, 99, 7, 1], pa.int64()))
    assert words[at].tolist() == ["a", "c", None, None, "g", "a"]
    assert len(words) == 5  # 1, 3, 7, 99 and the null: one string each, not one per row
    words, at = table.distinct(pa.chunked_array([pa.array([7, None, 7], pa.uint32())]))
    assert words[at].tolist() == ["g", None, "g"]
    assert table.ids_of(["g", "c-old", "a"]).tolist() == [1, 7]  # "c-old" lost its id to "c"
    assert table.ids_containing("C").tolist() == [3]


def test_a_task_s_arrow_tables_cross_the_spill_file_unchanged(nsys, tmp_path):
    # the pool's workers hand their results' Arrow tables over in a file the parent maps: the same tables and
    # the same other values as a direct call
    args = [(str(f), recipe, {}, None) for f in sorted(MPI_SET.glob("*.qdrep"))[:2]
            for recipe in ("sync_summary", "nvtx_gpu_proj", "kernel_pace")]
    direct = [runner.map_file(*a) for a in args]
    spill = tmp_path / "spill"
    spill.mkdir()
    done, path = runner._map_files(args, str(spill))
    assert path is not None and Path(path).parent == spill
    got = runner._unspill(done, path)
    tables = 0
    for want_file, got_file in zip(direct, got, strict=True):
        for want, res in zip(want_file, got_file, strict=True):
            assert want.keys() == res.keys()
            for key, value in want.items():
                if isinstance(value, pa.Table):
                    assert res[key].equals(value) and res[key].schema == value.schema
                    tables += 1
                else:
                    assert repr(res[key]) == repr(value)
    assert tables == 8  # sync_summary's calls, nvtx_gpu_proj's ranges and their sums, kernel_pace's times, of each


def test_a_lazy_recipe_gets_the_task_s_tables_as_references_read_from_its_file(nsys, tmp_path):
    # a recipe whose reduce reads the maps' tables when it needs them (Recipe.lazy_tables) gets StoredTable: read
    # back, whole or some columns, they are the tables a direct call gives; a file the client cannot see (a worker on
    # another node writing outside a shared filesystem) is the pack's error, saying what to do
    args = [(str(f), "straggler_heatmap", {}, None) for f in sorted(MPI_SET.glob("*.qdrep"))[:2]]
    direct = [runner.map_file(*a) for a in args]
    done, path = runner._map_files(args, str(tmp_path / "results"))
    got = runner._unspill(done, path, lazy=True)
    stored = 0
    for want_file, got_file in zip(direct, got, strict=True):
        for want, res in zip(want_file, got_file, strict=True):
            for key, value in want.items():
                if isinstance(value, pa.Table):
                    assert isinstance(res[key], spill.StoredTable) and len(res[key]) == value.num_rows
                    assert res[key].read().equals(value)
                    assert spill.table_of(res[key], value.column_names[:2]).equals(value.select(value.column_names[:2]))
                    stored += 1
    assert stored == 2 * 4  # each rank's iterations, components, NCCL kernels and communicators
    os.remove(path)
    with pytest.raises(PackError, match="shared filesystem"):
        got[0][0]["iterations"].read()
    done, path = runner._map_files(args, str(tmp_path / "other"))
    os.remove(path)
    with pytest.raises(PackError, match="shared filesystem"):
        runner._unspill(done, path)


@pytest.fixture(scope="module")
def memory_job(tmp_path_factory):
    """SYNTHETIC NCCL job with CUDA memory events (one rank leaking), four ranks."""
    return synth.write_synthetic(tmp_path_factory.mktemp("memory"), ranks=4, iterations=12, fmt="parquetdir",
                                 job="nccl", seed=3, memory=synth.parse_memory("leak=1,iterations=4-7,big=2"))


@pytest.mark.parametrize(("recipe", "table"), [
    ("straggler_heatmap", "iterations"), ("sync_summary", "sync_calls"), ("kernel_pace", "pace"),
    ("nvtx_gpu_proj", "ranges"), ("comm_overlap", "windows"), ("gpu_memory", "timeline")])
def test_a_run_of_workers_gives_a_lazy_recipe_the_tables_of_a_run_in_one_process(nsys, tmp_path, memory_job, recipe,
                                                                                  table):
    # each recipe whose reduce writes its tables a rank at a time (spill.RankedRows), reading the maps' tables then
    # (Recipe.lazy_tables) or not, with worker processes (the tables read back from the workers' files) and in this
    # process: the same tables, and no file of the workers' left in the output; the ranks given out of order
    inputs = sorted(memory_job.glob("*_pqtdir"), reverse=True) if recipe in ("comm_overlap", "gpu_memory") else \
        sorted(MPI_SET.glob("*.qdrep"), reverse=True)
    outs = {mode: runner.run(recipe, [str(f) for f in inputs], str(tmp_path / mode), mode=mode, jobs=2,
                             log=lambda m: None) for mode in ("none", "concurrent")}
    names = sorted(p.name for p in outs["none"].glob("*.parquet"))
    assert f"{table}.parquet" in names and names == sorted(p.name for p in outs["concurrent"].glob("*.parquet"))
    assert len(pd.read_parquet(outs["none"] / f"{table}.parquet")["rank"].unique()) == len(inputs)
    for name in names:
        pdt.assert_frame_equal(pd.read_parquet(outs["concurrent"] / name), pd.read_parquet(outs["none"] / name))
    assert not (outs["concurrent"] / runner.MAP_RESULTS).exists()
    files = {mode: sorted(p.name.replace(mode, "OUT") for p in out.iterdir()) for mode, out in outs.items()}
    assert files["concurrent"] == files["none"]  # hidden ones too


def test_a_table_is_written_a_row_group_at_a_time_as_to_parquet_writes_it(monkeypatch, tmp_path):
    import pyarrow.parquet as pq

    df = pd.DataFrame({"rank": np.arange(10, dtype=np.int64), "cause": [None, "a", None, "b", "c", None, "d", None,
                                                                         None, "e"],
                       "none": [None] * 10, "gpu_ns": pd.array([1, None, 3, 4, None, 6, 7, 8, 9, 10], dtype="Int64"),
                       "score": np.linspace(0, 1, 10), "flag": np.arange(10) % 3 == 0,
                       "members": [[i, i + 1] for i in range(10)]})
    monkeypatch.setattr(runner, "ROW_GROUP_ROWS", 3)
    runner.write_frame(df, tmp_path / "t.parquet")
    df.to_parquet(tmp_path / "whole.parquet")
    assert pq.ParquetFile(tmp_path / "t.parquet").metadata.num_row_groups == 4
    pdt.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), pd.read_parquet(tmp_path / "whole.parquet"))
    pdt.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), df)
    runner.write_frame(df.iloc[:0], tmp_path / "empty.parquet")
    assert pd.read_parquet(tmp_path / "empty.parquet").dtypes.to_dict() == pd.read_parquet(
        tmp_path / "whole.parquet").dtypes.to_dict()


def test_rows_made_a_rank_at_a_time_read_back_as_the_table_written_whole(monkeypatch, tmp_path):
    # each rank's names coded against its own words (other orders, other sets, nulls), its rows made as they are
    # written (RankedRows.made), row groups across ranks: as pandas' dtypes (spill.output_schema), they read back
    # as the frame written whole by to_parquet; kept as dictionaries, as the one table of them all written as before
    import pyarrow.parquet as pq

    monkeypatch.setattr(spill, "ROW_GROUP_ROWS", 7)
    rng = np.random.default_rng(8)
    pool = ["allreduce", "", "é", "sync", "x" * 30]
    per_rank = []
    for rank in rng.permutation(6):
        words = list(rng.permutation(pool)[:int(rng.integers(1, len(pool) + 1))])
        codes = rng.integers(-1, len(words), int(rng.integers(0, 9)))
        per_rank.append({"rank": int(rank), "calls": pa.table({"name": inputs.dictionary_column(codes, words),
                                                               "start_ns": rng.integers(0, 99, len(codes))})})

    def made(rank, at):
        calls = per_rank[at]["calls"]
        return calls.append_column("late_ns", pa.array(calls["start_ns"].to_numpy() + 1000 * rank))

    parts = [(r["rank"], at) for at, r in enumerate(per_rank)]
    spill.RankedRows(spill.output_schema({"rank": "int64", "name": "str", "start_ns": "int64", "late_ns": "int64"}),
                     parts, made).write_parquet(tmp_path / "text.parquet")
    whole = pd.concat([pd.DataFrame({"rank": np.int64(r["rank"]), "name": pd.Series(
        r["calls"]["name"].to_pylist(), dtype="str"), "start_ns": r["calls"]["start_ns"].to_numpy(),
        "late_ns": r["calls"]["start_ns"].to_numpy() + 1000 * r["rank"]}) for r in per_rank], ignore_index=True)
    whole.to_parquet(tmp_path / "whole.parquet")
    assert pq.ParquetFile(tmp_path / "text.parquet").metadata.num_row_groups > 1
    pdt.assert_frame_equal(pd.read_parquet(tmp_path / "text.parquet"), pd.read_parquet(tmp_path / "whole.parquet"))
    coded = pa.schema([("rank", pa.int64()), ("name", pa.dictionary(pa.int32(), pa.large_string())),
                       ("start_ns", pa.int64())])
    spill.RankedRows(coded, [(r["rank"], r["calls"]) for r in per_rank]).write_parquet(tmp_path / "coded.parquet")
    pq.write_table(inputs.ranked_tables(per_rank, "calls"), tmp_path / "before.parquet", store_schema=False)
    pdt.assert_frame_equal(pd.read_parquet(tmp_path / "coded.parquet"), pd.read_parquet(tmp_path / "before.parquet"))
    assert pd.read_parquet(tmp_path / "coded.parquet")["name"].dtype == "str"


def test_a_column_of_one_chunk_is_taken_without_a_copy_and_chunks_are_joined():
    values = pa.array(np.arange(10, dtype=np.int64), mask=np.arange(10) % 4 == 0)
    one = frames.one_array(pa.chunked_array([values]))
    assert one.buffers()[1].address == values.buffers()[1].address and one.equals(values)
    part = frames.one_array(pa.chunked_array([values.slice(3, 5)]))  # a slice keeps its offset
    assert part.to_pylist() == values.to_pylist()[3:8]
    np.testing.assert_array_equal(inputs.numpy_of(part, -1), [3, -1, 5, 6, 7])
    joined = frames.one_array(pa.chunked_array([values.slice(0, 4), values.slice(6)]))
    assert joined.to_pylist() == values.to_pylist()[:4] + values.to_pylist()[6:]
    assert frames.one_array(values) is values


def test_numpy_and_arrow_conversions_from_buffers_match_pyarrow_s_own():
    # the per-rank analyses convert through the buffers (pyarrow's to_numpy and pa.array import pandas);
    # nulls, sliced arrays (an offset into the buffers), several chunks, booleans and floats included
    rng = np.random.default_rng(11)
    for dtype, pa_type in [(np.int64, pa.int64()), (np.int32, pa.int32()), (np.float64, pa.float64()),
                           (bool, pa.bool_())]:
        for _ in range(20):
            n = int(rng.integers(0, 300))
            values = rng.integers(-50, 50, n).astype(dtype)
            mask = rng.random(n) < 0.2
            arr = pa.array(values, pa_type, mask=mask)
            cut = int(rng.integers(0, n + 1))
            chunked = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], pa_type)
            want = arr.fill_null(pa.scalar(7, pa_type) if dtype is not bool else True).to_numpy(
                zero_copy_only=False)
            fill = 7 if dtype is not bool else True
            np.testing.assert_array_equal(inputs.numpy_of(chunked, fill), want)
            np.testing.assert_array_equal(inputs.numpy_of(arr.slice(cut), fill), want[cut:])
            assert inputs.arrow_of(values, valid=~mask).equals(arr)
            frame = inputs.Frame(pa.Table.from_arrays([chunked], names=["c"]), {"c": str(np.dtype(dtype))})
            np.testing.assert_array_equal(frame.is_null("c"), mask)
    words = ["sync", "", "Jacobi é solve", "x" * 70]
    codes = rng.integers(-1, len(words), 500)
    want = pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32), mask=codes < 0),
                                          pa.array(words, pa.large_string()))
    got = inputs.dictionary_column(codes, words)
    assert got.equals(want) and got.type == want.type
    frame = inputs.Frame(pa.Table.from_arrays([got.slice(100)], names=["name"]), {"name": "object"})
    got_codes, got_words = frame.codes("name")
    assert list(got_words[got_codes]) == [words[c] if c >= 0 else None for c in codes[100:]]


def test_ranked_tables_share_one_dictionary_per_string_column_and_keep_every_value():
    # each rank codes its names against its own words (other orders, other sets, nulls); the combined
    # table must decode to the same strings with one dictionary for all chunks
    rng = np.random.default_rng(5)
    pool = ["Jacobi solve", "halo", "", "é", "allreduce", "x" * 40]
    per_rank, want = [], []
    for rank in rng.permutation(12):
        words = list(rng.permutation(pool)[:int(rng.integers(1, len(pool) + 1))])
        codes = rng.integers(-1, len(words), int(rng.integers(0, 50)))
        per_rank.append({"rank": int(rank), "calls": pa.Table.from_arrays(
            [inputs.dictionary_column(codes, words), inputs.arrow_of(codes.astype(np.int64))], names=["name", "n"])})
        want += [(int(rank), words[c] if c >= 0 else None, int(c)) for c in codes]
    table = inputs.ranked_tables(per_rank, "calls")
    chunks = [c for c in table.column("name").chunks if len(c)]
    assert all(c.dictionary.equals(chunks[0].dictionary) for c in chunks)
    got = list(zip(table.column("rank").to_pylist(), table.column("name").to_pylist(), table.column("n").to_pylist(),
                   strict=True))
    assert got == want


def test_no_recipe_map_imports_pandas_cold_warm_or_from_an_export(nsys, tmp_path):
    # the pool forks the workers before pandas is imported (it costs about 0.3 s of CPU) and the parent
    # imports it for the reduce while they map: that only pays if no per-rank work needs it, whether it
    # exports the report (cold), reads its loaded frames back (warm) or reads a user's SQLite export
    report = sorted(MPI_SET.glob("*.qdrep"))[0]
    user_export = Path(__file__).resolve().parent / "data" / "nccl_2gpu_h100" / "mfu_2gpu_before.sqlite"
    assert set(recipes.all_recipes()) == {"straggler_heatmap", "kernel_pace", "compute_memory_share", "sync_summary",
                                          "nvtx_gpu_proj", "comm_overlap", "gpu_memory", "collectives",
                                          "pipeline_bubbles", "critical_path"}
    reads = [(str(report), "cold"), (str(report), "warm"), (str(user_export), "export")]
    with_memory = tmp_path / "memory.sqlite"  # no shipped report records memory events: a real export given some
    shutil.copyfile(SAMPLES / "h100_gloo_8rank" / "rank0.sqlite", with_memory)
    plant_memory(with_memory)
    runs = [(name, {}, reads) for name in recipes.all_recipes()
            if name not in ("gpu_memory", "collectives", "pipeline_bubbles")] + [
        ("collectives", {}, reads[2:]),  # the export with NCCL kernels
        ("pipeline_bubbles", {}, reads[2:]),
        ("kernel_pace", {"kernel": "jacobi_kernel"}, reads[:2]),  # the report's kernel, then the export's
        ("kernel_pace", {"kernel": "reduce_kernel"}, reads[2:]),
        ("gpu_memory", {}, [(str(with_memory), "export")])]
    code = "\n".join([
        "import os, sys",
        "from nsys_recipe_pack import runner",
        f"for i, (recipe, options, reads) in enumerate({runs!r}):",
        f"    os.environ['XDG_CACHE_HOME'] = os.path.join({str(tmp_path)!r}, f'cache-{{i}}')",
        "    for path, read in reads:",
        "        res = runner.map_file(path, recipe, options, None)[0]",
        "        assert 'missing' not in res and 'bad_file' not in res, res",
        "        assert any(getattr(v, 'num_rows', 0) or getattr(v, 'size', 0) for v in res.values()), res",
        f"        runner._map_files([(path, recipe, options, None)], {str(tmp_path)!r})",
        "        print(recipe, options, read, sorted(m for m in sys.modules if m.split('.')[0] == 'pandas')[:3])",
    ])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == sum(len(r) for _, _, r in runs)
    assert [line for line in lines if not line.endswith(" []")] == []


def _awkward_export(path: Path) -> Path:
    """A small Parquet export with what real ones hold now and then: names as text or as string ids
    (unknown, repeated, null), ranges never closed, a named domain, null thread ids, MPI tables with and
    without textId, and two processes."""
    import pyarrow.parquet as pq

    path.mkdir()
    p0, p1 = 100 << 24, 101 << 24

    def write(table, columns):
        pq.write_table(pa.table(columns), path / f"{table}.parquet")

    write("StringIds", {"id": pa.array([1, 2, 5, 7, 5], pa.int64()),
                        "value": ["fwd", "NCCL", "rank 9", "fwd", "rank 3"]})  # id 5 twice: the last wins
    write("TARGET_INFO_SESSION_START_TIME", {"utcEpochNs": pa.array([1_700_000_000_123_456_789], pa.int64())})
    write("TARGET_INFO_SYSTEM_ENV", {"name": ["Other", "DeviceEnvironment"], "value": ["", "RANK=4;HOSTNAME=n1"]})
    write("NVTX_EVENTS", {
        "start": pa.array([0, 10, 12, 14, 15, 30], pa.int64()),
        "end": pa.array([None, 20, None, 16, None, 40], pa.int64()),
        "eventType": pa.array([75, 59, 59, 60, 34, 59], pa.int64()),
        "text": pa.array([None, "step", None, None, None, "MPI Rank 5"], pa.string()),
        "textId": pa.array([2, None, 1, 99, 5, 7], pa.int64()),
        "globalTid": pa.array([p0 + 1, p0 + 1, p0 + 1, None, p0 + 2, p1 + 1], pa.uint64()),
        "domainId": pa.array([9, 0, 9, 0, None, 9], pa.uint64()),
    })
    write("CUPTI_ACTIVITY_KIND_RUNTIME", {
        "start": pa.array([1, 2, 3], pa.int64()), "end": pa.array([4, 5, 6], pa.int64()),
        "globalTid": pa.array([p0 + 1, None, p1 + 1], pa.uint64()),
        "correlationId": pa.array([11, 12, 13], pa.uint32()), "nameId": pa.array([7, 99, None], pa.int64()),
    })
    write("CUPTI_ACTIVITY_KIND_KERNEL", {
        "start": pa.array([2, 3], pa.int64()), "end": pa.array([3, 4], pa.int64()),
        "deviceId": pa.array([0, 1], pa.int64()), "correlationId": pa.array([11, 13], pa.int64()),
        "globalPid": pa.array([p0, p1], pa.int64()), "shortName": pa.array([1, 1], pa.int64()),
        "demangledName": pa.array([1, 1], pa.int64()),
    })
    write("MPI_P2P_EVENTS", {"start": pa.array([5], pa.int64()), "end": pa.array([6], pa.int64()),
                             "globalTid": pa.array([p0 + 3], pa.uint64())})
    write("MPI_COLLECTIVES_EVENTS", {"start": pa.array([7, 8], pa.int64()), "end": pa.array([9, 9], pa.int64()),
                                     "globalTid": pa.array([p0 + 3, p1 + 3], pa.uint64()),
                                     "textId": pa.array([2, None], pa.int64())})
    return path


def test_a_clean_parquet_export_is_read_straight_to_arrow_with_what_the_general_path_gives(monkeypatch, tmp_path):
    export = _awkward_export(tmp_path / "x_pqtdir")
    frames, meta = rank_data.Reading(export, NEEDS, src=inputs.ExportSource(export, "parquetdir")).frames()
    assert all(isinstance(frames[k], inputs.Frame) for k in ("nvtx", "runtime", "mpi", "kernels"))
    # worked by hand from the tables above; the domain-create event itself is not kept
    nvtx = frames["nvtx"].to_pandas()
    assert nvtx["name"].tolist() == ["step", "fwd", "", "rank 3", "MPI Rank 5"]
    assert nvtx["domain"].tolist() == ["", "NCCL", "", "", "NCCL"]
    assert nvtx["end_ns"].tolist() == [20, pd.NA, 16, pd.NA, 40]
    assert nvtx["pid"].tolist() == [100, 100, 0, 100, 101] and nvtx["tid"].iloc[2] == 0
    runtime = frames["runtime"].to_pandas()
    assert runtime["name"].tolist() == ["fwd", "", ""] and runtime["pid"].tolist() == [100, 0, 101]
    assert runtime["correlation_id"].tolist() == [11, 12, 13]
    mpi = frames["mpi"].to_pandas()  # tables in name order: collectives, then point-to-point (no textId)
    assert mpi["name"].tolist() == ["NCCL", "MPI", "MPI"] and mpi["pid"].tolist() == [100, 101, 100]
    assert meta["pids"] == [100, 101] and meta["nvtx_rank"] == {"100": 3, "101": 5}
    assert meta["env"] == {"RANK": "4", "HOSTNAME": "n1"} and meta["session_start_ns"] == 1_700_000_000_123_456_789

    # the same export as SQLite reads the same, dtypes included
    sq = _as_sqlite(export, tmp_path / "x.sqlite")
    other, other_meta = rank_data.Reading(sq, NEEDS, src=inputs.ExportSource(sq, "sqlite")).frames()
    assert other_meta == meta
    assert frames.keys() == other.keys()
    for key in frames:  # tables the export lacks (memcpy, memset, sync) are empty frames in both
        assert frames[key].dtypes == other[key].dtypes, key
        pdt.assert_frame_equal(frames[key].to_pandas(), other[key].to_pandas())


def _as_sqlite(export: Path, path: Path) -> Path:
    """A Parquet export's tables written into an SQLite file, value for value."""
    import sqlite3

    import pyarrow.parquet as pq

    con = sqlite3.connect(path)
    for f in sorted(export.glob("*.parquet")):
        t = pq.read_table(f)
        con.execute(f'CREATE TABLE "{f.stem}" ({", ".join(t.column_names)})')
        con.executemany(f'INSERT INTO "{f.stem}" VALUES ({", ".join("?" * t.num_columns)})',
                        [tuple(r.values()) for r in t.to_pylist()])
    con.commit()
    con.close()
    return path


def test_sqlite_values_of_another_type_and_text_that_starts_null_are_read(tmp_path, monkeypatch):
    """SQLite types each value, not each column: a column that begins with nulls, or holds a stray value of
    another type (a damaged export), still reads, the stray value as null."""
    import sqlite3

    path = tmp_path / "odd name's #1.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "step"), (2, "k")])
    con.execute("CREATE TABLE NVTX_EVENTS (start, end, eventType, text, textId, globalTid, domainId)")
    rows = [(i, i + 1, 59, None, 1, 7 << 24, 0) for i in range(100_000)]
    rows.append((200_000, 200_001, 59, "late", None, 7 << 24, 0))
    rows.append((200_002, "never", 59, "stray end", None, 7 << 24, 0))
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, correlationId, globalPid, shortName)")
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?, ?)",
                    [(i, i + 1, 0, i, 7 << 24, 2) for i in range(70_000)] + [(5, 6, "gpu0", 2.0, 7 << 24, 2)])
    con.commit()
    con.close()
    src = inputs.ExportSource(path, "sqlite")
    frames, meta = rank_data.Reading(path, {"nvtx", "kernel"}, src=src).frames()
    nvtx = frames["nvtx"]
    codes, words = nvtx.codes("name")
    assert len(nvtx) == 100_002 and words[codes[-2]] == "late" and words[codes[0]] == "step"
    assert words[codes[-1]] == "stray end" and nvtx.is_null("end_ns")[-1]
    kernels = frames["kernels"].to_pandas()
    assert len(kernels) == 70_001 and kernels["device"].iloc[-1] is pd.NA and kernels["correlation_id"].iloc[-1] == 2
    assert kernels["name"].eq("k").all() and meta["pids"] == [7]
    # only the rows a recipe asks for: one kernel's launches
    few, _ = rank_data.Reading(path, {"kernel"}, src=src, rows={"kernel": ["k"]}).frames()
    assert len(few["kernels"]) == 70_001
    # a batch at a time, the stray value many batches in: the same rows, given once (by one connection or two)
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 1000)
    for table, cols in (("NVTX_EVENTS", ["start", "end", "text", "textId"]),
                        ("CUPTI_ACTIVITY_KIND_KERNEL", ["start", "deviceId", "correlationId"])):
        for connections in (1, 2):
            batches = list(src.read_batches(table, cols, connections=connections))
            assert len(batches) > 50 and pa.concat_tables(batches).equals(src.read_arrow(table, cols)), table
    src.close()


def test_sqlite_text_keeps_empty_strings_nulls_and_row_order(tmp_path, monkeypatch):
    """Text read as SQLite holds it: '' stays '', null stays null, a number in a text column becomes its text,
    every row once and in the table's order, whole, filtered, in batches, and in an empty table."""
    import sqlite3

    path = tmp_path / "text.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, text TEXT, textId INTEGER)")
    values = [None] * 70_000 + ["", "step", 5, None, "rank 3", "Rank 4"]
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?)", [(i, v, i % 3) for i, v in enumerate(values)])
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.commit()
    expected = [None if v is None else str(v) for v in values]
    src = inputs.ExportSource(path, "sqlite")
    whole = src.read_arrow("NVTX_EVENTS", ["text", "start"])
    assert whole.column("text").to_pylist() == expected
    assert whole.column("start").to_pylist() == list(range(len(values)))
    some = src.read_arrow("NVTX_EVENTS", ["start", "text"], where=[("text", "rank")])
    assert some.column("text").to_pylist() == ["rank 3", "Rank 4"]
    assert some.column("start").to_pylist() == [len(values) - 2, len(values) - 1]
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 1000)
    for connections in (1, 2):
        batches = list(src.read_batches("NVTX_EVENTS", ["text", "textId"], connections=connections))
        assert sum(b.num_rows for b in batches) == len(values)
        assert pa.concat_tables(batches).column("text").to_pylist() == expected
    empty = src.read_arrow("StringIds", ["id", "value"])
    assert empty.num_rows == 0 and empty.column("value").type == pa.string()
    src.close()


def test_sqlite_batches_come_in_scan_order_whatever_the_rowids(tmp_path, monkeypatch):
    """Read a block of rowids at a time by two connections at once (or in one scan), a table's rows come each once
    and in the order a scan of the table gives: rowids with gaps, rowids far apart (a few rows between 3 and
    2**62), an empty table; a read stopped early, then the source closed, leaves no reading thread behind."""
    import sqlite3

    path = tmp_path / "rowids.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER)")
    gaps = [r for r in range(1, 5_000) if r % 7 and r % 250 > 30]
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (rowid, start, end) VALUES (?, ?, ?)",
                    [(r, 5_000 - r, r * 3) for r in reversed(gaps)])
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER)")
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (rowid, start, end) VALUES (?, ?, ?)",
                    [(2**62, 1, 2), (3, 4, 5), (10**12, 6, 7), (4, 8, 9)])
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER, end INTEGER)")
    con.commit()
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 100)
    src = inputs.ExportSource(path, "sqlite")
    try:
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMSET"):
            scan = con.execute(f"SELECT start, end FROM {table}").fetchall()
            for connections in (1, 2):
                batches = list(src.read_batches(table, ["start", "end"], connections=connections))
                got = [row for b in batches for row in zip(*b.to_pydict().values(), strict=True)]
                assert got == scan and all(0 < b.num_rows <= 100 for b in batches), (table, connections)
        assert len(batches) == 0 and len(scan) == 0
        early = src.read_batches("CUPTI_ACTIVITY_KIND_KERNEL", ["start"], connections=2)
        assert next(early).column("start").to_pylist()[0] == 5_000 - gaps[0]
        early.close()
    finally:
        src.close()
        con.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("nsys-recipe-") and t.is_alive()]


def test_distinct_ids_match_numpy_unique():
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(0, 200))
        span = int(rng.choice([3, 50, 10**9]))
        values = rng.integers(-1, span, n).astype(rng.choice([np.int64, np.uint32]))
        want, want_at = np.unique(values, return_inverse=True)
        got, got_at = readers._distinct(values)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_at, want_at.reshape(-1))
        assert got.dtype == values.dtype


def test_host_is_the_name_nsys_recorded_not_a_hostname_variable(tmp_path):
    """A launcher may hand HOSTNAME down from the node it ran on; the report's own Hostname row names the
    machine the rank ran on."""
    import sqlite3

    from nsys_recipe_pack.synth import write_synthetic

    data = write_synthetic(tmp_path / "s", ranks=2, iterations=6, fmt="sqlite")
    with sqlite3.connect(data / "rank1.sqlite") as con:
        con.execute("update TARGET_INFO_SYSTEM_ENV set value = 'node7' where name = 'Hostname'")
    hosts = {Path(rd.file).name: rd.host for p in sorted(data.glob("*.sqlite"))
             for rd in inputs.load_file(p, {"nvtx"})}
    assert hosts == {"rank0.sqlite": "synth-node000", "rank1.sqlite": "node7"}  # HOSTNAME says synth-node000
    with sqlite3.connect(data / "rank1.sqlite") as con:
        con.execute("delete from TARGET_INFO_SYSTEM_ENV where name = 'Hostname'")
    assert inputs.load_file(data / "rank1.sqlite", {"nvtx"})[0].host == "synth-node000"  # no record: HOSTNAME


def test_a_rank_too_big_for_the_machine_is_refused_naming_the_file_and_the_memory(tmp_path):
    counts = {"NVTX_EVENTS": 3_000_000, "CUPTI_ACTIVITY_KIND_KERNEL": 1_000_000}
    inputs.check_memory(Path("r.sqlite"), counts, available=2 * 2**30)  # 4 M rows x 400 B = 1.5 GB: fits in 2
    with pytest.raises(BadInputError) as exc:
        inputs.check_memory(Path("r.sqlite"), counts, available=2**30)
    msg = str(exc.value)
    assert msg.startswith("r.sqlite: ") and "about 1.5 GB of memory (4.0 M rows: NVTX_EVENTS 3.0 M" in msg
    assert "1.0 GB is free" in msg and "\n" not in msg

    # end to end: exit 3, one line, no output folder; the same run allowed more memory works
    from nsys_recipe_pack.synth import write_synthetic

    data = write_synthetic(tmp_path / "in", ranks=1, iterations=6, fmt="sqlite")
    exe = Path(sys.executable).with_name("nsys-recipe")
    # (compute_memory_share reads its tables whole; sync_summary, which reads only the rows it uses a batch at a
    # time, is never refused: tests/test_selection.py)
    argv = [str(exe), "run", "--name", "compute_memory_share", "--output", str(tmp_path / "out"), str(data)]
    res = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "NSYS_RECIPE_MEMORY_GB": "0.00001"})
    assert res.returncode == 3 and "rank0.sqlite: this rank needs about" in res.stderr
    assert not (tmp_path / "out").exists()
    res = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "NSYS_RECIPE_MEMORY_GB": "1"})
    assert res.returncode == 0, res.stderr


def test_a_long_read_reports_rows_read_and_time_left(monkeypatch):
    monkeypatch.setattr(read_progress, "LONG_READ_ROWS", 10)
    out = io.StringIO()
    done = read_progress.ReadProgress(Path("big.sqlite"),
                                   {"NVTX_EVENTS": 3_000_000, "CUPTI_ACTIVITY_KIND_KERNEL": 1_000_000},
                                   stream=out)
    done("NVTX_EVENTS")
    done("CUPTI_ACTIVITY_KIND_KERNEL")
    lines = out.getvalue().splitlines()
    assert lines[0] == "big.sqlite: reading 4.0 M rows"
    assert lines[1].startswith("big.sqlite: 3.0 M of 4.0 M rows read in ") and "s left" in lines[1]
    assert lines[2].startswith("big.sqlite: 4.0 M of 4.0 M rows read in ") and "left" not in lines[2]
    # a table read a batch at a time: a line at its end, and between batches only once PROGRESS_EVERY_S passed
    batches = io.StringIO()
    done = read_progress.ReadProgress(Path("big.sqlite"), {"NVTX_EVENTS": 3_000_000}, stream=batches)
    done.add("NVTX_EVENTS", 1_000_000)
    monkeypatch.setattr(read_progress, "PROGRESS_EVERY_S", 0)
    done.add("NVTX_EVENTS", 1_000_000)
    monkeypatch.setattr(read_progress, "PROGRESS_EVERY_S", 10**6)
    done.add("NVTX_EVENTS", 1_000_000)
    lines = batches.getvalue().splitlines()
    assert len(lines) == 3 and lines[1].startswith("big.sqlite: 2.0 M of 3.0 M rows read in ")
    assert lines[2].startswith("big.sqlite: 3.0 M of 3.0 M rows read in ") and "left" not in lines[2]
    quiet = io.StringIO()
    monkeypatch.setattr(read_progress, "LONG_READ_ROWS", 10**9)
    read_progress.ReadProgress(Path("small.sqlite"), {"NVTX_EVENTS": 100}, stream=quiet)("NVTX_EVENTS")
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("text_type", [pa.string(), pa.large_string(), "all null as int64"])
@pytest.mark.parametrize("run_rows", [5, 12, 1 << 18])
def test_a_parquet_read_of_some_rows_gives_exactly_those_rows(tmp_path, monkeypatch, text_type, run_rows):
    """Rows whose text contains a word, or whose text id is one of some ids, from a Parquet table of several row
    groups read a run of groups at a time (some runs with no such row, whose other columns are then not read): the
    rows a filter over every row keeps."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    n = 40
    words = np.array(["MPI Rank 3", "forward", None, "rank", "Ranked", "step", "backward"], object)
    text = words[rng.integers(0, len(words), n)]
    text[:12] = "forward"  # the first row groups hold no such row
    if text_type == "all null as int64":
        text_col = pa.nulls(n, pa.int64())
    else:
        text_col = pa.array(text.tolist(), text_type)
    text_id = rng.integers(0, 9, n)
    text_id[:12] = 0
    table = pa.table({"start": np.arange(n, dtype=np.int64), "textId": text_id, "text": text_col})
    folder = tmp_path / "x_pqtdir"
    folder.mkdir()
    pq.write_table(table, folder / "NVTX_EVENTS.parquet", row_group_size=5)
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", run_rows)
    src = readers.ExportSource(folder, "parquetdir")
    got = src.read_arrow("NVTX_EVENTS", ["start", "text", "textId"], where=[("textId", [2, 7]), ("text", "rank")])
    with_word = np.array([isinstance(t, str) and "rank" in t.lower() for t in text], bool)
    if text_type == "all null as int64":
        with_word[:] = False
    want = np.flatnonzero(with_word | np.isin(table.column("textId").to_numpy(), [2, 7]))
    assert got.column("start").to_pylist() == want.tolist()
    assert got.column("text").type == pa.string()
    expected_text = [None] * len(want) if text_type == "all null as int64" else text[want].tolist()
    assert got.column("text").to_pylist() == expected_text


def test_row_groups_are_read_in_runs_of_about_the_rows_asked(tmp_path):
    """Groups of 5 rows (the last of 3), runs of 12 rows: a group joins the run its first row falls in."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": np.arange(23)}), tmp_path / "t.parquet", row_group_size=5)
    metadata = pq.ParquetFile(tmp_path / "t.parquet").metadata
    assert readers.row_group_runs(metadata, 12) == [[0, 1, 2], [3, 4]]  # first rows 0, 5, 10 | 15, 20
    assert readers.row_group_runs(metadata, 1) == [[0], [1], [2], [3], [4]]
    assert readers.row_group_runs(metadata, 100) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("needs,rows", [({"nvtx", "kernel", "memcpy", "memset", "runtime", "mpi"}, None),
                                        ({"kernel"}, {"kernel": ["elementwise_kernel"]})])
def test_tables_read_side_by_side_are_those_read_one_after_another(monkeypatch, needs, rows):
    """Whole tables read by several threads at once (each with its own SQLite connection, all closed with the
    source) give the frames and rank identity of one read after another."""
    path = SAMPLES / "h100_gloo_8rank" / "rank3.sqlite"  # real, beside its report (its README)
    got = {}
    monkeypatch.setattr(readers, "THREADED_READ_MIN_ROWS", 0)  # however few rows
    for threads in (1, 4):
        monkeypatch.setattr(rank_data, "READ_THREADS", threads)
        src = inputs.ExportSource(path, "sqlite")
        got[threads] = rank_data.Reading(path, needs, src=src, rows=rows).frames()
        assert len(src._readers) == 1 if threads == 1 else 1 < len(src._readers) <= 1 + threads
        src.close()
        assert not src._readers
    (one, one_meta), (four, four_meta) = got[1], got[4]
    assert one.keys() == four.keys() and len(one) == len(needs)
    for attr, frame in one.items():
        assert four[attr].table.equals(frame.table) and four[attr].dtypes == frame.dtypes, attr
    assert four_meta == one_meta and len(one["kernels"]) > 0


def test_reads_of_few_rows_start_no_thread_and_give_what_threaded_reads_give(monkeypatch):
    path = SAMPLES / "h100_gloo_8rank" / "rank3.sqlite"  # real, beside its report (its README)
    needs = {"nvtx", "kernel", "memcpy", "memset", "runtime", "mpi"}
    started = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), start(self))[1])
    got, few_rows = {}, readers.THREADED_READ_MIN_ROWS
    for least in (few_rows, 0):
        monkeypatch.setattr(readers, "THREADED_READ_MIN_ROWS", least)
        started.clear()
        src = inputs.ExportSource(path, "sqlite")
        rows = sum(src.count(t) for need in needs for t in readers.TABLES.get(need, {}))
        assert 0 < rows < few_rows
        got[least] = rank_data.Reading(path, needs, src=src).frames()
        batches = list(src.read_batches("CUPTI_ACTIVITY_KIND_KERNEL", ["start", "end"], rows=1000))
        src.close()
        if least:
            assert started == []
        else:  # tables side by side, and the next batch read while one is handled
            assert len(started) > 1 and "nsys-recipe-read-ahead" in started
        got[least] = (got[least], pa.concat_tables(batches))
    ((few, few_meta), few_batches), ((threaded, threaded_meta), threaded_batches) = got.values()
    assert few.keys() == threaded.keys() == {"nvtx", "kernels", "memcpy", "memset", "runtime", "mpi"}
    for attr, frame in few.items():
        assert threaded[attr].table.equals(frame.table) and threaded[attr].dtypes == frame.dtypes, attr
    assert few_meta == threaded_meta
    assert few_batches.equals(threaded_batches) and few_batches.num_rows == len(few["kernels"]) > 0


def test_a_batched_read_reads_ahead_in_order_raises_its_errors_and_stops_with_its_caller():
    closed = []

    def parts(n, fail_at=None):
        try:
            for i in range(n):
                if i == fail_at:
                    raise ValueError("part 4 is damaged")
                yield i
        finally:
            closed.append(threading.get_ident())  # where the read is closed

    threads = threading.active_count()
    assert list(readers.read_ahead(parts(50), lambda i: i * 10)) == [i * 10 for i in range(50)]
    with pytest.raises(ValueError, match="part 4 is damaged"):
        list(readers.read_ahead(parts(10, fail_at=4)))
    early = readers.read_ahead(parts(10**9))
    assert [next(early), next(early)] == [0, 1]
    early.close()  # a caller that stops: the read is closed, in its own thread, and the thread ends
    assert len(closed) == 3 and threading.get_ident() not in closed
    assert threading.active_count() == threads


def test_pid_of_takes_bits_24_to_47_of_signed_ids_as_of_unsigned():
    ids = np.array([0, 1 << 24, (7 << 24) + 5, (0xFFFFFF << 24) | 0xABC, 294065908970382, -1, -(1 << 63),
                    (1 << 63) - 1], np.int64)
    unsigned = ((ids.astype(np.uint64) >> np.uint64(24)) & np.uint64(0xFFFFFF)).astype(np.int64)
    assert readers.pid_of(ids).tolist() == unsigned.tolist() == [0, 1, 7, 0xFFFFFF, 17527694 & 0xFFFFFF,
                                                                  0xFFFFFF, 0, 0xFFFFFF]


MMAPPED_CHUNKS = """
import ctypes
import numpy as np
from nsys_recipe_pack import allocator
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
allocator.reuse_freed_memory()
for size in (3 << 20, 8 << 20):
    before = libc.mallinfo2().hblks
    held = np.ones(size, np.uint8)
    print(libc.mallinfo2().hblks - before)
    del held
"""


def test_a_map_process_takes_arrays_of_a_few_mb_from_freed_heap_not_fresh_mappings():
    """Once the command has set glibc's allocator up (allocator.reuse_freed_memory), a 3 MB array comes from the
    heap, where freed arrays are handed on, and an 8 MB one is still mapped fresh (one more mapped chunk), as glibc
    maps both by default in a fresh process."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc 2.33 or later")
    mapped = subprocess.run([sys.executable, "-c", MMAPPED_CHUNKS], capture_output=True, text=True, check=True,
                            timeout=120).stdout.split()
    assert mapped == ["0", "1"]


ARROW_POOL = """
import pyarrow as pa
from nsys_recipe_pack import allocator
allocator.reuse_freed_memory()
print(pa.default_memory_pool().backend_name)
"""


@pytest.mark.parametrize("chosen", [None, "system"])
def test_a_map_process_takes_arrows_buffers_from_jemalloc_unless_the_user_chose_a_pool(chosen):
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no jemalloc")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    backend = subprocess.run([sys.executable, "-c", ARROW_POOL], capture_output=True, text=True, check=True,
                             timeout=120, env=env).stdout.strip()
    assert backend == (chosen or "jemalloc")


POOL_AFTER = """
import sys
import pyarrow as pa
from nsys_recipe_pack import cli, run_recipe
before = pa.default_memory_pool().backend_name
if sys.argv[1] == "api":
    run_recipe("kernel_pace", sys.argv[2], sys.argv[3], mode="none")
else:
    assert cli.main(["run", "--name", "kernel_pace", "--mode", "none", "--output", sys.argv[3], sys.argv[2]]) == 0
print(before, pa.default_memory_pool().backend_name)
"""


@pytest.mark.parametrize("caller", ["api", "cli"])
def test_only_the_command_line_sets_the_process_allocator_up(caller, tmp_path):
    """The command's process (and the map workers that fork from it) takes Arrow's buffers from jemalloc; a Python
    API caller (a JupyterLab kernel) keeps the pool and glibc settings it had."""
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no jemalloc")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    export = SAMPLES / "h100_gloo_8rank" / "rank0.sqlite"
    said = subprocess.run([sys.executable, "-c", POOL_AFTER, caller, str(export), str(tmp_path / "o")],
                          capture_output=True, text=True, check=True, timeout=300, env=env).stdout
    before, after = said.splitlines()[-1].split()
    assert after == ("jemalloc" if caller == "cli" else before)


def test_a_dask_worker_started_by_the_command_gets_the_same_allocator_settings():
    env = allocator.worker_env({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.trim_threshold=0:glibc.malloc.mmap_threshold=4194304"
    assert env["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
    assert allocator.worker_env({"ARROW_DEFAULT_MEMORY_POOL": "system"})["ARROW_DEFAULT_MEMORY_POOL"] == "system"


PAD = "glibc.malloc.top_pad=67108864"


@pytest.mark.parametrize(("user_tunables", "seen"), [
    (None, f"glibc.malloc.hugetlb=1:{PAD}"),
    ("glibc.malloc.arena_max=2", f"glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1:{PAD}"),
    ("glibc.malloc.hugetlb=0", f"glibc.malloc.hugetlb=0:{PAD}"),
    ("glibc.malloc.top_pad=0:glibc.malloc.hugetlb=0", "glibc.malloc.top_pad=0:glibc.malloc.hugetlb=0"),
])
def test_nsys_runs_with_its_heap_in_huge_pages_unless_the_user_chose(user_tunables, seen, monkeypatch, tmp_path):
    fake = tmp_path / "nsys"
    fake.write_text('#!/bin/sh\nprintf "%s" "$GLIBC_TUNABLES"\n')
    fake.chmod(0o755)
    if user_tunables is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", user_tunables)
    res = nsys_tool.run_nsys(nsys_tool.Nsys(fake, "2023.4.4.54", "test"), ["export"])
    assert res.stdout == seen
    assert os.environ.get("GLIBC_TUNABLES") == user_tunables  # the pack's own environment is left alone
