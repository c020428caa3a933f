"""The same tables whichever Nsight Systems exports the reports and runs the recipe framework: 2023.4 and 2024.2."""

import shutil

import pandas as pd
import pandas.testing as pdt
import pytest
from conftest import CPU_SET, MPI_SET

from nsys_recipe_pack import nsys_tool, runner

NSYS_CACHE = nsys_tool.cache_root() / "nsys"  # read at collection, before the tests' own cache is set

RUNS = [
    ("straggler_heatmap", MPI_SET, {"iteration_kernel": "jacobi_kernel"}),
    ("straggler_heatmap", CPU_SET, {}),
    ("kernel_pace", MPI_SET, {"kernel": "jacobi_kernel"}),
    ("nvtx_gpu_proj", MPI_SET, {}),
    ("sync_summary", MPI_SET, {}),
    ("compute_memory_share", MPI_SET, {}),
]


@pytest.fixture(scope="module")
def versions():
    """Both releases as `make test` sets them up (setup-nsys --version 2023.4 and 2024.2)."""
    found = {}
    for v in ("2023.4", "2024.2"):
        path = NSYS_CACHE / v / "target-linux-x64" / "nsys"
        assert path.exists(), f"run `nsys-recipe setup-nsys --version {v}` (make test does)"
        found[v] = str(path)
    return found


@pytest.mark.parametrize("recipe,data,options", RUNS, ids=[f"{r[0]}-{r[1].name}" for r in RUNS])
def test_identical_tables_under_both_versions(tmp_path, versions, recipe, data, options):
    copy = tmp_path / "in"
    shutil.copytree(data, copy)
    outs = {}
    for v, nsys_path in versions.items():
        outs[v] = runner.run(recipe, [str(copy)], str(tmp_path / f"out-{v}"), engine="nsys", nsys_path=nsys_path,
                             options=options, log=lambda m: None)
    tables = sorted(p.name for p in outs["2023.4"].glob("*.parquet"))
    assert tables == sorted(p.name for p in outs["2024.2"].glob("*.parquet"))
    for t in tables:
        a, b = (pd.read_parquet(outs[v] / t) for v in versions)
        pdt.assert_frame_equal(a, b, obj=t)
