"""Execute a recipe's notebook against an output folder (papermill) and export HTML without code."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path

from . import resources
from .errors import MissingToolError, PackError

TEMPLATES = Path(__file__).resolve().parent / "templates"
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
            pm.execute_notebook(str(template), str(out_ipynb), parameters=params, kernel_name=KERNEL,
                                progress_bar=False, cwd=str(output_dir), log_output=False)
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


def notebook_to_html(ipynb: Path, html: Path, hide_code: bool = True) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(extra_template_basedirs=[str(TEMPLATES)], template_name="offline")
    exporter.exclude_input = hide_code
    exporter.exclude_input_prompt = hide_code
    exporter.exclude_output_prompt = hide_code
    body, _ = exporter.from_notebook_node(nbformat.read(str(ipynb), as_version=4))
    html.write_text(body, encoding="utf-8")
    return html


def render_report(recipe: str, output_dir: Path, parameters: dict | None = None) -> Path:
    """Executed notebook as output_dir/<recipe>.ipynb and its HTML as output_dir/report.html."""
    output_dir = Path(output_dir)
    executed = execute_notebook(resources.notebook_path(recipe), output_dir, output_dir / f"{recipe}.ipynb",
                                parameters)
    return notebook_to_html(executed, output_dir / "report.html")
