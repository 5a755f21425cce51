"""Every selected backend against every other, on identical inputs (the tests-all session)."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

import portattn as pa
from portattn import chapter
from portattn.testing import max_relative_error, to_numpy

from conftest import backend_names, get_backend, jitted

PAIRS = list(itertools.combinations(sorted(set(backend_names()) | {"numpy"}), 2))


# Each backend's result is computed once and compared with every other's: a
# pair recomputing both sides ran JAX's eager blockwise loop four times over.
@functools.cache
def _run(name: str, dtype_name: str, impl: str):
    be = get_backend(name)
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 4, n, 16)) for n in (33, 40, 40))
    mask = rng.random((33, 40)) < 0.9
    bias = rng.standard_normal((4, 1, 40))
    dtype = getattr(be.xp, dtype_name)
    args = [be.asarray(a, dtype) for a in (q, k, v)]
    out = jitted(
        be,
        lambda q, k, v, m, b: pa.attention(
            q, k, v, mask=m, bias=b, causal="bottom_right", impl=impl, block_size=(8, 16)
        ),
    )(*args, be.asarray(mask), be.asarray(bias, dtype))
    out = np.array(to_numpy(out), copy=True)
    out.flags.writeable = False  # shared between tests
    return out


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
@pytest.mark.parametrize(("dtype_name", "rtol"), [("float64", 1e-12), ("float32", 1e-5)])
@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
def test_backends_agree(a, b, dtype_name, rtol, impl):
    assert max_relative_error(_run(a, dtype_name, impl), _run(b, dtype_name, impl)) <= rtol


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_chapter_is_the_same_everywhere(a, b):
    ba, bb = get_backend(a), get_backend(b)
    ha = pa.Head.random(8, 8, seed=5, xp=ba.xp, device=ba.device)
    hb = pa.Head.random(8, 8, seed=5, xp=bb.xp, device=bb.device)
    assert to_numpy(ha.wq).tobytes() == to_numpy(hb.wq).tobytes()
    wa = to_numpy(chapter.demo_weights(xp=ba.xp))
    wb = to_numpy(chapter.demo_weights(xp=bb.xp))
    np.testing.assert_allclose(wa, wb, rtol=1e-5)
    assert [chapter.describe_row(chapter.DEMO_TOKENS, wa, i) for i in range(5)] == [
        chapter.describe_row(chapter.DEMO_TOKENS, wb, i) for i in range(5)
    ]
