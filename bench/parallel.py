"""Parallel jobs at scale: `collectives`, `straggler_heatmap`, `comm_overlap`, `pipeline_bubbles` and `critical_path`
over SYNTHETIC Megatron-style jobs
(tp=8, pp=4, the data-parallel size growing with the ranks; 4 steps of 4 micro-batches, delimited by their `step`
range), with NCCL's NVTX payloads
and without them (groups inferred from the kernels). Wall time and peak memory of each whole command, the time per
rank (`collectives` must stay linear in ranks), and whether the groups found are Megatron's rank order. Writes its
section of bench/RESULTS.md.

    .venv/bin/python bench/parallel.py                       # 128 to 1,024 ranks
    .venv/bin/python bench/parallel.py --sizes 128,256       # a quick look
    .venv/bin/python bench/parallel.py --recipes critical_path   # these again, the other rows kept from the last run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import BIN, PACK, ROOT, measure, replace_section  # noqa: E402

BEGIN, END = "<!-- parallel:begin -->", "<!-- parallel:end -->"
TP, PP = 8, 4
RECIPES = ("collectives", "straggler_heatmap", "comm_overlap", "pipeline_bubbles", "critical_path")


def job(work: Path, ranks: int, payloads: bool, env: dict, log: Path) -> Path:
    out = work / f"megatron-{ranks}-{'payload' if payloads else 'inferred'}"
    if not (out / "truth.json").exists():
        cmd = [PACK, "synth", "--job", "megatron", "--parallel", f"tp={TP},pp={PP},dp={ranks // (TP * PP)}",
               "--microbatches", "4", "--iterations", "4", "--output", str(out), "--force-overwrite",
               *([] if payloads else ["--no-nvtx-payload"])]
        with log.open("a") as fh:
            subprocess.run(cmd, env=env, check=True, stdout=fh, stderr=subprocess.STDOUT)
    return out


def groups_right(out: Path, ranks: int) -> str:
    """How many ranks' tp, pp and dp coordinates in groups.parquet are Megatron's: rank = t + TP (d + D p)."""
    dp = ranks // (TP * PP)
    got = pd.read_parquet(out / "groups.parquet").set_index("rank").reindex(range(ranks))
    r = got.index.to_numpy()
    right = (got["tp"] == r % TP) & (got["dp"] == (r // TP) % dp) & (got["pp"] == r // (TP * dp))
    return "all" if right.all() else f"{int(right.sum())}/{ranks}"


def render(rows: list[dict]) -> str:
    lines = [BEGIN, "## Parallel jobs: SYNTHETIC Megatron-style ranks (tp=8, pp=4, 4 steps of 4 micro-batches)", "",
             "`bench/parallel.py`. Groups from NCCL's NVTX payloads (`payload`) or inferred from the kernels "
             "(`inferred`); `ms/rank` is the wall time over the ranks; `groups right`: ranks whose tp, pp and dp "
             "coordinates are Megatron's (rank = t + tp (d + dp p)).", "",
             "| ranks | groups | recipe | wall s | ms/rank | peak MB | groups right |",
             "|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['groups']} | {r['recipe']} | {r['wall_s']:.2f} | "
                     f"{1000 * r['wall_s'] / r['ranks']:.1f} | {r['peak_mb']} | {r['groups_right']} |")
    return "\n".join([*lines, "", END])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="128,256,512,1024")
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "nsys-recipe-bench-parallel"))
    p.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"))
    p.add_argument("--raw", default=str(ROOT / "bench" / "results" / "parallel.json"))
    p.add_argument("--recipes", default=",".join(RECIPES))
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "commands.log"
    env = {**os.environ, "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", ""),
           "XDG_CACHE_HOME": str(work / "cache")}
    rows = []
    for ranks in (int(s) for s in args.sizes.split(",") if s):
        for payloads in (True, False):
            inputs = job(work, ranks, payloads, env, log)
            for recipe in (r for r in args.recipes.split(",") if r):
                out = work / "out" / f"{recipe}-{inputs.name}"
                r = measure([PACK, "run", "--name", recipe, str(inputs), "--output", str(out), "--force-overwrite",
                             "--mode", "none", "--iteration", "step"], env, log)
                right = groups_right(out, ranks) if r["ok"] else f"exit {r['exit']}"
                rows.append({"ranks": ranks, "groups": "payload" if payloads else "inferred", "recipe": recipe,
                             **r, "groups_right": right})
                print(f"{ranks:>5} {rows[-1]['groups']:<8} {recipe:<18} {r['wall_s']:7.2f} s {r['peak_mb']:6} MB "
                      f"groups right: {right}", flush=True)
    # the rows measured now replace those of the same size, groups and recipe from the last run; the others stay
    key = ("ranks", "groups", "recipe")
    kept = json.loads(Path(args.raw).read_text()) if Path(args.raw).exists() else []
    merged = {tuple(r[k] for k in key): r for r in [*kept, *rows]}
    order = {name: i for i, name in enumerate(RECIPES)}
    rows = sorted(merged.values(), key=lambda r: (r["ranks"], r["groups"] != "payload", order.get(r["recipe"], 99)))
    Path(args.raw).parent.mkdir(parents=True, exist_ok=True)
    Path(args.raw).write_text(json.dumps(rows, indent=1))
    replace_section(Path(args.results), BEGIN, END, render(rows))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    sys.exit(main())
