"""The docs' bad-input table: every case raises a one-line TypeError or ValueError, every time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "_gen"))

from sitegen.errors import CASES, run_case


@pytest.mark.parametrize("case", CASES, ids=[c.code for c in CASES])
def test_case_raises_a_clear_error(case):
    got = run_case(case)  # raises RuntimeError if the call stopped raising
    if got.kind == "not run":  # only where np.longdouble is float64 itself
        assert case.needs == "longdouble", got.message
        return
    assert got.kind in ("TypeError", "ValueError"), got.message
    assert "\n" not in got.message
    assert "expected" in got.message or "ambiguous" in got.message or "overflow" in got.message
    assert run_case(case) == got  # the same call, the same answer
