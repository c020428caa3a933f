"""The thin bridge between NVIDIA's recipe framework and the pack: used only by `recipes/*/*.py`.

Only `recipe_class` imports `nsys_recipe`, and only when NVIDIA's framework loads a recipe; the analyses never do.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import driver, recipes, runner
from .errors import PackError
from .spill import remove_spilled


def add_recipe_options(parser, name: str) -> None:
    recipes.get(name).add_options(parser.add_recipe_argument, framework=True)


def nsys_of_framework() -> str | None:
    """The nsys that runs this framework: target-linux-x64/python/packages/nsys_recipe -> ../../../nsys."""
    mod = sys.modules.get("nsys_recipe")
    if mod is None or not getattr(mod, "__file__", None):
        return None
    candidate = Path(mod.__file__).resolve().parents[3] / "nsys"
    return str(candidate) if candidate.exists() else None


def run_in_framework(recipe, context, name: str) -> None:
    """Map with the framework's context, reduce and write with the pack's code."""
    options = {k: recipe.get_parsed_arg(k) for k in recipes.get(name).option_names()}
    options["skip_bad"] = bool(recipe.get_parsed_arg("skip_bad"))
    inputs = [str(p) for p in recipe.get_parsed_arg("input")]
    mapped = []
    try:
        mapped = context.wait(context.map(driver.map_file, inputs, recipe=name, options=options,
                                          nsys_path=nsys_of_framework(),
                                          spill_dir=str(recipe.get_output_dir())))
        tables, analysis = runner.reduce_all(name, mapped, options)
    except PackError as exc:
        remove_spilled(mapped)
        print(f"nsys-recipe-pack error: {exc} [exit {exc.exit_code}]", file=sys.stderr)
        where = os.environ.get(runner.ERROR_FILE_ENV)  # set by the pack's own runner.run_framework_engine
        if where:
            Path(where).write_text(json.dumps({"message": str(exc), "exit_code": exc.exit_code,
                                               "kind": type(exc).__name__}))
        raise SystemExit(exc.exit_code) from None
    out = Path(recipe.get_output_dir())
    analysis["engine"] = "nsys recipe"
    found = nsys_of_framework()
    if found:
        from .nsys_tool import _version_of

        analysis["nsys_version"] = _version_of(found)
    try:
        written = runner.write_tables(out, tables, analysis)
    finally:
        remove_spilled(mapped)
    for table in written.values():
        recipe.add_output_file(table, "Parquet")
    recipe.add_output_file("analysis.json", "JSON")
    notebook = recipes.get(name).notebook_path()
    if notebook.exists():
        recipe.create_notebook(notebook.name, dir_path=str(notebook.parent))
    recipe._analysis_dict.update({"InputFiles": inputs, "Outputs": recipe._output_files})
    recipe.create_analysis_file()


def recipe_class(name: str, module: str):
    """The `nsys_recipe.lib.recipe.Recipe` subclass for one pack recipe, to be bound in `recipes/<name>/<name>.py`.

    `module` is that file's module name: the framework finds metadata.json beside the class's module.
    """
    from nsys_recipe.lib import recipe
    from nsys_recipe.lib.args import Option

    def run(self, context):
        recipe.Recipe.run(self, context)
        run_in_framework(self, context, name)

    def get_argument_parser(cls):
        parser = super(new, cls).get_argument_parser()
        parser.add_recipe_argument(Option.INPUT, required=True)
        parser.add_recipe_argument(Option.OUTPUT)
        parser.add_recipe_argument(Option.FORCE_OVERWRITE)
        add_recipe_options(parser, name)
        parser.add_recipe_argument("--skip-bad", action="store_true",
                                   help="go on without unusable inputs, listing them in files.parquet")
        return parser

    class_name = "".join(part.capitalize() for part in name.split("_"))
    new = type(class_name, (recipe.Recipe,), {"run": run, "get_argument_parser": classmethod(get_argument_parser),
                                              "__module__": module, "__doc__": recipes.get(name).description})
    return new
