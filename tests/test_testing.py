"""portattn.testing: its helpers check their own arguments."""

from __future__ import annotations

import numpy as np
import pytest

from portattn.testing import assert_close

from conftest import Backend

# --- assert_close's arguments ---------------------------------------------------------


def test_assert_close_takes_a_list_as_reference(backend: Backend):
    x = backend.asarray(np.array([1.0, 2.0]))
    assert_close(x, [1.0, 2.0], rtol=0, xp=backend.xp)
    with pytest.raises(AssertionError, match=r"max relative error"):
        assert_close(x, [1.0, 2.5], rtol=1e-3)


def test_assert_close_refuses_a_list_as_the_result():
    with pytest.raises(TypeError, match=r"expected actual to be an array .* got \[1\.0, 2\.0\]"):
        assert_close([1.0, 2.0], np.array([1.0, 2.0]), rtol=0)
    with pytest.raises(ValueError, match=r"expected rtol to be a finite real number >= 0, got"):
        assert_close(np.ones(2), np.ones(2), rtol="0")
