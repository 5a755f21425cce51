"""python -m portattn prints the chapter on every installed backend."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from portattn import chapter
from portattn.__main__ import heatmap, main


def test_module_runs_and_reports_each_section(capsys):
    assert main(["--backend", "numpy", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "== backend: numpy ==" in out
    for row in chapter.scaling_table():
        assert f"{row.d:>6} {row.unscaled:>10.3f} {row.scaled:>10.3f}" in out
    assert "with mask [0, 0, 0]" in out
    assert "causal mask ON" in out and "causal mask OFF" in out
    assert chapter.describe_row(chapter.DEMO_TOKENS, chapter.demo_weights(), 2) in out


def test_requested_missing_backend_is_an_error(monkeypatch, capsys):
    import portattn.__main__ as cli

    monkeypatch.setattr(
        cli, "available_backends", lambda names: ([], ["cupy (ModuleNotFoundError)"])
    )
    assert main(["--backend", "cupy"]) == 2
    assert "not available: cupy" in capsys.readouterr().err


def test_heatmap_shows_percentages_and_colour():
    w = np.array([[1.0, 0.0], [0.26, 0.74]])
    plain = heatmap(["a", "b"], w, color=False)
    assert "100%" in plain and "26%" in plain and "74%" in plain and "\x1b[" not in plain
    assert "\x1b[48;5;" in heatmap(["a", "b"], w, color=True)


def test_python_dash_m_entry_point():
    run = subprocess.run(
        [sys.executable, "-m", "portattn", "--backend", "numpy"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert "portattn: the single-head chapter" in run.stdout
