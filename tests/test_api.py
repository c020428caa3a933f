"""The Python API gives what the command line gives."""

import pandas as pd
import pandas.testing as pdt
import pytest
from conftest import CPU_SET

from nsys_recipe_pack import load_output, run_recipe
from nsys_recipe_pack.cli import main


def test_run_recipe_matches_the_command_line(tmp_path, nsys):
    res = run_recipe("straggler_heatmap", CPU_SET, tmp_path / "api", engine="pack", iteration="step")
    assert set(res.tables) == {"iterations", "ranks", "stragglers", "files"}
    assert res.analysis["delimiter"]["name"] == "step"
    assert main(["run", "--name", "straggler_heatmap", "--engine", "pack", "--iteration", "step", "--output",
                 str(tmp_path / "cli"), str(CPU_SET)]) == 0
    again = load_output(tmp_path / "cli")
    for t in ("iterations", "ranks", "stragglers"):
        pdt.assert_frame_equal(res.tables[t], again.tables[t])
    assert isinstance(res.tables["ranks"], pd.DataFrame) and res.tables["ranks"].iloc[0]["rank"] == 2


def test_unknown_option_and_missing_folder():
    with pytest.raises(TypeError, match="takes no option kernel"):
        run_recipe("straggler_heatmap", CPU_SET, kernel="x")
    with pytest.raises(FileNotFoundError):
        load_output("/nonexistent/folder")
