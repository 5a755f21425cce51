"""Gradients: torch autograd and ``jax.grad`` through every impl, and the O(N) blockwise backward.

Oracles: ``torch.autograd.gradcheck`` (finite differences, float64), the
gradients of torch's ``scaled_dot_product_attention`` and of
``jax.nn.dot_product_attention``, and a float64 formula written here with
plain autodiff over the materialised softmax. torch and jax are in the test
dependency group, so a missing one is an error, not a skip.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import portattn as pa
from portattn import _attention
from portattn._core._prepare import prepare
from portattn._core._variant import build_variant
from portattn._grad._backward import blockwise_backward

F = torch.nn.functional
IMPLS = ("materialize", "blockwise", "native")
BLOCKS = (4, 3)  # several query and key tiles at the small lengths used here


def _t(rng: np.random.Generator, *shape: int, grad: bool = True) -> torch.Tensor:
    return torch.tensor(rng.standard_normal(shape), dtype=torch.float64, requires_grad=grad)


def _kw(impl: str, **kw: Any) -> dict[str, Any]:
    if impl == "blockwise":
        kw["block_size"] = BLOCKS
    return {"impl": impl, **kw}


def _grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], d_out: torch.Tensor) -> list:
    return list(torch.autograd.grad(out, inputs, d_out, allow_unused=True))


# --- torch: finite differences ---------------------------------------------------------

# (name, options, native can do it)
CASES = [
    ("plain", {}, True),
    ("causal", {"causal": True}, True),
    ("bottom_right", {"causal": "bottom_right"}, True),
    ("window", {"window": (2, 1)}, True),
    ("softcap", {"softcap": 1.5}, False),
]


GRADCHECK = [
    pytest.param(impl, options, id=f"{impl}-{name}")
    for name, options, native_ok in CASES
    for impl in IMPLS
    if native_ok or impl != "native"  # native refuses softcap (test_native checks that)
]


@pytest.mark.parametrize(("impl", "options"), GRADCHECK)
def test_gradcheck_torch(rng, impl, options):
    lq = 11
    lk = 9 if options.get("causal") == "bottom_right" else lq
    q, k, v = _t(rng, 2, lq, 4), _t(rng, 2, lk, 4), _t(rng, 2, lk, 3)

    def f(q, k, v):
        return pa.attention(q, k, v, **_kw(impl, **options))

    # full Jacobians for the new backward once; a random projection (fast_mode) elsewhere
    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=bool(options) or impl != "blockwise")


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck_bias_mask_lengths_gqa(rng, impl):
    # GQA-style broadcasting: two query heads per KV head, bias shared over
    # the batch, a mask and lengths that leave some rows seeing nothing.
    b, hkv, g, lq, lk = 2, 2, 2, 13, 10
    q = _t(rng, b, hkv, g, lq, 4)
    k, v = _t(rng, b, hkv, 1, lk, 4), _t(rng, b, hkv, 1, lk, 3)
    bias = _t(rng, 1, hkv, g, lq, lk)
    mask = torch.from_numpy(rng.random((lq, lk)) < 0.8)
    mask[3] = False  # a row no key is visible to
    kl = torch.tensor([lk, 6])[:, None, None]
    ql = torch.tensor([lq - 2, lq])[:, None, None]

    def f(q, k, v, bias):
        return pa.attention(
            q,
            k,
            v,
            **_kw(impl, bias=bias, mask=mask, key_lengths=kl, query_lengths=ql, causal="top_left"),
        )

    assert torch.autograd.gradcheck(f, (q, k, v, bias), fast_mode=True)
    out = f(q, k, v, bias)
    dq, dk, dv, db = _grads(out, (q, k, v, bias), torch.ones_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape and db.shape == bias.shape
    for grad in (dq, dk, dv, db):
        assert torch.isfinite(grad).all()
    assert (dq[..., 3, :] == 0).all()  # the row that sees nothing: exact zeros, not NaN
    assert (dq[0, ..., lq - 2 :, :] == 0).all()  # rows past query_lengths
    assert (dk[1, ..., 6:, :] == 0).all()  # keys past key_lengths


@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
def test_gradcheck_return_lse(rng, impl):
    """The lse output has a gradient too (d lse / d s = P), alone or with the output."""
    q, k, v = _t(rng, 2, 10, 4), _t(rng, 2, 10, 4), _t(rng, 2, 10, 3)
    bias = _t(rng, 10, 10)
    qlen = torch.tensor([10, 7])

    def f(q, k, v, bias):
        out, lse = pa.attention(
            q,
            k,
            v,
            **_kw(impl, bias=bias, softcap=2.0, causal=True, query_lengths=qlen, return_lse=True),
        )
        return out, torch.where(torch.isinf(lse), 0.0, lse)

    assert torch.autograd.gradcheck(f, (q, k, v, bias), fast_mode=True)
    lse_only = torch.autograd.gradcheck(lambda *a: f(*a)[1], (q, k, v, bias), fast_mode=True)
    assert lse_only


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck_attention_weights_head_mha(rng, impl, monkeypatch):
    # Head and MultiHeadAttention run impl="auto"; its choice is pinned here
    # so that each path is differentiated through them.
    monkeypatch.setattr(_attention, "auto_impl", lambda p, **kw: impl)
    x = _t(rng, 2, 7, 6)
    q, k = _t(rng, 7, 3), _t(rng, 7, 3)
    assert torch.autograd.gradcheck(
        lambda q, k: pa.attention_weights(q, k, causal=True, softcap=3.0), (q, k), fast_mode=True
    )
    wq, wk, wv = _t(rng, 6, 3), _t(rng, 6, 3), _t(rng, 6, 3)
    assert torch.autograd.gradcheck(
        lambda x, wq, wk, wv: pa.Head(wq, wk, wv)(x, causal=True), (x, wq, wk, wv), fast_mode=True
    )
    weights = {
        "wq": _t(rng, 6, 8),
        "wk": _t(rng, 6, 4),
        "wv": _t(rng, 6, 4),
        "wo": _t(rng, 8, 6),
        "bq": _t(rng, 8),
        "bo": _t(rng, 6),
    }
    names = tuple(weights)

    def mha(x, *ws):
        w = dict(zip(names, ws, strict=True))
        m = pa.MultiHeadAttention(
            w["wq"], w["wk"], w["wv"], w["wo"], num_heads=4, num_kv_heads=2, bq=w["bq"], bo=w["bo"]
        )
        return m(x, causal=True), m.weights(x, window=2)

    assert torch.autograd.gradcheck(mha, (x, *weights.values()), fast_mode=True)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_linear_attention(rng, causal):
    q, k, v = _t(rng, 2, 9, 4), _t(rng, 2, 9, 4), _t(rng, 2, 9, 3)
    assert torch.autograd.gradcheck(
        lambda q, k, v: pa.linear_attention(q, k, v, causal=causal, chunk_size=4),
        (q, k, v),
        fast_mode=True,
    )


# --- torch: against SDPA's own gradients -----------------------------------------------


def _sdpa_case(rng: np.random.Generator, case: str):
    """Inputs, portattn options and the SDPA options that mean the same thing."""
    b, h, lq, lk = 2, 3, 12, 12
    q, k, v = _t(rng, b, h, lq, 5), _t(rng, b, h, lk, 5), _t(rng, b, h, lk, 4)
    extra: tuple[torch.Tensor, ...] = ()
    pa_kw: dict[str, Any] = {}
    sdpa_kw: dict[str, Any] = {}
    if case == "causal":
        pa_kw["causal"], sdpa_kw["is_causal"] = True, True
    elif case == "window":
        pa_kw["window"] = (3, 2)
        sdpa_kw["attn_mask"] = torch.from_numpy(pa.window_mask(lq, lk, window=(3, 2)))
    elif case == "bias":
        bias = _t(rng, h, lq, lk)
        extra = (bias,)
        pa_kw["bias"], sdpa_kw["attn_mask"] = bias, bias
    elif case == "mask_lengths":
        m = torch.from_numpy(rng.random((lq, lk)) < 0.7)
        m[:, 0] = True  # SDPA gives NaN for a row that sees nothing
        kl = torch.tensor([lk, 5])
        pa_kw["mask"], pa_kw["key_lengths"] = m, kl[:, None]
        sdpa_kw["attn_mask"] = m & (torch.arange(lk) < kl[:, None, None, None])
    elif case == "gqa":
        k = _t(rng, b, 1, lk, 5)
        v = _t(rng, b, 1, lk, 4)
        sdpa_kw["enable_gqa"] = True
    elif case == "scale":
        pa_kw["scale"], sdpa_kw["scale"] = 0.37, 0.37
    return (q, k, v, *extra), pa_kw, sdpa_kw


SDPA_CASES = ("plain", "causal", "window", "bias", "mask_lengths", "gqa", "scale")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", SDPA_CASES)
def test_grads_match_sdpa(rng, impl, case):
    inputs, pa_kw, sdpa_kw = _sdpa_case(rng, case)
    q, k, v = inputs[:3]
    out = pa.attention(*inputs[:3], **_kw(impl, **pa_kw))
    want = F.scaled_dot_product_attention(q, k, v, **sdpa_kw)
    d_out = torch.tensor(rng.standard_normal(out.shape))
    got = _grads(out, inputs, d_out)
    ref = _grads(want, inputs, d_out)
    for g, r, x in zip(got, ref, inputs, strict=True):
        assert g.shape == x.shape
        torch.testing.assert_close(g, r, rtol=0, atol=1e-10)


def test_float32_grads_match_sdpa(rng):
    """float32 and float16 come back through prepare's cast: grads keep the input's dtype."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        q, k, v = (
            torch.tensor(rng.standard_normal((2, 70, 16)), dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        out = pa.attention(q, k, v, causal=True, impl="blockwise", block_size=(16, 32))
        want = F.scaled_dot_product_attention(*(x.float() for x in (q, k, v)), is_causal=True)
        d_out = torch.tensor(rng.standard_normal(out.shape), dtype=dtype)
        got = _grads(out, (q, k, v), d_out)
        ref = _grads(want, (q, k, v), d_out.float())
        for g, r in zip(got, ref, strict=True):
            assert g.dtype == dtype
            torch.testing.assert_close(g.float(), r.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("impl", IMPLS)
def test_grad_after_inference_mode_and_no_grad(rng, impl):
    q, k, v = _t(rng, 1, 20, 4), _t(rng, 1, 20, 4), _t(rng, 1, 20, 4)
    with torch.inference_mode():
        pa.attention(q, k, v, **_kw(impl, causal=True))
    with torch.no_grad():
        pa.attention(q, k, v, **_kw(impl, causal=True))
    out = pa.attention(q, k, v, **_kw(impl, causal=True))
    out.sum().backward()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = torch.autograd.grad(want.sum(), (q,))[0]
    assert q.grad is not None
    torch.testing.assert_close(q.grad, ref, rtol=0, atol=1e-10)


def test_no_grad_runs_the_plain_forward(rng, monkeypatch):
    """Without a gradient to take, the autograd.Function stays out of the way."""
    from portattn._grad import _autodiff

    calls = []
    real = _autodiff._torch_function

    def spy():
        calls.append(1)
        return real()

    monkeypatch.setattr(_autodiff, "_torch_function", spy)
    q = _t(rng, 1, 9, 4, grad=False)
    pa.attention(q, q, q, impl="blockwise")
    qg = _t(rng, 1, 9, 4)
    with torch.no_grad():
        pa.attention(qg, qg, qg, impl="blockwise")
    assert calls == []
    pa.attention(qg, qg, qg, impl="blockwise")
    assert calls == [1]


# --- the O(N) claim, without timing ----------------------------------------------------


def test_blockwise_saves_no_score_sized_tensor(rng):
    """Everything autograd keeps for the backward is O(L·d): no (Lq, Lk) tile, nothing."""
    lq = lk = 256
    d = 8
    q, k, v = (_t(rng, 2, n, d) for n in (lq, lk, lk))
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = pa.attention(q, k, v, causal=True, impl="blockwise", block_size=(32, 64))
    assert saved, "nothing was saved: the Function did not run"
    biggest = max(math.prod(s) for s in saved)
    assert biggest <= 2 * lq * d, saved  # q, k, v, out, lse; a score tile would be 32*64*2
    out.sum().backward()
    # The materialising path, for contrast, keeps (Lq, Lk) score matrices.
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pa.attention(q, k, v, causal=True, impl="materialize")
    assert max(math.prod(s) for s in saved) >= 2 * lq * lk


# --- the generic backward on a library without autodiff --------------------------------


def test_generic_backward_runs_on_array_api_strict(rng):
    """The backward is array API code: array_api_strict gets torch autograd's answer."""
    import array_api_strict as xps

    from portattn._paths._blockwise import blockwise_attention

    lq, lk = 13, 11
    arrays = {
        "q": rng.standard_normal((2, lq, 4)),
        "k": rng.standard_normal((2, lk, 4)),
        "v": rng.standard_normal((2, lk, 3)),
        "bias": rng.standard_normal((1, lq, 1)),
    }
    mask = rng.random((lq, lk)) < 0.8
    d_out = rng.standard_normal((2, lq, 3))
    d_lse = rng.standard_normal((2, lq))
    opts = {"causal": "bottom_right", "window": (4, 1), "softcap": 1.2}

    p = prepare(
        *(xps.asarray(arrays[n]) for n in "qkv"),
        build_variant(bias=xps.asarray(arrays["bias"]), mask=xps.asarray(mask), **opts),
        xp=xps,
    )
    out, lse = blockwise_attention(p, block_size=BLOCKS, xp=xps)
    lse_d = xps.asarray(d_lse)
    g = blockwise_backward(p, out, lse, xps.asarray(d_out), lse_d, block_size=BLOCKS, xp=xps)

    tq, tk, tv, tb = (torch.tensor(arrays[n], requires_grad=True) for n in ("q", "k", "v", "bias"))
    t_out, t_lse = pa.attention(
        tq,
        tk,
        tv,
        bias=tb,
        mask=torch.from_numpy(mask),
        impl="materialize",
        return_lse=True,
        **opts,
    )
    finite = torch.isfinite(t_lse)
    loss = (t_out * torch.from_numpy(d_out)).sum() + (
        torch.where(finite, t_lse, 0.0) * torch.from_numpy(d_lse)
    ).sum()
    want = torch.autograd.grad(loss, (tq, tk, tv, tb))
    # prepare scaled q: its gradient is the scale times the one on the scaled q
    got = (np.asarray(g.q) * p.scale, np.asarray(g.k), np.asarray(g.v), np.asarray(g.bias))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=0, atol=1e-12)


def test_empty_lengths_give_zero_grads(rng):
    for lq, lk in ((0, 5), (5, 0)):
        q, k, v = _t(rng, 2, lq, 4), _t(rng, 2, lk, 4), _t(rng, 2, lk, 3)
        out = pa.attention(q, k, v, impl="blockwise")
        grads = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
        for grad, x in zip(grads, (q, k, v), strict=True):
            assert grad is None or (grad.shape == x.shape and (grad == 0).all())


# --- JAX --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jnp() -> Any:
    from portattn._lib._backends import load

    load("jax")  # turns on float64
    import jax.numpy

    return jax.numpy


def _formula(q, k, v, *, bias=None, allowed=None, softcap=None, scale=None, jnp):
    """Attention written out in jnp: the float64 oracle (materialised, plain autodiff)."""
    s = q @ jnp.swapaxes(k, -1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if softcap is not None:
        s = jnp.tanh(s / softcap) * softcap
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = jnp.where(allowed, s, -jnp.inf)
    lse = jax_logsumexp(s)
    return jnp.exp(s - lse[..., None]) @ v, lse


def jax_logsumexp(s):
    import jax

    return jax.nn.logsumexp(s, axis=-1)


JAX_CASES = ("plain", "causal", "window", "bias", "mask_lengths", "gqa")


def _jax_case(rng, case, dtype, jnp):
    """BNTH inputs, portattn options, and jax.nn.dot_product_attention's (BTNH) options."""
    b, h, lq, lk, d = 2, 2, 12, 12, 8
    hk = 1 if case == "gqa" else h
    arrays = {
        "q": rng.standard_normal((b, h, lq, d)),
        "k": rng.standard_normal((b, hk, lk, d)),
        "v": rng.standard_normal((b, hk, lk, d)),
    }
    opts: dict[str, Any] = {}
    ref: dict[str, Any] = {}
    if case == "causal":
        opts["causal"], ref["is_causal"] = True, True
    elif case == "window":
        opts["window"], ref["local_window_size"] = (3, 2), (3, 2)
    elif case == "bias":
        arrays["bias"] = rng.standard_normal((1, h, lq, lk))
    elif case == "mask_lengths":
        m = rng.random((lq, lk)) < 0.7
        m[:, 0] = True  # a row that sees nothing would be NaN-free here but uniform in JAX
        opts["mask"] = jnp.asarray(m)
        opts["key_lengths"] = jnp.asarray([[lk], [5]])
        ref["mask"] = jnp.asarray(m) & (jnp.arange(lk) < jnp.asarray([lk, 5])[:, None, None, None])
    out = {n: jnp.asarray(a, dtype=dtype) for n, a in arrays.items()}
    return out, opts, ref


def _bthn(x, jnp):
    return jnp.swapaxes(x, 1, 2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", JAX_CASES)
def test_jax_grads_match_dot_product_attention(rng, jnp, impl, case):
    import jax

    arrays, opts, ref_opts = _jax_case(rng, case, jnp.float32, jnp)
    names = tuple(arrays)
    d_out = jnp.asarray(rng.standard_normal(arrays["q"].shape), dtype=jnp.float32)

    def ours(*xs, **extra):
        a = dict(zip(names, xs, strict=True))
        return pa.attention(a["q"], a["k"], a["v"], bias=a.get("bias"), **_kw(impl, **extra))

    def theirs(*xs, **extra):
        a = dict(zip(names, xs, strict=True))
        bias = a.get("bias")
        out = jax.nn.dot_product_attention(*(_bthn(a[n], jnp) for n in "qkv"), bias=bias, **extra)
        return _bthn(out, jnp)

    def vjp(f, extra):
        # arrays go through jit as arguments (traced), everything else is closed over
        arrs = {n: x for n, x in extra.items() if hasattr(x, "shape")}
        static = {n: x for n, x in extra.items() if n not in arrs}

        @jax.jit
        def run(d_out, xs, arrs):
            _, pull = jax.vjp(lambda *ys: f(*ys, **arrs, **static), *xs)
            return pull(d_out)

        return run(d_out, tuple(arrays[n] for n in names), arrs)

    got = vjp(ours, opts)
    want = vjp(theirs, ref_opts)
    for g, w, n in zip(got, want, names, strict=True):
        assert g.shape == arrays[n].shape and g.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)


SUBSETS = ((0,), (2,), (1, 3), (0, 1, 2, 3))


@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
def test_jax_grad_any_subset_float64(rng, jnp, impl):
    """jax.grad with respect to any subset of (q, k, v, bias), against the float64 formula."""
    import jax

    lq, lk = 10, 13  # every row sees a key: the formula has no guard for empty rows
    xs = (
        jnp.asarray(rng.standard_normal((2, lq, 4))),
        jnp.asarray(rng.standard_normal((2, lk, 4))),
        jnp.asarray(rng.standard_normal((2, lk, 3))),
        jnp.asarray(rng.standard_normal((lq, 1))),
    )
    w_out = jnp.asarray(rng.standard_normal((2, lq, 3)))
    w_lse = jnp.asarray(rng.standard_normal((2, lq)))
    opts = {"causal": "bottom_right", "window": (6, 1), "softcap": 2.5}
    allowed = jnp.asarray(pa.window_mask(lq, lk, window=(6, 1), causal=True))

    def loss_ours(q, k, v, bias):
        out, lse = pa.attention(q, k, v, bias=bias, return_lse=True, **_kw(impl, **opts))
        return jnp.sum(out * w_out) + jnp.sum(jnp.where(jnp.isinf(lse), 0.0, lse) * w_lse)

    def loss_formula(q, k, v, bias):
        out, lse = _formula(q, k, v, bias=bias, allowed=allowed, softcap=2.5, jnp=jnp)
        return jnp.sum(out * w_out) + jnp.sum(lse * w_lse)

    for argnums in SUBSETS:
        got = jax.jit(jax.grad(loss_ours, argnums=argnums))(*xs)
        want = jax.grad(loss_formula, argnums=argnums)(*xs)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == jnp.float64
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=1e-12)


def test_jax_rows_that_see_nothing_get_zero_grads(rng, jnp):
    import jax

    q, k, v = (jnp.asarray(rng.standard_normal((2, 9, 4))) for _ in range(3))
    mask = np.ones((9, 9), bool)
    mask[4] = False
    ql = jnp.asarray([9, 6])

    def loss(q, k, v, mask, ql, impl):
        out = pa.attention(q, k, v, mask=mask, query_lengths=ql, **_kw(impl))
        return jnp.sum(out)

    for impl in ("materialize", "blockwise"):
        dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=5)(
            q, k, v, jnp.asarray(mask), ql, impl
        )
        for g in (dq, dk, dv):
            assert bool(jnp.all(jnp.isfinite(g)))
        assert bool(jnp.all(dq[:, 4] == 0)) and bool(jnp.all(dq[1, 6:] == 0))


# --- double backward, torch.func and empty shapes --------------------------------------

ALL_IMPLS = ("auto", *IMPLS)


@pytest.mark.parametrize(
    ("impl", "options"),
    [
        pytest.param(impl, options, id=f"{impl}-{name}")
        for impl in ALL_IMPLS
        for name, options in (("causal", {"causal": True}), ("softcap", {"softcap": 1.5}))
        if not (impl == "native" and "softcap" in options)
    ],
)
def test_double_backward_gradgradcheck(rng, impl, options):
    """Double backward is supported on every impl, blockwise's own backward included.

    With ``create_graph=True`` the first gradient stays in the graph (it was
    silently detached on the blockwise path), and finite differences of it
    agree with its second derivative.
    """
    q, k, v = _t(rng, 1, 7, 3), _t(rng, 1, 7, 3), _t(rng, 1, 7, 2)
    bias = _t(rng, 7, 7)

    def f(q, k, v, bias):
        return pa.attention(q, k, v, bias=bias, **_kw(impl, **options))

    (g,) = torch.autograd.grad(f(q, k, v, bias).sum(), q, create_graph=True)
    assert g.requires_grad
    (gg,) = torch.autograd.grad((g * g).sum(), k)
    assert torch.isfinite(gg).all() and gg.abs().max() > 0
    assert torch.autograd.gradgradcheck(f, (q, k, v, bias), fast_mode=True)


def test_double_backward_where_auto_goes_blockwise(rng):
    """Past auto's materialising size, with a window, auto goes blockwise: a penalty counts."""
    q, k, v = _t(rng, 1, 300, 2), _t(rng, 1, 300, 2), _t(rng, 1, 300, 2)
    assert (
        _attention.auto_impl(
            prepare(q, k, v, build_variant(window=(5, 0)), xp=torch),
            lib="torch",
            want_lse=False,
            xp=torch,
        )
        == "blockwise"
    )
    penalties = {}
    for impl in ("auto", "materialize"):
        out = pa.attention(q, k, v, window=(5, 0), impl=impl)
        (g,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        penalties[impl] = torch.autograd.grad((g * g).sum(), v)[0]
    torch.testing.assert_close(penalties["auto"], penalties["materialize"], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("impl", ["native", "auto"])
def test_double_backward_on_torch_kernel_is_torch_s(rng, impl):
    """On torch's own kernel the second derivative is torch's: right, or refused by torch.

    Its fused CPU kernel has none and torch raises at the second backward;
    the math kernel (chosen when the mask needs a gradient) has one. Never a
    silently detached first gradient.
    """
    q, k, v = _t(rng, 1, 7, 3), _t(rng, 1, 7, 3), _t(rng, 1, 7, 2)
    (g,) = torch.autograd.grad(
        pa.attention(q, k, v, causal=True, impl=impl).sum(), q, create_graph=True
    )
    assert g.requires_grad
    ref = pa.attention(q, k, v, causal=True, impl="materialize")
    (g_ref,) = torch.autograd.grad(ref.sum(), q, create_graph=True)
    want = torch.autograd.grad((g_ref * g_ref).sum(), k)[0]
    refused = None
    try:
        got = torch.autograd.grad((g * g).sum(), k)[0]
    except RuntimeError as exc:
        refused = str(exc)
    if refused is None:
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    else:
        assert "not implemented" in refused


def _func_case(rng):
    q, k, v = (_t(rng, 3, 2, 6, 4, grad=False) for _ in range(3))
    bias = _t(rng, 6, 6, grad=False)
    return q, k, v, bias


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_torch_func_grad_and_vjp_match_autograd(rng, impl):
    q, k, v, bias = _func_case(rng)
    kw = _kw(impl, causal=True, bias=bias)
    d_out = torch.from_numpy(rng.standard_normal((3, 2, 6, 4)))

    def loss(q, k, v):
        return (pa.attention(q, k, v, **kw) * d_out).sum()

    got = torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(loss(*leaves), leaves)
    _, pullback = torch.func.vjp(lambda q, k, v: pa.attention(q, k, v, **kw), q, k, v)
    for a, b, c in zip(got, pullback(d_out), want, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(b, c, rtol=1e-10, atol=1e-12)


# torch's own vmap of its fused kernel falls back to a loop, and says so
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_torch_func_vmap_of_grad_matches_a_loop(rng, impl):
    """vmap over the leading axis, of the forward and of ``torch.func.grad``, equals a loop."""
    q, k, v, bias = _func_case(rng)
    kw = _kw(impl, causal=True, bias=bias)

    def f(q, k, v):
        return pa.attention(q, k, v, **kw)

    out = torch.func.vmap(f)(q, k, v)
    grads = torch.func.vmap(torch.func.grad(lambda *a: f(*a).sum(), argnums=(0, 1, 2)))(q, k, v)
    for i in range(q.shape[0]):
        leaves = [x[i].clone().requires_grad_() for x in (q, k, v)]
        one = f(*leaves)
        torch.testing.assert_close(out[i], one.detach(), rtol=1e-12, atol=1e-12)
        for g, w in zip(grads, torch.autograd.grad(one.sum(), leaves), strict=True):
            torch.testing.assert_close(g[i], w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize(
    ("q_shape", "k_shape"),
    [((2, 5, 4), (2, 0, 4)), ((2, 0, 4), (2, 5, 4)), ((0, 5, 4), (0, 5, 4))],
    ids=["Lk0", "Lq0", "batch0"],
)
def test_empty_shapes_stay_connected_with_zero_grads(rng, impl, q_shape, k_shape):
    q, k = _t(rng, *q_shape), _t(rng, *k_shape)
    v = _t(rng, *k_shape[:-1], 3)
    bias = _t(rng, q_shape[-2], k_shape[-2])
    out = pa.attention(q, k, v, bias=bias, **_kw(impl))
    assert out.requires_grad and out.shape == (*q_shape[:-1], 3)
    (out.sum() + 0.0).backward()
    for x in (q, k, v, bias):
        assert x.grad is not None and x.grad.shape == x.shape and (x.grad == 0).all()
    w = pa.attention_weights(q, k, bias=bias)
    assert w.requires_grad
    torch.autograd.grad(w.sum(), (q, k))


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
@pytest.mark.parametrize("impl", ["blockwise", "auto"])
def test_jax_double_backward_through_blockwise(rng, jnp, impl):
    """``jax.grad`` of a gradient penalty: the custom_vjp's backward is itself differentiable."""
    import jax

    q, k, v = (jnp.asarray(rng.standard_normal((1, 6, 3))) for _ in range(3))

    def penalty(impl):
        def first(k):
            out = lambda q: pa.attention(q, k, v, causal=True, **_kw(impl)).sum()  # noqa: E731
            return jax.grad(out)(q)

        return jax.grad(lambda k: (first(k) ** 2).sum())(k)

    got, want = penalty(impl), penalty("materialize")
    assert float(jnp.abs(want).max()) > 0
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


# --- mixed precision: torch.autocast ------------------------------------------------------

AUTOCAST = [
    pytest.param(impl, amp, options, id=f"{impl}-{str(amp).split('.')[-1]}-{name}")
    for impl in ALL_IMPLS
    for amp in (torch.bfloat16, torch.float16)
    for name, options in (
        ("causal", {"causal": True}),
        ("bias_lengths", {"bias": "b", "key_lengths": "kl"}),
        ("softcap_lse", {"softcap": 2.0, "return_lse": True}),
    )
    if impl != "native" or name != "softcap_lse"
]


@pytest.mark.parametrize(("impl", "amp", "options"), AUTOCAST)
@pytest.mark.parametrize("inputs", ["float32", "autocast"])
def test_autocast_forward_and_backward(rng, impl, amp, options, inputs):
    """Under ``torch.autocast`` every impl runs, forward and backward, at half-precision bounds.

    Inputs come as float32 or in autocast's dtype (what an autocast
    ``Linear`` hands on); the output keeps their dtype. Oracles: the float64
    formula on the same (rounded) inputs, and float64 autograd for gradients.
    """
    dtype = torch.float32 if inputs == "float32" else amp
    q, k, v = (_t(rng, 2, 9, 8, grad=False).to(dtype).requires_grad_() for _ in range(3))
    bias = torch.from_numpy(rng.standard_normal((9, 9))).to(dtype)
    kl = torch.tensor([9, 4])
    kw = {**options}
    kw["bias"], kw["key_lengths"] = (bias, kl) if "bias" in options else (None, None)
    ref_leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref_kw = {**kw, "bias": None if kw["bias"] is None else bias.double()}
    d_out = torch.from_numpy(rng.standard_normal((2, 9, 8)))

    with torch.autocast("cpu", dtype=amp):
        got = pa.attention(q, k, v, **_kw(impl, **kw))
    want = pa.attention(*ref_leaves, **_kw("materialize", **ref_kw))
    got, want = (got, want) if options.get("return_lse") else ((got, None), (want, None))
    assert got[0].dtype == dtype
    tol = {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got[0].double(), want[0].detach(), **tol)
    loss = (got[0].double() * d_out).sum()
    ref_loss = (want[0] * d_out).sum()
    if got[1] is not None:
        torch.testing.assert_close(got[1].double(), want[1].detach(), **tol)
        loss, ref_loss = loss + got[1].double().sum(), ref_loss + want[1].sum()
    grads = torch.autograd.grad(loss, (q, k, v))
    for g, w, x in zip(grads, torch.autograd.grad(ref_loss, ref_leaves), (q, k, v), strict=True):
        assert g.dtype == x.dtype
        torch.testing.assert_close(g.double(), w, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
def test_lse_gradient_through_a_broadcast_value(rng, impl):
    """``value`` alone carries the batch: out and lse are broadcast copies, still in the graph.

    The copy is an ``astype(copy=True)``, differentiable on every torch
    version (``asarray(copy=True)`` changed its autograd behaviour in 2.13,
    and warns there).
    """
    q, k = _t(rng, 1, 6, 4), _t(rng, 1, 6, 4)
    v = _t(rng, 3, 6, 2)
    out, lse = pa.attention(q, k, v, causal=True, return_lse=True, **_kw(impl))
    assert out.shape == (3, 6, 2) and lse.shape == (3, 6) and lse.requires_grad
    dq, dk = torch.autograd.grad(lse.sum(), (q, k))
    _, one = pa.attention(q, k, v[:1], causal=True, return_lse=True, impl="materialize")
    want_q, want_k = torch.autograd.grad(one.sum(), (q, k))
    torch.testing.assert_close(dq, 3 * want_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dk, 3 * want_k, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("x64", [True, False], ids=["x64", "x64_off"])
def test_jax_native_grads_finite_when_a_bias_row_is_all_minus_inf(rng, jnp, x64):
    """The kernel never sees a row with nothing visible, so no NaN reaches the backward.

    Oracle: the materialising path's gradients (which equal the float64
    formula elsewhere in this file).
    """
    import jax

    from conftest import jax_x64

    with jax_x64(x64):
        q, k, v = (jnp.asarray(rng.standard_normal((2, 5, 4)), dtype=jnp.float32) for _ in range(3))
        bias = jnp.asarray(rng.standard_normal((5, 5)), dtype=jnp.float32).at[2].set(-jnp.inf)

        def grads(impl):
            def loss(q, k, v, b):
                return (pa.attention(q, k, v, bias=b, impl=impl) ** 2).sum()

            return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)

        got, want = grads("native"), grads("materialize")
        for g, w in zip(got, want, strict=True):
            assert bool(jnp.isfinite(g).all())
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
        assert float(jnp.abs(got[0][:, 2]).max()) == 0.0  # the row that sees nothing
