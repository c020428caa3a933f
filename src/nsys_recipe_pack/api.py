"""The Python API for notebooks: run a recipe as the command line does, or read a finished output folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import recipes, runner
from .errors import UsageError


@dataclass
class RecipeOutput:
    output_dir: Path
    tables: dict = field(default_factory=dict)  # one DataFrame per Parquet file, by file stem
    analysis: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {len(v)} rows" for k, v in self.tables.items())
        return f"RecipeOutput({str(self.output_dir)!r}; {shapes})"


def load_output(output_dir) -> RecipeOutput:
    out = Path(output_dir)
    if not out.is_dir():
        raise FileNotFoundError(f"{out}: no such output folder")
    tables = {p.stem: pd.read_parquet(p) for p in sorted(out.glob("*.parquet"))}
    analysis_file = out / "analysis.json"
    analysis = json.loads(analysis_file.read_text()) if analysis_file.exists() else {}
    return RecipeOutput(out, tables, analysis)


def run_recipe(name: str, inputs, output=None, *, overwrite: bool | None = None, force_overwrite: bool = False,
               mode: str = "concurrent", engine: str = "pack", report: bool = False, nsys: str | None = None,
               jobs: int | None = None, skip_bad: bool = False, dask_scheduler: str | None = None,
               **options) -> RecipeOutput:
    """`nsys-recipe run --name NAME INPUT...` from Python; recipe options as keywords (iteration="step").

    Running a cell again should just work: by default (`overwrite=None`) an output folder that holds an
    earlier output of the pack is replaced once the new one is complete, and any other existing folder is
    left alone with an error; `overwrite=True` replaces whatever is there (`force_overwrite=True`, as on the
    command line, means the same); `overwrite=False` never replaces."""
    recipe = recipes.get(name)
    allowed = set(recipe.option_names())
    unknown = set(options) - allowed
    if unknown:
        raise TypeError(f"{name} takes no option {', '.join(sorted(unknown))}; "
                        f"it takes {', '.join(sorted(allowed)) or 'none'}")
    opts = dict(options)  # runner.run fills in the recipe's defaults
    opts["skip_bad"] = skip_bad
    opts["_dask_scheduler"] = dask_scheduler
    inputs = [str(inputs)] if isinstance(inputs, (str, Path)) else [str(i) for i in inputs]
    force = bool(force_overwrite or overwrite or (overwrite is None and output is not None
                                                  and _earlier_output(Path(output))))
    if output is not None and Path(output).exists() and not force:
        raise UsageError(f"{output}: already exists" + (" and overwrite=False keeps it" if overwrite is False else
                         " and is not an output of the pack; pass overwrite=True to replace it")
                         + ", or choose another output folder")
    out = runner.run(name, inputs, str(output) if output else None, force=force, mode=mode, engine=engine,
                     report=report, nsys_path=nsys, jobs=jobs, options=opts, log=lambda m: None)
    return load_output(out)


def _earlier_output(folder: Path) -> bool:
    """Whether folder is what a run of the pack left: its analysis.json beside its Parquet tables."""
    return (folder / "analysis.json").is_file() and any(folder.glob("*.parquet"))
