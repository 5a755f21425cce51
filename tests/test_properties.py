"""Property tests (hypothesis) over shapes, masks, options and dtypes."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend, rtol_for
from reference import attention_ref

SETTINGS = settings(
    max_examples=int(os.environ.get("PORTATTN_HYPOTHESIS_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@st.composite
def problems(draw):
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    lq, lk = draw(st.integers(0, 9)), draw(st.integers(0, 9))
    d, dv = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*batch, lq, d)) * draw(st.sampled_from([0.1, 1.0, 10.0]))
    k = rng.standard_normal((*batch, lk, d))
    v = rng.standard_normal((*batch, lk, dv))
    opts = {}
    if draw(st.booleans()):
        mshape = draw(st.sampled_from([(lq, lk), (1, lk), (lq, 1), (*batch, lq, lk)]))
        opts["mask"] = rng.random(mshape) < draw(st.floats(0.0, 1.0))
    if draw(st.booleans()):
        opts["bias"] = rng.standard_normal((lq, lk))
    causal = draw(
        st.sampled_from([False, "top_left", "bottom_right"] + ([True] if lq == lk else []))
    )
    opts["causal"] = causal
    if draw(st.booleans()) and (lq == lk or causal):
        opts["window"] = (draw(st.integers(0, 4)), draw(st.integers(0, 4)))
    if draw(st.booleans()):
        # 0 and moderate magnitudes; a subnormal scale would underflow q * scale by design
        opts["scale"] = draw(st.one_of(st.just(0.0), st.floats(1e-3, 2.0), st.floats(-2.0, -1e-3)))
    impl = draw(
        st.sampled_from(
            [
                {"impl": "materialize"},
                {
                    "impl": "blockwise",
                    "block_size": (draw(st.integers(1, 5)), draw(st.integers(1, 5))),
                },
            ]
        )
    )
    return q, k, v, opts, impl


def _on(backend, opts, dtype):
    return {
        k: backend.asarray(v, dtype if v.dtype.kind == "f" else None)
        if isinstance(v, np.ndarray)
        else v
        for k, v in opts.items()
    }


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
@SETTINGS
@given(problem=problems(), which=st.integers(0, 3))
def test_attention_matches_reference(backend: Backend, problem, which):
    q, k, v, opts, impl = problem
    dtype = backend.float_dtypes[which % len(backend.float_dtypes)]
    args = [backend.asarray(a, dtype) for a in (q, k, v)]
    kwargs = _on(backend, opts, dtype)
    with np.errstate(all="raise"):
        got = pa.attention(*args, **kwargs, **impl)
    want, _ = attention_ref(q, k, v, **opts)
    rtol = rtol_for(backend, dtype)
    if dtype not in (backend.xp.float32, backend.xp.float64):
        rtol = 5e-2  # inputs themselves are rounded to half precision
    assert_close(got, want, rtol=rtol, dtype=dtype, xp=backend.xp)


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
@SETTINGS
@given(problem=problems())
def test_rows_of_weights_sum_to_one_or_zero(backend: Backend, problem):
    q, k, _, opts, _ = problem
    w = np.asarray(
        to_numpy(
            pa.attention_weights(backend.asarray(q), backend.asarray(k), **_on(backend, opts, None))
        )
    )
    sums = w.sum(axis=-1)
    assert np.all((np.abs(sums - 1) < 1e-12) | (sums == 0))
    assert np.all(w >= 0)
