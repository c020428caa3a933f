"""The synthetic export writer: the real 2023.4 schema, and the injected truth recoverable by hand.

`tests/data/nsys_2023_4_schema.json` records names and types of a real Nsight Systems 2023.4 export
(made by scripts/dump_export_schema.py); it is independent of the schema the writer itself reads.
"""

import argparse
import contextlib
import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pyarrow.parquet as pq
import pytest

from nsys_recipe_pack import inputs, synth
from nsys_recipe_pack.errors import UsageError
from nsys_recipe_pack.synth import Straggler, add_arguments, main, parse_straggler, write_synthetic

REAL = json.loads((Path(__file__).parent / "data" / "nsys_2023_4_schema.json").read_text())
RANKS, ITERS, SEED = 4, 12, 3
STALL = Straggler(rank=1, first=4, last=7, cause="dataloader", slowdown=1.5)
SLOW_GPU = Straggler(rank=2, first=9, last=10, cause="compute", slowdown=1.4)
CHILDREN = ["dataloader", "forward", "backward", "allreduce", "optimizer"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("synth")
    kw = {"ranks": RANKS, "iterations": ITERS, "seed": SEED}
    return {
        "sq": write_synthetic(base / "sq", fmt="sqlite", stragglers=[STALL, SLOW_GPU], **kw),
        "pq": write_synthetic(base / "pq", fmt="parquetdir", stragglers=[STALL, SLOW_GPU], **kw),
        "clean": write_synthetic(base / "clean", fmt="parquetdir", **kw),
    }


# plain-pandas readers of one rank's parquetdir export

def read(d, r, table):
    return pq.read_table(d / f"rank{r}_pqtdir" / f"{table}.parquet").to_pandas()


def strings(d, r):
    s = read(d, r, "StringIds")
    return pd.Series(s["value"].to_numpy(), index=s["id"].to_numpy())


def main_tid(d, r):
    t = read(d, r, "ThreadNames")
    return int(t.loc[t["nameId"].map(strings(d, r)) == "python3", "globalTid"].iloc[0])


def nvtx(d, r):
    """Main-thread NVTX ranges with names from `text` or `textId`, numbered by iteration."""
    df = read(d, r, "NVTX_EVENTS")
    df = df[df["globalTid"] == main_tid(d, r)].copy()
    df["name"] = df["text"].where(df["text"].notna(), df["textId"].map(strings(d, r)))
    df["iteration"] = (df["name"] == "step").cumsum() - 1
    df["dur"] = df["end"] - df["start"]
    return df


def durations(d, r):
    return nvtx(d, r).pivot_table(index="iteration", columns="name", values="dur", aggfunc="sum")


def kernels(d, r):
    k = read(d, r, "CUPTI_ACTIVITY_KIND_KERNEL")
    names = strings(d, r)
    k["short"] = k["shortName"].map(names)
    k["full"] = k["demangledName"].map(names)
    return k


def truth(d):
    return json.loads((d / "truth.json").read_text())


# schema and labels

def test_sqlite_tables_have_the_real_schema(runs):
    con = sqlite3.connect(runs["sq"] / "rank0.sqlite")
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
            "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV", "META_DATA_EXPORT"} <= tables
    assert tables <= set(REAL["tables"])
    for table in tables:
        got = [(name, typ, bool(notnull), bool(pk))
               for _, name, typ, notnull, _, pk in con.execute(f'PRAGMA table_info("{table}")')]
        assert got == [(c["name"], c["sqlite"], c["notnull"], c["pk"]) for c in REAL["tables"][table]], table


def test_parquet_tables_have_the_real_schema(runs):
    d = runs["pq"] / "rank0_pqtdir"
    files = sorted(d.glob("*.parquet"))
    con = sqlite3.connect(runs["sq"] / "rank0.sqlite")
    assert {f.stem for f in files} == {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for f in files:
        got = [(x.name, str(x.type), x.nullable) for x in pq.read_schema(f)]
        assert got == [(c["name"], c["arrow"], c["nullable"]) for c in REAL["tables"][f.stem]], f.stem
    # StringIds is a table of its own and every name column holds integer ids, as in nsys' parquetdir export
    assert str(pq.read_schema(d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").field("shortName").type) == "uint64"
    assert pq.ParquetFile(d / "NVTX_EVENTS.parquet").metadata.num_row_groups == 1  # 12 iterations: < 2048 rows


def test_labelled_synthetic(runs):
    for d in (runs["sq"], runs["pq"]):
        t = truth(d)
        assert t["synthetic"] is True and "SYNTHETIC" in t["note"]
        readme = (d / "README.md").read_text()
        assert "SYNTHETIC" in readme and "not real" in readme and "nsys-recipe-pack" in readme
    con = sqlite3.connect(runs["sq"] / "rank2.sqlite")
    meta = dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))
    assert meta["SYNTHETIC"] == "nsys-recipe-pack synthetic export"
    assert set(meta) - {"SYNTHETIC"} <= set(REAL["meta_data_export_names"])
    assert meta["EXPORT_PRODUCT_VERSION"] == "2023.4.4.54" == REAL["nsys_version"]
    assert meta["EXPORT_SCHEMA_VERSION"] == REAL["schema_version"]
    assert inputs.load_file(runs["pq"] / "rank0_pqtdir", {"nvtx"})[0].synthetic


def test_sqlite_and_parquetdir_hold_the_same_rows(runs):
    for r in range(RANKS):
        con = sqlite3.connect(runs["sq"] / f"rank{r}.sqlite")
        for f in sorted((runs["pq"] / f"rank{r}_pqtdir").glob("*.parquet")):
            table = pq.read_table(f)
            from_parquet = list(zip(*(c.to_pylist() for c in table.columns), strict=True))
            assert con.execute(f'SELECT * FROM "{f.stem}"').fetchall() == from_parquet, (r, f.stem)
    (a,) = inputs.load_file(runs["sq"] / "rank1.sqlite", {"nvtx", "kernel", "runtime"})
    (b,) = inputs.load_file(runs["pq"] / "rank1_pqtdir", {"nvtx", "kernel", "runtime"})
    for attr in ("nvtx", "kernels", "runtime"):
        pdt.assert_frame_equal(getattr(a, attr), getattr(b, attr), check_dtype=False)
    assert a.session_start_ns == b.session_start_ns and a.env == b.env


def test_ids_environment_and_clocks(runs):
    d = runs["pq"]
    starts = []
    for r in range(RANKS):
        proc = read(d, r, "PROCESSES")
        tid = main_tid(d, r)
        assert tid >> 48 == 1 and (tid >> 24) & 0xFFFFFF == proc["pid"].iloc[0] == 4000 + r  # as nsys encodes it
        assert int(proc["globalPid"].iloc[0]) == tid & ~0xFFFFFF
        k = read(d, r, "CUPTI_ACTIVITY_KIND_KERNEL")
        assert set(k["globalPid"]) == {proc["globalPid"].iloc[0]}
        assert set(read(d, r, "CUPTI_ACTIVITY_KIND_RUNTIME")["globalTid"]) == {tid}
        env = read(d, r, "TARGET_INFO_SYSTEM_ENV").set_index("name")
        kv = dict(item.split("=", 1) for item in env.loc["DeviceEnvironment", "value"].split(";"))
        assert (kv["RANK"], kv["LOCAL_RANK"], kv["WORLD_SIZE"], kv["HOSTNAME"]) == \
            (str(r), str(r), str(RANKS), "synth-node000")
        assert env.loc["DeviceEnvironment", "nameEnum"] == 610
        assert set(k["deviceId"]) == {r}
        starts.append(int(read(d, r, "TARGET_INFO_SESSION_START_TIME")["utcEpochNs"].iloc[0]))
        ev = read(d, r, "NVTX_EVENTS")
        assert (ev["start"] >= 1_000_000_000).all()  # times are relative to the rank's own session start
        assert ev["start"].is_monotonic_increasing and k["start"].is_monotonic_increasing
    gaps = np.diff(sorted(starts))
    assert len(set(starts)) == RANKS and (gaps > 0).all() and (gaps < 10_000_000).all()  # a few ms apart
    assert starts == truth(d)["session_start_utc_ns"]


def test_nodes_follow_gpus_per_node(tmp_path):
    d = write_synthetic(tmp_path / "n", ranks=5, iterations=2, fmt="sqlite", gpus_per_node=2)
    for r in range(5):
        con = sqlite3.connect(d / f"rank{r}.sqlite")
        env = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'").fetchone()[0]
        kv = dict(item.split("=", 1) for item in env.split(";"))
        assert (kv["HOSTNAME"], kv["LOCAL_RANK"]) == (f"synth-node{r // 2:03d}", str(r % 2))
        assert con.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall() == [(r % 2,)]
        assert con.execute("SELECT count(*) FROM TARGET_INFO_GPU").fetchone()[0] == 2


def test_nvtx_steps_children_text_and_text_id(runs):
    d = runs["pq"]
    raw = read(d, 0, "NVTX_EVENTS")
    assert set(raw["eventType"]) == {59} and raw["end"].notna().all()
    assert raw["text"].isna().any() and raw["textId"].notna().any()  # readers must handle both
    assert (raw["text"].isna() == raw["textId"].notna()).all()
    df = nvtx(d, 0)
    assert set(df.loc[df["textId"].notna(), "name"]) == set(truth(d)["nvtx_text_id_names"])
    for _, it in df.groupby("iteration"):
        step, kids = it.iloc[0], it.iloc[1:]
        assert step["name"] == "step" and kids["name"].tolist() == CHILDREN
        assert (kids["start"] >= step["start"]).all() and (kids["end"] <= step["end"]).all()
        assert (kids["start"].to_numpy()[1:] >= kids["end"].to_numpy()[:-1]).all()  # in order, not overlapping
    assert df["iteration"].max() == ITERS - 1


# injected truth, by hand

def test_dataloader_stall_by_hand(runs):
    d, clean, t = runs["pq"], runs["clean"], truth(runs["pq"])
    cells = pd.DataFrame(t["cells"])
    stall = cells[cells["cause"] == "dataloader"].set_index("iteration")
    assert stall["rank"].eq(1).all() and stall.index.tolist() == list(range(4, 8))
    assert all(c["acceptable_causes"] == ["dataloader"] for c in t["cells"] if c["cause"] == "dataloader")
    dur, base = durations(d, 1), durations(clean, 1)
    extra = dur["dataloader"] - base["dataloader"]
    assert extra.loc[4:7].tolist() == stall["extra_ns"].tolist()
    assert (extra.drop(range(4, 8)) == 0).all()
    for child in ("forward", "backward", "optimizer"):
        assert (dur[child] == base[child]).all()
    # slowdown multiplies the rank's busy time (step minus the allreduce wait)
    busy, busy0 = dur["step"] - dur["allreduce"], base["step"] - base["allreduce"]
    assert np.allclose(busy.loc[4:7], 1.5 * busy0.loc[4:7], rtol=0, atol=1)
    # against the other ranks' median: ~44 ms (half of 3 + 30 + 50 + 5 ms), give or take the 3 % jitter
    others = np.median([durations(d, r)["dataloader"] for r in (0, 2, 3)], axis=0)
    excess = dur["dataloader"].to_numpy() - others
    assert np.all(np.abs(excess[4:8] - stall["extra_ns"].to_numpy()) < 0.2e6)
    assert np.all(np.abs(np.delete(excess, range(4, 8))) < 0.2e6)
    # a host-side stall: no extra GPU work
    k, k0 = kernels(d, 1), kernels(clean, 1)
    compute = ~k["short"].str.startswith("nccl")
    assert ((k["end"] - k["start"])[compute].to_numpy() == (k0["end"] - k0["start"])[compute].to_numpy()).all()


def test_compute_slowdown_by_hand(runs):
    d, clean, t = runs["pq"], runs["clean"], truth(runs["pq"])
    cells = [c for c in t["cells"] if c["cause"] == "compute"]
    assert [(c["rank"], c["iteration"]) for c in cells] == [(2, 9), (2, 10)]
    assert all(set(c["acceptable_causes"]) == {"forward", "backward", "gpu_compute"} for c in cells)
    dur, base = durations(d, 2), durations(clean, 2)
    fb = dur["forward"] + dur["backward"] - base["forward"] - base["backward"]
    assert fb.loc[9:10].tolist() == [c["extra_ns"] for c in cells] and (fb.drop([9, 10]) == 0).all()
    assert (dur["dataloader"] == base["dataloader"]).all()
    busy, busy0 = dur["step"] - dur["allreduce"], base["step"] - base["allreduce"]
    assert np.allclose(busy.loc[9:10], 1.4 * busy0.loc[9:10], rtol=0, atol=1)
    # GPU busy grows with the ranges: the compute kernels in those iterations run ~0.9 x extra longer
    gpu = {}
    for name, run in (("slow", d), ("clean", clean)):
        k = kernels(run, 2)
        k = k[~k["short"].str.startswith("nccl") & (k["streamId"] == 7)]
        steps = nvtx(run, 2).query("name == 'step'")
        k["iteration"] = np.searchsorted(steps["start"].to_numpy(), k["start"].to_numpy(), side="right") - 1
        gpu[name] = (k["end"] - k["start"]).groupby(k["iteration"]).sum()
    grow = gpu["slow"] - gpu["clean"]
    assert (grow.loc[9:10] > 0.8 * fb.loc[9:10]).all() and (grow.drop([9, 10]) == 0).all()


def test_nccl_kernel_ends_together_on_the_aligned_clock(runs):
    d, t = runs["pq"], truth(runs["pq"])
    ends, arrivals, host_ends, utc = [], [], [], []
    for r in range(RANKS):
        k = kernels(d, r)
        nccl = k[k["short"] == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
        assert (nccl["full"] == "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)").all()
        assert len(nccl) == ITERS and nccl["streamId"].nunique() == 1 and (nccl["streamId"] != 7).all()
        start = int(read(d, r, "TARGET_INFO_SESSION_START_TIME")["utcEpochNs"].iloc[0])
        ar = nvtx(d, r).query("name == 'allreduce'")
        assert (nccl["start"].to_numpy() > ar["start"].to_numpy()).all()  # starts when this rank arrives
        ends.append(nccl["end"].to_numpy() + start)
        arrivals.append(ar["start"].to_numpy() + start)
        host_ends.append(ar["end"].to_numpy() + start)
        utc.append(start)
    ends, arrivals, host_ends = np.stack(ends), np.stack(arrivals), np.stack(host_ends)
    assert (np.ptp(ends, axis=0) == 0).all()  # the same instant for every rank
    assert (ends[0] == arrivals.max(axis=0) + t["transfer_ns"]).all()  # slowest arrival + transfer
    assert (ends[0] - min(utc) == np.array(t["nccl_end_aligned_ns"])).all()
    assert (host_ends >= ends).all()  # the host's allreduce range lasts until the kernel ends
    # the stalled rank arrives last in its stalled iterations, so it waits least
    wait = host_ends - arrivals
    assert (wait[:, 4:8].argmin(axis=0) == 1).all() and (arrivals[:, 4:8].argmax(axis=0) == 1).all()


def test_every_kernel_has_its_launch_inside_the_parent_range(runs):
    d = runs["pq"]
    for r in (0, 2):
        k = kernels(d, r)
        rt = read(d, r, "CUPTI_ACTIVITY_KIND_RUNTIME")
        rt["api"] = rt["nameId"].map(strings(d, r))
        k["pid"] = (k["globalPid"].to_numpy(np.int64) >> 24) & 0xFFFFFF
        rt["pid"] = (rt["globalTid"].to_numpy(np.int64) >> 24) & 0xFFFFFF
        m = k.merge(rt, on=["correlationId", "pid"], suffixes=("_k", "_r"))
        assert len(m) == len(k)  # every kernel has its launch, in its own process
        assert m.groupby("correlationId").size().max() == 3  # one cudaGraphLaunch starts three kernels
        graph = m["graphNodeId"].notna()
        assert (m.loc[~graph, "api"] == "cudaLaunchKernel_v7000").all()
        assert (m.loc[graph, "api"] == "cudaGraphLaunch_v10000").all()
        assert (m["start_k"] > m["end_r"]).all() and (m["end_r"] - m["start_r"] < 20_000).all()
        assert (m["globalTid"] == main_tid(d, r)).all()
        kids = nvtx(d, r).query("name != 'step'").sort_values("start")
        idx = np.searchsorted(kids["start"].to_numpy(), m["start_r"].to_numpy(), side="right") - 1
        assert (idx >= 0).all()
        assert (m["end_r"].to_numpy() <= kids["end"].to_numpy()[idx]).all()
        m["range"] = kids["name"].to_numpy()[idx]
        by_range = m.groupby("short")["range"].unique().map(set)
        for name in synth.FWD_KERNELS:
            assert by_range[name] == {"forward"}
        for name in synth.BWD_KERNELS:
            assert by_range[name] == {"backward"}
        assert by_range[synth.NCCL_SHORT] == {"allreduce"}


# API and command line

def test_parse_straggler():
    assert parse_straggler("rank=3,iterations=10-19,cause=compute,slowdown=2") == Straggler(3, 10, 19, "compute", 2.0)
    assert parse_straggler("rank=0,iterations=5") == Straggler(0, 5, 5, "dataloader", 1.5)
    assert parse_straggler("rank=2,iterations=all,cause=compute") == Straggler(2, 0, -1, "compute", 1.5)
    assert parse_straggler("rank=2,iterations=7-") == Straggler(2, 7, -1)
    for bad, says in [("rank=3", "give rank=R"), ("rank=x,iterations=1-2", "whole number"),
                      ("rank=1,iterations=5-2", "A <= B"), ("rank=1,iterations=1-2,cause=disk", "cause must be"),
                      ("rank=1,iterations=1-2,slowdown=0.5", "slowdown"),
                      ("rank=1,iterations=1-2,slowdown=x", "slowdown"),
                      ("rank=1,iterations=a-b", "iterations must"), ("rank=1,iterations=1,speed=2", "unknown key"),
                      ("nonsense", "KEY=VALUE")]:
        with pytest.raises(ValueError, match=says):
            parse_straggler(bad)


def test_rank_slow_in_every_iteration(tmp_path):
    d = write_synthetic(tmp_path / "a", ranks=3, iterations=6, stragglers=[parse_straggler("rank=2,iterations=all")])
    t = truth(d)
    assert [(c["rank"], c["iteration"]) for c in t["cells"]] == [(2, i) for i in range(6)]
    assert t["stragglers"][0]["last"] == 5
    dl = np.stack([durations(d, r)["dataloader"].to_numpy() for r in range(3)])
    assert (dl.argmax(axis=0) == 2).all()


def test_bad_calls_and_atomic_output(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="outside"):
        write_synthetic(tmp_path / "never", ranks=2, iterations=5, stragglers=[Straggler(7, 0, 1)])
    with pytest.raises(UsageError, match="slowdown"):
        write_synthetic(tmp_path / "never", ranks=2, iterations=5, stragglers=[Straggler(1, 0, 1, "compute", 0.9)])
    with pytest.raises(UsageError, match="--format"):
        write_synthetic(tmp_path / "never", fmt="csv")
    assert not (tmp_path / "never").exists()
    d = write_synthetic(tmp_path / "once", ranks=2, iterations=3)
    with pytest.raises(UsageError, match="force-overwrite"):
        write_synthetic(d, ranks=2, iterations=3)
    write_synthetic(d, ranks=1, iterations=3, overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == ["README.md", "rank0_pqtdir", "truth.json"]

    @contextlib.contextmanager
    def broken(path, fmt, schema):
        def write(tables):
            raise OSError("disk full")
        yield write

    monkeypatch.setattr(synth, "export_writer", broken)
    with pytest.raises(OSError):
        write_synthetic(tmp_path / "half", ranks=2, iterations=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["once"]  # no half-written folder left behind


@pytest.mark.parametrize("fmt,job", [("sqlite", "nccl"), ("parquetdir", "mpi")])
def test_written_a_block_of_iterations_at_a_time_the_export_is_the_same(tmp_path, monkeypatch, fmt, job):
    """A long capture is made and written BLOCK_ITERATIONS at a time: every table the same, row for row and in the
    same order, as when the whole run is one block (correlation ids included: a launch still pairs with its op)."""
    kw = {"ranks": 2, "iterations": 30, "seed": 5, "fmt": fmt, "job": job,
          "stragglers": [Straggler(1, 3, 9, "gpu", 1.5)]}
    whole = write_synthetic(tmp_path / "whole", **kw)
    monkeypatch.setattr(synth, "BLOCK_ITERATIONS", 7)
    blocks = write_synthetic(tmp_path / "blocks", **kw)
    assert (blocks / "truth.json").read_text() == (whole / "truth.json").read_text()
    for r in range(2):
        if fmt == "sqlite":
            def tables(path):
                con = sqlite3.connect(path)
                out = {name: (sql, con.execute(f'SELECT * FROM "{name}" ORDER BY rowid').fetchall())
                       for name, sql in con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
                con.close()
                return out
            a, b = tables(whole / f"rank{r}.sqlite"), tables(blocks / f"rank{r}.sqlite")
            assert a.keys() == b.keys() and len(a["CUPTI_ACTIVITY_KIND_KERNEL"][1]) == 30 * 15
            for name in a:
                assert a[name] == b[name], name
        else:
            files = sorted(p.name for p in (whole / f"rank{r}_pqtdir").iterdir())
            assert files == sorted(p.name for p in (blocks / f"rank{r}_pqtdir").iterdir())
            assert len(pq.read_table(whole / f"rank{r}_pqtdir" / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")) == 30
            for name in files:
                assert pq.read_table(blocks / f"rank{r}_pqtdir" / name).equals(
                    pq.read_table(whole / f"rank{r}_pqtdir" / name)), name


def test_reproducible_from_the_seed(tmp_path):
    a = write_synthetic(tmp_path / "a", ranks=2, iterations=4, seed=11)
    b = write_synthetic(tmp_path / "b", ranks=2, iterations=4, seed=11)
    c = write_synthetic(tmp_path / "c", ranks=2, iterations=4, seed=12)
    for f in sorted((a / "rank1_pqtdir").glob("*.parquet")):
        assert f.read_bytes() == (b / "rank1_pqtdir" / f.name).read_bytes(), f.name
    assert not durations(a, 1).equals(durations(c, 1))


def test_cli_hooks(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--ranks", "2", "--iterations", "3", "--gpus-per-node", "1", "--seed", "4",
                              "--straggler", "rank=1,iterations=0-1,cause=compute,slowdown=2",
                              "--output", str(tmp_path / "cli")])
    assert args.format == "parquetdir"
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and str(tmp_path / "cli") in out
    t = truth(tmp_path / "cli")
    assert (t["ranks"], t["gpus_per_node"], t["seed"], len(t["cells"])) == (2, 1, 4, 2)
    with pytest.raises(SystemExit):
        parser.parse_args(["--ranks", "2"])  # --output is required
    bad = parser.parse_args(["--straggler", "rank=1", "--output", str(tmp_path / "x")])
    with pytest.raises(UsageError, match="give rank=R"):
        main(bad)


def test_loader_reads_ranks_and_hosts(runs):
    ranks = [inputs.load_file(runs["pq"] / f"rank{r}_pqtdir", {"nvtx"})[0] for r in range(RANKS)]
    assert [rd.rank_candidates["env"] for rd in ranks] == [(r, "RANK") for r in range(RANKS)]
    assert {rd.host for rd in ranks} == {"synth-node000"}
    assert pd.Series([rd.session_start_ns for rd in ranks]).is_unique


@pytest.mark.parametrize("fmt", ["sqlite", "parquetdir"])
def test_newer_export_shape_gives_the_same_answers(tmp_path, fmt):
    from nsys_recipe_pack import runner

    outs = {}
    for shape in ("2023.4", "newer"):
        data = write_synthetic(tmp_path / shape, ranks=3, iterations=10, fmt=fmt, stragglers=[STALL], seed=9,
                               schema=shape)
        if shape == "newer" and fmt == "sqlite":
            con = sqlite3.connect(data / "rank0.sqlite")
            cols = {r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")}
            assert {"eventId", "binaryData"} <= cols
            assert con.execute("SELECT count(*) FROM TARGET_INFO_CUDA_DEVICE").fetchone()[0] == 1
            assert dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))["EXPORT_SCHEMA_VERSION"] == "3.25.0"
        for recipe in ("straggler_heatmap", "nvtx_gpu_proj", "sync_summary", "compute_memory_share"):
            out = runner.run(recipe, [str(data)], str(tmp_path / f"o-{shape}-{recipe}"), mode="none", options={})
            outs.setdefault(recipe, {})[shape] = out
    for recipe, pair in outs.items():
        for f in pair["2023.4"].glob("*.parquet"):
            a, b = pd.read_parquet(f), pd.read_parquet(pair["newer"] / f.name)
            if f.name == "files.parquet":
                a, b = (x.drop(columns=["file", "read_from"]) for x in (a, b))
            pdt.assert_frame_equal(a, b, obj=f"{recipe}/{f.name}")
