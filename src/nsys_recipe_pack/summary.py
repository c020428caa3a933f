"""What `nsys-recipe run` prints when a recipe is done: the headline table and where things are."""

from __future__ import annotations

from pathlib import Path

from . import recipes
from .escape import terminal_text


def print_summary(recipe: str, out: Path, shown: Path | None = None) -> None:
    """The recipe's lines from its output `out`, and where it lies: `shown`, where it will be once the run ends."""
    lines = recipes.get(recipe).summary
    if lines is not None:
        for line in lines(out):
            print(terminal_text(line))
    print(f"output: {shown or out}")
    if (out / "report.html").exists():
        print(f"report: {(shown or out) / 'report.html'}")


def print_recipe_table(results: list[tuple[str, str, str, int]]) -> int:
    """After several recipes: what ran, what was skipped and why; the exit status of the whole run.

    0 when every recipe ran, or some ran and the others do not apply (their reports lack a trace they
    need); else the first failing recipe's exit status (3 for bad input), also when none ran."""
    print("recipes:")
    width = max(len(name) for name, *_ in results)
    for name, status, detail, _ in results:
        print(terminal_text(f"  {name:<{width}}  {status:<7}  {detail}"))
    ran = any(status == "done" for _, status, _, _ in results)
    failed = [code for _, status, _, code in results if status == "failed"]
    if failed:
        return failed[0]
    return 0 if ran else 3
