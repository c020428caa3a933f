"""Benchmarks: the pack's recipes against Nsight Systems' nearest built-ins, scale runs, Dask.

Everything runs on this machine in one go and writes bench/RESULTS.md (the table, the machine, the nsys
version, the commands). Real rank sets are the shipped MPI Jacobi reports replicated under rank names
(hard links, so every rank is a separate report to both tools); synthetic sets come from
`nsys-recipe synth` and are labelled as such. Wall time is the whole command; peak memory is the
largest sum of resident memory over the command's process tree, sampled every 50 ms.

    make bench                      # everything (about half an hour on 2 cores)
    .venv/bin/python bench/bench.py --sizes 8,64 --no-scale --no-dask   # a quick look
    .venv/bin/python bench/bench.py --pairs straggler_heatmap --no-synthetic --no-scale --no-dask
                                    # those rows measured again, every other row kept as the raw numbers hold it
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from nsys_recipe_pack import nsys_tool  # noqa: E402

REAL_SOURCE = ROOT / "sample_reports" / "gpubootcamp_mpi_jacobi_v100"
BIN = Path(sys.executable).parent
PACK = str(BIN / "nsys-recipe")

# pack recipe (and its options) -> the nearest built-in counterpart (and its options)
PAIRS = [
    ("kernel_pace", ["--kernel", "jacobi_kernel"], "cuda_gpu_kern_pace", ["--name", "jacobi_kernel"]),
    ("nvtx_gpu_proj", [], "nvtx_gpu_proj_trace", []),
    ("sync_summary", [], "cuda_api_sync", []),
    # the reports' repeating NVTX range (one per solver iteration's halo exchange) delimits iterations for both
    ("straggler_heatmap", ["--iteration", "MPI"], "nvtx_pace", ["--name", "MPI"]),
    ("compute_memory_share", [], "nsys stats", ["--report", "cuda_gpu_kern_sum", "--report", "cuda_gpu_mem_time_sum"]),
]


RECIPES_SYNTH = ("straggler_heatmap", "kernel_pace", "nvtx_gpu_proj", "sync_summary", "compute_memory_share")
SECTION_RE = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.DOTALL)


def replace_section(results: Path, begin: str, end: str, block: str) -> None:
    """Put `block` (from `begin` to `end`) in place of that section of the results file, or at its end."""
    text = results.read_text() if results.exists() else "# Benchmark results\n"
    if begin in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    results.write_text(text)


def compile_bytecode(nsys) -> None:
    """Bytecode for both tools' Python before timing, as a first run would leave it where bytecode is written:
    where it is not (PYTHONDONTWRITEBYTECODE), every command would otherwise compile its modules again."""
    dirs = [ROOT / "src", ROOT / "recipes", nsys.recipe_python_path()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *[str(d) for d in dirs if d]], check=True,
                   stdout=subprocess.DEVNULL)


def measure(cmd: list[str], env: dict, log: Path) -> dict:
    """Wall seconds and peak resident memory (MB) of the whole process tree."""
    started = time.perf_counter()
    with log.open("a") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        peak = 0
        while proc.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
                rss = 0
                for p in procs:
                    try:
                        rss += p.memory_info().rss
                    except psutil.Error:
                        pass
                peak = max(peak, rss)
            except psutil.Error:
                pass
            time.sleep(0.05)
    wall = time.perf_counter() - started
    return {"wall_s": round(wall, 2), "peak_mb": round(peak / 2**20), "ok": proc.returncode == 0,
            "exit": proc.returncode, "cmd": shlex.join(cmd)}


def real_set(work: Path, n: int) -> Path:
    """n ranks: the shipped MPI reports, hard-linked under rank names (each its own report to both tools)."""
    d = work / f"real-{n}"
    sources = sorted(REAL_SOURCE.glob("*.qdrep"))
    if not d.exists():
        d.mkdir(parents=True)
        for i in range(n):
            os.link(sources[i % len(sources)], d / f"rank{i:04d}.qdrep")
    return d


def synth_set(work: Path, env: dict, n: int, iterations: int, log: Path) -> Path:
    d = work / f"synth-{n}x{iterations}"
    if not (d / "truth.json").exists():
        cmd = [PACK, "synth", "--ranks", str(n), "--iterations", str(iterations), "--format", "parquetdir",
               "--straggler", f"rank={n // 3},iterations={iterations // 4}-{iterations // 4 + 9},cause=dataloader,"
               "slowdown=3", "--straggler", f"rank={(7 * n) // 8},iterations={iterations // 2}-{iterations // 2 + 9},"
               "cause=compute,slowdown=2", "--output", str(d), "--force-overwrite"]
        res = measure(cmd, env, log)
        if not res["ok"]:
            sys.exit(f"synth failed; see {log}")
    return d


def clear_builtin_exports(d: Path) -> None:
    for p in d.iterdir():
        if p.name.endswith("_pqtdir"):
            shutil.rmtree(p)
        elif p.suffix == ".sqlite":
            p.unlink()


def pack_cmd(recipe: str, args: list[str], inputs: Path, out: Path, extra: list[str] = ()) -> list[str]:
    return [PACK, "run", "--name", recipe, "--engine", "pack", *args, "--output", str(out), "--force-overwrite",
            *extra, str(inputs)]


def builtin_cmd(nsys: str, name: str, args: list[str], inputs: Path, out: Path, jobs: int) -> list[str]:
    if name == "nsys stats":  # one report per call: run them `jobs` at a time, as a user's script would
        return [sys.executable, str(ROOT / "bench" / "stats_all.py"), "--nsys", nsys, "--jobs", str(jobs),
                str(inputs), *args]
    return [nsys, "recipe", name, "--input", str(inputs), "--output", str(out), "--force-overwrite", *args]


def compare(work: Path, env: dict, nsys: str, sizes: list[int], jobs: int, log: Path, repeat: int = 1,
            only: set | None = None) -> list[dict]:
    """Each pair cold then warm, `repeat` times (a fresh cache and no built-in exports before each cold run).

    The warm time is taken after one untimed warm run: the cold run may have written its exports long enough
    before that the OS has dropped them from the page cache (a long cold run more so), and the first warm
    run would then read them back from disk. Both tools are timed with exports and page cache in place.
    """
    rows = []
    for n in sizes:
        inputs = real_set(work, n)
        for recipe, args, builtin, bargs in PAIRS:
            if only and recipe not in only:
                continue
            for rep in range(repeat):
                cache = work / f"cache-{n}-{recipe}"
                shutil.rmtree(cache, ignore_errors=True)
                penv = {**env, "XDG_CACHE_HOME": str(cache)}
                out = work / "out" / f"{recipe}-{n}"
                for state in ("cold", "warm"):
                    if state == "warm":
                        measure(pack_cmd(recipe, args, inputs, out), penv, log)
                    r = measure(pack_cmd(recipe, args, inputs, out), penv, log)
                    rows.append({"ranks": n, "tool": "pack", "recipe": recipe, "state": state, "rep": rep, **r})
                    print(f"{n:>5} {recipe:<22} pack    {state}: {r['wall_s']:7.2f} s {r['peak_mb']:6} MB", flush=True)
                clear_builtin_exports(inputs)
                for state in ("cold", "warm"):
                    cmd = builtin_cmd(nsys, builtin, bargs, inputs, work / "out" / f"{builtin}-{n}", jobs)
                    if state == "warm":
                        measure(cmd, env, log)
                    r = measure(cmd, env, log)
                    rows.append({"ranks": n, "tool": "built-in", "recipe": builtin, "pair": recipe, "state": state,
                                 "rep": rep, **r})
                    print(f"{n:>5} {builtin:<22} nsys    {state}: {r['wall_s']:7.2f} s {r['peak_mb']:6} MB", flush=True)
                clear_builtin_exports(inputs)
                shutil.rmtree(cache, ignore_errors=True)
    return rows


def synthetic_rows(work: Path, env: dict, sizes: list[int], log: Path) -> list[dict]:
    """The pack on synthetic exports (no export step: nothing to be cold about)."""
    rows = []
    for n in sizes:
        d = synth_set(work, env, n, 50, log)
        for recipe in RECIPES_SYNTH:
            r = measure(pack_cmd(recipe, [], d, work / "out" / f"synth-{recipe}-{n}"), env, log)
            rows.append({"ranks": n, "recipe": recipe, **r})
            print(f"{n:>5} {recipe:<22} synthetic: {r['wall_s']:7.2f} s {r['peak_mb']:6} MB", flush=True)
    return rows


def found_stragglers(out: Path, truth: Path) -> str:
    t = json.loads(truth.read_text())
    s = pd.read_parquet(out / "stragglers.parquet")
    got = set(zip(s["rank"], s["iteration"], strict=True))
    want = {(c["rank"], c["iteration"]) for c in t["cells"]}
    return f"{len(got & want)}/{len(want)} injected cells found, {len(got - want)} other"


def scale(work: Path, env: dict, sizes: list[int], log: Path) -> list[dict]:
    rows = []
    for n in sizes:
        d = synth_set(work, env, n, 200, log)
        for recipe in ("straggler_heatmap", "kernel_pace"):
            if recipe == "kernel_pace" and n != max(sizes):
                continue
            out = work / "out" / f"scale-{recipe}-{n}"
            r = measure(pack_cmd(recipe, [], d, out), env, log)
            r["found"] = found_stragglers(out, d / "truth.json") if recipe == "straggler_heatmap" and r["ok"] else ""
            rows.append({"ranks": n, "iterations": 200, "recipe": recipe, **r})
            print(f"{n:>5} x200 {recipe:<22}: {r['wall_s']:7.2f} s {r['peak_mb']:6} MB {r['found']}", flush=True)
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_workers(address: str, workers: int) -> None:
    """Until the scheduler at `address` is up and has this many workers (two minutes at most)."""
    import distributed

    deadline = time.time() + 120
    while True:
        try:
            with distributed.Client(address, timeout="5s") as c:
                c.wait_for_workers(workers, timeout=60)
                return
        except (OSError, TimeoutError):
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def dask_rows(work: Path, env: dict, n: int, log: Path) -> list[dict]:
    """The same run through a real scheduler with 1 and with 2 `nsys-recipe dask-worker` processes."""

    d = synth_set(work, env, n, 200, log)
    rows = []
    for workers in (1, 2):
        port = _free_port()
        address = f"tcp://127.0.0.1:{port}"
        with log.open("a") as fh:
            procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                       "--port", str(port), "--no-dashboard"], env=env, stdout=fh,
                                      stderr=subprocess.STDOUT, start_new_session=True)]
            procs += [subprocess.Popen([PACK, "dask-worker", address, "--", "--no-dashboard"], env=env, stdout=fh,
                                       stderr=subprocess.STDOUT, start_new_session=True) for _ in range(workers)]
        try:
            wait_for_workers(address, workers)
            out = work / "out" / f"dask-{workers}"
            r = measure(pack_cmd("straggler_heatmap", [], d, out, ["--mode", "dask-futures", "--dask-scheduler",
                                                                   address]), env, log)
            rows.append({"ranks": n, "iterations": 200, "workers": workers, **r})
            print(f"{n:>5} x200 dask, {workers} worker(s): {r['wall_s']:7.2f} s", flush=True)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 15)
            for p in procs:
                p.wait(timeout=60)
    for jobs in (1, 2):
        r = measure(pack_cmd("straggler_heatmap", [], d, work / "out" / f"local-{jobs}", ["--jobs", str(jobs)]),
                    env, log)
        rows.append({"ranks": n, "iterations": 200, "workers": f"local --jobs {jobs}", **r})
        print(f"{n:>5} x200 local --jobs {jobs}: {r['wall_s']:7.2f} s", flush=True)
    return rows


def write_results(path: Path, meta: dict, cmp_rows, syn_rows, scale_rows, dask) -> None:
    lines = ["# Benchmark results", "",
             f"Written by `{meta['command']}` on {meta['date']}. Rerun with `make bench`.", "",
             "## Machine", "",
             f"- {meta['cpu']}, {meta['cores']} cores, {meta['memory_gb']} GB; {meta['os']}",
             f"- Python {meta['python']}; Nsight Systems {meta['nsys_version']} ({meta['nsys']})",
             f"- pandas {pd.__version__}; the pack's runner with {meta['jobs']} workers; NVIDIA's recipes with "
             "their default `--mode concurrent`", "",
             "Wall time is the whole command, peak memory the largest sum of resident memory over its process "
             "tree. Cold: no exports exist yet (the pack's cache is empty; the built-ins' `_pqtdir`/`.sqlite` "
             "beside the reports are deleted), so the time includes `nsys export`. Warm: the same command "
             "again, exports in place, timed after one untimed warm run (so that exports written by a long cold "
             "run and since dropped from the OS page cache are not read back from disk in the timed run). "
             "Both tools' Python modules are byte-compiled before the first run.", ""]
    if cmp_rows:
        df = pd.DataFrame(cmp_rows)
        df["pair"] = df["pair"].fillna(df["recipe"]) if "pair" in df else df["recipe"]
        again = {(pair, n) for u in meta.get("updates", []) for pair in u["pairs"] for n in u["sizes"]}
        first = df[[(pair, n) not in again for pair, n in zip(df["pair"], df["ranks"], strict=True)]]
        reps = int(first["rep"].max()) + 1 if "rep" in first and len(first) else 1
        med = (df.groupby(["ranks", "tool", "pair", "state"], sort=False)
                 .agg(recipe=("recipe", "first"), wall_s=("wall_s", "median"), peak_mb=("peak_mb", "median"),
                      ok=("ok", "all")).reset_index())
        lines += ["## The pack against the nearest built-in (real reports, replicated)", "",
                  f"Inputs: the {len(list(REAL_SOURCE.glob('*.qdrep')))} MPI Jacobi reports in "
                  f"`{REAL_SOURCE.relative_to(ROOT)}` hard-linked as `rank0000.qdrep` ... (real profiles)."
                  + (f" Each time is the median of {reps} runs" if reps > 1 else " One run each")
                  + (" (rows measured again: as said below)." if again else "."), "",
                  "| ranks | pack recipe | built-in | state | pack s | built-in s | speed-up | pack MB | built-in MB |",
                  "|---:|---|---|---|---:|---:|---:|---:|---:|"]
        for (n, pair, state), g in med.groupby(["ranks", "pair", "state"], sort=False):
            pk, bi = g[g["tool"] == "pack"], g[g["tool"] == "built-in"]
            if pk.empty or bi.empty:
                continue
            p, b = pk.iloc[0], bi.iloc[0]
            flag = "" if p["ok"] and b["ok"] else " (failed: see log)"
            lines.append(f"| {n} | {pair} | {b['recipe']} | {state} | {p['wall_s']:.2f} | {b['wall_s']:.2f} | "
                         f"{b['wall_s'] / max(p['wall_s'], 1e-9):.2f}x{flag} | {p['peak_mb']:.0f} | "
                         f"{b['peak_mb']:.0f} |")
        lines.append("")
        lines += [f"Rows of {', '.join(u['pairs'])} ({', '.join(map(str, u['sizes']))} ranks) measured again by "
                  f"`{u['command']}` on {u['date']} ({u['cpu']}, {u['cores']} cores"
                  + (f"; medians of {u['repeat']} runs" if u.get("repeat", 1) > 1 else "") + ")."
                  for u in meta.get("updates", [])]
        lines += [""] if meta.get("updates") else []
    if syn_rows:
        lines += ["## The pack on SYNTHETIC exports (50 iterations per rank)", "",
                  "| ranks | recipe | s | peak MB |", "|---:|---|---:|---:|"]
        lines += [f"| {r['ranks']} | {r['recipe']} | {r['wall_s']:.2f} | {r['peak_mb']} |" for r in syn_rows]
        lines.append("")
    if scale_rows:
        lines += ["## Scale: SYNTHETIC ranks x 200 iterations", "",
                  "| ranks | recipe | s | peak MB | injected stragglers |", "|---:|---|---:|---:|---|"]
        lines += [f"| {r['ranks']} | {r['recipe']} | {r['wall_s']:.2f} | {r['peak_mb']} | {r.get('found', '')} |"
                  for r in scale_rows]
        lines.append("")
    if dask:
        lines += ["## Dask: straggler_heatmap over SYNTHETIC 256 ranks x 200 iterations", "",
                  "A `dask scheduler` and N `nsys-recipe dask-worker` processes on 127.0.0.1 "
                  "(`--mode dask-futures --dask-scheduler ADDRESS`), and the local runner for reference.", "",
                  "| workers | s | client-side peak MB |", "|---|---:|---:|"]
        lines += [f"| {r['workers']} | {r['wall_s']:.2f} | {r['peak_mb']} |" for r in dask]
        lines.append("")
    raw = meta["raw"]
    lines += ["## Commands", "", f"Every command run, in order, is in `{raw}/commands.log` with its output; "
              f"the raw numbers are in `{raw}/*.json`.", ""]
    # the sections other scripts write (huge.py, before_after.py) stay
    kept = [m.group(0) for m in SECTION_RE.finditer(path.read_text())] if path.exists() else []
    path.write_text("\n".join(lines + [block + "\n" for block in kept]))


def trim_log(log: Path) -> None:
    """Keep the commands and what they printed, without per-report progress and export chatter."""
    noise = re.compile(r"^(\S+: \d+/\d+ done|INFO: Exporting |Processing \[|Generating SQLite|\s*$)")
    log.write_text("".join(ln for ln in log.read_text().splitlines(keepends=True) if not noise.match(ln)))


def merged_with_earlier(raw: Path, rows: dict[str, list], meta: dict, only: set[str], sizes: list[int],
                        repeat: int) -> tuple[dict[str, list], dict]:
    """A run of some pairs only (--pairs) replaces their rows at the sizes it measured and keeps every other row of
    the raw numbers (the sections it did not run too), with the machine they were measured on; the results then say
    which rows were measured again, when and where."""
    merged = {}
    for name, new in rows.items():
        path = raw / f"{name}.json"
        old = json.loads(path.read_text()) if path.exists() else []
        if name == "compare":
            kept = [r for r in old if (r.get("pair") or r["recipe"]) not in only or r["ranks"] not in sizes]
            order = {recipe: i for i, (recipe, *_) in enumerate(PAIRS)}
            merged[name] = sorted(kept + new, key=lambda r: (r["ranks"], order.get(r.get("pair") or r["recipe"], 0)))
        else:
            merged[name] = new or old
    path = raw / "meta.json"
    earlier = json.loads(path.read_text()) if path.exists() else dict(meta)
    update = {key: meta[key] for key in ("command", "date", "cpu", "cores")}
    earlier["updates"] = [*earlier.get("updates", []), {**update, "pairs": sorted(only), "sizes": sizes,
                                                         "repeat": repeat}]
    return merged, earlier


def machine_meta(nsys, jobs: int, raw: Path) -> dict:
    mem = psutil.virtual_memory().total / 2**30
    meta = {"command": "python bench/bench.py " + shlex.join(sys.argv[1:]),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "memory_gb": round(mem),
            "os": platform.platform(), "python": platform.python_version(), "nsys_version": nsys.version,
            "nsys": "Debian non-free package, fetched by `nsys-recipe setup-nsys`", "jobs": jobs,
            "raw": os.path.relpath(raw, ROOT)}
    try:
        meta["cpu"] = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                           if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return meta


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="8,64,256,512")
    p.add_argument("--scale-sizes", default="64,256,512,1024")
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "nsys-recipe-bench"))
    p.add_argument("--no-compare", action="store_true")
    p.add_argument("--no-synthetic", action="store_true")
    p.add_argument("--no-scale", action="store_true")
    p.add_argument("--no-dask", action="store_true")
    p.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"))
    p.add_argument("--raw", default=str(ROOT / "bench" / "results"), help="folder for the raw numbers and the log")
    p.add_argument("--repeat", type=int, default=1, help="runs per measurement in the comparison (median)")
    p.add_argument("--pairs", default="", help="only these pack recipes in the comparison (comma list)")
    p.add_argument("--render-only", action="store_true", help="rewrite --results from the raw numbers in --raw")
    args = p.parse_args()

    if args.render_only:
        raw = Path(args.raw)
        rows = {n: json.loads((raw / f"{n}.json").read_text()) if (raw / f"{n}.json").exists() else []
                for n in ("compare", "synthetic", "scale", "dask")}
        meta = (json.loads((raw / "meta.json").read_text()) if (raw / "meta.json").exists()
                else machine_meta(nsys_tool.find_nsys(required=True), os.cpu_count() or 1, raw))
        write_results(Path(args.results), meta, rows["compare"],
                      rows["synthetic"], rows["scale"], rows["dask"])
        print(f"wrote {args.results}")
        return
    nsys = nsys_tool.find_nsys(required=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    raw = Path(args.raw)
    raw.mkdir(parents=True, exist_ok=True)
    only = {x for x in args.pairs.split(",") if x} or None
    merging = only is not None and not args.no_compare and (raw / "compare.json").exists()
    log = raw / "commands.log"
    if merging:  # the earlier runs' commands stay, this run's follow them
        with log.open("a") as fh:
            fh.write(f"\n# python bench/bench.py {shlex.join(sys.argv[1:])}\n")
    else:
        log.write_text("")
    jobs = os.cpu_count() or 1
    compile_bytecode(nsys)
    env = {**os.environ, "NSYS": str(nsys.path), "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", ""),
           "XDG_CACHE_HOME": str(work / "cache-shared")}
    sizes = [int(s) for s in args.sizes.split(",") if s]
    scale_sizes = [int(s) for s in args.scale_sizes.split(",") if s]
    cmp_rows = [] if args.no_compare else compare(work, env, str(nsys.path), sizes, jobs, log, args.repeat, only)
    syn_rows = [] if args.no_synthetic else synthetic_rows(work, env, sizes, log)
    scale_rows = [] if args.no_scale else scale(work, env, scale_sizes, log)
    dask = [] if args.no_dask else dask_rows(work, env, 256, log)
    measured = {"compare": cmp_rows, "synthetic": syn_rows, "scale": scale_rows, "dask": dask}
    meta = machine_meta(nsys, jobs, raw)
    if merging:
        measured, meta = merged_with_earlier(raw, measured, meta, only, sizes, args.repeat)
    for name, rows in measured.items():
        if rows:
            (raw / f"{name}.json").write_text(json.dumps(rows, indent=1))
    trim_log(log)
    (raw / "meta.json").write_text(json.dumps(meta, indent=1))
    write_results(Path(args.results), meta, *measured.values())
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
