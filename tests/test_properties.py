"""Property tests over SYNTHETIC exports: tables and columns dropped, rows shuffled, odd names. Only the pack's
own errors may escape, and the invariants hold whenever a recipe succeeds."""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsys_recipe_pack import runner
from nsys_recipe_pack.errors import PackError
from nsys_recipe_pack.synth import write_synthetic

OPTIONAL_TABLES = ["CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
                   "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "TARGET_INFO_SESSION_START_TIME",
                   "TARGET_INFO_SYSTEM_ENV", "ThreadNames", "PROCESSES", "META_DATA_EXPORT"]
OPTIONAL_COLUMNS = [("NVTX_EVENTS", "textId"), ("NVTX_EVENTS", "domainId"), ("NVTX_EVENTS", "text"),
                    ("CUPTI_ACTIVITY_KIND_KERNEL", "demangledName"), ("CUPTI_ACTIVITY_KIND_KERNEL", "graphNodeId"),
                    ("CUPTI_ACTIVITY_KIND_MEMCPY", "srcKind"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "copyKind"),
                    ("CUPTI_ACTIVITY_KIND_MEMCPY", "bytes"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memKind"),
                    ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId"), ("CUPTI_ACTIVITY_KIND_KERNEL", "streamId")]
RECIPES = ["straggler_heatmap", "kernel_pace", "nvtx_gpu_proj", "sync_summary", "compute_memory_share"]


def mutate(data, drop_tables, drop_columns, shuffle, odd_name, seed):
    rng = np.random.default_rng(seed)
    for d in sorted(data.glob("rank*_pqtdir")):
        for table in drop_tables:
            (d / f"{table}.parquet").unlink(missing_ok=True)
        for f in d.glob("*.parquet"):
            t = pq.read_table(f)
            cols = [c for tbl, c in drop_columns if tbl == f.stem and c in t.column_names]
            if cols:
                t = t.drop_columns(cols)
            if f.stem == "StringIds" and odd_name is not None:
                df = t.to_pandas()
                df.loc[df["value"] == "forward", "value"] = odd_name
                t = t.from_pandas(df, schema=t.schema)
            if shuffle and t.num_rows > 1:
                t = t.take(rng.permutation(t.num_rows))
            pq.write_table(t, f)


def check_invariants(recipe, out):
    if recipe == "straggler_heatmap":
        it = pd.read_parquet(out / "iterations.parquet")
        assert (it["busy_ns"] + it["wait_ns"] == it["duration_ns"]).all()
        assert (it["wait_ns"] >= 0).all() and (it["wait_ns"] <= it["duration_ns"]).all()
        g = it["gpu_busy_ns"].dropna()
        assert (g <= it.loc[g.index, "duration_ns"]).all()
    elif recipe == "compute_memory_share":
        s = pd.read_parquet(out / "share.parquet")
        busy = s[s["category"] != "idle"]
        assert (busy["union_ns"] <= busy["sum_ns"]).all() and (s["union_ns"] >= 0).all()
        assert np.allclose(s.groupby(["rank", "device"])["pct_union"].sum(), 100.0)
        assert np.allclose(busy.groupby(["rank", "device"])["pct_sum"].sum(), 100.0)
    elif recipe == "nvtx_gpu_proj":
        r = pd.read_parquet(out / "ranges.parquet")
        has = r[r["gpu_ops"] > 0]
        assert has["gpu_start_ns"].notna().all()
        assert (has["gpu_start_ns"] <= has["gpu_end_ns"]).all()
        assert (has["gpu_busy_ns"] <= has["gpu_end_ns"] - has["gpu_start_ns"]).all()
        assert r.loc[r["gpu_ops"] == 0, "gpu_start_ns"].isna().all()
    elif recipe == "sync_summary":
        c = pd.read_parquet(out / "sync_calls.parquet")
        assert ((c["gpu_idle_ns"] >= 0) & (c["gpu_idle_ns"] <= c["duration_ns"])).all()
    elif recipe == "kernel_pace":
        p = pd.read_parquet(out / "pace.parquet")
        assert (p["duration_ns"] >= 0).all() and (p["lag_ns"] >= 0).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    drop_tables=st.sets(st.sampled_from(OPTIONAL_TABLES), max_size=3),
    drop_columns=st.sets(st.sampled_from(OPTIONAL_COLUMNS), max_size=3),
    shuffle=st.booleans(),
    odd_name=st.one_of(st.none(), st.text(min_size=1, max_size=300)),
    seed=st.integers(0, 2**16),
)
def test_only_pack_errors_escape_and_invariants_hold(tmp_path_factory, drop_tables, drop_columns, shuffle,
                                                     odd_name, seed):
    base = tmp_path_factory.mktemp("prop")
    data = write_synthetic(base / "in", ranks=2, iterations=6, seed=seed)
    mutate(data, drop_tables, drop_columns, shuffle, odd_name, seed)
    for recipe in RECIPES:
        try:
            out = runner.run(recipe, [str(data)], str(base / recipe), mode="none", options={}, log=lambda m: None)
        except PackError as exc:
            assert str(exc) and "\n" not in str(exc)
            assert not (base / recipe).exists()
            continue
        check_invariants(recipe, out)
