"""Where the CPU time of a cold multi-rank run goes: `nsys export` of the tables each tool reads, and the rest.

The cold straggler_heatmap / nvtx_pace pair of bench/RESULTS.md exports every report first, each tool the tables it
reads. On the same reports (the MPI Jacobi reports hard-linked as N ranks, as bench.py makes them) this measures
the CPU time (user + system) of one `nsys export` of a report for each tool's tables, and of each whole cold run
(the process tree's, as the OS accounts for waited-for children). The built-in's tables are those its export beside
a report holds after its run; the pack's, those its cache's manifest lists. Writes the "cold-export" section of
bench/RESULTS.md and the raw numbers to bench/results-cold-export/.

    .venv/bin/python bench/cold_export.py                 # 64 ranks, 3 runs of each
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench import (  # noqa: E402
    BIN,
    REAL_SOURCE,
    ROOT,
    builtin_cmd,
    clear_builtin_exports,
    compile_bytecode,
    machine_meta,
    pack_cmd,
    real_set,
    replace_section,
)
from nsys_recipe_pack import nsys_tool  # noqa: E402
from nsys_recipe_pack.inputs.export import export_args, export_kind  # noqa: E402

RECIPE, RECIPE_ARGS = "straggler_heatmap", ["--iteration", "MPI"]
BUILTIN, BUILTIN_ARGS = "nvtx_pace", ["--name", "MPI"]
BEGIN, END = "<!-- cold-export:begin -->", "<!-- cold-export:end -->"


def cpu_of(cmd: list[str], env: dict | None = None, log: Path | None = None) -> tuple[float, float]:
    """(wall s, CPU s of the command and every process under it) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with (log.open("a") if log else open(os.devnull, "w")) as out:
        if log:
            out.write(f"\n$ {shlex.join(cmd)}\n")
            out.flush()
        subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def whole_runs(inputs: Path, work: Path, env: dict, nsys: str, repeat: int, log: Path) -> tuple[dict, list, list]:
    """Cold runs of both tools (wall, CPU), and the tables each exported."""
    runs: dict = {"pack": [], "built-in": []}
    pack_tables: list = []
    builtin_tables: list = []
    for _ in range(repeat):
        cache = work / "cache-cold-export"
        shutil.rmtree(cache, ignore_errors=True)
        cmd = pack_cmd(RECIPE, RECIPE_ARGS, inputs, work / "out" / f"{RECIPE}-cold-export")
        runs["pack"].append(cpu_of(cmd, {**env, "XDG_CACHE_HOME": str(cache)}, log))
        manifest = next((cache / "nsys-recipe-pack" / "exports").glob("*/manifest.json"))
        pack_tables = json.loads(manifest.read_text())["requested"]
        shutil.rmtree(cache, ignore_errors=True)
        clear_builtin_exports(inputs)
        cmd = builtin_cmd(nsys, BUILTIN, BUILTIN_ARGS, inputs, work / "out" / f"{BUILTIN}-cold-export", 1)
        runs["built-in"].append(cpu_of(cmd, env, log))
        builtin_tables = sorted(p.stem for p in next(inputs.glob("*_pqtdir")).glob("*.parquet"))
        clear_builtin_exports(inputs)
    return runs, pack_tables, builtin_tables


def export_cpu(nsys: str, tables: list[str], repeat: int, env: dict, kind) -> float:
    """CPU s of exporting these tables of a report, to the kind of files and in the environment the tool exports
    to and in (kind: of a report): the median over runs of each source report, their mean."""
    per_report = []
    with tempfile.TemporaryDirectory() as tmp:
        for report in sorted(REAL_SOURCE.glob("*.qdrep")):
            runs = []
            for _ in range(repeat):
                out = Path(tmp) / "x"
                runs.append(cpu_of([nsys, *export_args(report, tables, out, kind(report))], env)[1])
                shutil.rmtree(out, ignore_errors=True)
            per_report.append(statistics.median(runs))
    return statistics.mean(per_report)


def write_section(results: Path, data: dict) -> None:
    n, meta = data["ranks"], data["meta"]
    lines = [BEGIN, "## Cold runs: what exporting costs", "",
             f"Written by `{meta['command']}` on {meta['date']} ({meta['cpu']}, {meta['cores']} cores; Nsight "
             f"Systems {meta['nsys_version']}). Inputs: the cold pair of the first table of this file, {RECIPE} "
             f"`{' '.join(RECIPE_ARGS)}` against {BUILTIN} `{' '.join(BUILTIN_ARGS)}` on {n} ranks. CPU: user + "
             "system seconds of the whole process tree (medians of "
             f"{data['repeat']} runs); export: one `nsys export` of a report's tables, to the files and in the "
             "environment the tool exports to and in (the built-in: `--type parquetdir`; the pack: `--type "
             "arrowdir`, as for any report up to 64 MiB, and `GLIBC_TUNABLES="
             f"{nsys_tool.HUGE_PAGES_TUNABLE}:{nsys_tool.HEAP_PAD_TUNABLE}`), the "
             f"median of {data['repeat']} runs of each of the {data['sources']} source reports, their mean, times "
             f"{n}.", "",
             "| tool | tables exported | wall s | CPU s | export CPU s per report | export CPU s, all reports | "
             "the rest, CPU s |", "|---|---|---:|---:|---:|---:|---:|"]
    for tool, name in (("built-in", BUILTIN), ("pack", RECIPE)):
        t = data[tool]
        exports = t["export_cpu_s"] * n
        lines.append(f"| {name} | {', '.join(t['tables'])} | {t['wall_s']:.2f} | {t['cpu_s']:.2f} | "
                     f"{t['export_cpu_s']:.3f} | {exports:.2f} | {t['cpu_s'] - exports:.2f} |")
    pack, builtin = data["pack"], data["built-in"]
    lines += ["", f"Exporting the tables {RECIPE} reads takes {pack['export_cpu_s'] * n:.2f} CPU s for the {n} "
              f"reports: {pack['export_cpu_s'] * n / builtin['cpu_s']:.2f}x all that {BUILTIN}'s cold run takes "
              f"({builtin['cpu_s']:.2f} s, its export of {len(builtin['tables'])} tables included). The whole cold "
              f"runs, {BUILTIN}'s time over {RECIPE}'s: {builtin['wall_s'] / pack['wall_s']:.2f}x in wall time "
              f"({builtin['wall_s']:.2f} s against {pack['wall_s']:.2f} s), {builtin['cpu_s'] / pack['cpu_s']:.2f}x "
              "in CPU time. Raw numbers: `bench/results-cold-export/`.", END]
    replace_section(results, BEGIN, END, "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "nsys-recipe-bench"))
    p.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"))
    p.add_argument("--raw", default=str(ROOT / "bench" / "results-cold-export"))
    args = p.parse_args()
    nsys = nsys_tool.find_nsys(required=True)
    work, raw = Path(args.work), Path(args.raw)
    work.mkdir(parents=True, exist_ok=True)
    raw.mkdir(parents=True, exist_ok=True)
    log = raw / "commands.log"
    log.write_text("")
    compile_bytecode(nsys)
    env = {**os.environ, "NSYS": str(nsys.path), "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", "")}
    inputs = real_set(work, args.ranks)
    runs, pack_tables, builtin_tables = whole_runs(inputs, work, env, str(nsys.path), args.repeat, log)
    data = {"ranks": args.ranks, "repeat": args.repeat, "sources": len(list(REAL_SOURCE.glob("*.qdrep"))),
            "meta": {**machine_meta(nsys, os.cpu_count() or 1, raw), "command": "python bench/cold_export.py "
                     + shlex.join(sys.argv[1:])}}
    export_envs = {"pack": nsys_tool.nsys_env(), "built-in": dict(os.environ)}
    export_kinds = {"pack": export_kind, "built-in": lambda report: "parquetdir"}
    for tool, tables in (("pack", pack_tables), ("built-in", builtin_tables)):
        data[tool] = {"tables": tables, "wall_s": statistics.median(w for w, _ in runs[tool]),
                      "cpu_s": statistics.median(c for _, c in runs[tool]), "runs": runs[tool],
                      "export_cpu_s": export_cpu(str(nsys.path), tables, args.repeat, export_envs[tool],
                                                 export_kinds[tool])}
        print(f"{tool}: {data[tool]['wall_s']:.2f} s wall, {data[tool]['cpu_s']:.2f} CPU s; export "
              f"{data[tool]['export_cpu_s']:.3f} CPU s per report", flush=True)
    (raw / "cold_export.json").write_text(json.dumps(data, indent=1))
    write_section(Path(args.results), data)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
