"""The pack's recipes at an earlier commit and now, warm, on the same inputs: did a change make any slower?

Each recipe runs with the pack's runner on the shipped MPI Jacobi reports replicated to N ranks (real, as in
bench.py) and on a SYNTHETIC N-rank set, the two versions taking turns after one untimed run each (exports
and page cache in place); the median of --repeat runs is kept. The earlier commit runs from a git worktree
of it, with this checkout's Python environment. Writes the "Before and after" section of bench/RESULTS.md.

With --huge, the inputs are instead bench/huge.py's long captures (the real report replicated COPIES times, SQLite
and Parquet, made by it into --huge-work) and its cases: no untimed run (huge.py leaves the files in the page
cache), and the "Huge reports, before and after" section.

    .venv/bin/python bench/before_after.py --base 5f369c2 --sizes 64 --repeat 3
    .venv/bin/python bench/before_after.py --base 1d00296 --huge 250,2000 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import RECIPES_SYNTH, ROOT, measure, real_set, replace_section, synth_set  # noqa: E402
from nsys_recipe_pack import nsys_tool  # noqa: E402

CASES = [  # recipe, its options on the real set
    ("straggler_heatmap", ["--iteration", "MPI"]),
    ("kernel_pace", ["--kernel", "jacobi_kernel"]),
    ("nvtx_gpu_proj", []),
    ("sync_summary", []),
    ("compute_memory_share", []),
]
BEGIN, END = "<!-- before-after:begin -->", "<!-- before-after:end -->"
HUGE_BEGIN, HUGE_END = "<!-- huge-before-after:begin -->", "<!-- huge-before-after:end -->"


def command(src: Path, recipe: str, args: list[str], inputs: Path, out: Path) -> list[str]:
    entry = "import sys; sys.path.insert(0, sys.argv.pop(1)); from nsys_recipe_pack.cli import entry; entry()"
    return [sys.executable, "-c", entry, str(src), "run", "--name", recipe, "--engine", "pack", *args, "--output",
            str(out), "--force-overwrite", str(inputs)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the earlier commit")
    p.add_argument("--new", default=None, help="the later commit (default: this checkout as it is)")
    p.add_argument("--sizes", default="64")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "nsys-recipe-bench"))
    p.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"))
    p.add_argument("--huge", default="", help="bench/huge.py's long captures of these copies instead (comma-separated)")
    p.add_argument("--huge-work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "nsys-recipe-bench-huge"),
                   help="where bench/huge.py made them (its --work)")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "before_after.log"
    def checkout(rev: str) -> tuple[str, Path]:
        short = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                               capture_output=True, text=True).stdout.strip()
        tree = work / f"worktree-{short}"
        if not tree.exists():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), short], check=True,
                           capture_output=True)
        return short, tree / "src"

    base, before = checkout(args.base)
    head, after = checkout(args.new) if args.new else ("this checkout", ROOT / "src")
    versions = {"before": before, "after": after}
    nsys = nsys_tool.find_nsys()  # before the cache moves: `make bench` fetched it into the usual one
    env = {**os.environ, "NSYS": str(nsys.path), "XDG_CACHE_HOME": str(work / "cache-before-after")}
    if args.huge:
        return huge(args, versions, base, head, env, log)
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        sets = {"real": real_set(work, n), "synthetic": synth_set(work, env, n, 50, log)}
        for kind, inputs in sets.items():
            for recipe, options in CASES:
                if kind == "synthetic":
                    options = []
                    if recipe not in RECIPES_SYNTH:
                        continue
                runs = {v: [] for v in versions}
                for rep in range(args.repeat + 1):
                    for version, src in versions.items():
                        r = measure(command(src, recipe, options, inputs, work / "out" / f"ba-{version}"), env, log)
                        if not r["ok"]:
                            sys.exit(f"{recipe} ({version}) failed; see {log}")
                        if rep:  # the first run of each only warms exports and page cache
                            runs[version].append(r)
                row = {"ranks": n, "set": kind, "recipe": recipe}
                for version, rs in runs.items():
                    row[f"{version}_s"] = statistics.median(r["wall_s"] for r in rs)
                    row[f"{version}_mb"] = statistics.median(r["peak_mb"] for r in rs)
                rows.append(row)
                print(f"{n:>5} {kind:<9} {recipe:<22} before {row['before_s']:6.2f} s {row['before_mb']:6.0f} MB  "
                      f"after {row['after_s']:6.2f} s {row['after_mb']:6.0f} MB", flush=True)
    write_section(args.results, BEGIN, END, f"## Before and after: {base} and {head}",
                  f"each recipe warm with the pack's runner, the two versions taking turns, median of {args.repeat} "
                  "runs (after one untimed run each); real = the MPI Jacobi reports replicated to N ranks, synthetic = "
                  "`nsys-recipe synth` (SYNTHETIC data).", {"ranks": "ranks", "set": "set", "recipe": "recipe"}, rows)
    return 0


def write_section(results: str, begin: str, end: str, title: str, how: str, keys: dict, rows: list[dict]) -> None:
    """A section of bench/RESULTS.md: the command, how it measured, and a row per case (`keys`: column -> row key)
    with both versions' times and peaks."""
    lines = [begin, "", title, "", f"`{' '.join(['python', 'bench/before_after.py', *sys.argv[1:]])}`: {how} Wall "
             "time of the whole command, to the 50 ms at which the sampler polls; peak resident memory of its "
             "process tree.", "",
             f"| {' | '.join(keys)} | before s | after s | after / before | before MB | after MB |",
             "|" + "---|" * (len(keys) + 5)]
    for r in rows:
        lines.append(f"| {' | '.join(str(r[k]) for k in keys.values())} | {r['before_s']:.2f} | {r['after_s']:.2f} | "
                     f"{r['after_s'] / max(r['before_s'], 1e-9):.2f} | {r['before_mb']:.0f} | {r['after_mb']:.0f} |")
    lines += ["", end]
    replace_section(Path(results), begin, end, "\n".join(lines))
    print(f"written: {results}")


def huge(args, versions: dict, base: str, head: str, env: dict, log: Path) -> int:
    """Each of bench/huge.py's cases on its long captures, from SQLite and from Parquet, the versions taking turns."""
    from huge import CASES as HUGE_CASES

    rows = []
    for copies in [int(c) for c in args.huge.split(",")]:
        case = Path(args.huge_work) / f"a100x{copies}"
        forms = {"sqlite": case / f"a100x{copies}.sqlite", "parquet": case / f"a100x{copies}_pqtdir"}
        if not all(p.exists() for p in forms.values()):
            sys.exit(f"{case}: not made; run bench/huge.py --copies {copies} --work {args.huge_work} first")
        for name, recipe, options, _, _ in HUGE_CASES:
            for form, inputs in forms.items():
                runs = {v: [] for v in versions}
                for _ in range(args.repeat):
                    for version, src in versions.items():
                        r = measure(command(src, recipe, options, inputs, Path(args.work) / "out" / f"ba-{version}"),
                                    env, log)
                        # a recipe the input holds nothing for says so, exit 3 (comm_overlap: no NCCL kernel)
                        if r["exit"] not in (0, 3):
                            sys.exit(f"{name} ({version}) failed; see {log}")
                        runs[version].append(r)
                row = {"copies": copies, "recipe": name, "form": form}
                for version, rs in runs.items():
                    row[f"{version}_s"] = statistics.median(r["wall_s"] for r in rs)
                    row[f"{version}_mb"] = statistics.median(r["peak_mb"] for r in rs)
                    row[f"{version}_exit"] = rs[0]["exit"]
                rows.append(row)
                print(f"{copies:>5} {name:<22} {form:<8} before {row['before_s']:6.2f} s {row['before_mb']:6.0f} MB  "
                      f"after {row['after_s']:6.2f} s {row['after_mb']:6.0f} MB", flush=True)
    write_section(args.results, HUGE_BEGIN, HUGE_END, f"## Huge reports, before and after: {base} and {head}",
                  "bench/huge.py's cases on its long captures (the real report replicated COPIES times), the two "
                  f"versions taking turns, median of {args.repeat} runs, the files in the page cache. comm_overlap "
                  "answers that it does not apply (no NCCL kernel, exit 3) after reading the capture.",
                  {"copies": "copies", "recipe": "recipe", "read from": "form"}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
