"""The synthetic export writer: the real 2023.4 schema, and the injected truth recoverable by hand."""

import json
import sqlite3

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pyarrow.parquet as pq
import pytest

from nsys_recipe_pack import loader
from nsys_recipe_pack.errors import UsageError
from nsys_recipe_pack.synth import SCHEMA_FILE, Straggler, parse_straggler, write_synthetic

SCHEMA = json.loads(SCHEMA_FILE.read_text())
STRAGGLER = Straggler(rank=1, first=4, last=7, cause="dataloader", slowdown=1.5)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    base = tmp_path_factory.mktemp("synth")
    sq = write_synthetic(base / "sq", ranks=4, iterations=12, fmt="sqlite", stragglers=[STRAGGLER], seed=3)
    pqt = write_synthetic(base / "pq", ranks=4, iterations=12, fmt="parquetdir", stragglers=[STRAGGLER], seed=3)
    return sq, pqt


def test_sqlite_tables_have_the_real_schema(both):
    sq, _ = both
    con = sqlite3.connect(sq / "rank0.sqlite")
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"} <= tables
    for table in tables:
        got = [(r[1], r[2]) for r in con.execute(f'PRAGMA table_info("{table}")')]
        assert got == [(c["name"], c["sqlite"]) for c in SCHEMA["tables"][table]], table


def test_parquet_tables_have_the_real_schema(both):
    _, pqt = both
    for f in (pqt / "rank0_pqtdir").glob("*.parquet"):
        schema = pq.read_schema(f)
        assert [(x.name, str(x.type)) for x in schema] == \
            [(c["name"], c["arrow"]) for c in SCHEMA["tables"][f.stem]], f.stem


def test_labelled_synthetic(both):
    for d in both:
        assert json.loads((d / "truth.json").read_text())["synthetic"] is True
        assert "SYNTHETIC" in (d / "README.md").read_text()
    con = sqlite3.connect(both[0] / "rank2.sqlite")
    assert dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))["SYNTHETIC"].startswith("nsys-recipe-pack")


def test_sqlite_and_parquetdir_hold_the_same_events(both):
    sq, pqt = both
    (a,) = loader.load_file(sq / "rank1.sqlite", {"nvtx", "kernel", "runtime"})
    (b,) = loader.load_file(pqt / "rank1_pqtdir", {"nvtx", "kernel", "runtime"})
    for attr in ("nvtx", "kernels", "runtime"):
        pdt.assert_frame_equal(getattr(a, attr), getattr(b, attr), check_dtype=False)
    assert a.session_start_ns == b.session_start_ns and a.env == b.env


def nvtx_table(d, r):
    df = pq.read_table(d / f"rank{r}_pqtdir" / "NVTX_EVENTS.parquet").to_pandas()
    strings = pq.read_table(d / f"rank{r}_pqtdir" / "StringIds.parquet").to_pandas().set_index("id")["value"]
    df["name"] = df["text"].fillna(df["textId"].map(strings))
    df["iteration"] = (df["name"] == "step").cumsum() - 1
    return df


def test_injected_dataloader_stall_by_hand(both):
    _, pqt = both
    dl = {}
    for r in range(4):
        df = nvtx_table(pqt, r)
        x = df[df["name"] == "dataloader"]
        dl[r] = (x["end"] - x["start"]).to_numpy()
    others = np.median([dl[r] for r in (0, 2, 3)], axis=0)
    extra = dl[1] - others
    inj = slice(4, 8)
    # busy is about 88 ms (3 + 30 + 50 + 5), so a 1.5x slowdown adds about 44 ms in the dataloader
    assert np.all((extra[inj] > 40e6) & (extra[inj] < 48e6))
    assert np.all(np.abs(np.delete(extra, range(4, 8))) < 1e6)


def test_collective_ends_together_on_the_aligned_clock(both):
    _, pqt = both
    ends = []
    for r in range(4):
        d = pqt / f"rank{r}_pqtdir"
        k = pq.read_table(d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").to_pandas()
        strings = pq.read_table(d / "StringIds.parquet").to_pandas().set_index("id")["value"]
        start = int(pq.read_table(d / "TARGET_INFO_SESSION_START_TIME.parquet").to_pandas()["utcEpochNs"][0])
        nccl = k[k["shortName"].map(strings).str.startswith("ncclDevKernel")]
        ends.append(nccl["end"].to_numpy() + start)
    spread = np.ptp(np.stack(ends), axis=0)
    assert len(ends[0]) == 12 and spread.max() == 0


def test_every_kernel_has_its_launch_inside_the_parent_range(both):
    _, pqt = both
    d = pqt / "rank2_pqtdir"
    k = pq.read_table(d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").to_pandas()
    rt = pq.read_table(d / "CUPTI_ACTIVITY_KIND_RUNTIME.parquet").to_pandas()
    m = k.merge(rt, on="correlationId", suffixes=("_k", "_r"))
    assert len(m) == len(k)  # every kernel has its launch; a CUDA graph launch starts three kernels
    assert m.groupby("correlationId").size().max() == 3
    assert (m["start_k"] > m["end_r"]).all()  # the GPU starts after the launch returns
    nv = nvtx_table(pqt, 2)
    fwd = nv[nv["name"].isin(["forward", "backward", "allreduce", "optimizer"])].sort_values("start")
    idx = np.searchsorted(fwd["start"].to_numpy(), m["start_r"].to_numpy(), side="right") - 1
    assert (idx >= 0).all()
    assert (m["end_r"].to_numpy() <= fwd["end"].to_numpy()[idx]).all()
    assert (m["globalTid"].astype("int64") == nv["globalTid"].astype("int64").iloc[0]).all()


def test_parse_straggler(tmp_path):
    assert parse_straggler("rank=3,iterations=10-19,cause=compute,slowdown=2") == Straggler(3, 10, 19, "compute", 2.0)
    for bad in ("rank=3", "rank=x,iterations=1-2", "rank=1,iterations=5-2", "rank=1,iterations=1-2,cause=disk",
                "rank=1,iterations=1-2,slowdown=0.5", "nonsense"):
        with pytest.raises(ValueError):
            parse_straggler(bad)
    with pytest.raises(UsageError):
        write_synthetic(tmp_path / "never", ranks=2, iterations=5, stragglers=[Straggler(7, 0, 1)])


def test_loader_reads_ranks_and_hosts(both):
    _, pqt = both
    ranks = [loader.load_file(pqt / f"rank{r}_pqtdir", {"nvtx"})[0] for r in range(4)]
    assert [rd.rank_candidates["env"] for rd in ranks] == [(r, "RANK") for r in range(4)]
    assert {rd.host for rd in ranks} == {"synth-node000"}
    assert pd.Series([rd.session_start_ns for rd in ranks]).is_unique


@pytest.mark.parametrize("fmt", ["sqlite", "parquetdir"])
def test_newer_export_shape_gives_the_same_answers(tmp_path, fmt):
    from nsys_recipe_pack import runner

    outs = {}
    for shape in ("2023.4", "newer"):
        data = write_synthetic(tmp_path / shape, ranks=3, iterations=10, fmt=fmt, stragglers=[STRAGGLER], seed=9,
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
                a, b = a.drop(columns="file"), b.drop(columns="file")
            pdt.assert_frame_equal(a, b, obj=f"{recipe}/{f.name}")
