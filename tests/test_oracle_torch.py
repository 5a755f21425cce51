"""torch.nn.functional.scaled_dot_product_attention as an outside oracle, on every backend.

torch is installed in every test session (it is the oracle), so a missing
torch is an error here, not a skip.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import portattn as pa
from portattn.testing import assert_close

from conftest import Backend, rtol_for

F = torch.nn.functional


def _sdpa(q, k, v, **kw):
    t = [torch.from_numpy(a) for a in (q, k, v)]
    kw = {
        key: torch.from_numpy(val) if isinstance(val, np.ndarray) else val
        for key, val in kw.items()
    }
    return F.scaled_dot_product_attention(*t, **kw).numpy()


COMBOS = list(itertools.product(["none", "bool", "float"], [False, True], [None, 0.3]))


@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
@pytest.mark.parametrize(("mask_kind", "causal", "scale"), COMBOS)
def test_agrees_with_torch_sdpa(backend: Backend, rng, impl, mask_kind, causal, scale):
    b, h, lq, lk, d = 2, 3, 6, 6, 8  # SDPA's is_causal is top-left; square keeps that unambiguous
    q, k, v = (rng.standard_normal((b, h, n, d)) for n in (lq, lk, lk))
    kw_pa, kw_torch = {}, {}
    if mask_kind == "bool":
        m = rng.random((lq, lk)) < 0.75
        m[:, 0] = True  # SDPA returns NaN for fully masked rows; keep every row alive
        if causal:
            kw_pa["mask"], kw_torch["attn_mask"] = m, m & np.tril(np.ones((lq, lk), bool))
        else:
            kw_pa["mask"], kw_torch["attn_mask"] = m, m
    elif mask_kind == "float":
        bias = rng.standard_normal((h, lq, lk))
        kw_pa["bias"] = bias
        if causal:
            kw_torch["attn_mask"] = np.where(np.tril(np.ones((lq, lk), bool)), bias, -np.inf)
        else:
            kw_torch["attn_mask"] = bias
    if causal and "attn_mask" not in kw_torch:
        kw_torch["is_causal"] = True
    want = _sdpa(q, k, v, scale=scale, **kw_torch)
    for dtype in backend.float_dtypes:
        args = [backend.asarray(a, dtype) for a in (q, k, v)]
        extra = {
            key: backend.asarray(val, dtype if val.dtype.kind == "f" else None)
            for key, val in kw_pa.items()
        }
        got = pa.attention(*args, causal=causal, scale=scale, impl=impl, block_size=(4, 4), **extra)
        assert_close(got, want, rtol=rtol_for(backend, dtype), dtype=dtype, xp=backend.xp)


def test_agrees_with_torch_top_left_rectangular(backend: Backend, rng):
    q, k, v = rng.standard_normal((5, 8)), rng.standard_normal((9, 8)), rng.standard_normal((9, 4))
    want = _sdpa(q, k, v, is_causal=True)  # torch aligns top-left
    got = pa.attention(*(backend.asarray(a) for a in (q, k, v)), causal="top_left")
    assert_close(got, want, rtol=1e-12)


def test_agrees_with_torch_bottom_right_via_explicit_mask(backend: Backend, rng):
    q, k, v = rng.standard_normal((5, 8)), rng.standard_normal((9, 8)), rng.standard_normal((9, 4))
    br = np.tril(np.ones((5, 9), bool), k=9 - 5)
    want = _sdpa(q, k, v, attn_mask=br)
    got = pa.attention(*(backend.asarray(a) for a in (q, k, v)), causal="bottom_right")
    assert_close(got, want, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(pa.causal_mask(5, 9)), br)
