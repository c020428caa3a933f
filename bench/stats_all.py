"""`nsys stats` over every report in a folder, JOBS at a time: the built-in way to get per-rank GPU sums.

    python bench/stats_all.py --nsys NSYS --jobs 2 DIR --report cuda_gpu_kern_sum --report cuda_gpu_mem_time_sum
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nsys", required=True)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("folder")
    p.add_argument("--report", action="append", required=True)
    args = p.parse_args()
    reports = sorted(f for f in Path(args.folder).iterdir() if f.suffix in (".qdrep", ".nsys-rep"))
    reports_args = [a for r in args.report for a in ("--report", r)]

    def one(report: Path) -> int:
        return subprocess.run([args.nsys, "stats", *reports_args, "--format", "csv", "--quiet", str(report)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode

    with ThreadPoolExecutor(args.jobs) as pool:
        codes = list(pool.map(one, reports))
    failed = sum(c != 0 for c in codes)
    print(f"nsys stats on {len(reports)} report(s), {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
