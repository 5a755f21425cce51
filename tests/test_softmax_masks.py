"""softmax, causal_mask and window_mask."""

from __future__ import annotations

import math

import numpy as np
import pytest

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend
from reference import allowed_pairs


def test_softmax_matches_definition(backend: Backend, rng):
    x = rng.standard_normal((3, 4, 5)) * 10
    for axis in (-1, 0, 1):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        want = e / e.sum(axis=axis, keepdims=True)
        for dtype in backend.float_dtypes:
            got = pa.softmax(backend.asarray(x, dtype), axis=axis)
            tol = (
                1e-12
                if dtype == backend.xp.float64
                else 1e-2
                if dtype not in (backend.xp.float32,)
                else 1e-6
            )
            assert_close(got, want, rtol=tol, dtype=dtype, xp=backend.xp)


def test_softmax_edge_rows(backend: Backend):
    x = np.array([[-np.inf, -np.inf, -np.inf], [1e30, 1e30, -np.inf], [0.0, -np.inf, 5.0]])
    with np.errstate(all="raise"):
        got = to_numpy(pa.softmax(backend.asarray(x)))
    np.testing.assert_array_equal(got[0], 0)
    np.testing.assert_array_equal(got[1], [0.5, 0.5, 0])
    np.testing.assert_allclose(got[2], [1 / (1 + np.exp(5)), 0, 1 / (1 + np.exp(-5))], rtol=1e-14)
    empty = pa.softmax(backend.asarray(np.zeros((2, 0))))
    assert tuple(empty.shape) == (2, 0)


def test_softmax_bad_axis(backend: Backend):
    with pytest.raises(ValueError, match=r"expected axis to be an int in \[-2, 2\), got 2"):
        pa.softmax(backend.asarray(np.zeros((2, 2))), axis=2)


@pytest.mark.parametrize(("lq", "lk"), [(4, 4), (3, 7), (7, 3), (0, 2), (1, 1)])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_causal_mask(backend: Backend, lq, lk, align):
    got = pa.causal_mask(lq, lk, align=align, xp=backend.xp, device=backend.device)
    assert got.dtype == backend.xp.bool
    np.testing.assert_array_equal(to_numpy(got), allowed_pairs(lq, lk, causal=align))


@pytest.mark.parametrize("window", [0, 2, (1, 0), (0, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_window_mask(backend: Backend, window, causal):
    w = (window, window) if isinstance(window, int) else window
    got = pa.window_mask(6, 6, window=window, causal=causal, xp=backend.xp, device=backend.device)
    np.testing.assert_array_equal(to_numpy(got), allowed_pairs(6, 6, causal=causal, window=w))
    got_br = pa.window_mask(3, 6, window=window, causal=causal, xp=backend.xp)
    want_br = allowed_pairs(3, 6, causal=causal, window=w, align="bottom_right")
    np.testing.assert_array_equal(to_numpy(got_br), want_br)


# --- window_mask arguments ------------------------------------------------------------


def test_window_mask_causal_is_a_bool():
    with pytest.raises(ValueError, match=r"expected causal to be True or False, got 'no'"):
        pa.window_mask(3, 3, window=1, causal="no")
    with pytest.raises(ValueError, match=r"expected causal to be True or False, got 1"):
        pa.window_mask(3, 3, window=1, causal=1)


def test_window_mask_huge_window_means_unbounded():
    np.testing.assert_array_equal(pa.window_mask(3, 4, window=2**63), np.ones((3, 4), bool))
    np.testing.assert_array_equal(pa.window_mask(3, 4, window=(2**70, 0)), pa.causal_mask(3, 4))


@pytest.mark.parametrize("window", [True, None, 1.0, (1, True), "2"])
def test_window_mask_bad_window(window):
    with pytest.raises(ValueError, match=r"expected window to be a non-negative int"):
        pa.window_mask(3, 3, window=window)


# --- softmax at the ends of the range -------------------------------------------------


def test_softmax_finite_extremes_are_in_range(backend: Backend):
    xp = backend.xp
    big = float(np.finfo(np.float32).max)
    x = backend.asarray(np.array([[big, -big], [-big, -big], [-big, big]]), dtype=xp.float32)
    with np.errstate(all="raise"):
        got = to_numpy(pa.softmax(x))
    np.testing.assert_array_equal(got, [[1, 0], [0.5, 0.5], [0, 1]])
    tiny = float(np.finfo(np.float64).max)
    y = backend.asarray(np.array([tiny, 0.0, -tiny]))
    with np.errstate(all="raise"):
        np.testing.assert_array_equal(to_numpy(pa.softmax(y)), [1, 0, 0])


def test_softmax_documented_non_finite_inputs(backend: Backend):
    x = backend.asarray(
        np.array([[np.inf, 0.0], [np.nan, 0.0], [-np.inf, -np.inf], [-np.inf, 1.0]])
    )
    with np.errstate(all="ignore"):
        got = to_numpy(pa.softmax(x))
    assert np.isnan(got[:2]).all()  # +inf or NaN in a slice: all of it NaN, as documented
    np.testing.assert_array_equal(got[2:], [[0, 0], [0, 1]])


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_floored_exp_is_safe_exp_without_the_slow_inputs(backend: Backend, dtype_name):
    """Exact 0 at or below its floor (-inf too), NaN kept, no weight below exp(exp_floor)."""
    from portattn._core import _softmax

    xp = backend.xp
    dtype = getattr(xp, dtype_name)
    floor = _softmax.exp_floor(dtype, xp=xp)
    high = floor - math.log(float(np.finfo(dtype_name).eps))
    z = np.concatenate(
        [
            -np.geomspace(1e-8, 1e3, 4001),  # around and across both floors
            np.linspace(high - 1, high + 1, 999),
            [0.0, high, floor, -1e30, -np.inf, np.nan],
        ]
    ).astype(dtype_name)  # compared in the dtype computed in, floor rounded alike
    high = np.dtype(dtype_name).type(high)
    with np.errstate(all="raise"):
        got = to_numpy(_softmax.floored_exp(backend.asarray(z, dtype), floor, xp=xp))
        want = to_numpy(_softmax.safe_exp(backend.asarray(z, dtype), floor, xp=xp))
    assert np.isnan(got[-1]) and not np.isnan(got[:-1]).any()
    got, want, z = got[:-1], want[:-1], z[:-1]
    np.testing.assert_array_equal(got[z <= high], 0.0)
    assert (got >= 0).all()
    assert (got[got > 0] >= np.exp(floor) * (1 - 1e-6)).all()  # never near a subnormal
    # Above the floor the weight moves by exp(high) at most, plus rounding.
    ulp = np.finfo(dtype_name).eps
    np.testing.assert_allclose(got, want, rtol=4 * ulp, atol=1.01 * np.exp(high))


def test_floored_exp_fast_path_is_taken_where_exp_is_one_function(backend: Backend):
    """On eager CPU libraries the floor's weight is read once and the fast path runs.

    Where this fails, every tile with distant keys pays exp's slow path
    again (13-40x on torch): the speed of score_mods rests on it.
    """
    from portattn._core import _softmax

    xp = backend.xp
    z = backend.asarray(np.array([-1.0, -200.0, -np.inf]), xp.float32)
    floor = _softmax.exp_floor(xp.float32, xp=xp)
    high = floor - math.log(float(np.finfo(np.float32).eps))
    np.testing.assert_array_equal(to_numpy(_softmax.floored_exp(z, floor, xp=xp))[1:], [0.0, 0.0])
    weight = _softmax._floor_weight(z, high, xp=xp)
    if backend.name.startswith(("numpy", "torch", "array_api_strict")):
        assert weight == pytest.approx(np.exp(high), rel=1e-6)
    else:  # JAX compiles exp per shape: the probe may or may not agree, never wrongly
        assert weight is None or weight == pytest.approx(np.exp(high), rel=1e-6)


def test_floored_exp_overwrite_computes_in_place_and_leaves_inputs_alone(backend: Backend):
    from portattn._core import _softmax

    xp = backend.xp
    values = np.array([0.0, -1.0, -300.0, -np.inf])
    floor = _softmax.exp_floor(xp.float32, xp=xp)
    kept = backend.asarray(values, xp.float32)
    _softmax.floored_exp(kept, floor, xp=xp)
    np.testing.assert_array_equal(to_numpy(kept), values.astype(np.float32))
    scratch = backend.asarray(values, xp.float32)
    got = _softmax.floored_exp(scratch, floor, xp=xp, overwrite=True)
    np.testing.assert_allclose(to_numpy(got), [1.0, np.exp(-1.0), 0.0, 0.0], rtol=1e-6)
