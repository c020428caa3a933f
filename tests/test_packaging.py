"""A non-editable install carries recipes/ and notebooks/ and works outside the checkout."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT


def test_wheel_carries_recipes_and_notebooks_and_runs_outside_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, capture_output=True)
    (wheel,) = wheels.glob("nsys_recipe_pack-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for recipe_dir in (ROOT / "recipes").iterdir():
        for f in recipe_dir.iterdir():
            if f.suffix in (".py", ".json"):
                assert f"nsys_recipe_pack/_data/recipes/{recipe_dir.name}/{f.name}" in names
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        assert f"nsys_recipe_pack/_data/notebooks/{nb.name}" in names

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target))
    res = subprocess.run([sys.executable, str(target / "bin" / "nsys-recipe"), "list"], cwd=elsewhere, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "straggler_heatmap" in res.stdout
    res = subprocess.run([sys.executable, "-c", "from nsys_recipe_pack import resources; "
                          "print(resources.recipes_dir()); print(resources.notebooks_dir())"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    recipes, notebooks = (Path(x) for x in res.stdout.split())
    assert recipes.is_relative_to(target) and (recipes / "straggler_heatmap" / "metadata.json").exists()
    assert notebooks.is_relative_to(target)


def test_every_module_of_the_package_imports_on_its_own():
    """Whichever module a user imports first (`from nsys_recipe_pack import spill`), no import cycle breaks it:
    each is imported with none of the package loaded before it, in one process."""
    script = """
import importlib, pkgutil, sys
import nsys_recipe_pack
names = [m.name for m in pkgutil.walk_packages(nsys_recipe_pack.__path__, "nsys_recipe_pack.")]
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "nsys_recipe_pack" or m.startswith("nsys_recipe_pack.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {exc!r}")
print(len(names))
print("\\n".join(failed))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    count, *failed = res.stdout.strip().split("\n")
    assert int(count) > 30 and not [f for f in failed if f], failed
