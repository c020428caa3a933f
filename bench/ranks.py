"""Thousands of ranks: `straggler_heatmap --report` over SYNTHETIC N ranks x 1,000 iterations, through a real Dask
scheduler and two `nsys-recipe dask-worker` processes on 127.0.0.1 (`--mode dask-futures --dask-scheduler`).

Each set is written once by the pack's generator (`nsys-recipe synth`, one straggler injected: rank N*7/9 computes
1.5 times as long in iterations 300-309), not a real profile, and kept in --work; its writing is timed apart. The run
is timed as a whole, from the command's start to its report page written. Memory is each process's own peak
resident memory, sampled every 100 ms: the client (the command: the reduce, then the report, whose notebook runs in
a kernel process of its own), the scheduler, the workers. Truth: the flagged cells are exactly the injected ones.
The page is then opened in headless Chromium with no network: every figure drawn, no console error.

    .venv/bin/python bench/ranks.py --ranks 1024,4096 --work /tmp/nsys-recipe-ranks
    .venv/bin/python bench/ranks.py --ranks 10000 --keep     # rows of other sizes kept as the raw numbers hold them
    .venv/bin/python bench/ranks.py --keep --recipes kernel_pace,comm_overlap --only-recipes   # those recipes only

With --recipes, other recipes run over each set too, through the same scheduler and workers, without a report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import PACK, ROOT, _free_port, found_stragglers, replace_section, wait_for_workers  # noqa: E402

ITERATIONS = 1000
WORKERS = 2
BEGIN, END = "<!-- ranks:begin -->", "<!-- ranks:end -->"


def synth(work: Path, n: int, log: Path) -> tuple[Path, float | None]:
    """The set of n ranks, written unless it is there; the seconds its writing took (None: written before)."""
    d = work / f"synth-{n}x{ITERATIONS}"
    if (d / "truth.json").exists():
        return d, None
    started = time.perf_counter()
    cmd = [PACK, "synth", "--ranks", str(n), "--iterations", str(ITERATIONS), "--format", "parquetdir",
           "--straggler", f"rank={n * 7 // 9},iterations=300-309,cause=compute,slowdown=1.5", "--output", str(d),
           "--force-overwrite"]
    with log.open("a") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n")
        fh.flush()
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=True)
    return d, round(time.perf_counter() - started, 1)


class Peaks:
    """Each watched process tree's largest resident memory of any one process in it, and of its root process alone
    and of the others alone (`NAME itself`, `NAME children`: the command and the notebook kernel it starts), and of its
    root before it first had a child (`NAME before children`: the command until its report starts, its map results
    gathered, reduced and written), sampled in a thread."""

    def __init__(self, roots: dict[str, int]):
        self.roots = roots
        self.peak = {k: 0 for name in roots for k in (name, f"{name} itself", f"{name} children",
                                                      f"{name} before children")}
        self._had_children = dict.fromkeys(roots, False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.roots.items():
                try:
                    root = psutil.Process(pid)
                    children = root.children(recursive=True)
                    self._had_children[name] |= bool(children)
                    for p in [root, *children]:
                        try:
                            rss = p.memory_info().rss
                        except psutil.Error:
                            continue
                        part = f"{name} itself" if p.pid == pid else f"{name} children"
                        self.peak[name] = max(self.peak[name], rss)
                        self.peak[part] = max(self.peak[part], rss)
                        if p.pid == pid and not self._had_children[name]:
                            self.peak[f"{name} before children"] = max(self.peak[f"{name} before children"], rss)
                except psutil.Error:
                    pass
            self._stop.wait(0.1)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return {name: round(v / 2**20) for name, v in self.peak.items()}


def run_one(work: Path, d: Path, n: int, log: Path, recipe: str = "straggler_heatmap") -> dict:
    """One recipe over the set through a fresh scheduler and workers; straggler_heatmap with its report."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ)
    with log.open("a") as fh:
        procs = {"scheduler": subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
             "--no-dashboard"], env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)}
        for i in range(WORKERS):
            procs[f"worker {i}"] = subprocess.Popen(
                [PACK, "dask-worker", address, "--", "--no-dashboard", "--nthreads", "1", "--name", f"w{i}"], env=env,
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_workers(address, WORKERS)
        report = recipe == "straggler_heatmap"
        out = work / "out" / (f"ranks-{n}" if report else f"ranks-{n}-{recipe}")
        cmd = [PACK, "run", "--name", recipe, "--mode", "dask-futures", "--dask-scheduler", address,
               *(["--report"] if report else []), "--output", str(out), "--force-overwrite", str(d)]
        with log.open("a") as fh:
            fh.write(f"\n$ {shlex.join(cmd)}\n")
            fh.flush()
            started = time.perf_counter()
            client = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
            peaks = Peaks({"client": client.pid, **{k: p.pid for k, p in procs.items()}})
            client.wait()
            wall = time.perf_counter() - started
            mb = peaks.stop()
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in procs.values():
            p.wait(timeout=60)
    ok = client.returncode == 0
    if not report:
        return {"ranks": n, "recipe": recipe, "wall_s": round(wall, 1), "ok": ok, "exit": client.returncode,
                "client_mb": mb["client"], "worker_mb": max(mb[f"worker {i}"] for i in range(WORKERS)),
                "cmd": shlex.join(cmd)}
    page = out / "report.html"
    return {"ranks": n, "iterations": ITERATIONS, "wall_s": round(wall, 1), "ok": ok, "exit": client.returncode,
            "client_mb": mb["client"], "command_mb": mb["client itself"], "notebook_mb": mb["client children"],
            "before_report_mb": mb["client before children"],
            "scheduler_mb": mb["scheduler"], "worker_mb": max(mb[f"worker {i}"] for i in range(WORKERS)),
            "page_mb": round(page.stat().st_size / 1e6, 1) if ok and page.exists() else None,
            "found": found_stragglers(out, d / "truth.json") if ok else "", "cmd": shlex.join(cmd),
            "chromium": opens_in_chromium(page, work) if ok and page.exists() else ""}


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]  # no network at all


def opens_in_chromium(page: Path, work: Path) -> str:
    """Whether headless Chromium, offline, draws every figure of the page without a console error, and how long it
    took to load it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return "no chromium"
    expected = len(re.findall(r'class="plotly-graph-div"', page.read_text()))
    started = time.perf_counter()
    res = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'chromium-profile'}",
                          "--enable-logging=stderr", "--v=0", "--virtual-time-budget=60000", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - started
    drawn = len(re.findall(r'class="main-svg"', res.stdout))
    errors = [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    if res.returncode or drawn < expected or errors:
        return f"no: exit {res.returncode}, {drawn} svg for {expected} figures, {len(errors)} console errors"
    return f"yes, {expected} figures drawn ({took:.0f} s)"


def write_results(results: Path, meta: dict, rows: list[dict], others: list[dict]) -> None:
    lines = [BEGIN, f"## Thousands of ranks: SYNTHETIC ranks x {ITERATIONS:,} iterations through Dask", "",
             f"Written by `{meta['command']}` on {meta['date']} ({meta['cpu']}, {meta['cores']} cores, "
             f"{meta['memory_gb']} GB), rows measured before kept (`--keep`: each row's command is in the raw "
             "numbers). Rerun with `make bench-ranks`.", "",
             "SYNTHETIC sets from `nsys-recipe synth --format parquetdir` (one straggler injected), not real profiles. "
             "`nsys-recipe run --name straggler_heatmap --report --mode dask-futures` against a `dask scheduler` and "
             f"{WORKERS} `nsys-recipe dask-worker --nthreads 1` on 127.0.0.1. Time: the whole command, its report page "
             "included (the writing of the set apart). Memory: each process's own peak resident memory, the largest "
             "of each kind (client: the command and the notebook kernel it starts, the larger; then each apart, and "
             "the command until its report starts: the map's results gathered, the reduce, the tables written). "
             "Page: report.html, without the "
             "plotly.js file beside it. Synth: the seconds the set took to write (—: written by an earlier run).", "",
             "What grows with ranks: the client's reduce holds each cell's cause code (rank x iteration: four "
             "bytes) and a few rows per rank; the cells and their component rows (ten a cell) are regrouped into "
             "files a run of iterations at a time and compared a run at a time, the run-wide medians and noise "
             "scales found in passes over those files, iterations.parquet made a rank at a time as it is written; "
             "the NCCL kernels (one a cell here) infer the groups from a few sampled instances per rank. The "
             "notebook kernel holds the columns its figures show of every cell (about 80 bytes a cell). The page's "
             "heatmap has 256 rows at most: the page does not grow.",
             "",
             "| ranks | synth s | run s | client MB | command / notebook MB | until the report MB | scheduler MB | "
             "worker MB | page MB | headless Chromium | injected straggler |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in sorted(rows, key=lambda r: r["ranks"]):
        status = r["found"] if r["ok"] else f"failed (exit {r['exit']})"
        synth_s = "—" if r.get("synth_s") is None else f"{r['synth_s']:.0f}"
        parts = f"{r['command_mb']} / {r['notebook_mb']}" if "command_mb" in r else "—"
        page = r['page_mb'] if r['page_mb'] is not None else '—'
        lines.append(f"| {r['ranks']} | {synth_s} | {r['wall_s']:.1f} | {r['client_mb']} | {parts} | "
                     f"{r.get('before_report_mb', '—')} | {r['scheduler_mb']} | {r['worker_mb']} | {page} | "
                     f"{r.get('chromium') or '—'} | {status} |")
    if others:
        lines += ["", "The other recipes over the same sets, through the same scheduler and workers (no report). Each "
                  "writes its per-rank and per-iteration tables a rank at a time; what its client holds is what needs "
                  "every rank: kernel_pace each iteration's duration (the run's median is over every one), "
                  "comm_overlap every NCCL kernel while it matches them across ranks (what grows here), sync_summary "
                  "and nvtx_gpu_proj a few rows a rank.", "",
                  "| ranks | recipe | run s | client MB | worker MB |", "|---:|---|---:|---:|---:|"]
        for r in sorted(others, key=lambda r: (r["recipe"], r["ranks"])):
            status = "" if r["ok"] else f" (failed, exit {r['exit']})"
            lines.append(f"| {r['ranks']} | {r['recipe']}{status} | {r['wall_s']:.1f} | {r['client_mb']} | "
                         f"{r['worker_mb']} |")
    lines += ["", f"Raw numbers: `{meta['raw']}`; commands and their output: `bench/results-ranks/commands.log`.",
              END]
    replace_section(results, BEGIN, END, "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1024,4096,10000", help="comma-separated rank counts")
    p.add_argument("--work", default="/tmp/nsys-recipe-ranks", help="where the sets and outputs are kept")
    p.add_argument("--keep", action="store_true", help="keep the rows of other rank counts already measured")
    p.add_argument("--drop-sets", action="store_true", help="remove each set once measured (10,000 ranks: 16 GB)")
    p.add_argument("--write-only", action="store_true", help="only write the section again from the raw numbers")
    p.add_argument("--recipes", default="", help="also these recipes over each set, without a report "
                   "(comma-separated, e.g. kernel_pace,comm_overlap,sync_summary,nvtx_gpu_proj)")
    p.add_argument("--only-recipes", action="store_true", help="run only --recipes, keeping straggler_heatmap's rows")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results_dir = ROOT / "bench" / "results-ranks"
    results_dir.mkdir(exist_ok=True)
    log, raw = results_dir / "commands.log", results_dir / "ranks.json"
    if args.write_only:
        saved = json.loads(raw.read_text())
        write_results(ROOT / "bench" / "RESULTS.md", saved["meta"], saved["rows"], saved.get("others", []))
        return
    if not args.keep:
        log.write_text("")
    sizes = [int(s) for s in args.ranks.split(",") if s]
    saved = json.loads(raw.read_text()) if args.keep and raw.exists() else {}
    rows = {r["ranks"]: r for r in saved.get("rows", [])}
    others = {(r["ranks"], r["recipe"]): r for r in saved.get("others", [])}
    recipes = [r for r in args.recipes.split(",") if r]
    for n in sizes:
        d, synth_s = synth(work, n, log)
        if not args.only_recipes:
            row = run_one(work, d, n, log)
            row["synth_s"] = synth_s if synth_s is not None else rows.get(n, {}).get("synth_s")
            rows[n] = row
            print(f"{n:>6} ranks: {row['wall_s']:7.1f} s, client {row['client_mb']} MB, workers {row['worker_mb']} "
                  f"MB, page {row['page_mb']} MB, {row['found'] or 'failed'}", flush=True)
        for recipe in recipes:
            other = others[(n, recipe)] = run_one(work, d, n, log, recipe)
            print(f"{n:>6} ranks, {recipe}: {other['wall_s']:7.1f} s, client {other['client_mb']} MB, workers "
                  f"{other['worker_mb']} MB{'' if other['ok'] else ', failed'}", flush=True)
        if args.drop_sets:
            shutil.rmtree(d, ignore_errors=True)
    meta = {"command": "python bench/ranks.py " + shlex.join(sys.argv[1:]),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cores": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30), "raw": os.path.relpath(raw, ROOT),
            "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                         if ln.startswith("model name")), "")}
    raw.write_text(json.dumps({"meta": meta, "rows": list(rows.values()), "others": list(others.values())}, indent=1))
    write_results(ROOT / "bench" / "RESULTS.md", meta, list(rows.values()), list(others.values()))


if __name__ == "__main__":
    main()
