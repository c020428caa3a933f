"""`nsys-recipe report`: every recipe that has its data, over several runs, with notebooks, HTML and an index."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from . import progress, recipes, runner
from .errors import MissingToolError, PackError, UsageError
from .escape import html_text
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
                row.update(status="done", headline=headline(recipe, target))
            except MissingToolError:
                raise
            except PackError as exc:
                shutil.rmtree(target, ignore_errors=True)
                row.update(status="not available", headline=str(exc))
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
    return out


def _index_html(index: pd.DataFrame, runs: list, started: datetime) -> str:
    e = html_text
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>nsys-recipe-pack report</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:6px 10px;vertical-align:top;text-align:left}"
             ".na{color:#888}</style></head><body>",
             f"<h1>nsys-recipe-pack report</h1><p>{len(runs)} run(s), "
             f"made {e(started.strftime('%Y-%m-%d %H:%M'))}.</p>"]
    for spec, name in runs:
        parts.append(f"<h2>{e(name)}</h2><p>input: <code>{e(spec)}</code> — "
                     f"<a href='{e(quote(name))}/overview.html'>overview</a></p>"
                     "<table><tr><th>recipe</th><th>headline</th></tr>")
        for r in index[index["run"] == name].itertuples():
            if r.status == "done":
                cell = f"<a href='{e(quote(name))}/{e(r.recipe)}/report.html'>{e(r.recipe)}</a>"
                parts.append(f"<tr><td>{cell}</td><td>{e(r.headline)}</td></tr>")
            else:
                parts.append(f"<tr class='na'><td>{e(r.recipe)}</td><td>not available: {e(r.headline)}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts)

