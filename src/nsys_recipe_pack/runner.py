"""Map over ranks, reduce across them, write the output folder atomically.

Two engines give the same tables: the pack's own (a process pool over the inputs) and NVIDIA's recipe
framework (`nsys recipe NAME`, which calls back into `map_file` and `reduce_all` from the recipe
module in `recipes/`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from . import errors, nsys_tool, progress, recipes, resources, versions
from .allocator import give_back_freed_memory
from .driver import map_file, map_rank_data
from .errors import BadInputError, MissingToolError, MissingTraceError, PackError, UsageError
from .inputs import (
    expand_inputs,
    export_beside,
    input_kind,
    read_arrow_streams,
    write_arrow_streams,
)
from .lazy import pd
from .ranks import assign_ranks, programs
from .spill import ROW_GROUP_ROWS, RankedRows, StoredTable, check_seen, parquet_options, remove_spilled
from .staging import staged_output

# `file` is the input as named; `read_from` what was read for it: the report itself, or an export beside it
FILES_COLUMNS = ["rank", "file", "rank_source", "host", "local_rank", "gpu", "pid", "read_from", "read_note"]


# ---------------------------------------------------------------------------------------------------
# map


def analyse(recipe: str, ranks: list, options: dict | None = None) -> tuple[dict, dict]:
    """Map and reduce a recipe over ranks already loaded, in this process: the tables `run` writes (for the
    metrics of `nsys-recipe diff`, which loads each run once for every recipe)."""
    spec = recipes.get(recipe)
    options = {**spec.option_defaults(), **(options or {})}
    return reduce_all(recipe, [[map_rank_data(spec, rank_data, options)] for rank_data in ranks], options)


def analysed(recipe: str, ranks: list) -> dict | None:
    """`analyse`'s tables, or None where the run holds nothing the recipe can answer (a PackError): a recipe's
    `diff_metrics` then has no metric for it."""
    try:
        return analyse(recipe, ranks)[0]
    except PackError:
        return None


# ---------------------------------------------------------------------------------------------------
# reduce


def reduce_all(recipe: str, mapped: list[list[dict]], options: dict) -> tuple[dict, dict]:
    spec = recipes.get(recipe)
    results = [r for per_file in mapped for r in per_file]
    bad = [r for r in results if "bad_file" in r]
    results = [r for r in results if "bad_file" not in r]
    if len(bad) == 1 and len(mapped) == 1:
        raise BadInputError(bad[0]["reason"])
    if bad and not options.get("skip_bad"):
        hint = " (pass --skip-bad to go on without them)" if len(bad) < len(mapped) else ""
        raise BadInputError(f"{len(bad)} of {len(mapped)} inputs cannot be used{hint}: {_group_reasons(bad)}")
    if not results:
        raise BadInputError("no ranks to analyse: the inputs hold no processes with NVTX or CUDA data")
    missing = [r for r in results if "missing" in r]
    if len(missing) == len(results):
        raise MissingTraceError(missing[0]["missing"] + (f" (nor do the other {len(missing) - 1} ranks)"
                                                          if len(missing) > 1 else ""))
    ids = pd.DataFrame([{**r["identity"], "order": i} for i, r in enumerate(results)])
    ids["pid"] = ids["pid"].astype("Int64")
    ids = assign_ranks(ids)
    notes = list(ids.attrs.get("notes", []))
    notes.extend(programs(ids))
    notes.extend(read_notes(ids))
    unclosed = ids[ids["unclosed_ranges"] > 0]
    if len(unclosed):
        notes.append(f"{int(unclosed['unclosed_ranges'].sum())} NVTX range(s) never closed (no end) were left out, "
                     f"on rank(s) {', '.join(map(str, unclosed['rank'].tolist()[:10]))}")
    sessions = ids["session_start_ns"].astype("int64")
    base = int(sessions[sessions > 0].min()) if (sessions > 0).any() else 0
    per_rank = []
    for _, row in ids.iterrows():
        res = results[int(row["order"])]
        offset = int(row["session_start_ns"]) - base if row["session_start_ns"] > 0 else 0
        per_rank.append({**res, "rank": int(row["rank"]), "offset_ns": offset})

    if missing:
        notes.append(f"{len(missing)} rank(s) contribute nothing: " + " | ".join(r["missing"] for r in missing[:5]))
        per_rank = [r for r in per_rank if "missing" not in r]
    delimiter = None
    if spec.per_iteration:
        keys = Counter(json.dumps(r["delimiter"], sort_keys=True) for r in per_rank)
        chosen, _ = keys.most_common(1)[0]
        delimiter = json.loads(chosen)
        same = [json.dumps(r["delimiter"], sort_keys=True) == chosen for r in per_rank]
        odd = [r for r, ok in zip(per_rank, same, strict=True) if not ok]
        if odd:
            notes.append(
                f"{len(odd)} rank(s) chose a different iteration delimiter and were left out: "
                + ", ".join(f"rank {r['rank']} ({r['delimiter']['name']})" for r in odd[:10])
                + f"; pass --iteration {shlex.quote(delimiter['name'])} to use one delimiter everywhere"
            )
            per_rank = [r for r, ok in zip(per_rank, same, strict=True) if ok]

    if spec.per_iteration:
        counts = {r["rank"]: _iteration_count(r) for r in per_rank}
        if counts and min(counts.values()) != max(counts.values()):
            short = sorted(k for k, v in counts.items() if v == min(counts.values()))
            notes.append(f"ranks have {min(counts.values())} to {max(counts.values())} iterations (fewest on rank(s) "
                         f"{', '.join(map(str, short[:10]))}): iterations past the shortest compare fewer ranks")
    tables = spec.reduce(per_rank, options)
    settings = tables.pop("settings", {})
    notes.extend(settings.pop("notes", []))  # what the recipe's reduce has to say of the inputs
    files = ids[FILES_COLUMNS].copy()
    files["local_rank"] = files["local_rank"].astype("Int64")
    files["gpu"] = files["gpu"].astype("Int64")
    files["status"] = "used"
    files["reason"] = None
    if bad:
        notes.append(f"{len(bad)} input(s) skipped (--skip-bad): {_group_reasons(bad)}")
        skipped = pd.DataFrame({"rank": pd.array([pd.NA] * len(bad), dtype="Int64"),
                                "file": [r["bad_file"] for r in bad], "rank_source": None, "host": None,
                                "local_rank": pd.array([pd.NA] * len(bad), dtype="Int64"),
                                "gpu": pd.array([pd.NA] * len(bad), dtype="Int64"),
                                "pid": pd.array([pd.NA] * len(bad), dtype="Int64"), "read_from": None,
                                "status": "skipped",
                                "reason": [r["reason"] for r in bad]})
        files = pd.concat([files.astype({"rank": "Int64"}), skipped], ignore_index=True)
    tables["files"] = files.sort_values("rank", na_position="last").reset_index(drop=True)
    analysis = {
        "recipe": recipe,
        "delimiter": delimiter,
        "ranks": int(len(per_rank)),
        "iterations": int(max((_iteration_count(r) for r in per_rank), default=0)),
        "options": {k: v for k, v in options.items() if not k.startswith("_")},
        "synthetic": bool(ids["synthetic"].any()),
        **settings,
        "notes": notes,
    }
    return tables, analysis


def read_notes(files: pd.DataFrame) -> list[str]:
    """One line for each way inputs were read that a user would not expect (an export beside a report skipped, or
    read though older than it), naming the files (a file of several ranks once)."""
    noted = files.loc[files["read_note"].notna(), ["file", "read_note"]].drop_duplicates()
    return [f"{', '.join(names.head(3))}{f' and {len(names) - 3} more' if len(names) > 3 else ''}: {note}"
            for note, names in noted.groupby("read_note", sort=False)["file"]]


def _iteration_count(mapped: dict) -> int:
    return len(mapped["iterations"]) if "iterations" in mapped else len(mapped.get("start_ns", []))


def _group_reasons(bad: list[dict]) -> str:
    """One clause per distinct reason, naming the files it applies to. A reason that names its own file again
    (a command to run on it) is grouped with the others as REPORT."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for r in bad:
        prefix = r["bad_file"] + ": "
        reason = r["reason"][len(prefix):] if r["reason"].startswith(prefix) else r["reason"]
        groups.setdefault(reason.replace(r["bad_file"], "REPORT"), []).append((r["bad_file"], reason))
    parts = []
    for reason, members in groups.items():
        files = [f for f, _ in members]
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        parts.append(f"{shown}: {members[0][1] if len(members) == 1 else reason}")
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------------------
# output folder


def default_output(name: str, cwd: Path | None = None) -> Path:
    cwd = cwd or Path.cwd()
    i = 1
    while (cwd / f"{name}-{i}").exists():
        i += 1
    return cwd / f"{name}-{i}"


def check_output(output: Path, force: bool) -> None:
    if output.exists() and not force:
        raise UsageError(f"{output}: output folder already exists; pass --force-overwrite or choose --output")


def write_tables(out_dir: Path, tables: dict, analysis: dict) -> dict:
    written = {}
    for name, df in tables.items():
        path = out_dir / f"{name}.parquet"
        if isinstance(df, RankedRows):  # per-event rows of the ranks, some maybe in files (spill.py)
            df.write_parquet(path)
        elif isinstance(df, pa.Table):
            # large tables built as Arrow, strings dictionary-encoded: without the Arrow schema in the file
            # they read back as plain strings, as pandas writes them
            pq.write_table(df, path, store_schema=False, **parquet_options(df.schema))
        else:
            write_frame(df, path)
        written[name] = path.name
    (out_dir / "analysis.json").write_text(json.dumps(analysis, indent=1, default=str))
    return written


def write_frame(df: pd.DataFrame, path: Path) -> None:
    """A table as to_parquet writes it, converted to Arrow a row group at a time: tens of millions of cells (ranks x
    iterations) are never held twice."""
    schema = pa.Schema.from_pandas(df, preserve_index=False)
    with pq.ParquetWriter(str(path), schema, **parquet_options(schema)) as writer:
        for first in range(0, max(len(df), 1), ROW_GROUP_ROWS):
            rows = df.iloc[first:first + ROW_GROUP_ROWS]
            writer.write_table(pa.Table.from_pandas(rows, schema=schema, preserve_index=False),
                               row_group_size=ROW_GROUP_ROWS)


def write_nsys_analysis(out_dir: Path, final_name: str, recipe: str, mode: str, inputs: list[str], outputs: dict,
                        started: datetime) -> None:
    spec = recipes.get(recipe)
    doc = {
        "RecipeJsonVersion": "1.2.0",
        "RecipeName": recipe,
        "DisplayName": spec.display_name,
        "Mode": mode,
        "StartTime": str(started),
        "EndTime": str(datetime.now()),
        "InputFiles": inputs,
        "Outputs": outputs,
    }
    (out_dir / f"{final_name}.nsys-analysis").write_text(json.dumps(doc, indent=4))


def copy_notebook(out_dir: Path, recipe: str) -> None:
    nb = recipes.get(recipe).notebook_path()
    if nb.exists():
        shutil.copy(nb, out_dir / f"{recipe}.ipynb")


# ---------------------------------------------------------------------------------------------------
# engines


MAP_RESULTS = ".map-results"  # in the output folder being written: the maps' Arrow tables until the reduce is done


def run_pack_engine(recipe: str, files: list[Path], options: dict, mode: str, jobs: int | None,
                    nsys_path: str | None, spill_dir: str | None = None) -> list[list[dict]]:
    """Each file's map results. spill_dir: where a long capture's map writes what it holds beyond memory, and the
    workers the Arrow tables of their results (the output folder being written; a Dask worker on another node must
    see it). A recipe whose reduce reads them lazily (`Recipe.lazy_tables`) gets them as spill.StoredTable, which
    stay there until the run removes MAP_RESULTS; any other, memory-mapped."""
    args = [(str(f), recipe, options, nsys_path, spill_dir) for f in files]
    if mode == "none" or len(files) == 1:
        # the reduce's pandas imported beside the maps, which mostly let go of Python, as the workers' parent does below
        threading.Thread(target=lambda: pd.DataFrame, name="nsys-recipe-import", daemon=True).start()
        return [map_file(*a) for a in progress.iterate(args, total=len(args), desc=recipe)]
    lazy = recipes.get(recipe).lazy_tables
    folder = Path(spill_dir) / MAP_RESULTS if spill_dir else Path(tempfile.mkdtemp(prefix="nsys-recipe-map-"))
    folder.mkdir(exist_ok=True)
    try:
        if mode == "dask-futures":
            return _run_dask(args, options, jobs, str(folder), lazy)
        return _run_pool(args, jobs, str(folder), lazy)
    finally:
        if not lazy or not spill_dir:  # memory-mapped tables stay readable once their files are gone
            shutil.rmtree(folder, ignore_errors=True)


def _run_pool(args: list[tuple], jobs: int | None, folder: str, lazy: bool) -> list[list[dict]]:
    """The maps in a pool of `jobs` worker processes, several files a task (task_sizes)."""
    workers = max(1, min(jobs or os.cpu_count() or 1, len(args)))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_map_files, args[first:first + size], folder): first
                   for first, size in task_sizes(len(args), workers)}
        # pandas takes about 0.3 s of CPU to import: the maps (reading exports included) work on Arrow and
        # NumPy only, so the parent imports it for the reduce while they run
        pd.DataFrame  # noqa: B018
        return _gathered(((futures[fut], fut.result()) for fut in as_completed(futures)), len(args), args[0][1],
                         lazy)


def _gathered(finished, total: int, desc: str, lazy: bool) -> list[list[dict]]:
    """Each file's results in input order, from (first file, _map_files' result) of each task as it finishes."""
    results: list = [None] * total
    bar = progress.Counter(total=total, desc=desc)
    for first, task in finished:
        done = _unspill(*task, lazy=lazy)
        results[first:first + len(done)] = done
        bar.advance(len(done))
    bar.close()
    return results


def task_sizes(n: int, workers: int, most: int = 16) -> list[tuple[int, int]]:
    """(first, size) of each task: several files per task (far fewer round trips to the workers), shrinking
    towards the end so that all workers finish together (one slow last task would leave the others idle)."""
    tasks, first = [], 0
    while first < n:
        size = max(1, min(most, (n - first) // (4 * workers)))
        tasks.append((first, size))
        first += size
    return tasks


class _Spilled(tuple):
    """Where a result's Arrow table lies in its task's spill file, and its rows: (offset, size, rows)."""


def _map_files(chunk: list[tuple], spill: str) -> tuple[list[list[dict]], str | None]:
    """Map a task's files. Their results' Arrow tables (per-event rows) go to one file in `spill` that the
    parent maps without copying; through the pool's pipe they would be pickled, copied and unpickled."""
    done = [map_file(*a) for a in chunk]
    where = _slots(done, pa.Table)
    if not where:
        return done, None
    os.makedirs(spill, exist_ok=True)  # a Dask worker's node: the output folder's, where the filesystem is shared
    fd, path = tempfile.mkstemp(suffix=".arrows", dir=spill)
    os.close(fd)
    for (res, key), span in zip(where, write_arrow_streams(path, [res[k] for res, k in where]), strict=True):
        res[key] = _Spilled((*span, res[key].num_rows))
    return done, path


def _slots(done: list[list[dict]], kind: type) -> list[tuple[dict, str]]:
    """(result, key) of every value of this type in a task's results, in one fixed order."""
    return [(res, key) for per_file in done for res in per_file for key, value in res.items()
            if isinstance(value, kind)]


def _unspill(done: list[list[dict]], path: str | None, lazy: bool = False) -> list[list[dict]]:
    """A task's results with their tables memory-mapped from its file, or with `lazy`, as StoredTable."""
    if path is None:
        return done
    check_seen(path)
    where = _slots(done, _Spilled)
    if lazy:
        for res, key in where:
            res[key] = StoredTable(path, *res[key])
        return done
    for (res, key), table in zip(where, read_arrow_streams(path, [res[k][:2] for res, k in where]), strict=True):
        res[key] = table
    return done


def _run_dask(args: list[tuple], options: dict, jobs: int | None, folder: str, lazy: bool) -> list[list[dict]]:
    """Map on a Dask cluster: the one at --dask-scheduler, else a local one with `jobs` worker processes. The workers
    write their results' tables to `folder` (_map_files): only the rest, a few hundred bytes a rank, comes back
    through the scheduler, and the client reads the tables from there."""
    distributed = import_distributed()
    address = options.get("_dask_scheduler")
    if address:
        try:
            client = distributed.Client(address, timeout="20s")
        except OSError as exc:
            raise MissingToolError(f"cannot reach the Dask scheduler at {address} ({exc}); start one with "
                                   "`dask scheduler` and workers with `nsys-recipe dask-worker ADDRESS`") from None
    else:
        client = distributed.Client(processes=True, n_workers=max(1, min(jobs or os.cpu_count() or 1, len(args))),
                                    threads_per_worker=1, dashboard_address=None)
    with client:
        # several files a task, as the pool's (ten thousand tasks of one cost the scheduler and this client more than
        # the workers' maps leave them of the machine)
        tasks = task_sizes(len(args), max(1, sum(client.nthreads().values())))
        futures = client.map(_map_files, [args[first:first + size] for first, size in tasks], spill=folder, pure=False)
        first_of = {f.key: first for f, (first, _) in zip(futures, tasks, strict=True)}

        def finished():
            for fut in distributed.as_completed(futures):
                yield first_of[fut.key], fut.result()
                fut.release()

        return _gathered(finished(), len(args), "dask", lazy)


def import_distributed():
    try:
        import distributed
    except ImportError:
        raise MissingToolError("--mode dask-futures needs dask and distributed: "
                               "pip install 'dask[distributed]'") from None
    return distributed


def dask_env(env: dict, address: str | None) -> dict:
    """Point `nsys recipe --mode dask-futures` at a scheduler through Dask's own configuration.

    nsys 2023.4 turns every NSYS_DASK_* value into True, so the address cannot go that way.
    """
    return {**env, "DASK_SCHEDULER_ADDRESS": address} if address else env


def _name_analysis_file(staged: Path, out: Path) -> None:
    """`nsys recipe` names its .nsys-analysis file after the (hidden) staging folder; name it after the output."""
    for f in staged.glob(".*.nsys-analysis"):
        os.replace(f, staged / f"{out.name}.nsys-analysis")


def framework_argv(recipe: str, options: dict) -> list[str]:
    """The recipe's options as `nsys recipe` arguments (the same flags `nsys-recipe run` takes)."""
    argv = []
    for key in recipes.get(recipe).option_names():
        value = options.get(key)
        if isinstance(value, bool):  # a flag (store_true): named when set
            argv += ["--" + key.replace("_", "-")] if value else []
        elif value is not None:
            argv += ["--" + key.replace("_", "-"), ",".join(value) if isinstance(value, list) else str(value)]
    if options.get("skip_bad"):
        argv.append("--skip-bad")
    return argv


ERROR_FILE_ENV = "NSYS_RECIPE_PACK_ERROR_FILE"  # where a recipe under `nsys recipe` writes the pack's own error


def run_framework_engine(recipe: str, files: list[Path], argv_options: list[str], mode: str,
                         nsys: nsys_tool.Nsys, staged: Path, dask_scheduler: str | None = None) -> None:
    """Run through `nsys recipe` with the pack's recipes on NSYS_RECIPE_PATH into `staged`. The pack's own error
    inside the framework (framework.run_in_framework) comes back as JSON and is raised here as the same error."""
    with tempfile.TemporaryDirectory(prefix="nsys-recipe-error-") as folder:
        error_file = Path(folder) / "error.json"
        env = {**dask_env(nsys_tool.recipe_env(nsys, resources.recipes_dir()), dask_scheduler),
               ERROR_FILE_ENV: str(error_file)}
        cmd = [str(nsys.path), "recipe", recipe, "--mode", mode, "--output", str(staged),
               "--input", *[str(f) for f in files], *argv_options]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode == 0 and staged.exists():
            return
        if error_file.exists():
            error = json.loads(error_file.read_text())
            cls = getattr(errors, error["kind"], None)
            raise (cls if isinstance(cls, type) and issubclass(cls, PackError) else PackError)(
                error["message"], int(error["exit_code"]))
    tail = "\n".join((res.stderr + res.stdout).strip().splitlines()[-15:])
    raise PackError(f"`nsys recipe {recipe}` failed (exit {res.returncode}):\n{tail}", 3)


def run(recipe: str, inputs: list[str], output: str | None = None, *, force: bool = False,
        mode: str = "concurrent", engine: str = "pack", report: bool = False, nsys_path: str | None = None,
        jobs: int | None = None, options: dict | None = None, log=None, shared_js: Path | None = None) -> Path:
    """Run one pack recipe end to end and return its output folder. shared_js: the plotly.js file that the
    report page loads (default: one beside it), for several pages of one report folder."""
    quiet = log is not None  # a caller that takes the messages (nsys-recipe report) shows its own progress
    log = log or (lambda msg: print(msg, file=sys.stderr))
    adapter = framework_adapter(recipe)
    # a recipe's defaults, under what the caller gave (cli, api and report pass only what was given)
    options = {**recipes.get(recipe).option_defaults(), **(options or {})}
    files = expand_inputs(inputs)
    out = Path(output) if output else default_output(recipe)
    check_output(out, force)
    all_reports = all(input_kind(f) == "report" for f in files)
    nsys = None
    notes = []
    if engine == "nsys" and adapter is None:
        raise UsageError(f"{recipe} has no `nsys recipe` adapter (recipes/{recipe}/ in the pack); use --engine pack")
    if engine in ("auto", "nsys") and all_reports and adapter is not None:
        nsys = nsys_tool.find_nsys(nsys_path, required=engine == "nsys")
        if nsys is not None and nsys.recipe_python_path() is None:
            if engine == "nsys":
                raise MissingToolError(f"{nsys.path}: this nsys has no recipe framework (python/packages/"
                                       "nsys_recipe); use --engine pack or run `nsys-recipe setup-nsys`")
            nsys = None
        too_new = _too_new_reports(files, nsys) if nsys is not None else {}
        if too_new:  # `nsys recipe` cannot open them: the pack's runner reads the exports beside them instead
            needs = set(recipes.get(recipe).needs_given(options))
            beside = sum(export_beside(f, needs)[0] is not None for f in too_new)
            if beside:  # else the runner fails on them with the one-line error that says what to do
                made_by = ", ".join(sorted(set(too_new.values())))
                notes.append(f"{len(too_new)} report(s) made by Nsight Systems {made_by}"
                             f", newer than the nsys found ({nsys.version}): run with the pack's runner, which reads "
                             f"the export beside {'each' if beside == len(too_new) else f'{beside} of them'}")
                log(f"note: {notes[-1]}")
            nsys = None
    elif engine == "nsys":
        raise UsageError("--engine nsys needs every input to be a .nsys-rep/.qdrep report "
                         "(`nsys recipe` takes no exports)")
    started = datetime.now()
    with staged_output(out, force) as staged:
        if nsys is not None:
            log(f"running {recipe} through `nsys recipe` ({nsys.version}) on {len(files)} report(s)")
            shutil.rmtree(staged)  # `nsys recipe` makes its output folder itself
            with _step(f"{recipe}: nsys recipe on {len(files)} report(s)", quiet):
                run_framework_engine(recipe, files, framework_argv(recipe, options), mode, nsys, staged,
                                     options.get("_dask_scheduler") if mode == "dask-futures" else None)
            _name_analysis_file(staged, out)
        else:
            log(f"running {recipe} with the pack's runner on {len(files)} input(s)")
            version = _nsys_version_or_none(files, nsys_path)  # before the map: the workers inherit it
            mapped = run_pack_engine(recipe, files, options, mode, jobs, nsys_path, str(staged))
            give_back_freed_memory()
            try:
                tables, analysis = reduce_all(recipe, mapped, options)
                analysis["engine"] = "pack"
                analysis["nsys_version"] = version
                analysis["notes"] = [*notes, *analysis.get("notes", [])]
                for note in read_notes(tables["files"]):
                    log(f"note: {note}")
                written = write_tables(staged, tables, analysis)
            finally:
                remove_spilled(mapped)
                shutil.rmtree(staged / MAP_RESULTS, ignore_errors=True)
            copy_notebook(staged, recipe)
            write_nsys_analysis(staged, out.name, recipe, mode, [str(f) for f in files], written, started)
        if report:
            from .notebook import render_report

            with _step(f"{recipe}: report (notebook and HTML)", quiet):
                render_report(recipe, staged, shared_js=shared_js)
    return out


def framework_adapter(recipe: str) -> Path | None:
    """The recipe's folder for NVIDIA's framework (recipes/NAME/NAME.py and metadata.json), None if it has none."""
    folder = resources.recipes_dir() / recipe
    return folder if (folder / f"{recipe}.py").is_file() else None


def _step(desc: str, quiet: bool):
    return contextlib.nullcontext() if quiet else progress.step(desc)


def _too_new_reports(files: list[Path], nsys: nsys_tool.Nsys) -> dict[Path, str]:
    """The reports a newer Nsight Systems made than `nsys` (which cannot read them), with their versions."""
    made_by = {f: versions.report_version(f) for f in files}
    return {f: v for f, v in made_by.items() if versions.newer_than(v, nsys.version)}


def _nsys_version_or_none(files: list[Path], nsys_path: str | None) -> str | None:
    if any(input_kind(f) == "report" for f in files):
        found = nsys_tool.find_nsys(nsys_path, required=False)
        return found.version if found else None
    return None


def run_builtin(name: str, inputs: list[str], output: str | None, *, force: bool = False, mode: str = "concurrent",
                nsys: nsys_tool.Nsys, dask_scheduler: str | None = None, log=None) -> Path:
    """One of Nsight Systems' built-in recipes, passed through to `nsys recipe NAME`, written atomically."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    files = expand_inputs(inputs)
    not_reports = [str(f) for f in files if input_kind(f) != "report"]
    if not_reports:
        raise UsageError(f"{not_reports[0]}: the built-in recipe {name} reads .nsys-rep/.qdrep reports only")
    too_new = _too_new_reports(files, nsys)
    if too_new:  # an export beside them is no help here
        (first, made_by), more = next(iter(too_new.items())), len(too_new) - 1
        others = f" (nor {more} more report(s))" if more else ""
        raise BadInputError(f"{first}: report made by Nsight Systems {made_by}, newer than the nsys found "
                            f"({nsys.version} at {nsys.path}), which cannot read it{others}; "
                            f"the built-in recipe {name} reads reports only: pass --nsys PATH of Nsight Systems "
                            f"{made_by} or newer")
    out = Path(output) if output else default_output(name)
    check_output(out, force)
    log(f"running Nsight Systems' built-in {name} ({nsys.version}) on {len(files)} report(s)")
    with staged_output(out, force) as staged:
        shutil.rmtree(staged)  # `nsys recipe` makes its output folder itself
        res = subprocess.run([str(nsys.path), "recipe", name, "--mode", mode, "--output", str(staged), "--input",
                              *[str(f) for f in files]],
                             env=dask_env(nsys_tool.recipe_env(nsys), dask_scheduler), capture_output=True, text=True)
        if res.returncode != 0 or not staged.exists():
            tail = [ln for ln in (res.stderr + res.stdout).strip().splitlines() if ln.strip()][-1:] or ["no output"]
            raise BadInputError(f"`nsys recipe {name}` produced no output (exit {res.returncode}): {tail[0].strip()}")
        _name_analysis_file(staged, out)
    return out
