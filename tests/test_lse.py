"""return_lse, and merging partial results over key chunks into the full call."""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend, jitted, make_qkv, rtol_for
from reference import allowed_pairs, lse_ref

IMPLS = [
    pytest.param({"impl": "materialize"}, id="materialize"),
    pytest.param({"impl": "blockwise", "block_size": (3, 4)}, id="blockwise"),
]


@pytest.mark.parametrize("impl", IMPLS)
def test_lse_matches_reference(backend: Backend, rng, impl):
    xp = backend.xp
    q, k, v = make_qkv(rng, 7, 9, d=5, dv=3, batch=(2,))
    for dtype in (xp.float32, xp.float64):
        out, lse = jitted(backend, lambda q, k, v: pa.attention(q, k, v, return_lse=True, **impl))(
            *(backend.asarray(a, dtype) for a in (q, k, v))
        )
        assert_close(lse, lse_ref(q, k), rtol=rtol_for(backend, dtype), xp=xp, dtype=dtype)
        assert tuple(out.shape) == (2, 7, 3)


def test_lse_is_in_compute_dtype_for_half(backend: Backend, rng):
    xp = backend.xp
    # The standard defines no half precision, so array_api_strict alone has none.
    assert backend.half_dtypes or backend.name == "array_api_strict"
    if not backend.half_dtypes:
        return
    half = backend.half_dtypes[0]
    q = backend.asarray(rng.standard_normal((4, 8)), half)
    out, lse = pa.attention(q, q, q, return_lse=True)
    assert out.dtype == half
    assert lse.dtype == xp.float32


@pytest.mark.parametrize("impl", IMPLS)
def test_lse_neg_inf_for_rows_that_see_nothing(backend: Backend, rng, impl):
    xp = backend.xp
    q, k, v = make_qkv(rng, 6, 3, d=4, dv=2)
    with np.errstate(all="raise"):
        out, lse = pa.attention(
            *(backend.asarray(a, xp.float64) for a in (q, k, v)),
            causal="bottom_right",
            return_lse=True,
            **impl,
        )
    ls = to_numpy(lse)
    assert np.isneginf(ls[:3]).all()
    assert np.isfinite(ls[3:]).all()
    np.testing.assert_array_equal(to_numpy(out)[:3], 0.0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("chunks", [(4,), (1, 3), (2, 2, 0, 5), (3, 3, 3)], ids=str)
def test_merge_over_key_chunks_equals_full_call(backend: Backend, rng, impl, chunks):
    xp = backend.xp
    lk = sum(chunks)
    q, k, v = make_qkv(rng, 5, lk, d=4, dv=6, batch=(2, 3))
    args = [backend.asarray(a, xp.float64) for a in (q, k, v)]
    full, full_lse = pa.attention(*args, return_lse=True, **impl)
    outs, lses, start = [], [], 0
    for n in chunks:
        o, ls = pa.attention(
            args[0],
            args[1][..., start : start + n, :],
            args[2][..., start : start + n, :],
            scale=1 / np.sqrt(4),
            return_lse=True,
            **impl,
        )
        outs.append(o)
        lses.append(ls)
        start += n
    out, lse = pa.merge_attention(outs, lses)
    rtol = rtol_for(backend, xp.float64)
    assert_close(out, full, rtol=rtol, xp=xp, dtype=xp.float64, device=backend.device)
    assert_close(lse, full_lse, rtol=rtol, xp=xp, dtype=xp.float64)


def test_merge_with_masks_matches_masked_full_call(backend: Backend, rng):
    """Causal split over key chunks: some chunks show some rows nothing (lse -inf)."""
    xp = backend.xp
    lq = lk = 8
    q, k, v = make_qkv(rng, lq, lk, d=4, dv=3)
    ok = allowed_pairs(lq, lk, causal=True)
    args = [backend.asarray(a, xp.float32) for a in (q, k, v)]
    full = pa.attention(*args, causal=True)
    outs, lses = [], []
    for lo, hi in ((0, 3), (3, 8)):
        o, ls = pa.attention(
            args[0],
            args[1][lo:hi, :],
            args[2][lo:hi, :],
            mask=backend.asarray(ok[:, lo:hi]),
            scale=0.5,
            return_lse=True,
        )
        outs.append(o)
        lses.append(ls)
    with np.errstate(all="raise"):
        out, lse = pa.merge_attention(outs, lses)
    assert_close(out, full, rtol=rtol_for(backend, xp.float32), xp=xp, dtype=xp.float32)
    assert_close(lse, lse_ref(q, k, mask=ok), rtol=rtol_for(backend, xp.float32), xp=xp)


def test_merge_all_chunks_empty_gives_zero(backend: Backend):
    xp = backend.xp
    o = backend.asarray(np.ones((3, 2)), xp.float32)
    ls = backend.asarray(np.full(3, -np.inf), xp.float32)
    with np.errstate(all="raise"):
        out, lse = pa.merge_attention([o, o], [ls, ls])
    np.testing.assert_array_equal(to_numpy(out), 0.0)
    assert np.isneginf(to_numpy(lse)).all()


def test_merge_rejects_bad_input(backend: Backend):
    xp = backend.xp
    o = backend.asarray(np.ones((3, 2)), xp.float32)
    ls = backend.asarray(np.zeros(3), xp.float32)
    with pytest.raises(ValueError, match="one lse per output"):
        pa.merge_attention([o, o], [ls])
    with pytest.raises(ValueError, match="one lse per output"):
        pa.merge_attention([], [])
    with pytest.raises(ValueError, match="match outputs"):
        pa.merge_attention([o], [backend.asarray(np.zeros(2), xp.float32)])
    with pytest.raises(TypeError, match="real floating"):
        pa.merge_attention([o], [backend.asarray(np.zeros(3, dtype=np.int32))])


# --- merge_attention's inputs ---------------------------------------------------------


def test_merge_attention_takes_generators_and_stacked_arrays(backend: Backend, rng):
    xp = backend.xp
    q = backend.asarray(rng.standard_normal((2, 4, 3)))
    k8, v8 = (backend.asarray(rng.standard_normal((2, 8, 3))) for _ in range(2))
    parts = [
        pa.attention(q, k8[:, i : i + 2, :], v8[:, i : i + 2, :], return_lse=True)
        for i in (0, 2, 4, 6)
    ]
    want = to_numpy(pa.attention(q, k8, v8))
    out, _ = pa.merge_attention((o for o, _ in parts), (lse for _, lse in parts))
    assert_close(out, want, rtol=1e-12, xp=xp)
    stacked_o = xp.stack([o for o, _ in parts], axis=0)
    stacked_l = xp.stack([lse for _, lse in parts], axis=0)
    out, _ = pa.merge_attention(stacked_o, stacked_l)
    assert_close(out, want, rtol=1e-12, xp=xp)
    out, _ = pa.merge_attention(stacked_o, [lse for _, lse in parts])
    assert_close(out, want, rtol=1e-12, xp=xp)


@pytest.mark.parametrize("bad", [3, "ab", None])
def test_merge_attention_refuses_non_iterables(bad):
    with pytest.raises(TypeError, match=r"expected outputs to be a sequence or iterable"):
        pa.merge_attention(bad, [np.zeros(2)])


def test_merge_attention_refuses_non_arrays_inside():
    with pytest.raises(TypeError, match=r"expected lses\[1\] to be an array, got \[0\.0, 0\.0\]"):
        pa.merge_attention([np.zeros((2, 3))] * 2, [np.zeros(2), [0.0, 0.0]])


# --- merge_attention in the wider dtype -----------------------------------------------


def test_merge_attention_computes_in_the_wider_dtype(backend: Backend, rng):
    xp = backend.xp
    q = backend.asarray(rng.standard_normal((3, 4)))
    k = backend.asarray(rng.standard_normal((8, 4)))
    v = backend.asarray(rng.standard_normal((8, 5)))
    parts = [pa.attention(q, k[i : i + 4, :], v[i : i + 4, :], return_lse=True) for i in (0, 4)]
    lses32 = [xp.astype(lse, xp.float32) for _, lse in parts]
    out, lse = pa.merge_attention([o for o, _ in parts], lses32)
    assert out.dtype == xp.float64 and lse.dtype == xp.float32
    # the same float32 lses, widened by hand: the merge itself must add no float32 rounding
    ref, _ = pa.merge_attention([o for o, _ in parts], [xp.astype(x, xp.float64) for x in lses32])
    assert_close(out, to_numpy(ref), rtol=1e-15, xp=xp, dtype=xp.float64)
