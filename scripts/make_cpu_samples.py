"""Make the pack's own real CPU-only multi-rank sample reports (sample_reports/cpu_ddp/).

Runs scripts/cpu_ddp_train.py as WORLD_SIZE ranks on 127.0.0.1 with torchrun, through
`nsys-recipe profile` (one `nsys profile` per rank, NVTX trace only so the files stay small, reports
named by torchrun's RANK), in a clean environment (`env -i` with only what the job needs, because a
report records the profiled process's environment). One rank is made slow on purpose; truth.json
beside the reports says which, when and why.

    make setup                                   # the venv has torch 2.13.0 (CPU) and nvtx 0.2.11
    .venv/bin/nsys-recipe setup-nsys --version 2023.4 --with-host
    .venv/bin/python scripts/make_cpu_samples.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from nsys_recipe_pack import nsys_tool  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_python(python: str) -> dict:
    probe = ("import json, torch, nvtx, importlib.metadata as m; "
             "print(json.dumps({'torch': torch.__version__, 'nvtx': m.version('nvtx')}))")
    res = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{python} cannot import torch and nvtx; install them with "
                 f"`{python} -m pip install torch==2.13.0 nvtx==0.2.11`")
    versions = json.loads(res.stdout)
    if versions["nvtx"] != "0.2.11":
        sys.exit(f"nvtx {versions['nvtx']} is not recorded by nsys 2023.4; install nvtx==0.2.11")
    return versions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=sys.executable, help="interpreter with torch and nvtx==0.2.11")
    p.add_argument("--output", default=str(ROOT / "sample_reports" / "cpu_ddp"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--slow-iterations", default="20-29")
    p.add_argument("--slow-ms", type=float, default=40.0)
    p.add_argument("--nsys-version", default="2023.4")
    args = p.parse_args()

    versions = check_python(args.python)
    nsys_path = nsys_tool.setup_nsys(args.nsys_version, with_host=True, log=lambda m: print(m, file=sys.stderr))
    nsys = nsys_tool.find_nsys(str(nsys_path))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="cpu-ddp-home-"))
    script = home / "cpu_ddp_train.py"
    shutil.copy(HERE / "cpu_ddp_train.py", script)
    torchrun = Path(args.python).with_name("torchrun")
    job = [str(torchrun), "--nproc-per-node", str(args.ranks), "--master-addr", "127.0.0.1", "--master-port",
           str(port), str(script), "--steps", str(args.steps), "--slow-rank", str(args.slow_rank),
           "--slow-iterations", args.slow_iterations, "--slow-ms", str(args.slow_ms)]
    # `nsys-recipe profile` runs nsys once per rank inside torchrun, naming each report by its RANK; the
    # whole job runs in a clean environment, because every report records its process's environment
    clean_env = ["PATH=/usr/bin:/bin", f"HOME={home}", "LANG=C.UTF-8", "HOSTNAME=node0"]
    cmd = ["env", "-i", *clean_env, sys.executable, "-m", "nsys_recipe_pack.cli", "profile", "--output", str(out),
           "--trace", "nvtx", "--nsys", str(nsys.path), "--force-overwrite", "--", *job]
    print(" ".join(cmd), file=sys.stderr)
    started = time.time()
    res = subprocess.run(cmd, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed = res.returncode != 0 or any(not (out / f"rank{r}.nsys-rep").exists() for r in range(args.ranks))
    if failed:
        print(f"profiling failed (exit {res.returncode}):\n{res.stdout[-3000:]}", file=sys.stderr)
    shutil.rmtree(home, ignore_errors=True)
    for leftover in list(out.glob("*.qdstrm")) + list(out.glob("*.sqlite")):
        leftover.unlink()
    if failed:
        sys.exit(1)
    first, _, last = args.slow_iterations.partition("-")
    truth = {
        "what": "real Nsight Systems reports of a CPU-only torch data-parallel job (gloo all_reduce on 127.0.0.1)",
        "world_size": args.ranks,
        "steps": args.steps,
        "iteration_delimiter": "step",
        "child_ranges": ["dataloader", "forward", "backward", "allreduce", "optimizer"],
        "straggler": {
            "rank": args.slow_rank,
            "iterations": list(range(int(first), int(last or first) + 1)),
            "cause": "dataloader",
            "added_ms": args.slow_ms,
            "how": "time.sleep inside the dataloader range of that rank",
        },
        "nsys_version": nsys.version,
        "torch_version": versions["torch"],
        "nvtx_version": versions["nvtx"],
        "made_by": "scripts/make_cpu_samples.py",
        "seconds": round(time.time() - started, 1),
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"wrote {args.ranks} reports and truth.json to {out}")


if __name__ == "__main__":
    main()
