"""The notebooks execute top to bottom (nbclient, the venv's ``python3`` kernel).

``results.ipynb`` reads the small CSVs shipped under ``notebooks/data/``;
``mechanism.ipynb`` builds its own tiny trace. Both must run in seconds. The
``python3`` kernel is ipykernel's; jupyter_client starts it with this interpreter
(``sys.executable``), so the notebooks see the venv's saria.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[test]')")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[test]')")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e '.[test]')")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _execute(name: str) -> "nbformat.NotebookNode":
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return nb


def _outputs(nb) -> tuple[str, int]:
    text, images = [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out
            if out.get("output_type") == "stream":
                text.append(out["text"])
            if "image/png" in out.get("data", {}):
                images += 1
    return "".join(text), images


@pytest.mark.parametrize("name", ["mechanism.ipynb", "results.ipynb"])
def test_notebook_runs(name: str) -> None:
    nb = _execute(name)
    text, images = _outputs(nb)
    assert images >= 3
    if name == "mechanism.ipynb":
        assert "DRAM[0:4] SSD[4:8] DRAM[8:10]" in text  # the interleaved reload plan
        assert "written to SSD" in text and "dropped (history kept)" in text  # E2's decisions
    else:
        assert "full-duplicate" in text and "saria" in text


def test_results_data_present() -> None:
    data = NOTEBOOKS / "data"
    for n in ("01_write_latency", "02_cache_pressure", "03_reload_sources",
              "04_read_path_ablation", "05_endurance"):
        p = data / f"{n}.csv"
        assert p.is_file() and p.stat().st_size < 200_000, p
