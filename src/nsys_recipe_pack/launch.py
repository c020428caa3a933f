"""`nsys-recipe profile`: wrap a multi-rank launch so that every rank writes its own report, named by its rank.

nsys expands `%q{VAR}` in its output name from its own environment, so nsys must run *inside* the launcher,
once per rank, where the launcher has set the rank variable: `torchrun ... --no-python nsys profile ...
python train.py`, `srun ... nsys profile ... ./app`, `mpirun ... nsys profile ... ./app`. Building the
command is pure (`plan_profile`); only `run_profile` starts anything.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BadInputError, MissingToolError, PackError, UsageError

DEFAULT_TRACE = "cuda,nvtx,osrt"
# Sampling and context switches are not read by any recipe; off, the reports stay small and the job fast.
DEFAULT_QUIET = ["--sample=none", "--cpuctxsw=none"]

RANK_VARS = {"torchrun": "RANK", "srun": "SLURM_PROCID", "openmpi": "OMPI_COMM_WORLD_RANK", "mpich": "PMI_RANK"}

# Launcher options that take a value (the next word unless written --opt=value); everything else is a flag.
TORCHRUN_VALUE_OPTIONS = {
    "--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint",
    "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--max-restarts", "--max_restarts",
    "--monitor-interval", "--monitor_interval", "--start-method", "--start_method", "--event-log-handler",
    "--event_log_handler", "--role", "--log-dir", "--log_dir", "-r", "--redirects", "-t", "--tee",
    "--local-ranks-filter", "--local_ranks_filter", "--duplicate-stdout-filters", "--duplicate_stdout_filters",
    "--duplicate-stderr-filters", "--duplicate_stderr_filters", "--node-rank", "--node_rank", "--master-addr",
    "--master_addr", "--master-port", "--master_port", "--local-addr", "--local_addr", "--logs-specs",
    "--logs_specs", "--numa-binding", "--numa_binding", "--signals-to-handle", "--signals_to_handle",
    "--shutdown-timeout", "--shutdown_timeout",
}
TORCHRUN_FLAGS = {"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                  "--virtual-local-rank", "--virtual_local_rank"}
SRUN_VALUE_OPTIONS = {
    "-n", "--ntasks", "-N", "--nodes", "-c", "--cpus-per-task", "-p", "--partition", "-A", "--account", "-t",
    "--time", "-J", "--job-name", "-o", "--output", "-e", "--error", "-i", "--input", "-G", "--gpus",
    "--gpus-per-node", "--gpus-per-task", "--ntasks-per-node", "--ntasks-per-gpu", "--mem", "--mem-per-cpu",
    "--mem-per-gpu", "-w", "--nodelist", "-x", "--exclude", "--mpi", "--cpu-bind", "--gpu-bind", "-m",
    "--distribution", "--export", "-D", "--chdir", "-q", "--qos", "--reservation", "-C", "--constraint", "-d",
    "--dependency", "--jobid", "--het-group", "--network", "--cpu-freq", "--gres", "--container-image",
    "--container-mounts", "--container-workdir", "--container-name", "--time-min", "--signal", "--hint",
}
SRUN_FLAGS = {"-l", "--label", "--exclusive", "--overlap", "-u", "--unbuffered", "-K", "--kill-on-bad-exit",
              "-v", "--verbose", "-Q", "--quiet", "--pty", "-X", "--disable-status", "--exact", "-O",
              "--overcommit", "--container-remap-root", "--no-container-mount-home"}
MPIRUN_VALUE_OPTIONS = {
    "-n", "-np", "--n", "--np", "-c", "-H", "--host", "-host", "-hosts", "-hostfile", "--hostfile", "-machinefile",
    "--machinefile", "-f", "--map-by", "-map-by", "--bind-to", "-bind-to", "--rank-by", "-rank-by", "-x",
    "-wdir", "--wdir", "-npernode", "--npernode", "-ppn", "--ppn", "-N", "--prefix", "--output-filename",
    "--rankfile", "-rf", "--cpus-per-proc", "--cpus-per-rank", "-launcher", "-iface", "--display",
    "--pmixmca", "--app",
}
MPIRUN_TWO_VALUE_OPTIONS = {"--mca", "-mca", "--gmca", "-gmca", "-genv", "-env", "--prtemca", "--pmixmca"}
MPIRUN_FLAGS = {"--oversubscribe", "-oversubscribe", "--allow-run-as-root", "--tag-output", "-tag-output",
                "--report-bindings", "-report-bindings", "-q", "--quiet", "-v", "--verbose", "-genvall",
                "-genvnone", "--timestamp-output", "--merge-stderr-to-stdout", "--noprefix", "-l", "-prepend-rank"}

# nsys profile options the pack sets; a user's own `--nsys-args` replace them
OWN_OPTIONS = {"trace": {"-t", "--trace"}, "sample": {"-s", "--sample"}, "cpuctxsw": {"--cpuctxsw"},
               "cuda_memory": {"--cuda-memory-usage"}, "capture": {"-c", "--capture-range"},
               "capture_end": {"--capture-range-end"}, "output": {"-o", "--output"},
               "overwrite": {"-f", "--force-overwrite"}}
MEGATRON_SCRIPT = re.compile(r"(^|/)pretrain_[A-Za-z0-9_]+\.py$")


@dataclass
class ProfilePlan:
    launcher: str  # torchrun, srun, mpirun (openmpi or mpich), or "none"
    argv: list[str]
    rank_var: str | None
    output_pattern: str
    notes: list[str] = field(default_factory=list)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)


def parse_iterations(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not m or int(m.group(1)) >= int(m.group(2)):
        raise UsageError(f"--iterations {text!r}: expected A-B with whole numbers A < B, e.g. 10-12")
    return int(m.group(1)), int(m.group(2))


def launcher_kind(command: list[str]) -> str:
    exe = Path(command[0]).name
    if exe == "torchrun" or (len(command) > 2 and command[1] == "-m"
                             and command[2] in ("torch.distributed.run", "torch.distributed.launch")):
        return "torchrun"
    if exe == "srun":
        return "srun"
    if exe in ("mpirun", "mpiexec", "orterun", "prterun", "mpiexec.hydra"):
        return "mpirun"
    return "none"


def split_launcher(command: list[str], value_opts: set, flags: set, two_value: frozenset | set = frozenset(),
                   start: int = 1) -> int:
    """Index of the program in `command`: the first word after the launcher's own options."""
    i = start
    while i < len(command):
        word = command[i]
        if word == "--":
            return i + 1
        if not word.startswith("-") or word == "-":
            return i
        name = word.split("=", 1)[0]
        if "=" in word or name in flags:
            i += 1
        elif name in two_value:
            i += 3
        elif name in value_opts:
            i += 2
        elif len(word) > 2 and not word.startswith("--") and word[:2] in value_opts:
            i += 1  # a short option with its value attached, -n4
        else:
            raise UsageError(f"{Path(command[0]).name} option {word}: cannot tell whether it takes a value; "
                             f"write it as {name}=VALUE (or report the option so it can be added)")
    raise UsageError(f"{shlex.join(command)}: no program to run after the launcher's options")


def mpi_flavour(launcher: str, which=shutil.which, run=subprocess.run) -> tuple[str, str | None]:
    """Open MPI or MPICH-like (Hydra, Intel MPI), from `LAUNCHER --version`; a note when it cannot tell."""
    path = which(launcher)
    if path is None:
        return "openmpi", f"{launcher} not found here; assuming Open MPI ({RANK_VARS['openmpi']}); pass --rank-var"
    try:
        res = run([path, "--version"], capture_output=True, text=True, timeout=20)
        text = res.stdout + res.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    if re.search(r"Open MPI|OpenRTE|open-mpi|PRRTE", text):
        return "openmpi", None
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI|MVAPICH", text, re.IGNORECASE):
        return "mpich", None
    return "openmpi", f"could not tell which MPI {launcher} is; assuming Open MPI ({RANK_VARS['openmpi']})"


def interpreter_of(launcher_path: str | None) -> str:
    """The Python a `torchrun` script runs its workers with: the one in its #! line."""
    if launcher_path:
        try:
            with open(launcher_path, "rb") as fh:
                first = fh.readline().decode(errors="replace").strip()
            if first.startswith("#!"):
                words = shlex.split(first[2:])
                if words and "python" in Path(words[-1]).name:
                    return words[-1]
                if words and Path(words[0]).name.startswith("python"):
                    return words[0]
        except OSError:
            pass
    return sys.executable


def _option_names(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("-")}


def nsys_profile_args(nsys: str, output_pattern: str, trace: str | None, capture: bool, force: bool,
                      cuda_memory: bool, extra: list[str]) -> list[str]:
    user = _option_names(extra)
    trace = trace or DEFAULT_TRACE

    def mine(key: str) -> bool:
        return not (OWN_OPTIONS[key] & user)

    args = [nsys, "profile"]
    if mine("trace"):
        args += ["--trace", trace]
    if mine("sample"):
        args.append(DEFAULT_QUIET[0])
    if mine("cpuctxsw"):
        args.append(DEFAULT_QUIET[1])
    if cuda_memory and mine("trace") and "cuda" in trace.split(",") and mine("cuda_memory"):
        args.append("--cuda-memory-usage=true")
    if capture and mine("capture"):
        args.append("--capture-range=cudaProfilerApi")
        if mine("capture_end"):
            args.append("--capture-range-end=stop")
    if force and mine("overwrite"):
        args += ["--force-overwrite", "true"]
    if mine("output"):
        args += ["--output", output_pattern]
    return args + extra


def plan_profile(command: list[str], output: Path, nsys: str, *, trace: str | None = None,
                 iterations: tuple[int, int] | None = None, force: bool = False, rank_var: str | None = None,
                 nsys_args: list[str] | None = None, cuda_memory: bool = True, which=shutil.which,
                 run=subprocess.run) -> ProfilePlan:
    """The exact command that profiles every rank of `command` into `output`/rank<N>.nsys-rep."""
    if not command:
        raise UsageError("no job to profile: put the launch command after --, e.g. "
                         "nsys-recipe profile --output prof -- torchrun --nproc-per-node 8 train.py")
    kind = launcher_kind(command)
    notes: list[str] = []
    launcher = kind
    if kind == "torchrun":
        start = 3 if Path(command[0]).name != "torchrun" else 1
        at = split_launcher(command, TORCHRUN_VALUE_OPTIONS, TORCHRUN_FLAGS, start=start)
        opts, program = command[:at], command[at:]
        no_python = any(o in ("--no-python", "--no_python") for o in opts[start:])
        module = any(o in ("-m", "--module") for o in opts[start:])
        if not no_python:
            python = command[0] if start == 3 else interpreter_of(which(command[0]) or command[0])
            opts = opts[:start] + [o for o in opts[start:] if o not in ("-m", "--module")] + ["--no-python"]
            program = [python, "-m", *program] if module else [python, *program]
        var = rank_var or RANK_VARS["torchrun"]
    elif kind in ("srun", "mpirun"):
        if kind == "srun":
            at = split_launcher(command, SRUN_VALUE_OPTIONS, SRUN_FLAGS)
            var = rank_var or RANK_VARS["srun"]
        else:
            at = split_launcher(command, MPIRUN_VALUE_OPTIONS, MPIRUN_FLAGS, MPIRUN_TWO_VALUE_OPTIONS)
            flavour, note = (None, None) if rank_var else mpi_flavour(command[0], which, run)
            if note:
                notes.append(note)
            var = rank_var or RANK_VARS[flavour]
            launcher = f"mpirun ({flavour})" if flavour else "mpirun"
        opts, program = command[:at], command[at:]
    else:
        opts, program, var = [], command, rank_var
        notes.append("no torchrun, srun or mpirun in front: one report for the whole process tree "
                     "(the pack makes one rank per process that did GPU or NVTX work)")
    if not program:
        raise UsageError(f"{shlex.join(command)}: no program to run after the launcher's options")
    name = f"rank%q{{{var}}}" if var else "report"
    pattern = str(output / name)
    if iterations:
        first, last = iterations
        if any(MEGATRON_SCRIPT.search(w) for w in program):
            if "--profile-step-start" not in program:
                program = [*program, *([] if "--profile" in program else ["--profile"]),
                           "--profile-step-start", str(first), "--profile-step-end", str(last)]
            if "--profile-ranks" not in program:
                world = _torchrun_world_size(opts) if kind == "torchrun" else None
                if world:
                    program = [*program, "--profile-ranks", *map(str, range(world))]
                else:
                    notes.append("Megatron-LM profiles only the ranks in --profile-ranks (rank 0 by default): "
                                 "add --profile-ranks with every rank to profile")
        else:
            notes.append(f"capture window: nsys records from cudaProfilerStart to cudaProfilerStop; the program "
                         f"must call them at steps {first} and {last} (torch.cuda.profiler.start()/stop())")
    profile = nsys_profile_args(nsys, pattern, trace, bool(iterations), force, cuda_memory, list(nsys_args or []))
    return ProfilePlan(launcher, [*opts, *profile, *program], var, pattern, notes)


def _torchrun_world_size(opts: list[str]) -> int | None:
    def value(names: set) -> str | None:
        for i, o in enumerate(opts):
            key, eq, val = o.partition("=")
            if key in names:
                return val if eq else (opts[i + 1] if i + 1 < len(opts) else None)
        return None

    per_node = value({"--nproc-per-node", "--nproc_per_node"})
    nodes = value({"--nnodes"}) or "1"
    if per_node and per_node.isdigit() and nodes.isdigit():
        return int(per_node) * int(nodes)
    return None


def supports_cuda_memory_usage(nsys: str) -> bool:
    try:
        res = subprocess.run([nsys, "profile", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--cuda-memory-usage" in res.stdout + res.stderr


def check_output_dir(output: Path, force: bool) -> None:
    if output.exists() and not output.is_dir():
        raise UsageError(f"{output}: exists and is not a folder; choose another --output")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise UsageError(f"{output}: folder is not empty; pass --force-overwrite to replace the reports in it "
                         "or choose another --output")


def run_profile(plan: ProfilePlan, output: Path, importer: Path | None = None, log=print) -> list[Path]:
    """Run the planned job; return the reports it wrote (one per rank).

    nsys now and then exits with a rank's capture left unimported (a `.qdstrm` and no `.nsys-rep`); `importer`
    (nsys' own QdstrmImporter) then finishes it, so that no rank goes missing without a word.
    """
    output.mkdir(parents=True, exist_ok=True)
    log(f"running: {plan.command_line}")
    try:
        code = subprocess.call(plan.argv)
    except FileNotFoundError as exc:
        raise MissingToolError(f"{exc.filename}: not found; is the launcher on PATH?") from None
    unimported = import_leftovers(output, importer, log)
    reports = sorted(output.glob("*.nsys-rep"))
    unexpanded = [r for r in reports if "%q{" in r.name]
    if unexpanded:
        raise BadInputError(f"{unexpanded[0]}: ${plan.rank_var} was not set where nsys ran, so the ranks' reports "
                            "overwrote each other; pass --rank-var with the variable your launcher sets")
    if code != 0 or unimported:
        raise PackError("; ".join([*([f"the job exited with code {code}"] if code else []),
                                   *(f"{u} (the capture is kept)" for u in unimported),
                                   f"{len(reports)} report(s) in {output}"]), 1)
    if not reports:
        raise BadInputError(f"{output}: the job ran but no report was written; an nsys without its host side "
                            "cannot make reports (run `nsys-recipe setup-nsys --with-host`)")
    return reports


def import_leftovers(output: Path, importer: Path | None, log=print) -> list[str]:
    """Turn each capture nsys left unimported in `output` into its report; return what failed, one text each."""
    failed = []
    for capture in sorted(output.glob("*.qdstrm")):
        report = capture.with_suffix(".nsys-rep")
        if report.exists():
            capture.unlink()
            continue
        if importer is None or not importer.exists():
            failed.append(f"{capture.name}: no QdstrmImporter to import it with")
            continue
        log(f"{capture.name}: nsys left this capture unimported; importing it")
        res = subprocess.run([str(importer), "--input-file", str(capture)], capture_output=True, text=True)
        if res.returncode == 0 and report.exists():
            capture.unlink()
            continue
        said = (res.stderr.strip() or res.stdout.strip()).splitlines()
        why = said[-1].strip() if said else f"exit code {res.returncode}"
        failed.append(f"{capture.name}: nsys left it unimported and importing it failed ({why})")
    return failed
