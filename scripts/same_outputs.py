"""Every recipe's tables on every shipped sample set, and on SYNTHETIC exports, saved or compared with a saved run.

A change to how reports are read or analysed must leave every output table equal (values and dtypes). Each set is
read in every form the pack takes: the reports themselves (where a Nsight Systems that reads them is found), their
SQLite exports and their Parquet exports (made once into --work with the nsys found), and SYNTHETIC exports from
the pack's writer (NCCL and MPI jobs with injected stragglers, both formats, one with CUDA memory events).

    python scripts/same_outputs.py --save /tmp/before      # on the old code
    python scripts/same_outputs.py --against /tmp/before   # on the new code: exit 1 on any difference
    python scripts/same_outputs.py --against /tmp/before --spans   # every input read as a long capture would be
    python scripts/same_outputs.py --against /tmp/before --mode concurrent   # each set's files mapped by workers
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pandas.testing as pdt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from nsys_recipe_pack import nsys_tool, runner, synth, versions  # noqa: E402
from nsys_recipe_pack.errors import PackError  # noqa: E402

SAMPLES = ROOT / "sample_reports"
RUNS = [  # (recipe, options)
    ("straggler_heatmap", {}),
    ("kernel_pace", {}),
    ("nvtx_gpu_proj", {}),
    ("nvtx_gpu_proj", {"attribution": "thread"}),
    ("sync_summary", {}),
    ("compute_memory_share", {}),
    ("comm_overlap", {}),
    ("gpu_memory", {}),
]
KERNELS = {"gpubootcamp_mpi_jacobi_v100": "jacobi_kernel", "gpubootcamp_jacobi_memcpy": "jacobi_kernel",
           "ai_profiler_a100": "nchwToNhwcKernel"}


def export_forms(work: Path, nsys) -> dict[str, Path]:
    """Each sample set as reports, as SQLite exports and as Parquet exports (made once), plus SYNTHETIC sets."""
    sets: dict[str, Path] = {}
    for folder in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        reports = sorted([*folder.glob("*.nsys-rep"), *folder.glob("*.qdrep")])
        readable = [r for r in reports if nsys and not versions.newer_than(versions.report_version(r), nsys.version)]
        if reports and len(readable) == len(reports):
            sets[f"{folder.name}/report"] = folder
        for kind, suffix in (("sqlite", ".sqlite"), ("parquetdir", "_pqtdir")):
            dest = work / f"{folder.name}-{kind}"
            beside = sorted(folder.glob(f"*{suffix}"))
            if beside and kind == "sqlite":
                sets[f"{folder.name}/{kind}"] = folder / "*.sqlite"
                continue
            if not readable or len(readable) != len(reports):
                continue
            if not dest.exists():
                tmp = Path(tempfile.mkdtemp(dir=work))
                for r in readable:
                    out = tmp / (r.name.rsplit(".", 1)[0] + suffix)
                    subprocess.run([str(nsys.path), "export", "--type", kind, "--quiet", "true", "--output", str(out),
                                    str(r)], check=True, capture_output=True)
                tmp.rename(dest)
            sets[f"{folder.name}/{kind}"] = dest
    for job, fmt, schema, memory in (("nccl", "sqlite", "2023.4", None), ("nccl", "parquetdir", "2023.4", None),
                                     ("mpi", "sqlite", "2023.4", None), ("nccl", "sqlite", "newer", None),
                                     ("nccl", "parquetdir", "memory", "leak=1,iterations=4-7,big=2")):
        dest = work / f"synthetic-{job}-{fmt}-{schema}"
        if not dest.exists():
            stragglers = ["rank=1,iterations=8-9,cause=gpu,slowdown=2"]
            if job == "nccl":
                stragglers.append("rank=2,iterations=4-6,cause=dataloader,slowdown=3")
            synth.write_synthetic(dest, ranks=4, iterations=12, fmt=fmt, job=job, seed=3,
                                  schema="2023.4" if memory else schema,
                                  stragglers=[synth.parse_straggler(s) for s in stragglers],
                                  memory=synth.parse_memory(memory) if memory else None)
        sets[f"synthetic-{job}-{schema}/{fmt}"] = dest
    return sets


def run_all(sets: dict[str, Path], out: Path, recipes: set[str] | None = None, mode: str = "none") -> list[str]:
    done = []
    for set_name, path in sets.items():
        folder = set_name.split("/")[0]
        runs = list(RUNS)
        if folder in KERNELS:
            runs.append(("kernel_pace", {"kernel": KERNELS[folder]}))
        for recipe, options in runs:
            if recipes and recipe not in recipes:
                continue
            tag = "-".join([recipe, *(f"{k}={v}" for k, v in options.items())])
            dest = out / set_name.replace("/", "__") / tag
            try:
                runner.run(recipe, [str(path)], str(dest), force=True, mode=mode, options=dict(options),
                           log=lambda m: None)
            except PackError as exc:
                dest.mkdir(parents=True, exist_ok=True)
                # where the checkout and the exports lie is no part of the message's meaning
                text = str(exc).replace(str(ROOT), "ROOT").replace(str(path.parent), "INPUTS")
                (dest / "error.txt").write_text(f"{type(exc).__name__}: {text}\n")
            done.append(f"{set_name} {tag}")
            print(f"{set_name:<48} {tag}", flush=True)
    return done


def compare(new: Path, old: Path, recipes: set[str] | None = None) -> list[str]:
    problems = []
    for old_run in sorted(p for p in old.glob("*/*") if p.is_dir()):
        rel = old_run.relative_to(old)
        if recipes and old_run.name.split("-")[0] not in recipes:
            continue
        new_run = new / rel
        if (old_run / "error.txt").exists() or (new_run / "error.txt").exists():
            a = (old_run / "error.txt").read_text() if (old_run / "error.txt").exists() else "(no error)"
            b = (new_run / "error.txt").read_text() if (new_run / "error.txt").exists() else "(no error)"
            if a != b:
                problems.append(f"{rel}: error before {a.strip()!r}, after {b.strip()!r}")
            continue
        for table in sorted(old_run.glob("*.parquet")):
            other = new_run / table.name
            if not other.exists():
                problems.append(f"{rel}/{table.name}: missing after")
                continue
            want, got = pd.read_parquet(table), pd.read_parquet(other)
            if table.name == "files.parquet":  # where the inputs lay differs between the two runs
                want, got = want.drop(columns=["file", "read_from"]), got.drop(columns=["file", "read_from"])
            try:
                pdt.assert_frame_equal(got, want)
            except AssertionError as exc:
                problems.append(f"{rel}/{table.name}: {str(exc).splitlines()[0:3]}")
        extra = {p.name for p in new_run.glob("*.parquet")} - {p.name for p in old_run.glob("*.parquet")}
        if extra:
            problems.append(f"{rel}: new tables {sorted(extra)}")
    return problems


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", help="write every run's tables into this folder")
    g.add_argument("--against", help="run again into a scratch folder and compare with this saved folder")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "nsys-recipe-same-outputs"),
                   help="where the exports of the sample sets are made once and kept")
    p.add_argument("--recipes", help="only these recipes (comma-separated; with --against)")
    p.add_argument("--spans", action="store_true", help="read every input as a long capture is read (the recipes "
                   "that can, span by span of time), to compare with tables saved from whole reads")
    p.add_argument("--mode", choices=["none", "concurrent"], default="none",
                   help="how a set's files are mapped: in this process, or by worker processes (their tables handed "
                   "over in files)")
    args = p.parse_args()
    if args.spans:
        from nsys_recipe_pack.inputs import rank_data

        rank_data.STREAM_MIN_ROWS = 0
    recipes = set(args.recipes.split(",")) if args.recipes else None
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    nsys = nsys_tool.find_nsys(required=False)
    sets = export_forms(work, nsys)
    if args.save:
        out = Path(args.save)
        shutil.rmtree(out, ignore_errors=True)
        done = run_all(sets, out)
        print(f"saved {len(done)} runs in {out}")
        return
    out = Path(tempfile.mkdtemp(prefix="same-outputs-", dir=work))
    try:
        done = run_all(sets, out, recipes, args.mode)
        problems = compare(out, Path(args.against), recipes)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    for line in problems:
        print("DIFFERS", line)
    print(f"{len(done)} runs compared: {'all tables equal' if not problems else f'{len(problems)} differences'}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
