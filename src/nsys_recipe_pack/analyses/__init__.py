"""The pack's recipes: what each needs from a report, its map (one rank) and reduce (all ranks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import straggler


@dataclass(frozen=True)
class RecipeSpec:
    name: str
    display_name: str
    description: str
    needs: frozenset
    map_rank: Callable
    reduce: Callable
    add_arguments: Callable  # add_arguments(add) with add(flag, **argparse kwargs)
    per_iteration: bool  # whether ranks must agree on one iteration delimiter


def _comma_list(text: str) -> list[str]:
    return [t for t in (x.strip() for x in text.split(",")) if t]


def _straggler_args(add) -> None:
    add("--iteration", metavar="NAME[@DOMAIN]", default=None,
        help="NVTX range that delimits iterations (default: found automatically)")
    add("--iteration-kernel", metavar="KERNEL", default=None,
        help="each launch of this kernel starts an iteration")
    add("--sync", metavar="NAME[,NAME]", type=_comma_list, default=None,
        help="extra NVTX range names that are sync points (collective names are matched anyway)")
    add("--threshold", type=float, default=straggler.DEFAULT_THRESHOLD,
        help="minimum excess busy time over the iteration's cross-rank median, as a fraction (default 0.1)")
    add("--sigma", type=float, default=straggler.DEFAULT_SIGMA,
        help="minimum excess in units of the run-wide robust noise scale (default 4)")


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
}
OPTION_NAMES = {
    "straggler_heatmap": ["iteration", "iteration_kernel", "sync", "threshold", "sigma"],
}


def get(name: str) -> RecipeSpec:
    from ..errors import UsageError

    try:
        return RECIPES[name]
    except KeyError:
        raise UsageError(f"unknown recipe {name!r}; `nsys-recipe list` shows the recipes") from None
