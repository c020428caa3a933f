"""`nsys-recipe report`: every recipe that has its data, over several runs, with notebooks, HTML and an index."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from . import progress, recipes, runner
from .errors import MissingToolError, MissingTraceError, PackError, UsageError, one_line
from .escape import html_text, terminal_text
from .inputs import expand_inputs, report_stem
from .notebook import PLOTLY_JS, execute_notebook, notebook_to_html
from .resources import notebook_path
from .staging import staged_output


def headline(recipe: str, out: Path) -> str:
    """One line with the number that matters most in this recipe's output."""
    said = recipes.get(recipe).headline
    return said(out) if said else ""


def _run_name(spec: str, taken: set) -> str:
    p = Path(spec)
    name = p.name if p.is_dir() else report_stem(p)
    base, i = name or "run", 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    taken.add(name)
    return name


def report(inputs: list[str], output: str, force: bool = False, nsys_path: str | None = None,
           log=print) -> Path:
    if not inputs:
        raise UsageError("no runs given; pass one report, export or folder per run")
    out = Path(output)
    runner.check_output(out, force)
    for spec in inputs:
        expand_inputs([spec])  # every run must name real inputs before anything is done
    started = datetime.now()
    with staged_output(out, force) as staged:
        taken: set = set()
        runs = [(spec, _run_name(spec, taken)) for spec in inputs]
        jobs = [(spec, name, recipe) for spec, name in runs for recipe in recipes.all_recipes()]
        results: list[dict] = []
        for spec, name, recipe in progress.iterate(jobs, total=len(jobs), desc="report"):
            target = staged / name / recipe
            row = {"run": name, "input": spec, "recipe": recipe}
            try:
                runner.run(recipe, [spec], str(target), report=True, nsys_path=nsys_path, options={},
                           log=lambda m: None, shared_js=staged / PLOTLY_JS)
                row.update(status=DONE, headline=headline(recipe, target))
            except MissingToolError:
                raise
            except Exception as exc:  # this recipe on this run only: every other page is still written
                shutil.rmtree(target, ignore_errors=True)
                row.update(status=status_of(exc), headline=one_line(exc))
                if row["status"] == FAILED:
                    log(terminal_text(f"report: {name}: {recipe} failed: {row['headline']}"))
            results.append(row)
        index = pd.DataFrame(results)
        for _, name in runs:
            run_dir = staged / name
            run_dir.mkdir(parents=True, exist_ok=True)
            index[index["run"] == name].to_parquet(run_dir / "recipes.parquet", index=False)
            with progress.step(f"{name}: overview page"):
                execute_notebook(notebook_path("overview"), run_dir, run_dir / "overview.ipynb")
                notebook_to_html(run_dir / "overview.ipynb", run_dir / "overview.html", shared_js=staged / PLOTLY_JS)
        index.to_parquet(staged / "index.parquet", index=False)
        (staged / "index.html").write_text(_index_html(index, runs, started))
    log(f"report: {out / 'index.html'}")
    failed = index[index["status"] == FAILED]
    if len(failed):
        raise RecipesFailed(f"{len(failed)} of {len(index)} recipe run(s) failed: "
                            + "; ".join(f"{r.run}/{r.recipe}" for r in failed.head(5).itertuples())
                            + (" ..." if len(failed) > 5 else "") + f" (see {out / 'index.html'})")
    return out


DONE, NOT_APPLICABLE, FAILED = "done", "not applicable", "failed"


class RecipesFailed(PackError):
    """Some recipes of a batch failed; the rest of the report was written (exit 1, so that CI notices)."""

    exit_code = 1


def status_of(exc: BaseException) -> str:
    """A recipe whose data the run lacks does not apply to it; anything else is a failure."""
    return NOT_APPLICABLE if isinstance(exc, MissingTraceError) else FAILED


def _index_html(index: pd.DataFrame, runs: list, started: datetime) -> str:
    e = html_text
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>nsys-recipe-pack report</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:6px 10px;vertical-align:top;text-align:left}"
             ".na{color:#888}.failed{color:#b00020}</style></head><body>",
             f"<h1>nsys-recipe-pack report</h1><p>{len(runs)} run(s), "
             f"made {e(started.strftime('%Y-%m-%d %H:%M'))}.</p>"]
    for spec, name in runs:
        parts.append(f"<h2>{e(name)}</h2><p>input: <code>{e(spec)}</code> — "
                     f"<a href='{e(quote(name))}/overview.html'>overview</a></p>"
                     "<table><tr><th>recipe</th><th>headline</th></tr>")
        for r in index[index["run"] == name].itertuples():
            if r.status == DONE:
                cell = f"<a href='{e(quote(name))}/{e(r.recipe)}/report.html'>{e(r.recipe)}</a>"
                parts.append(f"<tr><td>{cell}</td><td>{e(r.headline)}</td></tr>")
            else:
                kind = "failed" if r.status == FAILED else "na"
                parts.append(f"<tr class='{kind}'><td>{e(r.recipe)}</td><td>{e(r.status)}: {e(r.headline)}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts)

