"""notebooks/analysis.ipynb runs top to bottom against a copy of the fixture results, as CI runs it."""

import shutil
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"
FIXTURE = Path(__file__).parent / "fixtures" / "results"


def _text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_analysis_notebook_runs_on_the_fixture(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    monkeypatch.setenv("SPECBENCH_RESULTS", str(results))  # the kernel inherits the environment
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), "commit it cleared"

    # Raises CellExecutionError, with the cell and its traceback, if any cell fails.
    cwd = {"metadata": {"path": str(NOTEBOOK.parent)}}  # the kernel's working directory, as in Jupyter
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources=cwd)
    client.execute()

    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    text = "\n".join(_text(cell) for cell in code)
    assert f"{results}: 14 rows" in text  # 6 decode runs, 8 toy rule rows
    assert "thresholded" in text and "speedup_vs_baseline" in text and "tokens_per_round_expected" in text
    assert "skipped real_rules" in text  # the fixture has no real rule check
    images = [o for cell in code for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 6  # every figure but real_rules
