"""Execute a recipe's notebook against an output folder (papermill) and export HTML without code."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

from . import resources
from .errors import MissingToolError, PackError
from .escape import html_text

TEMPLATES = Path(__file__).resolve().parent / "templates"
PLOTLY_JS = "plotly.min.js"  # one copy per report folder, beside or above its pages
KERNEL = "python3"  # Jupyter runs the native kernel with this very interpreter (sys.executable)


def execute_notebook(template: Path, output_dir: Path, out_ipynb: Path, parameters: dict | None = None) -> Path:
    try:
        import papermill as pm
    except ImportError:
        raise MissingToolError("--report needs papermill and nbconvert: pip install papermill nbconvert") from None
    # relative to the executed notebook, which lies beside (or in) its output: it runs again from there in
    # JupyterLab after the staging folder has become the output folder, and still does once the folder moves
    params = {"output_dir": os.path.relpath(Path(output_dir).resolve(), Path(out_ipynb).resolve().parent),
              **(parameters or {})}
    logging.getLogger("papermill").setLevel(logging.WARNING)
    try:
        with _kernel_chatter_hidden():
            # written once, at the end (or where a cell fails): a figure of many cells makes every write take seconds
            pm.execute_notebook(str(template), str(out_ipynb), parameters=params, kernel_name=KERNEL,
                                progress_bar=False, cwd=str(output_dir), log_output=False,
                                request_save_on_cell_execute=False, autosave_cell_every=0)
    except pm.PapermillExecutionError as exc:
        raise PackError(f"{template.name}: cell {exc.exec_count} failed ({exc.ename}: {exc.evalue}); "
                        f"the executed notebook with the error is {out_ipynb}", 1) from None
    return out_ipynb


@contextlib.contextmanager
def _kernel_chatter_hidden():
    """The Jupyter kernel inherits our stderr and logs start/stop noise there; keep it unless a cell fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as log:
        os.dup2(log.fileno(), 2)
        show = False
        try:
            yield
        except KeyboardInterrupt:
            raise
        except BaseException:
            show = True  # a failing cell: what the kernel said may help
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if show:
                log.seek(0)
                tail = log.read().decode(errors="replace").strip().splitlines()[-20:]
                if tail:
                    print("\n".join(tail), file=sys.stderr)


PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"


def notebook_to_html(ipynb: Path, html: Path, hide_code: bool = True, shared_js: Path | None = None) -> Path:
    """HTML of an executed notebook without its code. With shared_js, the page and the notebook load plotly.js
    from that file (written there if missing) instead of each carrying its own 4.8 MB copy: a report folder
    holds one."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(extra_template_basedirs=[str(TEMPLATES)], template_name="offline")
    exporter.exclude_input = hide_code
    exporter.exclude_input_prompt = hide_code
    exporter.exclude_output_prompt = hide_code
    nb = nbformat.read(str(ipynb), as_version=4)
    body, _ = exporter.from_notebook_node(_html_outputs_only(nb))
    if shared_js is not None:
        body = _load_plotly_from(body, Path(html), Path(shared_js))
        changed = False
        for output in (o for cell in nb.cells for o in cell.get("outputs", [])):
            text = output.get("data", {}).get("text/html")
            if isinstance(text, str | list):  # JupyterLab draws plotly's own mimetype beside it
                lighter = _load_plotly_from("".join(text), Path(ipynb), Path(shared_js))
                changed |= lighter != "".join(text)
                output["data"]["text/html"] = lighter
        if changed:
            nbformat.write(nb, str(ipynb))
    html.write_text(body, encoding="utf-8")
    return html


def _html_outputs_only(nb):
    """The notebook without plotly's own mimetype beside each figure's HTML (the page shows the HTML): the exporter
    copies the notebook whole, and a heatmap's cells as JSON lists take it many times longer than as the one text."""
    import nbformat

    light = nbformat.from_dict({**nb, "cells": []})
    for cell in nb.cells:
        outputs = [{**o, "data": {k: v for k, v in o["data"].items() if k != PLOTLY_MIMETYPE}} if "data" in o else o
                   for o in cell.get("outputs", [])]
        light.cells.append(nbformat.from_dict({**cell, "outputs": outputs} if "outputs" in cell else cell))
    return light


@functools.lru_cache(maxsize=1)
def _plotly_js() -> str:
    """plotly.js as plots.show embeds it (read from plotly's package data, 4.8 MB: once per process)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _load_plotly_from(body: str, page: Path, shared_js: Path) -> str:
    """The HTML with its inline plotly.js (embedded by plots.show in the first figure) replaced by a script
    that loads the shared file, by a path relative to the page, so the folder still opens offline and moved."""
    js = _plotly_js()
    at = body.find(js)
    if at < 0:
        return body
    start, end = body.rfind("<script", 0, at), body.find("</script>", at + len(js)) + len("</script>")
    if not shared_js.exists():
        shared_js.parent.mkdir(parents=True, exist_ok=True)
        partial = shared_js.with_name(f".{shared_js.name}.{os.getpid()}")
        partial.write_text(js, encoding="utf-8")
        os.replace(partial, shared_js)
    src = quote(Path(os.path.relpath(shared_js.resolve(), page.resolve().parent)).as_posix())
    return body[:start] + f'<script charset="utf-8" src="{html_text(src)}"></script>' + body[end:]


def render_report(recipe: str, output_dir: Path, parameters: dict | None = None, shared_js: Path | None = None) -> Path:
    """Executed notebook as output_dir/<recipe>.ipynb and its HTML as output_dir/report.html, loading plotly.js
    from shared_js (default: plotly.min.js beside it)."""
    from . import recipes

    output_dir = Path(output_dir)
    known = recipes.all_recipes().get(recipe)  # else one of the commands' own notebooks (diff)
    template = known.notebook_path() if known else resources.notebook_path(recipe)
    executed = execute_notebook(template, output_dir, output_dir / f"{recipe}.ipynb", parameters)
    return notebook_to_html(executed, output_dir / "report.html", shared_js=shared_js or output_dir / PLOTLY_JS)
