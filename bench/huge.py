"""One long capture per rank: the pack's recipes against the floor (just reading what each needs) and against
Nsight Systems' built-in counterparts, on the same file, in one run. Writes the "huge reports" section of
bench/RESULTS.md and the raw numbers to bench/results-huge/.

The inputs are real: `sample_reports/ai_profiler_a100/baseline_nvtx.nsys-rep` exported to SQLite by the nsys
found, then its activity tables (NVTX, kernels, copies, memsets, runtime and OS runtime calls, syncs) replicated
end to end in time COPIES times, each copy shifted by the capture's span and its correlation ids by the largest
one, so that every launch still pairs with its own call. 250 copies make 2.34 M kernels, 4.82 M NVTX ranges and
2.78 M runtime calls in 680 MB; 2,000 copies make 5.4 GB. The truth is known: every count and duration sum per
name is COPIES times the original's (checked against SQL over the original export). Beside each replicated
`X.sqlite` lie `X.nsys-rep` (the original report, older, so the built-ins read the export beside it) and
`X_pqtdir` (the same tables as Parquet, for the built-ins that read Parquet and for the pack's Parquet runs).

The second case is SYNTHETIC: one rank of the pack's generator (`nsys_recipe_pack.synth`, its NCCL job), SCALE
times SYNTH_ITERATIONS iterations (scales 1, 4 and 16: about 330 MB, 1.3 GB and 5.3 GB of SQLite), written once as
SQLite and once as Parquet into WORK/syntheticSCALEx/. It has no report, so no built-in runs on it; its truth is
what SQL gives over the synthetic export itself.

    make bench-huge                                  # 250 and 2000 copies, SYNTHETIC x1, x4 and x16
    .venv/bin/python bench/huge.py --copies 250 --synthetic ''   # the 680 MB case only
    .venv/bin/python bench/huge.py --recipes sync_summary   # measure one recipe again, keep the other rows
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench import BIN, PACK, ROOT, compile_bytecode, machine_meta, measure, replace_section  # noqa: E402
from nsys_recipe_pack import inputs, nsys_tool  # noqa: E402
from nsys_recipe_pack.inputs import readers, sqlite  # noqa: E402

SOURCE = ROOT / "sample_reports" / "ai_profiler_a100" / "baseline_nvtx.nsys-rep"
REPLICATED = ["NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "OSRT_API"]
KERNEL = "nchwToNhwcKernel"
NOT_APPLICABLE = "does not apply"  # the truth of a recipe the input holds nothing for (comm_overlap without NCCL)
EXIT_NOT_APPLICABLE = 3  # its exit code (README, exit codes)
ALL_COPIES = (250, 2000)  # the 680 MB and 5.4 GB cases
DELIMITER = "Epoch 2"  # the range kernel_pace finds delimiting iterations in the replicated report (once per copy)
# the SYNTHETIC case: one rank of the pack's generator (`nsys-recipe synth`), SYNTH_ITERATIONS steps times each scale
# (1x about 330 MB of SQLite, 16x about 5.3 GB); its kernel and delimiting range
SYNTH_ITERATIONS, ALL_SCALES, SYNTH_KERNEL, SYNTH_DELIMITER = 125_000, (1, 4, 16), "relu_fwd", "step"
# case (rows and --recipes name it), pack recipe, its command-line options and the same as the recipe's options,
# the built-in counterparts (each a command's arguments; none for iterations found from NVTX ranges)
CASES = [
    ("kernel_pace", "kernel_pace", ["--kernel", KERNEL], {"kernel": KERNEL},
     [["recipe", "cuda_gpu_kern_pace", "--name", KERNEL]]),
    ("kernel_pace_iterations", "kernel_pace", [], {}, []),
    ("sync_summary", "sync_summary", [], {}, [["recipe", "cuda_api_sync"], ["recipe", "cuda_memcpy_sync"],
                                              ["recipe", "cuda_memset_sync"]]),
    ("compute_memory_share", "compute_memory_share", [], {},
     [["stats", "-r", "cuda_gpu_kern_sum"], ["recipe", "cuda_gpu_mem_time_sum"]]),
    ("nvtx_gpu_proj", "nvtx_gpu_proj", [], {}, [["recipe", "nvtx_gpu_proj_trace"]]),
    ("straggler_heatmap", "straggler_heatmap", [], {}, []),
    # nccl_gpu_overlap_trace: not in Nsight Systems 2023.4, and later ones write nothing for a report without NCCL
    ("comm_overlap", "comm_overlap", [], {}, []),
]
BEGIN, END = "<!-- huge-reports:begin -->", "<!-- huge-reports:end -->"


def replicate(base: Path, dest: Path, copies: int) -> None:
    """The base export with its activity tables repeated `copies` times end to end in time."""
    tmp = dest.with_suffix(".partial")
    shutil.copy(base, tmp)
    con = sqlite3.connect(tmp)
    tables = [t for t in REPLICATED if con.execute("SELECT 1 FROM sqlite_master WHERE name=?", (t,)).fetchone()]
    low = min(con.execute(f"SELECT min(start) FROM {t}").fetchone()[0] for t in tables)
    high = max(con.execute(f"SELECT max(coalesce(end, start)) FROM {t}").fetchone()[0] for t in tables)
    span = high - low + 1000
    corr = con.execute("SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] + 1
    con.execute("CREATE TEMP TABLE copy (k INTEGER)")
    con.executemany("INSERT INTO temp.copy VALUES (?)", [(k,) for k in range(1, copies)])
    for t in tables:
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
        last = con.execute(f"SELECT max(rowid) FROM {t}").fetchone()[0]
        shifted = {"start": f"start + k * {span}", "end": f"end + k * {span}",
                   "correlationId": f"correlationId + k * {corr}"}
        sel = ", ".join(shifted.get(c, c) for c in cols)
        no_domains = " AND eventType != 75" if t == "NVTX_EVENTS" else ""  # a domain is made once
        con.execute(f"INSERT INTO {t} ({', '.join(cols)}) SELECT {sel} FROM temp.copy, {t} "
                    f"WHERE {t}.rowid <= {last}{no_domains} ORDER BY k, {t}.rowid")
    con.commit()
    con.close()
    os.replace(tmp, dest)


def to_parquet(sqlite_path: Path, dest: Path) -> None:
    """Every table of an SQLite export as `TABLE.parquet`, streamed a batch at a time through ADBC's driver."""
    import adbc_driver_manager
    import adbc_driver_sqlite

    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    names = [r[0] for r in sqlite3.connect(sqlite_path).execute("SELECT name FROM sqlite_master WHERE type='table'")]
    db = adbc_driver_sqlite.connect(sqlite_path.resolve().as_uri() + "?mode=ro")
    conn = adbc_driver_manager.AdbcConnection(db)
    for name in names:
        stmt = adbc_driver_manager.AdbcStatement(conn)
        stmt.set_options(**{"adbc.sqlite.query.batch_rows": "1000000"})
        stmt.set_sql_query(f'SELECT * FROM "{name}"')
        handle, _ = stmt.execute_query()
        reader = pa.RecordBatchReader._import_from_c(handle.address)
        batches = list(_batches_of(reader))
        schema = _common_schema([b.schema for b in batches]) if batches else reader.schema
        with pq.ParquetWriter(tmp / f"{name}.parquet", schema) as writer:
            for batch in batches:
                writer.write_table(pa.Table.from_batches([batch]).cast(schema))
        stmt.close()
    conn.close()
    db.close()
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def _batches_of(reader):
    while True:
        try:
            yield reader.read_next_batch()
        except StopIteration:
            return


def _common_schema(schemas: list[pa.Schema]) -> pa.Schema:
    """A column typed null in some batches (all nulls there) takes its type from the others."""
    fields = []
    for i, field in enumerate(schemas[0]):
        kinds = [s.field(i).type for s in schemas if not pa.types.is_null(s.field(i).type)]
        fields.append(pa.field(field.name, kinds[0] if kinds else pa.int64()))
    return pa.schema(fields)


def make_case(work: Path, copies: int, nsys) -> Path:
    """X.nsys-rep (the original, older), X.sqlite (replicated) and X_pqtdir beside it; returns X.nsys-rep."""
    case = work / f"a100x{copies}"
    case.mkdir(parents=True, exist_ok=True)
    report = case / f"a100x{copies}.nsys-rep"
    sqlite_path, pqt = report.with_suffix(".sqlite"), case / f"a100x{copies}_pqtdir"
    if not (sqlite_path.exists() and pqt.exists()):
        shutil.copy2(SOURCE, report)
        base = work / "baseline_nvtx.sqlite"
        if not base.exists():
            subprocess.run([str(nsys.path), "export", "--type", "sqlite", "--quiet", "true", "--force-overwrite",
                            "true", "--output", str(base), str(SOURCE)], check=True, capture_output=True)
        time.sleep(1)  # the exports beside must be newer than the report
        replicate(base, sqlite_path, copies)
        to_parquet(sqlite_path, pqt)
    return report


def make_synthetic(work: Path, scale: int) -> tuple[Path, Path]:
    """One SYNTHETIC rank of `scale` x SYNTH_ITERATIONS iterations, as SQLite and as Parquet (made once)."""
    from nsys_recipe_pack import synth

    case = work / f"synthetic{scale}x"
    sqlite_path, pqt = case / "sqlite" / "rank0.sqlite", case / "parquet" / "rank0_pqtdir"
    for fmt, folder, made in (("sqlite", case / "sqlite", sqlite_path), ("parquetdir", case / "parquet", pqt)):
        if not made.exists():
            synth.write_synthetic(folder, ranks=1, iterations=scale * SYNTH_ITERATIONS, fmt=fmt, overwrite=True)
    return sqlite_path, pqt


def floor(path: Path, case: str, kernel: str = KERNEL) -> None:
    """Read just the tables, columns and rows a case's recipe needs from one export with the fastest reader for its
    format (ADBC's SQLite driver, pyarrow's Parquet reader), into Arrow, and nothing else."""
    from nsys_recipe_pack import recipes

    _, recipe, _, options, _ = next(c for c in CASES if c[0] == case)
    spec = recipes.get(recipe)
    needs, rows = set(spec.needs_given(options)), spec.rows_given(options) or {}
    wanted = {t: c for need in needs for t, c in inputs.TABLES.get(need, {}).items()}
    if "nvtx" not in needs:  # the rank's identity: the NVTX events whose names hold "rank"
        wanted["NVTX_EVENTS"] = inputs.TABLES["nvtx"]["NVTX_EVENTS"]
    small = {"StringIds": ["id", "value"], "TARGET_INFO_SYSTEM_ENV": ["name", "value"],
             "TARGET_INFO_SESSION_START_TIME": ["utcEpochNs"]}
    rows_read = 0
    if path.suffix == ".sqlite":
        import adbc_driver_manager
        import adbc_driver_sqlite

        db = adbc_driver_sqlite.connect(path.resolve().as_uri() + "?mode=ro")
        conn = adbc_driver_manager.AdbcConnection(db)
        have = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
        for table, cols in [*small.items(), *wanted.items()]:
            if table not in have:
                continue
            present = {r[1] for r in sqlite3.connect(path).execute(f"PRAGMA table_info({table})")}
            condition = ""
            if table == "CUPTI_ACTIVITY_KIND_KERNEL" and rows.get("kernel"):
                condition = f" WHERE shortName IN (SELECT id FROM StringIds WHERE value = '{kernel}')"
            elif table == "NVTX_EVENTS" and "nvtx" not in needs:
                condition = (" WHERE text LIKE '%rank%' OR textId IN (SELECT id FROM StringIds WHERE value LIKE "
                             "'%rank%')")
            # text read as the pack reads it (a first row that types the column as text)
            sql, _ = sqlite.sqlite_query(table, [c for c in cols if c in present],
                                           readers.TEXT_COLUMNS.get(table, set()), False, condition)
            stmt = adbc_driver_manager.AdbcStatement(conn)
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": "65536"})
            stmt.set_sql_query(sql)
            handle, _ = stmt.execute_query()
            rows_read += pa.RecordBatchReader._import_from_c(handle.address).read_all().num_rows
            stmt.close()
    else:
        ids = pq.read_table(path / "StringIds.parquet")
        for table, cols in [*small.items(), *wanted.items()]:
            f = path / f"{table}.parquet"
            if not f.exists():
                continue
            footer = pq.read_metadata(f)  # once a table, as the pack reads it (readers.ExportSource._footer)
            present = footer.schema.to_arrow_schema().names
            cols = [c for c in cols if c in present]
            if table == "CUPTI_ACTIVITY_KIND_KERNEL" and rows.get("kernel"):
                rows_read += _parquet_rows(f, footer, cols, ["shortName"], _is_kernel(ids, kernel))
            elif table == "NVTX_EVENTS" and "nvtx" not in needs:  # the events whose names hold "rank"
                rows_read += _parquet_rows(f, footer, cols, ["text", "textId"], _names_rank(ids))
            else:
                rows_read += pq.ParquetFile(f, metadata=footer).read(columns=cols).num_rows
    print(f"read {rows_read} rows")


def _parquet_rows(f: Path, footer: pq.FileMetaData, cols: list[str], tested: list[str], test) -> int:
    """Rows of a Parquet file that pass `test`, read a run of row groups at a time (`readers.row_group_runs`): the
    tested columns first (text as the file's dictionary), the others only for the runs with a row that passes."""
    from nsys_recipe_pack.inputs.readers import STREAM_BATCH_ROWS, row_group_runs

    names = footer.schema.to_arrow_schema().names
    file = pq.ParquetFile(f, metadata=footer, read_dictionary=[c for c in ("text",) if c in names])
    found = 0
    for run in row_group_runs(file.metadata, STREAM_BATCH_ROWS):
        hit = test(file.read_row_groups(run, columns=[c for c in tested if c in names]))
        if hit is not None and pc.any(hit).as_py():
            found += file.read_row_groups(run, columns=cols).filter(hit).num_rows
    return found


def _is_kernel(ids: pa.Table, kernel: str):
    kernel_ids = ids.filter(pc.equal(ids["value"], kernel))["id"]
    return lambda group: pc.is_in(group["shortName"], kernel_ids)


def _names_rank(ids: pa.Table):
    named = ids.filter(pc.match_substring(ids["value"], "rank", ignore_case=True))["id"]

    def test(group: pa.Table):
        hit = pc.is_in(group["textId"], named) if "textId" in group.column_names else None
        if "text" in group.column_names:  # read as the file's dictionary: each word tested once
            text = group["text"].combine_chunks()
            in_text = pc.is_in(text.indices, pc.indices_nonzero(pc.match_substring(text.dictionary, "rank",
                                                                                    ignore_case=True)))
            hit = in_text if hit is None else pc.or_kleene(hit, in_text)
        return hit
    return test


def truth(base: Path, copies: int, kernel: str = KERNEL, delimiter: str = DELIMITER) -> dict:
    """What the pack must find in a replicated case, by SQL over the original export: copies x its counts and sums
    (a SYNTHETIC case: over the export itself, copies 1)."""
    con = sqlite3.connect(base)
    q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
    name = "COALESCE(text, (SELECT value FROM StringIds WHERE id = textId))"
    api = "(SELECT value FROM StringIds WHERE id = nameId)"
    iterations = q(f"SELECT count(*) FROM NVTX_EVENTS WHERE {name} = '{delimiter}' AND end IS NOT NULL")[0][0] * copies
    collectives = q("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE shortName IN "
                    "(SELECT id FROM StringIds WHERE value LIKE 'nccl%')")[0][0] * copies
    out = {
        "kernel_pace": {"launches": q(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE shortName IN "
                                      f"(SELECT id FROM StringIds WHERE value = '{kernel}')")[0][0] * copies},
        "kernel_pace_iterations": {"iterations": iterations, "delimiter": delimiter},
        "straggler_heatmap": {"iterations": iterations},
        "comm_overlap": {"iterations": iterations, "collectives": collectives} if collectives else NOT_APPLICABLE,
        "compute_memory_share": {"kernel_ns": q("SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
                                 * copies,
                                 "kernels": q("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0] * copies},
        "nvtx_gpu_proj": {"ranges": {n: c * copies for n, c in q(
            f"SELECT {name}, count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL "
            "AND end >= start GROUP BY 1")}},
        "sync_summary": {"syncs": {k: c * copies for k, c in q(
            f"SELECT CASE WHEN {api} LIKE 'cudaDeviceSynchronize%' THEN 'device' "
            f"WHEN {api} LIKE 'cudaStreamSynchronize%' "
            f"THEN 'stream' WHEN {api} LIKE 'cudaEventSynchronize%' THEN 'event' END AS kind, count(*) "
            "FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1 HAVING kind IS NOT NULL")}},
    }
    con.close()
    return out


def found(case: str, out: Path) -> dict:
    """The same figures from the pack's output tables."""
    import pandas as pd

    if case == "kernel_pace":
        return {"launches": len(pd.read_parquet(out / "pace.parquet"))}
    if case == "kernel_pace_iterations":
        pace = pd.read_parquet(out / "pace.parquet")
        return {"iterations": len(pace), "delimiter": pace["kernel"].iloc[0]}
    if case == "straggler_heatmap":
        return {"iterations": len(pd.read_parquet(out / "iterations.parquet"))}
    if case == "comm_overlap":
        return {"iterations": int(pd.read_parquet(out / "windows.parquet")["iteration"].nunique()),
                "collectives": int(pd.read_parquet(out / "collectives.parquet")["kernels"].sum())}
    if case == "compute_memory_share":
        s = pd.read_parquet(out / "share.parquet")
        k = s[s["category"].isin(["compute", "communication"])]
        return {"kernel_ns": int(k["sum_ns"].sum()), "kernels": int(k["ops"].sum())}
    if case == "nvtx_gpu_proj":
        s = pd.read_parquet(out / "summary.parquet")
        return {"ranges": {n: int(c) for n, c in s.groupby("name")["count"].sum().items()}}
    c = pd.read_parquet(out / "sync_calls.parquet")
    c = c[c["kind"].isin(["device", "stream", "event"])]
    return {"syncs": {k: int(n) for k, n in c.groupby("kind", observed=True).size().items() if n}}


def pack_case(recipe, args, inputs: Path, out: Path) -> list[str]:
    return [PACK, "run", "--name", recipe, "--engine", "pack", *args, "--output", str(out), "--force-overwrite",
            str(inputs)]


def run(work: Path, copies_list: list[int], raw: Path, env: dict, nsys, repeat: int,
        only: set[str] | None = None, scales: list[int] = ()) -> list[dict]:
    log = raw / "commands.log"
    rows = []
    cases = [c for c in CASES if not only or c[0] in only]  # rows name the case as "recipe"
    for copies in copies_list:
        report = make_case(work, copies, nsys)
        sqlite_path, pqt = report.with_suffix(".sqlite"), report.with_name(report.stem + "_pqtdir")
        want = truth(work / "baseline_nvtx.sqlite", copies)
        size_mb = sqlite_path.stat().st_size / 1e6
        case = {"copies": copies, "size_mb": round(size_mb), "rows": _counts(sqlite_path)}
        for recipe, pack_recipe, args, _, builtins in cases:
            rows += _pack_rows(case, recipe, pack_recipe, args, sqlite_path, pqt, want, work, env, log, repeat)
            label = " + ".join("nsys " + " ".join(b[:3]) if b[0] == "stats" else b[1] for b in builtins)
            if not builtins:
                continue
            grown = _too_big(rows, recipe, size_mb)
            if grown:  # it would be killed for memory (or swap for hours): recorded, not run
                rows.append({"copies": copies, "size_mb": round(size_mb), "recipe": recipe, "form": "built-in",
                             "builtin": label, "builtin_s": float("nan"), "builtin_mb": grown, "ok": False,
                             "skipped": True})
                print(f"{copies:>5} {recipe:<22} built-in not run: would need about {grown / 1024:.0f} GB", flush=True)
                continue
            for _ in range(repeat):
                total_s, peak, ok = 0.0, 0, True
                for b in builtins:
                    target = str(sqlite_path) if b[0] == "stats" else str(report)
                    cmd = ([str(nsys.path), "stats", *b[1:], "--format", "csv", "--output", "-", "--quiet", target]
                           if b[0] == "stats" else
                           [str(nsys.path), "recipe", b[1], "--input", target, "--output",
                            str(work / "out" / b[1]), "--force-overwrite", *b[2:]])
                    r = measure(cmd, env, log)
                    total_s, peak, ok = total_s + r["wall_s"], max(peak, r["peak_mb"]), ok and r["ok"]
                rows.append({"copies": copies, "size_mb": round(size_mb), "recipe": recipe, "form": "built-in",
                             "builtin": label, "builtin_s": round(total_s, 2), "builtin_mb": peak, "ok": ok})
                print(f"{copies:>5} {recipe:<22} built-in {total_s:6.2f} s {peak:6} MB", flush=True)
    for scale in scales:  # SYNTHETIC: no report, so no built-in
        sqlite_path, pqt = make_synthetic(work, scale)
        want = truth(sqlite_path, 1, SYNTH_KERNEL, SYNTH_DELIMITER)
        case = {"scale": scale, "iterations": scale * SYNTH_ITERATIONS,
                "size_mb": round(sqlite_path.stat().st_size / 1e6), "rows": _counts(sqlite_path)}
        for recipe, pack_recipe, args, _, _ in cases:
            args = [SYNTH_KERNEL if a == KERNEL else a for a in args]
            rows += _pack_rows(case, recipe, pack_recipe, args, sqlite_path, pqt, want, work, env, log, repeat)
    return rows


def _pack_rows(case: dict, recipe: str, pack_recipe: str, args: list[str], sqlite_path: Path, pqt: Path, want: dict,
               work: Path, env: dict, log: Path, repeat: int) -> list[dict]:
    """The floor and the pack's run of one recipe on one input (`case`: its size, rows and how it was made), in both
    forms, `repeat` times."""
    rows = []
    kernel = args[args.index("--kernel") + 1] if "--kernel" in args else KERNEL
    name = f"x{case['copies']}" if "copies" in case else f"synthetic x{case['scale']}"
    for form, path in (("sqlite", sqlite_path), ("parquet", pqt)):
        for _ in range(repeat):
            in_page_cache(path)
            fl = measure([sys.executable, __file__, "floor", "--recipe", recipe, "--kernel", kernel, str(path)], env,
                         log)
            out = work / "out" / recipe
            pk = measure(pack_case(pack_recipe, args, path, out), env, log)
            if want[recipe] == NOT_APPLICABLE:  # the pack says so, exit 3, and writes nothing
                right = pk["exit"] == EXIT_NOT_APPLICABLE
            else:
                right = pk["ok"] and found(recipe, out) == want[recipe]
            rows.append({**case, "recipe": recipe, "form": form, "floor_s": fl["wall_s"], "floor_mb": fl["peak_mb"],
                         "pack_s": pk["wall_s"], "pack_mb": pk["peak_mb"], "ok": (pk["ok"] or right) and fl["ok"],
                         "truth": bool(right)})
            verdict = "truth found" if right else "truth NOT found" if pk["ok"] else "pack failed (see the log)"
            print(f"{name:>14} {recipe:<22} {form:<8} floor {fl['wall_s']:6.2f} s  pack {pk['wall_s']:6.2f} s "
                  f"{pk['peak_mb']:6} MB  {verdict}", flush=True)
    return rows


def in_page_cache(path: Path) -> None:
    """Read a file, or every file of a folder, once untimed: the floor runs first, and would otherwise pay alone the
    disk reads of a file the runs before it pushed out of the page cache (a floor of 10.8 s against 6.4 s with the
    5.4 GB case's Parquet export in the page cache), leaving the pack's run after it the cached file."""
    for f in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def _too_big(rows: list[dict], recipe: str, size_mb: float) -> int:
    """The memory (MB) a built-in would take on this case, grown in proportion to the file from its peak on a
    smaller one, when that exceeds 80 % of this machine's memory; else 0."""
    import psutil

    before = [r for r in rows if r["recipe"] == recipe and r["form"] == "built-in" and not r.get("skipped")]
    if not before:
        return 0
    grown = int(before[0]["builtin_mb"] * size_mb / before[0]["size_mb"])
    return grown if grown * 2**20 > 0.8 * psutil.virtual_memory().total else 0


def _counts(sqlite_path: Path) -> dict:
    con = sqlite3.connect(sqlite_path)
    have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    out = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] if t in have else 0 for t in REPLICATED}
    con.close()
    return out


def write_section(results: Path, rows: list[dict], meta: dict) -> None:
    import pandas as pd

    everything = pd.DataFrame(rows)
    synthetic = everything[everything["scale"].notna()] if "scale" in everything else everything.iloc[:0]
    df = everything.drop(index=synthetic.index).astype({"copies": int})
    place = {c[0]: i for i, c in enumerate(CASES)}
    label = {case: " ".join([recipe, *args]) for case, recipe, args, _, _ in CASES}  # the command's recipe and options
    df = df.assign(place=df["recipe"].map(place)).sort_values(["copies", "place"], kind="stable")
    lines = [BEGIN, "## Huge reports: one long capture per rank", "",
             f"Written by `{meta['command']}` on {meta['date']} ({meta['cpu']}, {meta['cores']} cores, "
             f"{meta['memory_gb']} GB; Nsight Systems {meta['nsys_version']}). Rerun with `make bench-huge`.", "",
             "Inputs: the real `baseline_nvtx` report of `ai_profiler_a100` with its activity tables replicated "
             "COPIES times end to end in time (how: the docstring of `bench/huge.py`). Floor: a process that "
             "only reads the tables, columns and rows the recipe needs from the same file (ADBC's SQLite driver, "
             "pyarrow's Parquet reader), timed after the file was read once untimed, so that it and the pack's "
             "run after it both find the file in the page cache (rows measured before 2026-11-28 05:40 UTC timed a "
             "floor that may have read it from disk, the pack then finding it cached). Built-in: Nsight Systems' "
             "nearest counterparts on the `.nsys-rep` with "
             "the export beside it (times summed, peak the largest). Times are wall seconds of the whole command, "
             "medians where repeated; memory is the peak resident memory of the process tree. Truth: the pack's "
             "counts and sums equal COPIES times those SQL gives over the original export (launches of the kernel, "
             "kernel time and count, closed ranges per name, device/stream/event syncs, iterations, NCCL kernels; "
             "the report has no NCCL kernel, so comm_overlap's answer is that it does not apply, exit 3). "
             "No built-in: Nsight Systems has none for iterations, and its `nccl_gpu_overlap_trace` (not in 2023.4) "
             "writes nothing for a report without NCCL.", "",
             "| copies | SQLite MB (10^6 B) | kernels / NVTX / runtime rows | recipe | read from | pack s | pack MB "
             "| floor s | pack / floor | built-in | built-in s | built-in MB | built-in / pack | truth |",
             "|---:|---:|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for (copies, recipe), g in df.groupby(["copies", "recipe"], sort=False):
        b = g[g["form"] == "built-in"]
        bs, bmb = (float(b["builtin_s"].median()), float(b["builtin_mb"].median())) if len(b) else (0.0, 0.0)
        skipped = "skipped" in b and b["skipped"].fillna(False).astype(bool).any()
        for form, p, ps, pmb, fs, rows_text, failed in _forms(g):
            builtin = ("— | — | —" if b.empty else f"not run: would need about {bmb / 1024:.0f} GB | — | —" if skipped
                       else f"{bs:.2f}{'' if b['ok'].all() else ' (failed)'} | {bmb:.0f} | {bs / max(ps, 1e-9):.2f}x")
            pack = ("refused or failed (see the log) | — " if failed else f"{ps:.2f} | {pmb:.0f} ")
            ratio = "—" if failed else f"{ps / max(fs, 1e-9):.2f}x"
            if failed or skipped:
                builtin = builtin.rsplit("|", 1)[0] + "| —"
            lines.append(f"| {copies} | {int(p['size_mb'].iloc[0])} | {rows_text} | {label[recipe]} | {form} | {pack}| "
                         f"{fs:.2f} | {ratio} | {b['builtin'].iloc[0] if len(b) else 'none'} | {builtin} | "
                         f"{'—' if failed else 'found' if p['truth'].all() else 'not found'} |")
    lines += _synthetic_lines(synthetic, place, label)
    updates = meta.get("updates", [])
    again = {r for u in updates for r in u["recipes"]}
    if updates:
        lines += [""] + [f"Rows of {', '.join(u['recipes'])} ({_sizes_text(u)}) measured again by `{u['command']}` "
                         f"on {u['date']}{_machine_text(u)}." for u in updates]
        if len(updates) > 1:
            lines.append("Where two of these lines name a row, the later one measured it.")
        if set(everything["recipe"]) - again:
            lines.append("The other rows are the first run's.")
    lines += ["", f"Every command, in order, with its output: `{meta['raw']}/commands.log`; raw numbers: "
              f"`{meta['raw']}/huge.json`.", END]
    replace_section(results, BEGIN, END, "\n".join(lines))


def _synthetic_lines(rows, place: dict, label: dict) -> list[str]:
    """The table of the SYNTHETIC case: no built-in (a synthetic export has no report to give one)."""
    if rows.empty:
        return []
    rows = rows.astype({"scale": int, "iterations": int})
    rows = rows.assign(place=rows["recipe"].map(place)).sort_values(["scale", "place"], kind="stable")
    lines = ["", "SYNTHETIC case: one rank written by the pack's generator (`nsys-recipe synth --ranks 1 "
             f"--iterations N`, {SYNTH_ITERATIONS:,} iterations times the scale; SQLite and Parquet written apart), "
             "not a real profile. Nsight Systems has no built-in run for it: there is no report. Truth: the pack's "
             "counts and sums equal those SQL gives over the synthetic export itself (kernel: "
             f"`{SYNTH_KERNEL}`, iterations: the `{SYNTH_DELIMITER}` ranges).", "",
             "| scale | iterations | SQLite MB (10^6 B) | kernels / NVTX / runtime rows | recipe | read from | pack s "
             "| pack MB | floor s | pack / floor | truth |",
             "|---:|---:|---:|---|---|---|---:|---:|---:|---:|---|"]
    for (scale, recipe), g in rows.groupby(["scale", "recipe"], sort=False):
        for form, p, ps, pmb, fs, rows_text, failed in _forms(g):
            lines.append(
                f"| x{scale} | {int(p['iterations'].iloc[0]):,} | {int(p['size_mb'].iloc[0])} | {rows_text} | "
                f"{label[recipe].replace(KERNEL, SYNTH_KERNEL)} | {form} | "
                + ("refused or failed (see the log) | — | " if failed else f"{ps:.2f} | {pmb:.0f} | ")
                + f"{fs:.2f} | {'—' if failed else f'{ps / max(fs, 1e-9):.2f}x'} | "
                f"{'—' if failed else 'found' if p['truth'].all() else 'not found'} |")
    return lines


def _forms(g):
    """Per form measured of one case's rows: (form, its rows, pack s, pack MB, floor s, rows text, failed)."""
    for form in ("sqlite", "parquet"):
        p = g[g["form"] == form]
        if p.empty:
            continue
        counts = p["rows"].iloc[0]
        rows_text = (f"{counts['CUPTI_ACTIVITY_KIND_KERNEL'] / 1e6:.2f} M / {counts['NVTX_EVENTS'] / 1e6:.2f} M / "
                     f"{counts['CUPTI_ACTIVITY_KIND_RUNTIME'] / 1e6:.2f} M")
        yield (form, p, float(p["pack_s"].median()), float(p["pack_mb"].median()), float(p["floor_s"].median()),
               rows_text, not p["ok"].all())


def _machine_text(update: dict) -> str:
    """The processor an update ran on, where it recorded one: the rows of one section may come from several machines."""
    return f" ({update['cpu']})" if update.get("cpu") else ""


def _sizes_text(update: dict) -> str:
    copies, scales = update.get("copies", ALL_COPIES), update.get("scales", ())
    return " and ".join([*([" and ".join(map(str, copies)) + " copies"] if copies else []),
                         *(["SYNTHETIC " + ", ".join(f"x{s}" for s in scales)] if scales else [])])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "floor":
        p = argparse.ArgumentParser()
        p.add_argument("floor")
        p.add_argument("--recipe", required=True, help="a case of CASES")
        p.add_argument("--kernel", default=KERNEL, help="the kernel of the kernel_pace case")
        p.add_argument("path")
        a = p.parse_args()
        floor(Path(a.path), a.recipe, a.kernel)
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", default=",".join(map(str, ALL_COPIES)), help="replication factors, comma-separated")
    p.add_argument("--synthetic", default=",".join(map(str, ALL_SCALES)),
                   help=f"scales of the SYNTHETIC case (x {SYNTH_ITERATIONS} iterations), comma-separated; '' for none")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "nsys-recipe-bench-huge"))
    p.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"))
    p.add_argument("--raw", default=str(ROOT / "bench" / "results-huge"))
    p.add_argument("--render-only", action="store_true", help="rewrite the section from the raw numbers in --raw")
    p.add_argument("--recipes", default="", help="measure only these recipes (comma-separated); their rows replace "
                   "those of the earlier run in --raw, the other rows are kept")
    args = p.parse_args()
    if args.render_only:
        saved = json.loads((Path(args.raw) / "huge.json").read_text())
        write_section(Path(args.results), saved["rows"], saved["meta"])
        print(f"wrote {args.results}")
        return
    nsys = nsys_tool.find_nsys(required=True)
    work, raw = Path(args.work), Path(args.raw)
    work.mkdir(parents=True, exist_ok=True)
    raw.mkdir(parents=True, exist_ok=True)
    only = {r for r in args.recipes.split(",") if r}
    earlier = json.loads((raw / "huge.json").read_text()) if only else None
    if not only:
        (raw / "commands.log").write_text("")
    compile_bytecode(nsys)
    env = {**os.environ, "NSYS": str(nsys.path), "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", ""),
           "XDG_CACHE_HOME": str(work / "cache")}
    copies = [int(c) for c in args.copies.split(",") if c]
    scales = [int(c) for c in args.synthetic.split(",") if c]
    rows = run(work, copies, raw, env, nsys, args.repeat, only, scales)
    meta = machine_meta(nsys, 1, raw)
    command = "python bench/huge.py " + shlex.join(sys.argv[1:])
    if earlier:  # the other recipes' rows as the earlier run measured them
        rows = [r for r in earlier["rows"]
                if not (r["recipe"] in only and (r.get("copies") in copies or r.get("scale") in scales))] + rows
        meta, update = earlier["meta"], {"command": command, "date": meta["date"], "cpu": meta["cpu"],
                                         "recipes": sorted(only), "copies": copies, "scales": scales}
        # an earlier update still names the recipes whose rows of some other size it measured
        meta["updates"] = [{**u, "recipes": sorted(set(u["recipes"]) - only)} if set(u.get("copies", ALL_COPIES))
                           <= set(copies) and set(u.get("scales", ())) <= set(scales) else u
                           for u in meta.get("updates", [])]
        meta["updates"] = [u for u in meta["updates"] if u["recipes"]] + [update]
    else:
        meta["command"] = command
    (raw / "huge.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    write_section(Path(args.results), rows, meta)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
