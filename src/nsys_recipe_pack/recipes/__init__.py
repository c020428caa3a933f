"""The pack's recipes, one module each, and the registry through which every command finds them.

A recipe module holds the analysis (`map_rank` over one rank's data, `reduce` across ranks, pure functions)
and, at its end, the `RECIPE` that declares everything else about it: its options, what it reads from a
report, the lines `run` prints, the headline `report` shows, the metrics `diff` tracks and its notebook.
A module added to this package is a recipe everywhere (CONTRIBUTING.md walks through one); another package
adds its own through the `nsys_recipe_pack.recipes` entry point group, or `register()` from Python.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..errors import UsageError

ENTRY_POINT_GROUP = "nsys_recipe_pack.recipes"


def no_options(add, framework: bool = False) -> None:
    return None


@dataclass(frozen=True)
class Metric:
    """A metric `nsys-recipe diff` compares. A time regresses when it grows by more than the tolerance in
    percent; a share (percent of a whole) when it moves the wrong way by more than the tolerance in points:
    up, except for the keys in `good_keys` (more compute is better)."""

    name: str
    words: str  # what it is, in the diff's reasons
    share: bool = False
    good_keys: tuple = ()
    always_tracked: bool = False  # tracked even when its keys are small against the metric's total
    new_is_bad: bool = False  # a value where the base run had none at all is a regression (a new straggler, a leak)


@dataclass(frozen=True)
class Recipe:
    name: str
    display_name: str
    description: str
    needs: frozenset  # report data it reads: nvtx, kernel, memcpy, memset, runtime, mpi, osrt
    map_rank: Callable  # map_rank(rank_data, options) -> dict, one rank
    reduce: Callable  # reduce(per_rank, options) -> {table name: DataFrame or Arrow table}
    # add_options(add, framework): add(*flags, **argparse keywords) once per option; framework is True under
    # `nsys recipe`, where a recipe may also accept the spelling of its built-in counterpart
    add_options: Callable = no_options
    per_iteration: bool = False  # whether ranks must agree on one iteration delimiter
    # whether its reduce reads the maps' tables when it needs them (spill.table_of): a run of many ranks then hands
    # it spill.StoredTable, never holding every rank's tables at once
    lazy_tables: bool = False
    needs_for: Callable | None = None  # needs_for(options): fewer needs for some options (read less)
    rows_for: Callable | None = None  # rows_for(options): need -> names, when only those rows are used
    # peak memory over one rank per event row read: measured on a 680 MB export (bench/RESULTS.md, huge reports)
    # with some margin; None: the default of inputs.rank_data
    bytes_per_row: int | None = None
    # inputs.chunks.Stream: for a long capture, a map that adds up span by span of time instead of whole tables
    stream: object | None = None
    summary: Callable | None = None  # summary(output folder) -> the lines `nsys-recipe run` prints
    headline: Callable | None = None  # headline(output folder) -> the one line of `nsys-recipe report`'s index
    # diff_metrics(ranks) -> DataFrame metric, key, value over one run's rank data (`nsys-recipe diff`), which
    # reads diff_needs; each metric it gives is described in `metrics`
    diff_metrics: Callable | None = None
    diff_needs: frozenset = frozenset()
    metrics: tuple = ()  # Metric of each metric diff_metrics gives
    # the module of its figures (imported only where figures are drawn): its overview(output folder) gives the
    # figures and tables of the recipe's section on `nsys-recipe report`'s overview page
    figures: str | None = None
    notebook: Path | None = None  # default: the pack's notebooks/<name>.ipynb

    def needs_given(self, options: dict) -> frozenset:
        return frozenset(self.needs_for(options)) if self.needs_for else frozenset(self.needs)

    def rows_given(self, options: dict) -> dict | None:
        return self.rows_for(options) if self.rows_for else None

    def parser(self, framework: bool = False) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=self.name, add_help=False)
        self.add_options(parser.add_argument, framework=framework)
        return parser

    def option_names(self) -> list[str]:
        return [action.dest for action in self.parser()._actions]

    def option_defaults(self) -> dict:
        return vars(self.parser().parse_args([]))

    def notebook_path(self) -> Path:
        if self.notebook is not None:
            return Path(self.notebook)
        from ..resources import notebook_path

        return notebook_path(self.name)


_REGISTRY: dict[str, Recipe] = {}
_discovered: list[bool] = []


def register(recipe: Recipe) -> Recipe:
    """Make a recipe known to every command (a name already taken is replaced: the last one wins)."""
    if not recipe.name.isidentifier():
        raise ValueError(f"recipe name {recipe.name!r}: use letters, digits and underscores (it names files)")
    _REGISTRY[recipe.name] = recipe
    return recipe


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def all_recipes() -> dict[str, Recipe]:
    """Every recipe: this package's modules in name order, then those of installed entry points."""
    if not _discovered:
        _discovered.append(True)
        for module in pkgutil.iter_modules(__path__):
            if not module.name.startswith("_"):
                register(importlib.import_module(f"{__name__}.{module.name}").RECIPE)
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            found = entry.load()
            register(getattr(found, "RECIPE", found))
    return dict(_REGISTRY)


def get(name: str) -> Recipe:
    try:
        return all_recipes()[name]
    except KeyError:
        raise UsageError(f"unknown recipe {name!r}; `nsys-recipe list` shows the recipes") from None


def comma_list(text: str) -> list[str]:
    return [t for t in (x.strip() for x in text.split(",")) if t]


def iteration_options(add) -> None:
    """--iteration and --iteration-kernel, for every recipe that works per iteration."""
    add("--iteration", metavar="NAME[@DOMAIN]", default=None,
        help="NVTX range that delimits iterations (default: found automatically)")
    add("--iteration-kernel", metavar="KERNEL", default=None,
        help="each launch of this kernel starts an iteration")


def parallel_option(add) -> None:
    add("--parallel", metavar="tp=T,pp=P,dp=D[,cp=C,ep=E][,order=...]", default=None,
        help="the job's parallel sizes (Megatron Core's rank order tp-cp-ep-dp-pp by default): the groups where the "
             "trace shows none or only guesses them from the NCCL kernels' timing; checked against NCCL's payloads")


def iteration_and_parallel_options(add, framework: bool = False) -> None:
    """--iteration, --iteration-kernel and --parallel: the options of a recipe over a parallel job's iterations."""
    iteration_options(add)
    parallel_option(add)


def ranked_times(per_rank: list[dict], table: str, shift: dict):
    """A map table (Arrow, with start_ns and end_ns) of every rank as one frame with a rank column, its times moved
    by `shift` (rank -> ns: onto the run's aligned clock, collective_match's Matched.shifts)."""
    import numpy as np
    import pyarrow as pa

    out = pa.concat_tables([r[table] for r in per_rank]).to_pandas()
    counts = [r[table].num_rows for r in per_rank]
    out["rank"] = np.repeat([r["rank"] for r in per_rank], counts).astype(np.int64)
    add = np.repeat([shift.get(r["rank"], 0) for r in per_rank], counts).astype(np.int64)
    for c in ("start_ns", "end_ns"):
        out[c] = out[c].astype(np.int64) + add
    return out


def ms_cell(ns) -> str:
    """Nanoseconds as milliseconds for a table cell ("" when missing)."""
    from ..lazy import pd

    return "" if pd.isna(ns) else f"{ns / 1e6:,.1f}"


def ms(ns) -> str:
    """Nanoseconds as milliseconds in a sentence."""
    return f"{ns / 1e6:,.1f} ms"


def indented(title: str, text: str) -> list[str]:
    """A title line and a table's text (DataFrame.to_string), indented under it."""
    return [title] + ["  " + line for line in text.splitlines()]
