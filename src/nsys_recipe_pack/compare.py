"""`nsys-recipe diff`: load two runs, compare their metrics, write diff.parquet atomically."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from . import loader, runner
from .analyses import diff
from .notebook import render_report


def _load_run(spec: str, nsys_path: str | None) -> list:
    ranks = []
    for f in loader.expand_inputs([spec]):
        ranks.extend(loader.load_file(f, set(diff.NEEDS), nsys_path))
    return ranks


def diff_runs(base: str, new: str, output: str | None, tolerance: float = 5.0, force: bool = False,
              nsys_path: str | None = None):
    out = Path(output) if output else runner.default_output("diff")
    runner.check_output(out, force)
    table = diff.compare(diff.run_metrics(_load_run(base, nsys_path)), diff.run_metrics(_load_run(new, nsys_path)),
                         tolerance)
    staged = runner.staging_dir(out)
    try:
        table.to_parquet(staged / "diff.parquet", index=False)
        (staged / "analysis.json").write_text(json.dumps({
            "recipe": "diff", "base": base, "new": new, "tolerance_pct": tolerance,
            "verdicts": table["verdict"].value_counts().to_dict(), "gating": int(table["gates"].sum()),
        }, indent=1))
        render_report("diff", staged)
        runner.publish(staged, out, force)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return out, table
