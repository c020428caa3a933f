"""notebooks/quickstart.ipynb runs top to bottom, as a new user would run it in JupyterLab."""

import json

import nbformat
import pandas as pd
import papermill as pm
from conftest import CPU_SET, ROOT, SAMPLES

from nsys_recipe_pack.notebook import KERNEL


def test_quickstart_runs_end_to_end_and_finds_the_injected_straggler(tmp_path):
    out_nb = tmp_path / "quickstart.ipynb"
    pm.execute_notebook(str(ROOT / "notebooks" / "quickstart.ipynb"), str(out_nb), kernel_name=KERNEL,
                        parameters={"samples_dir": str(SAMPLES), "work_dir": str(tmp_path / "work")},
                        cwd=str(tmp_path), progress_bar=False)
    nb = nbformat.read(out_nb, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code)
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    last = code[-1]["outputs"][-1]["data"]["text/plain"]
    assert last.strip() == "True"  # load_output read back exactly what run_recipe returned

    # what the notebook computed, checked against the truth the sample set was made with
    truth = json.loads((CPU_SET / "truth.json").read_text())["straggler"]
    s = pd.read_parquet(tmp_path / "work" / "straggler" / "stragglers.parquet")
    hit = s[(s["rank"] == truth["rank"]) & s["iteration"].isin(truth["iterations"])]
    assert len(hit) == len(truth["iterations"])
    assert set(hit["cause"]) == {truth["cause"]}
    for sub in ("pace", "share"):
        assert (tmp_path / "work" / sub / "analysis.json").exists()
