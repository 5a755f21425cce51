"""python -m portattn prints the chapter on every installed backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import portattn as pa
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


# --- the CLI on closed pipes and failing writes ---------------------------------------


SRC = str(Path(pa.__file__).resolve().parents[1])  # the portattn under test


def _cli(shell_redirect: str | None = None, **kwargs) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "portattn", "--backend", "numpy", "--no-color"]
    if shell_redirect is not None:
        line = " ".join(cmd) + " " + shell_redirect
        return subprocess.run(
            ["/bin/sh", "-c", line], capture_output=True, text=True, env=env, timeout=300
        )
    return subprocess.run(cmd, text=True, env=env, timeout=300, **kwargs)


def test_cli_exits_quietly_when_the_reader_has_gone():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write is EPIPE
    try:
        run = _cli(stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert run.stderr == ""
    assert run.returncode == 141


def test_cli_with_stdout_closed_says_so_in_one_line():
    run = _cli(">&-")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "python -m portattn: cannot write the report: standard output is closed"
    ]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="this OS has no /dev/full")
def test_cli_on_a_full_device_says_so_in_one_line():
    run = _cli(">/dev/full")
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write the report: No space left" in lines[0]


# --- what a newcomer sees: version, help, colour, hints, the verdict ---------------------


def test_version_and_help_name_hf_without_markup(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"portattn {pa.__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    assert "python -m portattn hf" in help_text and "NO_COLOR" in help_text
    assert "docs/chapter.md" in help_text
    assert "``" not in help_text and ":func:" not in help_text


def test_no_color_is_honoured(monkeypatch):
    import portattn.__main__ as cli

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert cli.use_color(no_color_flag=False, stream=Tty())
    assert not cli.use_color(no_color_flag=True, stream=Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not cli.use_color(no_color_flag=False, stream=Tty())
    monkeypatch.setenv("NO_COLOR", "")  # no-color.org: present but empty does not count
    assert cli.use_color(no_color_flag=False, stream=Tty())


def test_every_missing_backend_gets_an_install_hint(monkeypatch):
    import portattn.__main__ as cli

    def absent(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(cli, "load", absent)
    found, missing = cli.available_backends()
    assert found == []
    names = [m.split()[0] for m in missing]
    assert names == list(cli._CANDIDATES)
    for line in missing:
        assert "(ModuleNotFoundError; " in line and ("pip install" in line or "GPU" in line), line


def test_the_report_ends_with_a_verdict(capsys):
    assert main(["--backend", "numpy", "--no-color"]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("verdict: ran on numpy alone")


def test_the_verdict_names_agreement_and_disagreement():
    import portattn.__main__ as cli

    w = chapter.demo_weights(chapter.DEMO_TOKENS, causal=False)
    assert cli.verdict([("numpy", w), ("other", w + 1e-7)], []).startswith(
        "verdict: numpy, other agree"
    )
    assert "DISAGREE" in cli.verdict([("numpy", w), ("other", w + 1e-3)], [])
    hint = cli.verdict([("numpy", w)], ["jax (ModuleNotFoundError; pip install 'portattn[jax]')"])
    assert "next: pip install 'portattn[jax]'" in hint
