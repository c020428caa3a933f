"""Uneven iteration counts, duplicate rank ids, never-closed NVTX ranges, zero-length events: handled and said."""

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from nsys_recipe_pack import runner
from nsys_recipe_pack.synth import Straggler, write_synthetic


def edit(path, fn):
    t = pq.read_table(path)
    df = fn(t.to_pandas())
    pq.write_table(pa.Table.from_pandas(df, schema=t.schema, preserve_index=False), path)


def test_uneven_iterations_unclosed_ranges_and_duplicate_ranks_are_reported(tmp_path):
    data = write_synthetic(tmp_path / "in", ranks=3, iterations=12, stragglers=[Straggler(2, 3, 5, "dataloader", 1.6)])
    nv = data / "rank1_pqtdir" / "NVTX_EVENTS.parquet"
    # rank 1 stops early: its last two steps (and their children) are gone
    edit(nv, lambda df: df[df["start"] < df.loc[df["text"] == "step", "start"].sort_values().iloc[-2]])
    # rank 0's process was killed with two ranges open: no end; plus a zero-length range
    edit(data / "rank0_pqtdir" / "NVTX_EVENTS.parquet",
         lambda df: pd.concat([df, df.tail(2).assign(end=None), df.head(1).assign(end=df.head(1)["start"])]))
    # every report says RANK=0 (a launcher that set it once): the environment cannot name the ranks
    for r in range(3):
        edit(data / f"rank{r}_pqtdir" / "TARGET_INFO_SYSTEM_ENV.parquet",
             lambda df: df.assign(value=df["value"].str.replace(r"RANK=\d+;", "RANK=0;", regex=True)))
    out = runner.run("straggler_heatmap", [str(data)], str(tmp_path / "o"), mode="none", options={"iteration": "step"})
    notes = " ".join(json.loads((out / "analysis.json").read_text())["notes"])
    assert "ranks from env were not used: they repeat (0)" in notes
    assert "2 NVTX range(s) never closed" in notes and "rank(s) 0" in notes
    assert "ranks have 10 to 12 iterations (fewest on rank(s) 1)" in notes
    files = pd.read_parquet(out / "files.parquet")
    assert files["rank"].tolist() == [0, 1, 2] and set(files["rank_source"]) == {"filename"}
    it = pd.read_parquet(out / "iterations.parquet")
    assert it.groupby("rank").size().to_dict() == {0: 12, 1: 10, 2: 12}
    assert (it["busy_ns"] + it["wait_ns"] == it["duration_ns"]).all()
    flagged = set(zip(it.loc[it["is_straggler"], "rank"], it.loc[it["is_straggler"], "iteration"], strict=True))
    assert flagged == {(2, 3), (2, 4), (2, 5)}
