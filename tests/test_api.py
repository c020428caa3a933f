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


def test_running_a_cell_again_replaces_the_earlier_output_but_nothing_else(tmp_path):
    from nsys_recipe_pack.errors import UsageError
    from nsys_recipe_pack.synth import Straggler, write_synthetic

    data = write_synthetic(tmp_path / "in", ranks=3, iterations=10, stragglers=[Straggler(1, 2, 5, "dataloader", 1.5)])
    first = run_recipe("straggler_heatmap", data, tmp_path / "out", mode="none")
    again = run_recipe("straggler_heatmap", data, tmp_path / "out", mode="none", threshold=0.5)
    assert again.analysis["threshold"] == 0.5 and first.analysis["threshold"] == 0.1
    assert len(again.tables["stragglers"]) < len(first.tables["stragglers"])  # the new settings, not the old
    with pytest.raises(UsageError, match="already exists"):
        run_recipe("straggler_heatmap", data, tmp_path / "out", mode="none", overwrite=False)
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me")
    with pytest.raises(UsageError, match="already exists"):  # not an output of the pack: left alone
        run_recipe("straggler_heatmap", data, mine, mode="none")
    assert (mine / "todo.txt").read_text() == "keep me"
    run_recipe("straggler_heatmap", data, mine, mode="none", overwrite=True)
    assert not (mine / "todo.txt").exists()
