"""Issue 8, the attention core: every class here gave a wrong answer or a deep error before."""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend

IMPLS = ("materialize", "blockwise")


def _impls(backend: Backend) -> tuple[str, ...]:
    return (*IMPLS, "native") if backend.name in ("torch", "jax") else IMPLS


def _qkv(backend: Backend, rng, *shape_lk, b=2, lq=5, lk=300, d=4, dtype=None):
    q = backend.asarray(rng.standard_normal((b, lq, d)), dtype)
    k = backend.asarray(rng.standard_normal((b, lk, d)), dtype)
    v = backend.asarray(rng.standard_normal((b, lk, d)), dtype)
    return q, k, v


# --- 1. narrow integer lengths ------------------------------------------------------


@pytest.mark.parametrize("int_dtype", ["int8", "uint8", "int16", "uint16"])
def test_narrow_integer_lengths_do_not_wrap(backend: Backend, rng, int_dtype):
    xp = backend.xp
    if not hasattr(xp, int_dtype):
        pytest.fail(f"{backend.name} has no {int_dtype}")
    q, k, v = _qkv(backend, rng, lk=300, dtype=xp.float32)
    lengths = np.array([100, 120])
    wide = backend.asarray(lengths)
    narrow_lengths = backend.asarray(lengths, getattr(xp, int_dtype))
    for impl in _impls(backend):
        want = to_numpy(pa.attention(q, k, v, key_lengths=wide, impl=impl, block_size=64))
        got = pa.attention(q, k, v, key_lengths=narrow_lengths, impl=impl, block_size=64)
        np.testing.assert_array_equal(to_numpy(got), want, err_msg=impl)
    # and the wide answer is right: the padded keys are really hidden
    cut = to_numpy(pa.attention(q[:1, ...], k[:1, :100, :], v[:1, :100, :]))
    assert_close(pa.attention(q, k, v, key_lengths=narrow_lengths)[:1, ...], cut, rtol=1e-5)


def test_torch_uint64_lengths(rng):
    import torch

    q, k, v = (torch.from_numpy(rng.standard_normal((2, 4, 300, 8))) for _ in range(3))
    lengths = torch.tensor([[100], [7]])
    want = to_numpy(pa.attention(q, k, v, key_lengths=lengths))
    for impl in ("materialize", "blockwise", "native"):
        got = pa.attention(q, k, v, key_lengths=lengths.to(torch.uint64), impl=impl)
        assert_close(got, want, rtol=1e-12)


# --- 3. what lies beyond key_lengths never reaches the output ----------------------


@pytest.mark.parametrize("garbage", [np.nan, np.inf, -np.inf])
def test_non_finite_padding_never_reaches_the_output(backend: Backend, rng, garbage):
    xp = backend.xp
    q, k, v = _qkv(backend, rng, lk=40, dtype=xp.float32)
    lengths = backend.asarray(np.array([30, 12]))
    k_np, v_np = to_numpy(k), to_numpy(v)
    k_bad, v_bad = k_np.copy(), v_np.copy()
    k_bad[0, 30:], v_bad[0, 30:] = garbage, garbage
    k_bad[1, 12:], v_bad[1, 12:] = garbage, garbage
    for impl in _impls(backend):
        clean = to_numpy(pa.attention(q, k, v, key_lengths=lengths, impl=impl, block_size=8))
        with np.errstate(all="ignore"):
            got = pa.attention(
                q,
                backend.asarray(k_bad, xp.float32),
                backend.asarray(v_bad, xp.float32),
                key_lengths=lengths,
                impl=impl,
                block_size=8,
            )
        np.testing.assert_array_equal(to_numpy(got), clean, err_msg=impl)


def test_non_finite_values_hidden_by_causal_or_mask_are_documented(backend: Backend, rng):
    """Documented in attention's Notes: only key_lengths sanitises; hidden inf/NaN can give NaN."""
    q, k, v = _qkv(backend, rng, b=1, lq=6, lk=6)
    v_np = to_numpy(v).copy()
    v_np[0, -1] = np.nan  # the last value, hidden by causality from every row but the last
    with np.errstate(all="ignore"):
        got = to_numpy(pa.attention(q, k, backend.asarray(v_np), causal=True, impl="materialize"))
    assert np.isnan(got[0, :-1]).all()  # 0 * NaN: earlier rows become NaN, as documented
    # ... and the documented remedy: say it with key_lengths, and nothing leaks
    for impl in _impls(backend):
        if impl == "native" and backend.name == "jax":
            continue  # JAX's kernel computes float64 inputs in float32: refused
        fixed = pa.attention(
            q,
            k,
            backend.asarray(v_np),
            causal=True,
            impl=impl,
            key_lengths=backend.asarray(np.array([5])),
            query_lengths=backend.asarray(np.array([5])),
        )
        assert np.isfinite(to_numpy(fixed)).all()
    # finite hidden values: earlier rows are bit-for-bit unchanged (the causality claim)
    v_np[0, -1] = 1e30
    a = to_numpy(pa.attention(q, k, v, causal=True))
    b = to_numpy(pa.attention(q, k, backend.asarray(v_np), causal=True))
    np.testing.assert_array_equal(a[0, :-1], b[0, :-1])


# --- 4. np.longdouble ---------------------------------------------------------------


@pytest.mark.skipif(
    np.finfo(np.longdouble).bits <= 64, reason="this platform's longdouble is float64"
)
def test_longdouble_is_refused_not_relabelled(rng):
    q = rng.standard_normal((3, 4)).astype(np.longdouble)
    for call in (
        lambda: pa.attention(q, q, q),
        lambda: pa.attention_weights(q, q),
        lambda: pa.softmax(q),
        lambda: pa.linear_attention(q, q, q),
        lambda: pa.apply_rope(q),
    ):
        with pytest.raises(TypeError, match=r"at most 64 bits .* got float128.*cast to float64"):
            call()


# --- 6. blockwise on odd shapes --------------------------------------------------------


@pytest.mark.parametrize("impl", ["auto", "blockwise", "materialize"])
def test_zero_size_batch(backend: Backend, impl):
    xp = backend.xp
    q = xp.zeros((0, 300, 4), dtype=xp.float64, device=backend.device)
    out = pa.attention(q, q, q, impl=impl)
    assert tuple(out.shape) == (0, 300, 4)
    out, lse = pa.attention(q, q, q, impl=impl, return_lse=True)
    assert tuple(lse.shape) == (0, 300)


@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
def test_zero_feature_size(backend: Backend, rng, impl):
    q = backend.asarray(np.zeros((2, 3, 0)))
    v = backend.asarray(rng.standard_normal((2, 4, 5)))
    k = backend.asarray(np.zeros((2, 4, 0)))
    want = np.broadcast_to(to_numpy(v).mean(axis=-2, keepdims=True), (2, 3, 5))  # scores all 0
    for scale in (None, 1.0):
        assert_close(pa.attention(q, k, v, impl=impl, scale=scale), want, rtol=1e-12)


def test_torch_meta_tensors_on_every_impl():
    import torch

    q = torch.empty((2, 4, 300, 8), device="meta")
    for impl in ("auto", "blockwise", "materialize", "native"):
        out = pa.attention(q, q, q, impl=impl, causal=True)
        assert out.shape == (2, 4, 300, 8) and out.device.type == "meta"


# --- 8. impl="native" hands torch a 4-D problem ------------------------------------------


@pytest.mark.parametrize("shape", [(7, 8), (3, 7, 8), (2, 3, 7, 8), (2, 2, 3, 7, 8)])
def test_native_torch_always_gets_4d(monkeypatch, rng, shape):
    import torch
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        mask = kwargs.get("attn_mask")
        seen.append((q.ndim, k.ndim, v.ndim, None if mask is None else mask.ndim))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    x = torch.from_numpy(rng.standard_normal(shape))
    want = to_numpy(pa.attention(x, x, x, causal=True, impl="materialize"))
    for kwargs in ({"causal": True}, {"causal": "bottom_right", "window": 2}):
        got = pa.attention(x, x, x, impl="native", **kwargs)
        if kwargs == {"causal": True}:
            assert_close(got, want, rtol=1e-12)
        assert tuple(got.shape) == shape
    assert seen and all(s[:3] == (4, 4, 4) and s[3] in (None, 4) for s in seen)


# --- 10./11./12. options validated before any cache, whatever the path -------------------


def test_validation_does_not_depend_on_call_history(rng):
    q = rng.standard_normal((3, 4))
    pa.attention(q, q, q, causal=True)
    pa.attention(q, q, q, window=1)
    with pytest.raises(ValueError, match=r"expected causal"):
        pa.attention(q, q, q, causal=1)
    with pytest.raises(ValueError, match=r"expected window"):
        pa.attention(q, q, q, window=True)


@pytest.mark.parametrize("impl", ["auto", "materialize", "blockwise"])
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"block_size": 0}, r"expected block_size"),
        ({"block_size": -1}, r"expected block_size"),
        ({"block_size": "4"}, r"expected block_size"),
        ({"return_lse": "no"}, r"expected return_lse to be True or False"),
        ({"window": 2**63 + 5.0}, r"expected window"),
    ],
)
def test_options_checked_on_every_path(rng, impl, kwargs, pattern):
    q = rng.standard_normal((3, 4))
    with pytest.raises(ValueError, match=pattern):
        pa.attention(q, q, q, impl=impl, **kwargs)


def test_huge_window_means_unbounded(backend: Backend, rng):
    q = backend.asarray(rng.standard_normal((5, 4)))
    want = to_numpy(pa.attention(q, q, q, causal=True))
    for impl in _impls(backend):
        if impl == "native" and backend.name == "jax":
            continue  # float64 is refused by JAX's kernel
        got = pa.attention(q, q, q, causal=True, window=(2**63, 2**70), impl=impl)
        assert_close(got, want, rtol=1e-12)


def test_numpy_integers_as_window_and_block_size(rng):
    q = rng.standard_normal((6, 4))
    want = pa.attention(q, q, q, window=(2, 1), impl="blockwise", block_size=(2, 3))
    got = pa.attention(
        q,
        q,
        q,
        window=(np.int64(2), np.int8(1)),
        impl="blockwise",
        block_size=(np.int64(2), np.uint16(3)),
    )
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        pa.attention(q, q, q, window=np.int64(1)), pa.attention(q, q, q, window=1)
    )


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_none_arrays_are_named(rng, which):
    args = {
        "query": rng.standard_normal((3, 4)),
        "key": rng.standard_normal((3, 4)),
        "value": rng.standard_normal((3, 4)),
    }
    args[which] = None
    with pytest.raises(TypeError, match=rf"expected {which} to be an array, got None"):
        pa.attention(args["query"], args["key"], args["value"])


def test_masked_arrays_are_refused(rng):
    q = rng.standard_normal((3, 4))
    with pytest.raises(
        TypeError, match=r"expected query to be a plain array, got a numpy.ma.MaskedArray"
    ):
        pa.attention(np.ma.masked_array(q, mask=q > 0), q, q)
    with pytest.raises(TypeError, match=r"expected value to be a plain array"):
        pa.attention(q, q, np.ma.masked_array(q))


def test_head_random_std_must_be_a_real_number():
    with pytest.raises(ValueError, match=r"expected std to be a finite real number >= 0, got '1'"):
        pa.Head.random(4, 2, std="1")
    head = pa.Head.random(4, 2, std=np.float32(0.5))
    assert head.wq.shape == (4, 2)


def test_from_torch_refuses_other_modules():
    import torch

    with pytest.raises(TypeError, match=r"expected a torch.nn.MultiheadAttention, got Linear"):
        pa.MultiHeadAttention.from_torch(torch.nn.Linear(4, 4))


# --- 13. scores that overflow the compute dtype (documented) ------------------------------


def test_scores_that_overflow_give_nan_rows_as_documented(backend: Backend):
    xp = backend.xp
    q = backend.asarray(np.array([[1e20, 0.0], [1.0, 0.0]]), xp.float32)
    with np.errstate(all="ignore"):
        out = to_numpy(pa.attention(q, q, q, scale=1.0, impl="materialize"))
    assert np.isnan(out[0]).all()  # |q.k| = 1e40 > float32's 3.4e38: that row is out of range
    assert np.isfinite(out[1]).all()  # other rows are unaffected


# --- 2. a failed MultiHeadAttention call with a cache appends nothing --------------------


def _mha(backend: Backend, **kwargs):
    return pa.MultiHeadAttention.random(
        8,
        4,
        num_kv_heads=2,
        rope="half",
        seed=3,
        xp=backend.xp,
        dtype=backend.xp.float64,
        device=backend.device,
        **kwargs,
    )


BAD_CALLS = [
    ({"window": -1}, ValueError),
    ({"causal": "yes"}, ValueError),
    ({"causal": 1}, ValueError),
    ({"mask": np.ones((1, 9), dtype=bool)}, ValueError),
    ({"mask": np.ones((1, 4))}, TypeError),
    ({"key_lengths": np.array([2.0, 3.0])}, TypeError),
    ({"key_lengths": np.array([[4], [4]])}, ValueError),
    ({"positions": np.arange(3)}, ValueError),
]


@pytest.mark.parametrize(("kwargs", "exc"), BAD_CALLS, ids=[str(k) for k, _ in BAD_CALLS])
def test_failed_cached_call_leaves_the_cache_and_a_retry_exact(backend: Backend, rng, kwargs, exc):
    mha = _mha(backend)
    x = rng.standard_normal((2, 4, 8))
    full = to_numpy(mha(backend.asarray(x), causal=True))
    cache = mha.new_cache(batch_shape=(2,))
    mha(backend.asarray(x[:, :3]), causal=True, cache=cache)
    before = (cache.length, to_numpy(cache.keys).tobytes(), to_numpy(cache.values).tobytes())
    bad = {k: backend.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    step = backend.asarray(x[:, 3:])
    with pytest.raises(exc):
        mha(step, **{"causal": True, **bad}, cache=cache)
    assert (
        cache.length,
        to_numpy(cache.keys).tobytes(),
        to_numpy(cache.values).tobytes(),
    ) == before
    got = mha(step, causal=True, cache=cache)  # the retry decodes against an intact cache
    assert_close(got, full[:, 3:], rtol=1e-12, xp=backend.xp)
    assert cache.length == 4


# --- 5. torch / Hugging Face mask and lengths layouts in MultiHeadAttention --------------


def test_mha_accepts_torch_hf_mask_layouts_with_their_meaning(backend: Backend, rng):
    mha = _mha(backend)
    b, lq = 3, 5
    x = backend.asarray(rng.standard_normal((b, lq, 8)))
    m = rng.random((b, lq, lq)) < 0.7
    m[..., 0] = True
    shared = to_numpy(mha(x, mask=backend.asarray(m)))
    one = to_numpy(mha(x, mask=backend.asarray(m[:, None])))  # (B, 1, Lq, Lk)
    assert one.shape == (b, lq, 8)
    assert_close(one, shared, rtol=1e-12)
    per_head = np.repeat(m[:, None], 4, axis=1)  # (B, H, Lq, Lk), all heads alike
    assert_close(mha(x, mask=backend.asarray(per_head)), shared, rtol=1e-12)
    # a head-specific mask really is per head: head 0 sees only key 0
    per_head[:, 0] = False
    per_head[:, 0, :, 0] = True
    w = to_numpy(mha.weights(x, mask=backend.asarray(per_head)))
    np.testing.assert_array_equal(w[:, 0, :, 1:], 0.0)
    assert (w[:, 1:][~np.repeat(m[:, None], 3, axis=1)] == 0).all()


def test_mha_refuses_layouts_that_would_enlarge_the_batch(backend: Backend, rng):
    mha = _mha(backend)
    x = backend.asarray(rng.standard_normal((3, 5, 8)))
    with pytest.raises(ValueError, match=r"key_lengths .* batch shape \(3,\), got shape \(3, 1\)"):
        mha(x, key_lengths=backend.asarray(np.full((3, 1), 5)))
    with pytest.raises(ValueError, match=r"Hugging Face layout .* got mask shape \(3, 2, 5, 5\)"):
        mha(x, mask=backend.asarray(np.ones((3, 2, 5, 5), dtype=bool)))
    with pytest.raises(ValueError, match=r"got mask shape \(2, 3, 1, 5, 5\)"):
        mha(x, mask=backend.asarray(np.ones((2, 3, 1, 5, 5), dtype=bool)))
