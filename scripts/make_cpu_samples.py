"""Make the pack's own real CPU-only multi-rank sample reports (sample_reports/cpu_ddp/).

Runs scripts/cpu_ddp_train.py as WORLD_SIZE ranks on 127.0.0.1, each under its own `nsys profile`
(NVTX trace only, so the files stay small), each in a clean environment (`env -i` with only what the
job needs, because a report records the profiled process's environment). One rank is made slow on
purpose; truth.json beside the reports says which, when and why.

    python3.11 -m venv /tmp/samples-venv
    /tmp/samples-venv/bin/pip install torch==2.13.0 nvtx==0.2.11
    .venv/bin/nsys-recipe setup-nsys --version 2023.4 --with-host
    .venv/bin/python scripts/make_cpu_samples.py --python /tmp/samples-venv/bin/python
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
    train = [args.python, str(script), "--steps", str(args.steps), "--slow-rank", str(args.slow_rank),
             "--slow-iterations", args.slow_iterations, "--slow-ms", str(args.slow_ms)]
    procs = []
    started = time.time()
    for rank in range(args.ranks):
        env = {
            "PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "RANK": str(rank),
            "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.ranks), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "HOSTNAME": "node0",
        }
        cmd = [str(nsys.path), "profile", "-t", "nvtx", "-s", "none", "--cpuctxsw=none",
               "--force-overwrite", "true", "-o", str(out / f"rank{rank}"), *train]
        print(f"rank {rank}: {' '.join(cmd)}", file=sys.stderr)
        procs.append(subprocess.Popen(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *cmd], cwd=home,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    failed = False
    for rank, proc in enumerate(procs):
        text, _ = proc.communicate()
        if proc.returncode != 0 or not (out / f"rank{rank}.nsys-rep").exists():
            failed = True
            print(f"rank {rank} failed (exit {proc.returncode}):\n{text[-3000:]}", file=sys.stderr)
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
