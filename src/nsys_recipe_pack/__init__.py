"""nsys-recipe-pack: multi-rank Nsight Systems recipes, Parquet tables and notebooks.

    from nsys_recipe_pack import run_recipe, load_output
    res = run_recipe("straggler_heatmap", "sample_reports/cpu_ddp", iteration="step")
    res.tables["ranks"]
"""

__version__ = "0.1.0"


def run_recipe(*args, **kwargs):
    from .api import run_recipe as _run

    return _run(*args, **kwargs)


def load_output(*args, **kwargs):
    from .api import load_output as _load

    return _load(*args, **kwargs)


__all__ = ["run_recipe", "load_output", "__version__"]
