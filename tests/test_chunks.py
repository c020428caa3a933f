"""compute_memory_share on a long capture, added up span by span of time as its tables are read (inputs.chunks):
the same tables as the map over whole tables, however the tables are cut, and the whole read wherever spans
cannot give the same answer."""

import collections
import dataclasses
import importlib
import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import folded
from test_batches import REAL_GLOO, REAL_NCCL, synthetic  # noqa: F401 (a fixture)

from nsys_recipe_pack import synth
from nsys_recipe_pack.inputs import chunks, load_file, rank_data, readers
from nsys_recipe_pack.inputs.batches import Extents
from nsys_recipe_pack.inputs.readers import ExportSource, string_table
from nsys_recipe_pack.recipes import compute_memory_share as share

NEEDS = set(share.NEEDS)


@pytest.fixture()
def always_spans(monkeypatch):
    monkeypatch.setattr(rank_data, "STREAM_MIN_ROWS", 0)


def _same_maps(path, expect_spans=True):
    whole, spanned = load_file(path, NEEDS), folded(share.RECIPE, path, {})
    assert [r.pid for r in whole] == [r.pid for r, _ in spanned]
    for a, (b, result) in zip(whole, spanned, strict=True):
        assert (result is not None) == expect_spans, path
        want, got = share.map_rank(a, {}), share.map_rank(b, {})
        for key in ("share", "by_range", "nccl_kernels", "nccl_inits"):
            assert (got[key] is None) == (want[key] is None), (path, key)
            if want[key] is not None:
                assert got[key].equals(want[key]), (path, key)  # values, names' dictionaries and types
        assert (b.gpu, b.unclosed_ranges, b.rank_candidates) == (a.gpu, a.unclosed_ranges, a.rank_candidates)
    return whole


@pytest.mark.parametrize("batch_rows", [7, 1000])
def test_spans_give_the_whole_reads_tables(synthetic, always_spans, monkeypatch, batch_rows):  # noqa: F811
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", batch_rows)
    for path in [REAL_NCCL, REAL_GLOO, synthetic["sqlite"][2], synthetic["parquetdir"][2]]:
        ranks = _same_maps(path)
        assert any(share.map_rank(r, {})["by_range"] is not None for r in ranks), path


def test_the_fold_keeps_the_nccl_kernels_read_whole_or_in_spans(always_spans, monkeypatch):
    """The real 2-GPU NCCL export: the NCCL kernels the fold keeps for the waiting split (start, end, stream, in time
    order) are those SQL finds by name, whether the rank is read whole or 40 rows a batch."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 40)
    with sqlite3.connect(REAL_NCCL) as db:
        want = db.execute("SELECT k.start, k.end, k.streamId FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
                          "s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel%' OR s.value LIKE 'ncclKernel%' "
                          "ORDER BY k.start, k.end").fetchall()
    assert len(want) > 10
    spanned = folded(share.RECIPE, REAL_NCCL, {})
    assert len(spanned) == 2 and all(result is not None for _, result in spanned)
    for ranks in (load_file(REAL_NCCL, NEEDS), [rank for rank, _ in spanned]):  # its two processes, each a rank
        got = pa.concat_tables([share.map_rank(rank, {})["nccl_kernels"] for rank in ranks]).to_pandas()
        got = got.sort_values(["start_ns", "end_ns"], kind="stable")
        assert list(zip(got["start_ns"], got["end_ns"], got["stream"], strict=True)) == want
        assert (got["op"] >= 0).all() and (got[["comm_id", "bytes", "iteration"]] == -1).all().all()


def test_every_row_is_handed_over_once_in_its_span(always_spans, monkeypatch):
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 5)
    src = ExportSource(REAL_NCCL, "sqlite")
    try:
        seen = {n: [] for n in share.STREAM.needs}
        spans = []
        view = lambda need, frame: pa.table({"start_ns": frame.values("start_ns")})  # noqa: E731
        for low, high, chunk in chunks.time_chunks(src, list(share.STREAM.needs), string_table(src), view, Extents(),
                                                   lambda t, n: None, {}):
            spans.append((low, high))
            for need, rows in chunk.items():
                starts = np.zeros(0, np.int64) if rows is None else rows.column("start_ns").to_numpy()
                assert ((starts >= low) & (starts < high)).all() or high == chunks.END_OF_TIME
                seen[need].append(starts)
        for need in share.STREAM.needs:
            (table, _), = readers.TABLES[need].items()
            want = np.sort(src.read_arrow(table, ["start"]).column("start").to_numpy())
            assert np.array_equal(np.concatenate(seen[need]), want), need
    finally:
        src.close()
    assert len(spans) > 10 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] == chunks.END_OF_TIME


def test_an_export_out_of_time_order_is_read_whole(tmp_path, always_spans, monkeypatch):
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 50)
    path = tmp_path / "shuffled.sqlite"
    shutil.copy(REAL_GLOO, path)
    con = sqlite3.connect(path)  # the kernels written again latest first
    con.execute("CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start DESC")
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM k")
    con.execute("DROP TABLE k")
    con.commit()
    con.close()
    _same_maps(path, expect_spans=False)


def test_one_rank_holding_several_processes_is_read_whole(tmp_path, always_spans):
    """A report of one GPU process whose NVTX ranges partly come from another process: the rank's ranges are all
    of them, which per-process spans do not give."""
    path = tmp_path / "two_processes.sqlite"
    shutil.copy(REAL_GLOO, path)
    con = sqlite3.connect(path)
    con.execute(f"UPDATE NVTX_EVENTS SET globalTid = globalTid + {1 << 24} WHERE rowid % 2 = 0")
    con.commit()
    con.close()
    _same_maps(path, expect_spans=False)



def test_windows_are_let_go_once_no_op_can_land_in_them(tmp_path, always_spans, monkeypatch):
    """Memory holds the top-level ranges still open at a span's end, not every one of the capture: SYNTHETIC, one
    rank of 60 steps read 50 rows a batch, each step a top-level range."""
    synth.write_synthetic(tmp_path, ranks=1, iterations=60, fmt="sqlite", job="nccl", seed=3)
    path, = tmp_path.glob("*.sqlite")
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 50)
    held = []

    def fold(state, low, high, chunk):
        share._fold(state, low, high, chunk)
        for proc in state.values():
            assert (proc.windows["end"] > high).all()
            held.append(len(proc.windows["end"]))

    (_, result), = folded(share.RECIPE, path, {}, stream=dataclasses.replace(share.STREAM, fold=fold))
    by_range = result["by_range"].to_pandas()
    steps = by_range[(by_range["range_name"] == "step") & (by_range["category"] == "idle")]["instances"]
    assert steps.tolist() == [60]  # every step a window, each with its idle row
    assert len(held) > 20 and max(held) <= 2
    _same_maps(path)


def test_a_parquet_tables_footer_is_read_once(synthetic, always_spans, monkeypatch):  # noqa: F811
    """However often a table is read (counted, read ahead, then span by span), its footer is parsed once: Nsight
    Systems writes row groups of 2,048 rows, so a long table's footer is large (readers.ExportSource._footer)."""
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 50)
    parsed = collections.Counter()
    read_metadata, parquet_file = pq.read_metadata, pq.ParquetFile.__init__

    def counted(where, *args, **kwargs):
        parsed[Path(where).name] += 1
        return read_metadata(where, *args, **kwargs)

    def opened(self, source, *args, metadata=None, **kwargs):
        if metadata is None and isinstance(source, str | os.PathLike):  # a file opened so parses its footer
            parsed[Path(source).name] += 1
        parquet_file(self, source, *args, metadata=metadata, **kwargs)

    monkeypatch.setattr(pq, "read_metadata", counted)
    monkeypatch.setattr(pq.ParquetFile, "__init__", opened)
    assert folded(share.RECIPE, synthetic["parquetdir"][2], {})[0][1] is not None
    assert parsed["CUPTI_ACTIVITY_KIND_KERNEL.parquet"] == 1 and max(parsed.values()) == 1, parsed


def _nvtx_parquet_export(folder: Path, seed: int) -> Path:
    """A Parquet export of NVTX events only, written here: range names as text (some repeated, some empty, some
    null) or as ids into StringIds, domains named by create events along the way, some ranges never closed; row
    groups of 64 rows, so that a batch of fewer rows meets words of its row group that it does not hold."""
    rng = np.random.default_rng(seed)
    n = 400
    words = np.array([f"step {i}" for i in range(30)] + ["MPI Rank 3", ""], object)
    text = words[rng.integers(0, len(words), n)]
    text_id = np.where(rng.random(n) < 0.2, rng.integers(1, 4, n), -1)
    text[text_id > 0] = None
    event = np.where(rng.random(n) < 0.7, 59, 60)
    domain = rng.integers(0, 3, n)  # 0: the default domain, which no event names
    domain[250:] = rng.integers(0, 4, n - 250)
    create = np.array([0, 1, 249])  # each before the first range of its domain, the last in a later batch
    domain[create] = [1, 2, 3]
    event[create], text[create], text_id[create] = 75, [f"domain {d}" for d in domain[create]], -1
    start = np.sort(rng.integers(0, 10**6, n))
    end = start + rng.integers(1, 10**4, n)
    unclosed = (rng.random(n) < 0.05) | (event == 75)
    folder.mkdir(parents=True)
    pq.write_table(pa.table({
        "start": start, "end": pa.array(end, mask=unclosed), "eventType": event, "text": pa.array(text.tolist()),
        "textId": pa.array(text_id, mask=text_id < 0), "globalTid": (7 << 24) + rng.integers(7, 9, n),
        "domainId": domain}), folder / "NVTX_EVENTS.parquet", row_group_size=64)
    pq.write_table(pa.table({"id": [1, 2, 3], "value": ["forward", "backward", "step 4"]}),
                   folder / "StringIds.parquet")
    return folder


@pytest.mark.parametrize("seed", [1, 2])
def test_nvtx_text_read_from_parquet_as_its_dictionary_gives_the_frames_strings_give(tmp_path, monkeypatch, seed):
    """A batched read of NVTX text from Parquet keeps the file's dictionary (readers.DICTIONARY_TEXT): every span's
    frame, the name dictionary and the rows every read keeps are those of the text read as strings, dictionaries
    in the same order."""
    src = ExportSource(_nvtx_parquet_export(tmp_path / "x_pqtdir", seed), "parquetdir")
    monkeypatch.setattr(readers, "STREAM_BATCH_ROWS", 16)  # batches within row groups, as without the dictionary
    batch = next(src.read_batches("NVTX_EVENTS", readers.TABLES["nvtx"]["NVTX_EVENTS"]))
    assert pa.types.is_dictionary(batch.column("text").type)

    def read() -> tuple:
        found = {}
        spans = [chunk["nvtx"] for _, _, chunk in chunks.time_chunks(
            src, ["nvtx"], string_table(src), lambda need, frame: frame.table, Extents(), lambda t, n: None, found)]
        return pa.concat_tables(spans), found

    got, got_found = read()
    monkeypatch.setattr(readers, "DICTIONARY_TEXT", {})
    want, want_found = read()
    assert not pa.types.is_dictionary(next(src.read_batches("NVTX_EVENTS", ["text"])).column("text").type)
    assert got.num_rows > 300 and got.equals(want)
    assert got_found["names"] == want_found["names"]
    assert got_found["nvtx"].table.equals(want_found["nvtx"].table) and got_found["nvtx"].table.num_rows


def test_what_the_reads_ahead_of_the_spans_freed_is_handed_back_before_the_first_span(always_spans, monkeypatch):
    """glibc keeps what the read-ahead threads free in their own arenas: given back once the stream's `prepare` is
    done, before the spans allocate beside it (allocator.give_back_freed_memory)."""
    from nsys_recipe_pack.recipes import straggler_heatmap

    steps = []
    stream = straggler_heatmap.STREAM

    def prepare(ahead, options):
        steps.append("prepare")
        return stream.prepare(ahead, options)

    def fold(*args):
        steps.append("fold")
        return stream.fold(*args)

    monkeypatch.setattr(rank_data, "give_back_freed_memory", lambda: steps.append("give back"))
    (_, result), = folded(straggler_heatmap.RECIPE, REAL_GLOO, {},
                          stream=dataclasses.replace(stream, prepare=prepare, fold=fold))
    assert result is not None
    assert steps[:3] == ["prepare", "give back", "fold"] and steps.count("give back") == 1


@pytest.mark.parametrize("name", ["compute_memory_share", "sync_summary", "kernel_pace", "nvtx_gpu_proj"])
def test_a_rank_read_whole_is_one_span_of_the_same_fold(monkeypatch, name):
    """map_rank is the stream a long capture goes through span by span, given the whole rank as one span, and what it
    reads ahead through the same `prepare` (kernel_pace: its iterations, iteration_scan over the rank as one span): no
    other analysis makes its maps."""
    module = importlib.import_module(f"nsys_recipe_pack.recipes.{name}")
    stream, spans, prepared = module.STREAM, [], []

    def fold(state, low, high, span):
        spans.append((low, high))
        return stream.fold(state, low, high, span)

    def prepare(ahead, options):
        prepared.append(type(ahead).__name__)
        return stream.prepare(ahead, options)

    monkeypatch.setattr(module, "STREAM", dataclasses.replace(stream, fold=fold, prepare=prepare))
    ranks = load_file(REAL_NCCL, set(module.NEEDS))
    maps = [module.map_rank(r, {}) for r in ranks]
    assert spans == [(chunks.START_OF_TIME, chunks.END_OF_TIME)] * len(ranks) and all(maps)
    assert prepared == ["RankAhead"] * len(ranks)
    assert all(m["ranges"].num_rows for m in maps if "ranges" in m)  # nvtx_gpu_proj's: what its one fold finished
