"""portattn.testing: its helpers check their own arguments and say what they are asked."""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn.testing import assert_close, backends, dask_schedule, load_backend

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


# --- the backend list and the dask schedule -------------------------------------------


def test_backends_are_the_ones_the_matrix_knows():
    names = [b.name for b in backends()]
    assert names[:3] == ["numpy", "numpy_readonly", "torch"]
    assert len(set(names)) == len(names)
    assert all(set(b.dtypes) <= {"float16", "bfloat16", "float32", "float64"} for b in backends())
    with pytest.raises(ValueError, match=r"expected a backend name out of numpy, .* got 'nope'"):
        load_backend("nope")


def test_load_backend_puts_numpy_data_on_its_device(backend: Backend):
    got = load_backend(backend.name)
    source = np.arange(3.0)
    x = got.from_numpy(source)
    source[:] = -1.0  # a fresh array: the source's later changes never show in it
    assert_close(x, [0.0, 1.0, 2.0], rtol=0, xp=backend.xp, device=backend.device)


def test_dask_schedule_reads_the_graph_without_computing_it():
    import dask.array as da

    x = da.ones((2, 12, 4), chunks=(1, 4, 4))
    full = dask_schedule(pa.attention(x, x, x))
    causal = dask_schedule(pa.attention(x, x, x, causal=True))
    assert full.pairs == {(i, j) for i in range(3) for j in range(3)}
    assert causal.pairs == {(i, j) for i in range(3) for j in range(i + 1)}
    assert (full.pair_tasks, causal.pair_tasks) == (2 * 9, 2 * 6)  # two batch blocks
    assert causal.merge_tasks > 0 and causal.tasks > causal.pair_tasks
