"""`nsys-recipe`: list, run, doctor, setup-nsys, synth."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

BLAS_THREADS = "OPENBLAS_NUM_THREADS"


def _numpy_with_one_blas_thread() -> None:
    """NumPy's OpenBLAS starts a thread per core when NumPy is imported, and they spin idle for a while: CPU time
    spent by every command, for a pack that makes no BLAS calls and runs workers of its own. A number the user set
    stays; the processes the pack starts (nsys, the job `profile` runs) get the environment as it was."""
    told = os.environ.get(BLAS_THREADS)
    os.environ[BLAS_THREADS] = told or "1"
    try:
        import numpy  # noqa: F401
    finally:
        if told is None:
            del os.environ[BLAS_THREADS]


_numpy_with_one_blas_thread()

from . import nsys_tool, recipes, resources  # noqa: E402
from .allocator import reuse_freed_memory, worker_env  # noqa: E402
from .errors import (  # noqa: E402
    EXIT_MISSING_TOOL,
    EXIT_USAGE,
    MissingToolError,
    MissingTraceError,
    PackError,
    UsageError,
    one_line,
)
from .escape import terminal_text  # noqa: E402
from .staging import STOP, staged_output  # noqa: E402

MODES = ["none", "concurrent", "dask-futures"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other usage error
        raise UsageError(f"{self.prog}: {message}")


def _comma_names(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError("empty recipe name")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nsys-recipe", description="Multi-rank Nsight Systems recipes and notebooks.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("list", help="list the pack's recipes")

    run = sub.add_parser("run", help="run a recipe over reports or exports")
    run.add_argument("inputs", nargs="*", metavar="INPUT",
                     help=".nsys-rep/.qdrep reports, .sqlite exports, *_pqtdir folders, folders or globs")
    run.add_argument("--name", required=True, type=_comma_names, help="recipe name, or a comma-separated list")
    run.add_argument("--input", dest="more_inputs", nargs="+", default=[], metavar="INPUT",
                     help="inputs, as `nsys recipe` takes them")
    run.add_argument("--output", default=None, help="output folder (default ./NAME-N)")
    run.add_argument("--force-overwrite", action="store_true", help="replace an existing output folder")
    run.add_argument("--mode", choices=MODES, default="concurrent", help="how ranks are processed")
    run.add_argument("--engine", choices=["pack", "nsys", "auto"], default="pack",
                     help="pack (default): the pack's own runner; nsys: through `nsys recipe` (reports only); "
                          "auto: `nsys recipe` for reports when an nsys with its recipe framework is found")
    run.add_argument("--report", action="store_true", help="also execute the notebook and write report.html")
    run.add_argument("--nsys", default=None, help="path of the nsys executable to use")
    run.add_argument("--jobs", type=int, default=None, help="parallel workers (default: the core count)")
    run.add_argument("--skip-bad", action="store_true",
                     help="go on without unusable inputs; each is listed with its reason in files.parquet")
    run.add_argument("--dask-scheduler", default=None, metavar="ADDRESS", help="scheduler for --mode dask-futures")
    _add_recipe_options(run)

    rep = sub.add_parser("report", help="every recipe with its data over one or more runs: notebooks, HTML, index")
    rep.add_argument("inputs", nargs="*", metavar="RUN", help="one report, export or folder of them per run")
    rep.add_argument("--output", required=True)
    rep.add_argument("--force-overwrite", action="store_true")
    rep.add_argument("--nsys", default=None)

    diff = sub.add_parser("diff", help="compare two runs; exit 1 when a tracked metric regresses")
    diff.add_argument("base", help="the base run: a report, an export, or a folder of them")
    diff.add_argument("new", help="the new run, the same way")
    diff.add_argument("--output", default=None, help="output folder (default ./diff-N)")
    diff.add_argument("--force-overwrite", action="store_true")
    diff.add_argument("--tolerance", type=float, default=5.0, metavar="PCT",
                      help="change that counts, in percent (percentage points for shares); default 5")
    diff.add_argument("--gate", action="append", default=[], metavar="METRIC=PCT",
                      help="a tolerance of its own for one metric (repeatable), or METRIC=off: it never fails the "
                           "comparison; metrics: recoverable_ns, median_iteration_ns, exposed_comm_ns, peak_bytes, ...")
    diff.add_argument("--fail-on-missing", action="store_true",
                      help="exit 1 when a recipe that ran on the base run could not run on the new one")
    diff.add_argument("--junit", default=None, metavar="FILE",
                      help="also write a JUnit XML report: one test case per tracked metric and key")
    diff.add_argument("--summary", default=None, metavar="FILE",
                      help="also write a Markdown summary (appended to $GITHUB_STEP_SUMMARY as well, when set)")
    diff.add_argument("--nsys", default=None)

    doctor = sub.add_parser("doctor", help="what nsys and packages the pack finds, and what is missing")
    doctor.add_argument("--nsys", default=None)

    setup = sub.add_parser("setup-nsys", help="fetch Nsight Systems from Debian's non-free archive")
    setup.add_argument("--version", default=nsys_tool.DEFAULT_VERSION, choices=sorted(nsys_tool.RELEASES))
    setup.add_argument("--with-host", action="store_true", help="also the host side, needed to make reports")

    prof = sub.add_parser("profile", help="profile every rank of a job into one report per rank: "
                                          "nsys-recipe profile --output DIR -- LAUNCHER ...")
    prof.add_argument("--output", required=True, help="folder for the reports (rank<N>.nsys-rep)")
    prof.add_argument("--trace", default=None, metavar="LIST",
                      help="nsys -t list (default cuda,nvtx,osrt; CUDA memory usage too where nsys supports it)")
    prof.add_argument("--iterations", default=None, metavar="A-B",
                      help="record only steps A to B (cudaProfilerApi capture range; drives Megatron-LM's "
                           "--profile-step-start/--profile-step-end)")
    prof.add_argument("--rank-var", default=None, metavar="VAR",
                      help="environment variable holding the rank (default: RANK for torchrun, SLURM_PROCID for "
                           "srun, OMPI_COMM_WORLD_RANK or PMI_RANK for mpirun)")
    prof.add_argument("--nsys-args", default="", metavar="ARGS",
                      help="more `nsys profile` options, one string; they replace the pack's own where they overlap")
    prof.add_argument("--dry-run", action="store_true", help="print the exact command and run nothing")
    prof.add_argument("--force-overwrite", action="store_true", help="write into a non-empty --output")
    prof.add_argument("--nsys", default=None)

    worker = sub.add_parser("dask-worker", help="a Dask worker that can run the pack's and NVIDIA's recipes")
    worker.add_argument("address", metavar="ADDRESS", help="the scheduler, e.g. tcp://node0:8786")
    worker.add_argument("--nworkers", type=int, default=1, help="worker processes (default 1)")
    worker.add_argument("--nthreads", type=int, default=1,
                        help="threads per worker process (default 1: the map step is CPU-bound Python)")
    worker.add_argument("--nsys", default=None, help="the nsys whose nsys_recipe package the worker imports")
    worker.add_argument("dask_args", nargs=argparse.REMAINDER, metavar="-- DASK_WORKER_OPTION",
                        help="further options for `dask worker`, after --")

    synth = sub.add_parser("synth", help="write SYNTHETIC exports with known stragglers (for tests, scale runs)")
    try:
        from . import synth as synth_mod

        synth_mod.add_arguments(synth)
    except ImportError:
        pass
    return p


def _add_recipe_options(run: argparse.ArgumentParser) -> None:
    """Every recipe's options on `run`, each flag once (several recipes share --iteration), none with a
    default: what was not given is absent, and each recipe fills in its own defaults (`_recipe_options`)."""
    group = run.add_argument_group("recipe options (each recipe takes only its own; `nsys-recipe list` names them)")
    seen: set[str] = set()

    def add(*flags, **kw):
        if flags[0] not in seen:
            seen.add(flags[0])
            group.add_argument(*flags, **{**kw, "default": argparse.SUPPRESS})

    for recipe in recipes.all_recipes().values():
        recipe.add_options(add)


def _builtins(nsys_path: str | None = None) -> dict:
    found = nsys_tool.find_nsys(nsys_path, required=False)
    return nsys_tool.builtin_recipes(str(found.path)) if found and found.recipe_python_path() else {}


def cmd_list(args) -> int:
    builtins = _builtins()
    ours = recipes.all_recipes()
    width = max(len(n) for n in [*ours, *builtins])
    for name, recipe in sorted(ours.items()):
        print(f"{name:<{width}}  {recipe.description}")
        flags = _flags(recipe)
        if flags:
            print(f"{'':<{width}}  options: {' '.join(flags)}")
    if builtins:
        print("\nNsight Systems' built-in recipes (run through `nsys recipe`):")
        for name, title in sorted(builtins.items()):
            if name not in ours:
                print(f"{name:<{width}}  [nsys built-in] {title}")
    return 0


def _flags(recipe) -> list[str]:
    return [action.option_strings[0] for action in recipe.parser()._actions]


def _recipe_options(args, names: list[str]) -> dict[str, dict]:
    """Each named recipe's options as given (runner.run fills in its defaults). A flag that none of the named
    recipes takes is a usage error naming the recipes that do."""
    ours = {name: recipes.get(name) for name in names if name in recipes.all_recipes()}
    given = {key for recipe in recipes.all_recipes().values() for key in recipe.option_names() if hasattr(args, key)}
    for key in sorted(given):
        if not any(key in recipe.option_names() for recipe in ours.values()):
            takers = [r for r in recipes.all_recipes().values() if key in r.option_names()]
            flag = next(a.option_strings[0] for a in takers[0].parser()._actions if a.dest == key)
            raise UsageError(f"{flag} is not an option of {', '.join(names)}; it is an option of "
                             f"{', '.join(r.name for r in takers)}")
    return {name: {k: getattr(args, k) for k in recipe.option_names() if k in given} for name, recipe in ours.items()}


def cmd_run(args) -> int:
    from . import runner, summary

    inputs = list(args.inputs) + list(args.more_inputs)
    names = args.name
    unknown = [n for n in names if n not in recipes.all_recipes()]
    builtins = _builtins(args.nsys) if unknown else {}
    for n in unknown:
        if n not in builtins:
            recipes.get(n)  # the one-line "unknown recipe" error
    if len(set(names)) != len(names):
        raise UsageError(f"--name lists a recipe twice: {','.join(names)}")
    options = _recipe_options(args, names)
    if args.dask_scheduler and args.mode != "dask-futures":
        raise UsageError("--dask-scheduler goes with --mode dask-futures")
    if len(names) == 1:
        _run_each(args, names, inputs, Path(args.output) if args.output else None, None, options)
        return 0
    # several recipes are one output: written into a hidden folder that becomes --output once they have all run,
    # so an interrupted run leaves nothing, and a finished one every recipe that could run
    base = Path(args.output) if args.output else runner.default_output("nsys-recipe")
    runner.check_output(base, args.force_overwrite)
    results = []
    with contextlib.suppress(_NothingWritten), staged_output(base, args.force_overwrite) as staged:
        results = _run_each(args, names, inputs, base, staged, options)
        if not any(status == "done" for _, status, _, _ in results):
            raise _NothingWritten
    return summary.print_recipe_table(results)


class _NothingWritten(Exception):
    """No recipe of a run of several could run: its output folder is not made."""


def _run_each(args, names: list[str], inputs: list[str], base: Path | None, staged: Path | None,
              options: dict[str, dict]) -> list[tuple[str, str, str, int]]:
    """Run the recipes one after another: (recipe, status, output or reason, exit code) of each. With several
    (written under `staged`, which becomes `base`), a recipe that cannot run does not stop the others."""
    from . import runner, summary

    results = []
    for name in names:
        output, shown = (staged / name, base / name) if staged is not None else (base, None)
        try:
            if name not in options:
                nsys = nsys_tool.find_nsys(args.nsys)
                out = runner.run_builtin(name, inputs, str(output) if output else None, force=args.force_overwrite,
                                         mode=args.mode, nsys=nsys, dask_scheduler=args.dask_scheduler)
                print(f"output: {shown or out}")
            else:
                given = {**options[name], "_dask_scheduler": args.dask_scheduler, "skip_bad": args.skip_bad}
                out = runner.run(name, inputs, str(output) if output else None, force=args.force_overwrite,
                                 mode=args.mode, engine=args.engine, report=args.report, nsys_path=args.nsys,
                                 jobs=args.jobs, options=given)
                summary.print_summary(name, out, shown)
            results.append((name, "done", str(shown or out), 0))
        except (UsageError, MissingToolError):
            raise  # the same for every recipe: nothing more can run
        except Exception as exc:
            if staged is None:
                raise
            said = one_line(exc)
            print(terminal_text(f"nsys-recipe: {name}: {said}"), file=sys.stderr)
            applies = not isinstance(exc, MissingTraceError)  # a missing trace: the recipe does not apply
            code = exc.exit_code if isinstance(exc, PackError) else 1
            results.append((name, "failed" if applies else "skipped", said, code if applies else 0))
    return results


def cmd_report(args) -> int:
    from . import report

    report.report(args.inputs, args.output, force=args.force_overwrite, nsys_path=args.nsys)
    return 0


def cmd_diff(args) -> int:
    from .diff import MIN_SHARE, by_time_moved, diff_runs, exit_code, most_moved, parse_gates

    gates = parse_gates(args.gate)
    try:
        out, table, missing = diff_runs(args.base, args.new, args.output, tolerance=args.tolerance,
                                        force=args.force_overwrite, nsys_path=args.nsys, gates=gates)
    except PackError as exc:  # the CI job's page and test report say so too
        _ci_outputs(args, gates, None, [], None, error=str(exc), code=exc.exit_code)
        raise
    code = exit_code(table, missing, args.fail_on_missing)
    _ci_outputs(args, gates, table, missing, out, code=code)

    gating = table[table["gates"]]
    for verdict, title in (("regressed", "slower"), ("improved", "faster")):
        rows = most_moved(table, verdict)
        if len(rows):
            print(f"{title}, by time moved (* decides the exit status):")
            for r in rows.itertuples():
                moved = (r.new - r.base) / 1e6
                print(terminal_text(f"  {'*' if r.gates else ' '} {r.metric:<20} {str(r.key)[:50]:<50} "
                                    f"{moved:+10.2f} ms {r.change_pct:+8.1f} %"))
    print(f"output: {out}")
    print(f"tracked: keys worth at least {MIN_SHARE:.0%} of their metric in either run, the shares of GPU time and "
          f"the median iteration; a tracked time that grows by more than {args.tolerance:g} % (a share that "
          f"moves the wrong way by more than {args.tolerance:g} points) fails the comparison"
          + ("; " + ", ".join(f"{k} {'off' if v is None else f'{v:g}'}" for k, v in gates.items()) if gates else ""))
    if missing:
        print(f"ran on the base run only: {', '.join(missing)}"
              + (" (fails the comparison: --fail-on-missing)" if args.fail_on_missing else ""))
    if len(gating):
        print(terminal_text(f"verdict: {len(gating)} tracked metric(s) regressed: "
                            + ", ".join(f"{r.key} ({r.change_pct:+.1f} %)"
                                        for r in by_time_moved(gating, 5).itertuples())))
    elif code:
        print(f"verdict: {', '.join(missing)} could not run on the new run (--fail-on-missing)")
    else:
        print(f"verdict: no tracked metric regressed by more than {args.tolerance:g} %")
    return code


def _ci_outputs(args, gates: dict, table, missing: list[str], out, error: str | None = None, code: int = 0) -> None:
    """`diff --junit`/`--summary` and $GITHUB_STEP_SUMMARY: what a CI system shows of the comparison."""
    from .diff import junit_xml, summary_markdown, write_text
    from .lazy import pd

    if table is None:
        table = pd.DataFrame(columns=["metric", "key", "base", "new", "change_pct", "verdict", "gates", "reason"])
        table["gates"] = table["gates"].astype(bool)
    if args.junit:
        write_text(Path(args.junit), junit_xml(table, missing, args.fail_on_missing, error))
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if args.summary or summary_file:
        text = summary_markdown(table, missing, args.fail_on_missing, args.base, args.new, args.tolerance, gates,
                                Path(out) / "report.html" if out is not None else None, error, code)
        if args.summary:
            write_text(Path(args.summary), text)
        if summary_file:
            write_text(Path(summary_file), text, append=True)


def cmd_doctor(args) -> int:
    ok = True
    try:
        nsys = nsys_tool.find_nsys(args.nsys)
        print(f"nsys: {nsys.path} (version {nsys.version}, found via {nsys.source})")
        framework = nsys.recipe_python_path()
        print(f"  recipe framework: {framework / 'nsys_recipe' if framework else 'missing'}")
        print(f"  host side (needed to make reports): {'present' if nsys.has_host_side else 'missing'}"
              + ("" if nsys.has_host_side else " -> nsys-recipe setup-nsys --with-host"))
    except PackError as exc:
        ok = False
        print(f"nsys: not found -> nsys-recipe setup-nsys ({exc})")
    print(f"python: {sys.executable} ({sys.version.split()[0]})")
    for mod, needed in [("numpy", True), ("pandas", True), ("pyarrow", True), ("psutil", True),
                        ("plotly", True), ("papermill", True), ("nbconvert", True), ("tqdm", True),
                        ("dask", False), ("distributed", False)]:
        try:
            m = importlib.import_module(mod)
            print(f"  {mod}: {getattr(m, '__version__', 'installed')}")
        except ImportError:
            ok = ok and not needed
            hint = ("pip install nsys-recipe-pack" if needed
                    else "pip install 'dask[distributed]' (for --mode dask-futures)")
            print(f"  {mod}: missing -> {hint}")
    print(f"recipes: {resources.recipes_dir()} (use NSYS_RECIPE_PATH={resources.recipes_dir()} nsys recipe NAME)")
    print(f"notebooks: {resources.notebooks_dir()}")
    print(f"export cache: {nsys_tool.cache_root() / 'exports'}")
    return 0 if ok else EXIT_MISSING_TOOL


def cmd_setup(args) -> int:
    path = nsys_tool.setup_nsys(args.version, with_host=args.with_host,
                                log=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0


def cmd_dask_worker(args) -> int:
    """Start `dask worker` with nsys_recipe and the pack's recipes importable, as `nsys recipe` tasks need."""
    from .runner import import_distributed

    import_distributed()
    paths = [str(resources.recipes_dir())]
    nsys = nsys_tool.find_nsys(args.nsys, required=False)
    if nsys is not None and nsys.recipe_python_path() is not None:
        paths.insert(0, str(nsys.recipe_python_path()))
    else:
        print("nsys-recipe: note: no nsys with a recipe framework found; this worker runs the pack's runner only "
              "(--engine pack)", file=sys.stderr)
    env = worker_env(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    if nsys is not None:
        env.setdefault("NSYS", str(nsys.path))
    extra = [a for a in args.dask_args if a != "--"]
    argv = [sys.executable, "-m", "distributed.cli.dask_worker", args.address, "--nworkers", str(args.nworkers),
            "--nthreads", str(args.nthreads), *extra]
    print("nsys-recipe: starting " + " ".join(argv[1:]), file=sys.stderr, flush=True)
    os.execve(sys.executable, argv, env)


def cmd_profile(args) -> int:
    import shlex

    from . import launch

    job = getattr(args, "job", None) or []
    if not job:
        raise UsageError("no job to profile: put the launch command after --, e.g. "
                         "nsys-recipe profile --output prof -- torchrun --nproc-per-node 8 train.py")
    nsys = nsys_tool.find_nsys(args.nsys)
    output = Path(args.output).absolute()
    plan = launch.plan_profile(job, output, str(nsys.path), trace=args.trace,
                               iterations=launch.parse_iterations(args.iterations), force=args.force_overwrite,
                               rank_var=args.rank_var, nsys_args=shlex.split(args.nsys_args),
                               cuda_memory=launch.supports_cuda_memory_usage(str(nsys.path)))
    for note in plan.notes:
        print(f"nsys-recipe: note: {note}", file=sys.stderr)
    if args.dry_run:
        print(plan.command_line)
        return 0
    if not nsys.has_host_side:
        raise MissingToolError(f"{nsys.path}: this nsys has no host side, so it cannot make reports; "
                               "run `nsys-recipe setup-nsys --with-host` or pass --nsys with a full install")
    launch.check_output_dir(output, args.force_overwrite)
    reports = launch.run_profile(plan, output, nsys.importer,
                                 log=lambda m: print(f"nsys-recipe: {m}", file=sys.stderr, flush=True))
    print(f"{len(reports)} report(s) in {output}:")
    for r in reports:
        print(f"  {r.name}")
    print(f"next: nsys-recipe run --name straggler_heatmap {shlex.quote(str(output))}")
    return 0


def cmd_synth(args) -> int:
    from . import synth

    return synth.main(args)


COMMANDS = {"list": cmd_list, "run": cmd_run, "diff": cmd_diff, "report": cmd_report, "doctor": cmd_doctor,
            "setup-nsys": cmd_setup, "synth": cmd_synth, "dask-worker": cmd_dask_worker, "profile": cmd_profile}


def _terminated(signum, frame):
    STOP.set()  # remembered: the exception below may land where Python drops it (staging.py)
    raise KeyboardInterrupt  # the same clean-up as Ctrl-C: no half-written output, no broken cache entry


@contextlib.contextmanager
def _stopped_by_signals():
    """SIGTERM, and Ctrl-C unless the shell had it ignored, stop the command through _terminated while it runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    STOP.clear()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, _terminated)
    if before[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, _terminated)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    with _stopped_by_signals():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        job = None
        if argv[:1] == ["profile"] and "--" in argv:  # everything after -- is the job, untouched
            cut = argv.index("--")
            argv, job = argv[:cut], argv[cut + 1:]
        args = build_parser().parse_args(argv)
        if job is not None:
            args.job = job
        if args.command in ("run", "report", "diff"):
            reuse_freed_memory()  # this process and the workers that fork from it; not a Python API caller's
        return COMMANDS[args.command](args)
    except PackError as exc:
        print(terminal_text(f"nsys-recipe: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("nsys-recipe: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other commands do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 141
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except Exception as exc:  # a bug: one line unless asked for the traceback
        if os.environ.get("NSYS_RECIPE_DEBUG"):
            traceback.print_exc()
        print(f"nsys-recipe: internal error: {type(exc).__name__}: {exc} "
              "(set NSYS_RECIPE_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return 1


def entry() -> None:
    """The `nsys-recipe` command: main(), then exit without tearing the interpreter down.

    Everything is written and flushed by then; freeing pandas' and Arrow's modules and objects one by one
    would only add time to every command.
    """
    code = main() or 0
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # a reader that went away, or a closed stream
        code = code or 1
    os._exit(code)


if __name__ == "__main__":
    entry()
