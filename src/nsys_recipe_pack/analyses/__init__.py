"""The pack's recipes: what each needs from a report, its map (one rank) and reduce (all ranks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import pace, proj, share, straggler, sync


@dataclass(frozen=True)
class RecipeSpec:
    name: str
    display_name: str
    description: str
    needs: frozenset
    map_rank: Callable
    reduce: Callable
    add_arguments: Callable  # add_arguments(add, framework) with add(*flags, **argparse kwargs)
    per_iteration: bool  # whether ranks must agree on one iteration delimiter
    needs_for: Callable | None = None  # needs_for(options): fewer needs for some options (read less)
    rows_for: Callable | None = None  # rows_for(options): need -> names, when only those rows are used
    # peak memory over one rank per event row read: measured on a 680 MB export (bench/RESULTS.md, huge reports)
    # with some margin; None: the loader's default
    bytes_per_row: int | None = None

    def needs_given(self, options: dict) -> frozenset:
        return frozenset(self.needs_for(options)) if self.needs_for else self.needs

    def rows_given(self, options: dict) -> dict | None:
        return self.rows_for(options) if self.rows_for else None


def _comma_list(text: str) -> list[str]:
    return [t for t in (x.strip() for x in text.split(",")) if t]


def _iteration_args(add) -> None:
    add("--iteration", metavar="NAME[@DOMAIN]", default=None,
        help="NVTX range that delimits iterations (default: found automatically)")
    add("--iteration-kernel", metavar="KERNEL", default=None,
        help="each launch of this kernel starts an iteration")


def _straggler_args(add, framework: bool = False) -> None:
    _iteration_args(add)
    add("--sync", metavar="NAME[,NAME]", type=_comma_list, default=None,
        help="extra NVTX range names that are sync points (collective names are matched anyway)")
    add("--threshold", type=float, default=straggler.DEFAULT_THRESHOLD,
        help="minimum excess busy time over the iteration's cross-rank median, as a fraction (default 0.1)")
    add("--sigma", type=float, default=straggler.DEFAULT_SIGMA,
        help="minimum excess in units of the run-wide robust noise scale (default 4)")


def _pace_args(add, framework: bool = False) -> None:
    # under `nsys recipe kernel_pace`, --name is accepted too, like the built-in cuda_gpu_kern_pace
    flags = ("--kernel", "--name") if framework else ("--kernel",)
    add(*flags, dest="kernel", metavar="KERNEL", default=None,
        help="one iteration per launch of this kernel (its short name), as cuda_gpu_kern_pace --name")
    _iteration_args(add)


def _proj_args(add, framework: bool = False) -> None:
    add("--attribution", choices=proj.ATTRIBUTIONS, default="process",
        help="process (default): GPU work launched by a thread with no NVTX range open counts for the ranges open "
             "on the other threads of its process (PyTorch's autograd thread); thread: the launching thread "
             "only, as Nsight Systems' nvtx_gpu_proj_trace")


def _no_args(add, framework: bool = False) -> None:
    return None


RECIPES = {
    "straggler_heatmap": RecipeSpec(
        name="straggler_heatmap",
        display_name="Straggler heatmap",
        description="Which rank holds the others back, in which iterations, and why (rank x iteration heatmap).",
        needs=frozenset(straggler.NEEDS),
        map_rank=straggler.map_rank,
        reduce=straggler.reduce,
        add_arguments=_straggler_args,
        per_iteration=True,
    ),
    "kernel_pace": RecipeSpec(
        name="kernel_pace",
        display_name="Kernel pace",
        description="How steadily each rank's iterations (or launches of one kernel) progress, and the lag "
                    "between ranks.",
        needs=frozenset(pace.NEEDS),
        map_rank=pace.map_rank,
        reduce=pace.reduce,
        add_arguments=_pace_args,
        per_iteration=True,
        needs_for=pace.needs_for,
        rows_for=pace.rows_for,
    ),
    "compute_memory_share": RecipeSpec(
        name="compute_memory_share",
        display_name="Compute vs memory share",
        description="How GPU time splits between compute, communication, copies by kind, memset and idle "
                    "(plain sums and exclusive wall time).",
        needs=frozenset(share.NEEDS),
        map_rank=share.map_rank,
        reduce=share.reduce,
        add_arguments=_no_args,
        per_iteration=False,
        bytes_per_row=260,  # 1.56 GB over 7.3 M rows
    ),
    "sync_summary": RecipeSpec(
        name="sync_summary",
        display_name="Sync summary",
        description="Where the host blocks on the GPU (device, stream, event syncs, synchronous and pageable "
                    "copies, memsets), inside which NVTX range, with findings.",
        needs=frozenset(sync.NEEDS),
        map_rank=sync.map_rank,
        reduce=sync.reduce,
        add_arguments=_no_args,
        per_iteration=False,
        bytes_per_row=260,  # 2.12 GB over 10.1 M rows
    ),
    "nvtx_gpu_proj": RecipeSpec(
        name="nvtx_gpu_proj",
        display_name="NVTX GPU projection",
        description="What each NVTX range costs on the GPU: its GPU ops projected onto it (start, end, busy "
                    "union), and whether the GPU or the CPU launch path bounds it.",
        needs=frozenset(proj.NEEDS),
        map_rank=proj.map_rank,
        reduce=proj.reduce,
        add_arguments=_proj_args,
        per_iteration=False,
        bytes_per_row=450,  # 3.82 GB over 10.1 M rows
    ),
}
OPTION_NAMES = {
    "straggler_heatmap": ["iteration", "iteration_kernel", "sync", "threshold", "sigma"],
    "kernel_pace": ["kernel", "iteration", "iteration_kernel"],
    "compute_memory_share": [],
    "sync_summary": [],
    "nvtx_gpu_proj": ["attribution"],
}


def get(name: str) -> RecipeSpec:
    from ..errors import UsageError

    try:
        return RECIPES[name]
    except KeyError:
        raise UsageError(f"unknown recipe {name!r}; `nsys-recipe list` shows the recipes") from None
