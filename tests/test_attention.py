"""attention / attention_weights against the float64 reference, on every backend and both paths."""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn._lib import _compat
from portattn._paths import _auto
from portattn.testing import assert_close, to_numpy

from conftest import Backend, assert_close_on, impls_for, make_qkv
from reference import attention_ref

# Every semantic test runs on the materialising path and on the blockwise
# path with blocks that do not divide the lengths, so tiles are ragged.
IMPLS = [
    pytest.param({"impl": "materialize"}, id="materialize"),
    pytest.param({"impl": "blockwise", "block_size": (3, 4)}, id="blockwise"),
]

LQ, LK, D, DV = 7, 9, 5, 6


def _options(rng, name):
    """Named combinations of options, as (portattn kwargs, reference kwargs, lq, lk)."""
    mask = rng.random((LQ, LK)) < 0.7
    bias = rng.standard_normal((3, LQ, LK))
    kl = np.array([[9], [4]])  # (2, 1): per batch entry, broadcast over heads
    ql = np.array([[7], [3]])
    square = LK
    table = {
        "plain": ({}, LQ, LK),
        "mask": ({"mask": mask}, LQ, LK),
        "bias": ({"bias": bias}, LQ, LK),
        "scale": ({"scale": 0.37}, LQ, LK),
        "causal_true": ({"causal": True}, square, square),
        "top_left": ({"causal": "top_left"}, LQ, LK),
        "bottom_right": ({"causal": "bottom_right"}, LQ, LK),
        "bottom_right_lq_gt_lk": ({"causal": "bottom_right"}, LK, LQ),
        "window": ({"window": (2, 1)}, square, square),
        "window_causal": ({"window": (3, 0), "causal": True}, square, square),
        "window_bottom_right": ({"window": 2, "causal": "bottom_right"}, LQ, LK),
        "key_lengths": ({"key_lengths": kl}, LQ, LK),
        "query_lengths": ({"query_lengths": ql}, LQ, LK),
        "all_combined": (
            {"mask": mask, "bias": bias, "causal": "bottom_right", "scale": 0.5, "key_lengths": kl},
            LQ,
            LK,
        ),
    }
    return table[name]


OPTION_NAMES = [
    "plain",
    "mask",
    "bias",
    "scale",
    "causal_true",
    "top_left",
    "bottom_right",
    "bottom_right_lq_gt_lk",
    "window",
    "window_causal",
    "window_bottom_right",
    "key_lengths",
    "query_lengths",
    "all_combined",
]


def _on(backend: Backend, kwargs: dict, dtype=None) -> dict:
    out = {}
    for key, val in kwargs.items():
        if isinstance(val, np.ndarray):
            is_float = val.dtype.kind == "f"
            out[key] = backend.asarray(val, dtype if is_float else None)
        else:
            out[key] = val
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", OPTION_NAMES)
def test_matches_float64_reference(backend: Backend, rng, impl, name):
    opts, lq, lk = _options(rng, name)
    q, k, v = make_qkv(rng, lq, lk, d=D, dv=DV, batch=(2, 3))
    for dtype in backend.float_dtypes:
        got = pa.attention(
            backend.asarray(q, dtype),
            backend.asarray(k, dtype),
            backend.asarray(v, dtype),
            **_on(backend, opts, dtype),
            **impl,
        )
        want, _ = attention_ref(q, k, v, **opts)
        assert_close_on(backend, got, want, dtype=dtype, shape=(2, 3, lq, DV))


@pytest.mark.parametrize("name", OPTION_NAMES)
def test_weights_match_reference(backend: Backend, rng, name):
    opts, lq, lk = _options(rng, name)
    q, k, _ = make_qkv(rng, lq, lk, d=D, dv=DV, batch=(2, 3))
    got = pa.attention_weights(backend.asarray(q), backend.asarray(k), **_on(backend, opts))
    _, want = attention_ref(q, k, np.zeros((*k.shape[:-1], 1)), **opts)
    assert_close(got, want, rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64)
    sums = to_numpy(got).sum(axis=-1)
    assert np.all((np.abs(sums - 1) < 1e-12) | (sums == 0))


@pytest.mark.parametrize("impl", IMPLS)
def test_leading_dimensions_broadcast(backend: Backend, rng, impl):
    q = rng.standard_normal((4, 1, LQ, D))
    k = rng.standard_normal((3, LK, D))
    v = rng.standard_normal((1, LK, DV))
    got = pa.attention(*(backend.asarray(a) for a in (q, k, v)), **impl)
    want, _ = attention_ref(q, k, v)
    assert_close(got, want, rtol=1e-12, shape=(4, 3, LQ, DV), xp=backend.xp)


@pytest.mark.parametrize("impl", IMPLS)
def test_fully_masked_rows_give_zero_without_warnings(backend: Backend, rng, impl):
    q, k, v = make_qkv(rng, LQ, LK, d=D, dv=DV, batch=(2, 3))
    mask = rng.random((LQ, LK)) < 0.5
    mask[2] = False
    bias = np.zeros((LQ, LK))
    bias[4] = -np.inf  # a row hidden through the bias alone
    with np.errstate(all="raise"):
        out, lse = pa.attention(
            *(backend.asarray(a) for a in (q, k, v)),
            mask=backend.asarray(mask),
            bias=backend.asarray(bias),
            return_lse=True,
            **impl,
        )
        w = pa.attention_weights(
            backend.asarray(q),
            backend.asarray(k),
            mask=backend.asarray(mask),
            bias=backend.asarray(bias),
        )
    out, lse, w = to_numpy(out), to_numpy(lse), to_numpy(w)
    assert not np.isnan(out).any()
    assert np.all(out[..., 2, :] == 0)
    assert np.all(out[..., 4, :] == 0)
    assert np.all(w[..., [2, 4], :] == 0)
    assert np.all(lse[..., [2, 4]] == -np.inf)
    want, _ = attention_ref(q, k, v, mask=mask, bias=bias)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_keys_give_zero(backend: Backend, rng, impl):
    q = backend.asarray(rng.standard_normal((2, LQ, D)))
    k = backend.asarray(np.zeros((2, 0, D)))
    v = backend.asarray(np.zeros((2, 0, DV)))
    with np.errstate(all="raise"):
        out = pa.attention(q, k, v, **impl)
        w = pa.attention_weights(q, k)
    assert tuple(out.shape) == (2, LQ, DV)
    assert tuple(w.shape) == (2, LQ, 0)
    assert np.all(to_numpy(out) == 0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
def test_large_finite_scores_do_not_overflow(backend: Backend, rng, impl, causal):
    """No flag and no error, with hidden entries (causal) among the huge scores too."""
    xp = backend.xp
    q = rng.standard_normal((LQ, D)) * 1e18  # scores near 1e36, the float32 limit is 3.4e38
    k = rng.standard_normal((LK, D)) * 1e18
    v = rng.standard_normal((LK, DV))
    with np.errstate(all="raise"):
        got = pa.attention(
            *(backend.asarray(a, xp.float32) for a in (q, k, v)), causal=causal, **impl
        )
    want, _ = attention_ref(q, k, v, causal=causal)
    assert_close(got, want, rtol=1e-5, dtype=xp.float32)


class _FlagsOnce(np.ndarray):
    """An array whose first product raises as NumPy does for a BLAS's spurious "invalid" flag."""

    error: type[Exception] = FloatingPointError
    calls = 0

    def __matmul__(self, other):
        type(self).calls += 1
        if type(self).calls == 1:
            raise type(self).error("invalid value encountered in matmul")
        return np.asarray(self) @ other


@pytest.mark.parametrize("error", [FloatingPointError, RuntimeWarning])
def test_a_spurious_invalid_flag_in_a_product_is_dropped(rng, monkeypatch, error):
    """NumPy's OpenBLAS may flag "invalid" on a finite product (numpy/numpy#24067). The result
    holds no NaN, so the flag was wrong and the product stands: under errstate's "raise" and
    with warnings made errors alike."""
    monkeypatch.setattr(_FlagsOnce, "error", error)
    monkeypatch.setattr(_FlagsOnce, "calls", 0)
    a = rng.standard_normal((2, 3, 5))
    b = rng.standard_normal((2, 5, 4))
    got = _compat.matmul(a.view(_FlagsOnce), b, xp=_compat.array_namespace(b))
    assert _FlagsOnce.calls == 2  # it raised, and the product was taken again
    np.testing.assert_array_equal(np.asarray(got), a @ b)


@pytest.mark.parametrize("impl", [*IMPLS, pytest.param({"impl": "auto"}, id="auto")])
def test_a_real_invalid_value_in_a_product_still_raises(impl):
    """0 times an inf key is NaN: a caller who asked for invalid values to raise gets the error,
    and one who did not gets NumPy's warning and the NaN."""
    q = np.ones((1, 2, 4))
    q[..., 0] = 0.0
    k = np.ones((1, 3, 4))
    k[0, 1, 0] = np.inf
    v = np.ones((1, 3, 2))
    with np.errstate(all="raise"), pytest.raises(FloatingPointError, match="invalid value"):
        pa.attention(q, k, v, **impl)
    with pytest.warns(RuntimeWarning, match="invalid value encountered in matmul"):
        out = pa.attention(q, k, v, **impl)
    assert np.isnan(out).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_inputs_are_not_mutated(backend: Backend, rng, impl):
    q, k, v = make_qkv(rng, LQ, LK, d=D, dv=DV, batch=(2, 3))
    mask = rng.random((LQ, LK)) < 0.8
    bias = rng.standard_normal((LQ, LK))
    arrays = [backend.asarray(a) for a in (q, k, v, mask, bias)]
    before = [to_numpy(a) for a in arrays]
    pa.attention(
        *arrays[:3],
        mask=arrays[3],
        bias=arrays[4],
        causal=True if LQ == LK else "bottom_right",
        **impl,
    )
    pa.attention_weights(arrays[0], arrays[1], mask=arrays[3], bias=arrays[4])
    for a, b in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(to_numpy(a), b)


@pytest.mark.parametrize("impl", IMPLS)
def test_same_call_twice_is_bit_identical(backend: Backend, rng, impl):
    args = make_qkv(
        rng, LQ, LK, d=D, dv=DV, batch=(2, 3), backend=backend, dtype=backend.xp.float32
    )
    a = to_numpy(pa.attention(*args, causal="bottom_right", **impl))
    b = to_numpy(pa.attention(*args, causal="bottom_right", **impl))
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, "top_left", "bottom_right"])
@pytest.mark.parametrize("factor", [-3.0, 1e6])
def test_causality_is_bit_exact(backend: Backend, rng, impl, causal, factor):
    lq = LK if causal is True else LQ
    q, k, v = make_qkv(rng, lq, LK, d=D, dv=DV, batch=(2, 3))
    offset = LK - lq if causal == "bottom_right" else 0
    for dtype in backend.float_dtypes:
        if factor > 1e4 and dtype not in (backend.xp.float32, backend.xp.float64):
            continue  # 1e6 times a normal draw is not representable in half precision
        base = pa.attention(*(backend.asarray(a, dtype) for a in (q, k, v)), causal=causal, **impl)
        for t in range(1, LK):  # rewrite every key/value position >= t
            k2, v2 = k.copy(), v.copy()
            k2[..., t:, :] *= factor
            v2[..., t:, :] *= factor
            out = pa.attention(
                backend.asarray(q, dtype),
                backend.asarray(k2, dtype),
                backend.asarray(v2, dtype),
                causal=causal,
                **impl,
            )
            rows = max(0, min(lq, t - offset))  # queries that only see keys < t
            a, b = to_numpy(base)[..., :rows, :], to_numpy(out)[..., :rows, :]
            assert a.tobytes() == b.tobytes(), (dtype, t)
            if rows < lq:
                assert (
                    to_numpy(base)[..., rows:, :].tobytes()
                    != to_numpy(out)[..., rows:, :].tobytes()
                )


def test_one_namespace_lookup_per_public_call(backend: Backend, rng, monkeypatch):
    calls = []
    real = _compat.array_namespace

    def counting(*arrays, **names):
        calls.append(len(arrays))
        return real(*arrays, **names)

    monkeypatch.setattr(_compat, "array_namespace", counting)
    for module in ("_attention", "_core._softmax", "_layers._head"):
        monkeypatch.setattr(f"portattn.{module}.array_namespace", counting)
    q, k, v = (backend.asarray(a) for a in make_qkv(rng, LQ, LK, d=D, dv=DV, batch=(2, 3)))
    head = pa.Head.random(D, 3, xp=backend.xp, device=backend.device, dtype=backend.xp.float64)
    calls_expected = [
        lambda: pa.attention(q, k, v),  # a repeat takes the shortcut from the public entry
        lambda: pa.attention(q, k, v, mask=backend.asarray(np.ones((LQ, LK), bool))),
        lambda: pa.attention(q, k, v, impl="blockwise", block_size=2),
        lambda: pa.attention_weights(q, k),
        lambda: pa.softmax(q),
        lambda: head(q),
        lambda: head.weights(q, causal=True),
        lambda: head.scores(q),
    ]
    _auto.forget_plans()
    for call in calls_expected:
        calls.clear()
        call()
        assert len(calls) == 1
        # A repeat, memoised where the library allows: at most once (torch's
        # shortcut to SDPA needs no namespace at all).
        calls.clear()
        call()
        assert len(calls) <= 1


def test_dtype_and_namespace_follow_inputs(backend: Backend, rng):
    xp = backend.xp
    q, k, v = make_qkv(rng, LQ, LK, d=D, dv=DV, batch=(2, 3))
    for dtype in backend.float_dtypes:
        out = pa.attention(*(backend.asarray(a, dtype) for a in (q, k, v)))
        assert out.dtype == dtype
        assert _compat.array_namespace(out) is xp
        assert _compat.device(out) == backend.device
    mixed = pa.attention(
        backend.asarray(q, xp.float32),
        backend.asarray(k, xp.float64),
        backend.asarray(v, xp.float32),
    )
    assert mixed.dtype == xp.float64  # standard type promotion, as in xp.result_type


def test_half_precision_is_computed_in_float32(backend: Backend, rng):
    """Half inputs whose float16 scores would overflow still work: scores live in float32."""
    # The standard defines no half precision, so array_api_strict alone has none.
    assert backend.half_dtypes or backend.name == "array_api_strict"
    q = rng.standard_normal((LQ, 64)) * 40
    k = rng.standard_normal((LK, 64)) * 40
    v = rng.standard_normal((LK, DV))
    for dtype in backend.half_dtypes:
        qh, kh, vh = (backend.asarray(a, dtype) for a in (q, k, v))
        got = pa.attention(qh, kh, vh)
        exact = [to_numpy(a).astype(np.float64) for a in (qh, kh, vh)]
        want, _ = attention_ref(*exact)
        assert_close(got, want, rtol=1e-2, dtype=dtype)


def test_float64_stays_float64(backend: Backend, rng):
    """A float64-only difference: 1 + 1e-12 survives end to end."""
    xp = backend.xp
    v = np.ones((2, 3))
    v[1] += 1e-12
    q = np.zeros((1, 2))
    k = np.zeros((2, 2))
    out = pa.attention(*(backend.asarray(a, xp.float64) for a in (q, k, v)))
    assert out.dtype == xp.float64
    assert to_numpy(out)[0, 0] == (1 + (1 + 1e-12)) / 2


# --- non-finite values hidden without key_lengths (documented) ------------------------


def test_non_finite_values_hidden_by_causal_or_mask_are_documented(backend: Backend, rng):
    """Documented in attention's Notes: only key_lengths sanitises; hidden inf/NaN can give NaN."""
    q, k, v = make_qkv(rng, 6, 6, d=4, batch=(1,), backend=backend)
    v_np = to_numpy(v).copy()
    v_np[0, -1] = np.nan  # the last value, hidden by causality from every row but the last
    with np.errstate(all="ignore"):
        got = to_numpy(pa.attention(q, k, backend.asarray(v_np), causal=True, impl="materialize"))
    assert np.isnan(got[0, :-1]).all()  # 0 * NaN: earlier rows become NaN, as documented
    # ... and the documented remedy: say it with key_lengths, and nothing leaks
    for impl in impls_for(backend):
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


# --- odd shapes -----------------------------------------------------------------------


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


# --- scores that overflow the compute dtype (documented) ------------------------------


def test_scores_that_overflow_give_nan_rows_as_documented(backend: Backend):
    xp = backend.xp
    q = backend.asarray(np.array([[1e20, 0.0], [1.0, 0.0]]), xp.float32)
    with np.errstate(all="ignore"):
        out = to_numpy(pa.attention(q, q, q, scale=1.0, impl="materialize"))
    assert np.isnan(out[0]).all()  # |q.k| = 1e40 > float32's 3.4e38: that row is out of range
    assert np.isfinite(out[1]).all()  # other rows are unaffected
