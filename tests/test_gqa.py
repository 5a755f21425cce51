"""Grouped-query attention: ``Hkv`` key/value heads shared by ``H`` query heads, never copied.

Every option, on every impl and backend, against the same call on keys and
values repeated per query head (the copied-K/V formula, float64 NumPy);
gradients of every option on torch and on JAX (under ``jax.jit``) against
autodiff through that formula, and against SDPA with ``enable_gqa`` and
``jax.nn``'s own GQA. No call copies K or V: NumPy's peak memory and every
tensor torch makes, forward and backward, stay below one repeated K.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from array_api_compat import array_namespace

import portattn as pa
from portattn._core._prepare import prepare
from portattn._core._variant import build_variant
from portattn.testing import to_numpy

from conftest import Backend, assert_close_on, impls_for, jitted

B, H, HKV, LQ, LK, D, DV = 2, 6, 2, 5, 9, 4, 3
G = H // HKV


def _score_mod(s: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    # Reads h, the query head; small integers over 8, exact in any float dtype.
    xp = array_namespace(s)
    return s + xp.astype((h % 4) - (kv_idx - q_idx) * (b + 1), s.dtype) / 8


def _head_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return (kv_idx <= q_idx + 4) & ((h + kv_idx) % 3 != 0)  # differs by query head


# name -> (portattn options as builders on (backend, rng)); "native" refuses four of them.
OPTIONS: dict[str, Any] = {
    "plain": lambda be, rng: {},
    "causal": lambda be, rng: {"causal": "bottom_right"},
    "window": lambda be, rng: {"window": (2, 1), "causal": "top_left"},
    "scale": lambda be, rng: {"scale": 0.3},
    "mask per head": lambda be, rng: {
        "mask": be.asarray(rng.random((B, H, LQ, LK)) < 0.6),
    },
    "bias per head": lambda be, rng: {
        "bias": be.asarray(rng.standard_normal((1, H, LQ, LK)), be.xp.float64),
    },
    "key lengths": lambda be, rng: {"key_lengths": be.asarray(np.array([[LK], [3]]))},
    "key lengths per query head": lambda be, rng: {
        "key_lengths": be.asarray(rng.integers(0, LK + 1, (B, H))),
    },
    "query lengths": lambda be, rng: {"query_lengths": be.asarray(np.array([[2], [LQ]]))},
    "softcap": lambda be, rng: {"softcap": 1.5},
    "sinks per head": lambda be, rng: {
        "sinks": be.asarray(rng.standard_normal(H), be.xp.float64),
    },
    "score_mod": lambda be, rng: {"score_mod": _score_mod},
    "block_mask per head": lambda be, rng: {
        "block_mask": pa.create_block_mask(
            _head_mask, B, H, LQ, LK, block_size=(2, 3), xp=be.xp, device=be.device
        ),
    },
    "return_lse": lambda be, rng: {"return_lse": True},
}
NATIVE_REFUSES = ("softcap", "sinks per head", "score_mod", "return_lse")


def _numpy(x: Any) -> Any:
    if isinstance(x, (bool, int, float, str, tuple)) or x is None or callable(x):
        return x if not isinstance(x, pa.BlockMask) else None
    return to_numpy(x)


def _repeated(x: np.ndarray) -> np.ndarray:
    return np.repeat(x, G, axis=-3)  # (..., Hkv, L, d) -> (..., H, L, d): head h reads h // G


def _inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        rng.standard_normal((B, H, LQ, D)),
        rng.standard_normal((B, HKV, LK, D)),
        rng.standard_normal((B, HKV, LK, DV)),
    )


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, options: dict[str, Any]) -> Any:
    """The copied-K/V formula: the same call on NumPy float64, K and V repeated per query head."""
    ref = {}
    for name, x in options.items():
        if name == "block_mask":
            ref[name] = pa.create_block_mask(_head_mask, B, H, LQ, LK, block_size=(2, 3))
        else:
            ref[name] = _numpy(x)
    return pa.attention(q, _repeated(k), _repeated(v), impl="materialize", **ref)


# The default run takes the cases that reach the most code; tests-extra takes all.
SLOW = ("scale", "window", "bias per head", "key lengths", "query lengths", "return_lse")


def _cases(names: Any) -> list[Any]:
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in names]


@pytest.mark.parametrize("case", _cases(OPTIONS))
def test_every_option_matches_repeated_keys(backend: Backend, rng, case):
    q, k, v = _inputs(rng)
    options = OPTIONS[case](backend, rng)
    want = _reference(q, k, v, options)
    xp = backend.xp
    args = [backend.asarray(x, xp.float64) for x in (q, k, v)]
    for impl in (*impls_for(backend), "auto"):
        for block_size in (None, (2, 4)) if impl == "blockwise" else (None,):
            if impl == "native" and case in NATIVE_REFUSES:
                with pytest.raises(NotImplementedError):
                    pa.attention(*args, impl=impl, **options)
                continue
            if impl == "native" and backend.name.startswith("jax"):
                continue  # float64 is refused there; jax.nn's GQA is held to below, in float32
            call = functools.partial(pa.attention, impl=impl, block_size=block_size, **options)
            got = jitted(backend, call)(*args)
            if case == "return_lse":
                assert_close_on(backend, got[0], want[0], dtype=xp.float64)
                assert_close_on(backend, got[1], want[1], dtype=xp.float64)
            else:
                assert_close_on(backend, got, want, dtype=xp.float64)


def test_weights_match_repeated_keys(backend: Backend, rng):
    q, k, _ = _inputs(rng)
    xp = backend.xp
    got = pa.attention_weights(
        backend.asarray(q, xp.float64), backend.asarray(k, xp.float64), causal="bottom_right"
    )
    want = pa.attention_weights(q, _repeated(k), causal="bottom_right")
    assert_close_on(backend, got, want, dtype=xp.float64)


def test_keys_and_values_are_not_repeated(rng):
    """The problem every path reads holds the caller's Hkv heads, not H."""
    q, k, v = _inputs(rng)
    p = prepare(q, k, v, xp=np)
    assert p.groups == G
    assert p.k is k and p.v is v  # float64 already: not even a cast
    assert p.batch == (B, H)
    # Per-query-head padding lengths zero different keys per head: only then repeated.
    p = prepare(q, k, v, build_variant(key_lengths=np.full((B, H), 4)), xp=np)
    assert (p.groups, p.k.shape[-3]) == (1, H)


def test_not_a_grouped_layout_is_still_refused(rng):
    q, _, _ = _inputs(rng)
    k = rng.standard_normal((B, 4, LK, D))  # 4 does not divide 6
    with pytest.raises(ValueError, match="the query's 6 heads must be a multiple of the key's 4"):
        pa.attention(q, k, k)
    with pytest.raises(ValueError, match="broadcast"):  # value's heads differ from key's
        pa.attention(q, k[:, :2], rng.standard_normal((B, 3, LK, D)))


# One query row per head (a decode step): NumPy's scores are per-head products then.
DECODE_OPTIONS: dict[str, Any] = {
    "plain": lambda rng: {},
    "causal": lambda rng: {"causal": "bottom_right"},
    "bias per head": lambda rng: {"bias": rng.standard_normal((B, H, 1, LK))},
    "key lengths": lambda rng: {"key_lengths": np.array([[LK], [3]])},
    "softcap": lambda rng: {"softcap": 1.5},
    "score_mod": lambda rng: {"score_mod": _score_mod},
    "sinks per head": lambda rng: {"sinks": rng.standard_normal(H)},
    "return_lse": lambda rng: {"return_lse": True},
}


@pytest.mark.parametrize("case", list(DECODE_OPTIONS))
def test_one_query_row_matches_repeated_keys_on_numpy(rng, case):
    q = rng.standard_normal((B, H, 1, D))
    _, k, v = _inputs(rng)
    options = DECODE_OPTIONS[case](rng)
    want = pa.attention(q, _repeated(k), _repeated(v), impl="materialize", **options)
    for impl in ("materialize", "blockwise", "auto"):
        for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
            args = (q.astype(dtype), k.astype(dtype), v.astype(dtype))
            got = pa.attention(*args, impl=impl, **options)
            pairs = zip(got, want, strict=True) if case == "return_lse" else [(got, want)]
            for g, w in pairs:
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{impl} {dtype}")


@pytest.mark.parametrize(
    ("q_batch", "kv_batch"), [((1,), (3,)), ((2, 1), (1, 3))], ids=["q-broadcasts", "both"]
)
def test_one_query_row_with_broadcast_batch_matches_repeated_keys(rng, q_batch, kv_batch):
    """The per-head scores take their batch from the product: q's batch may broadcast."""
    q = rng.standard_normal((*q_batch, H, 1, D))
    k = rng.standard_normal((*kv_batch, HKV, LK, D))
    v = rng.standard_normal((*kv_batch, HKV, LK, DV))
    want = pa.attention(q, _repeated(k), _repeated(v), impl="materialize")
    for impl in ("materialize", "blockwise", "auto"):
        got = pa.attention(q, k, v, impl=impl)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=impl)


def test_one_query_row_scores_are_each_heads_own_product(rng):
    """``grouped_scores``, one row per head: plain multi-head attention's products, bits and all.

    Folded (the group's rows as one matrix) they are one matrix product per
    key/value head, which BLAS may sum in another order; per head they are
    what the copied-K/V formula computes, in the same layout either way.
    """
    from portattn._core._groups import fold_rows, grouped_scores

    q = rng.standard_normal((B, H, 1, D), dtype=np.float32)
    k = rng.standard_normal((B, HKV, 64, D), dtype=np.float32)
    k_t = np.swapaxes(k, -1, -2)
    want = q @ np.swapaxes(_repeated(k), -1, -2)  # (B, H, 1, 64)
    got = grouped_scores(q, k_t, G, xp=np)
    assert got.shape == want.shape and np.array_equal(got, want)
    folded = grouped_scores(q, k_t, G, xp=np, folded=True)
    assert np.array_equal(folded, fold_rows(want, G, xp=np))  # (B, Hkv, G, 64)
    # Several rows per head take the folded product: the same values.
    q3 = rng.standard_normal((B, H, 3, D), dtype=np.float32)
    want3 = q3 @ np.swapaxes(_repeated(k), -1, -2)
    np.testing.assert_allclose(grouped_scores(q3, k_t, G, xp=np), want3, rtol=1e-5, atol=1e-5)


def test_dask_chunks_split_groups(rng):
    da = pytest.importorskip("dask.array")  # dask is a test dependency; CI has it
    q, k, v = _inputs(rng)
    want = pa.attention(q, _repeated(k), _repeated(v), causal="bottom_right")
    # Head chunks (1, 2, 3): the first two end inside a group of 3 and are merged.
    dq = da.from_array(q, chunks=(1, (1, 2, 3), 2, D))
    dk = da.from_array(k, chunks=(1, 1, 4, D))
    dv = da.from_array(v, chunks=(1, 1, 4, DV))
    got = pa.attention(dq, dk, dv, causal="bottom_right")
    np.testing.assert_allclose(got.compute(), want, rtol=1e-12, atol=1e-12)


# --- torch gradients ---------------------------------------------------------------------

GRAD_CASES = (
    "plain",
    "causal",
    "mask per head",
    "bias per head",
    "key lengths",
    "query lengths",
    "softcap",
    "sinks per head",
    "score_mod",
    "block_mask per head",
    "window",
    "scale",
    "key lengths per query head",
)


@pytest.mark.parametrize("case", _cases(GRAD_CASES))
def test_torch_grads_match_repeated_keys(case):
    torch = pytest.importorskip("torch")
    from conftest import get_backend

    be = get_backend("torch")
    rng = np.random.default_rng(7)
    q, k, v = (torch.from_numpy(x) for x in _inputs(rng))
    options = OPTIONS[case](be, rng)
    d_out = torch.from_numpy(rng.standard_normal((B, H, LQ, DV)))

    def grads(impl: str, *, repeat: bool) -> list[Any]:
        arrays = [x.clone().requires_grad_() for x in (q, k, v)]
        opts = {
            n: x.clone().requires_grad_()
            if isinstance(x, torch.Tensor) and x.is_floating_point()
            else x
            for n, x in options.items()
        }
        qq, kk, vv = arrays
        if repeat:
            kk, vv = (x.repeat_interleave(G, dim=1) for x in (kk, vv))
        out = pa.attention(qq, kk, vv, impl=impl, **opts)
        wrt = arrays + [x for x in opts.values() if isinstance(x, torch.Tensor) and x.requires_grad]
        return list(torch.autograd.grad(out, wrt, d_out))

    want = grads("materialize", repeat=True)
    impls = ["materialize", "blockwise"] + ([] if case in NATIVE_REFUSES else ["native"])
    for impl in impls:
        for g, w in zip(grads(impl, repeat=False), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", _cases(("plain", "causal", "bias per head")))
def test_torch_grads_match_sdpa_enable_gqa(case):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    n = 8  # causal needs Lq == Lk
    q = torch.from_numpy(rng.standard_normal((B, H, n, D))).requires_grad_()
    k = torch.from_numpy(rng.standard_normal((B, HKV, n, D))).requires_grad_()
    v = torch.from_numpy(rng.standard_normal((B, HKV, n, DV))).requires_grad_()
    d_out = torch.from_numpy(rng.standard_normal((B, H, n, DV)))
    pa_kw: dict[str, Any] = {}
    sdpa_kw: dict[str, Any] = {}
    if case == "causal":
        pa_kw["causal"] = sdpa_kw["is_causal"] = True
    elif case == "bias per head":
        bias = torch.from_numpy(rng.standard_normal((1, H, n, n)))
        pa_kw["bias"] = sdpa_kw["attn_mask"] = bias
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True, **sdpa_kw)
    want = torch.autograd.grad(ref, (q, k, v), d_out)
    for impl in ("materialize", "blockwise", "native", "auto"):
        out = pa.attention(q, k, v, impl=impl, **pa_kw)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
        for g, w in zip(torch.autograd.grad(out, (q, k, v), d_out), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_torch_blockwise_backward_is_bit_identical_between_runs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    q = torch.from_numpy(rng.standard_normal((1, 8, 64, 16), dtype=np.float32))
    k = torch.from_numpy(rng.standard_normal((1, 2, 64, 16), dtype=np.float32))
    v = torch.from_numpy(rng.standard_normal((1, 2, 64, 16), dtype=np.float32))
    runs = []
    for _ in range(2):
        arrays = [x.clone().requires_grad_() for x in (q, k, v)]
        out = pa.attention(*arrays, causal=True, impl="blockwise", block_size=(16, 16))
        runs.append(torch.autograd.grad(out.sum(), arrays))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


# --- JAX, under jax.jit ------------------------------------------------------------------


@pytest.mark.parametrize("case", _cases(("causal", "bias per head", "sinks per head")))
def test_jax_grads_under_jit(case):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    n = 8
    rng = np.random.default_rng(10)
    q, k, v = (
        jnp.asarray(rng.standard_normal(shape), dtype=jnp.float32)
        for shape in ((B, H, n, D), (B, HKV, n, D), (B, HKV, n, D))
    )
    options: dict[str, Any] = {
        "causal": {"causal": True},
        "bias per head": {"bias": jnp.asarray(rng.standard_normal((1, H, n, n)), jnp.float32)},
        "sinks per head": {"sinks": jnp.asarray(rng.standard_normal(H), jnp.float32)},
    }[case]

    def loss(impl: str, repeat: bool) -> Any:
        def f(q: Any, k: Any, v: Any) -> Any:
            if repeat:
                k, v = jnp.repeat(k, G, axis=1), jnp.repeat(v, G, axis=1)
            return jnp.sum(jnp.sin(pa.attention(q, k, v, impl=impl, **options)))

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))

    want_val, want = loss("materialize", True)(q, k, v)
    impls = ["materialize", "blockwise"] + (["native"] if case != "sinks per head" else [])
    for impl in impls:
        val, got = loss(impl, False)(q, k, v)
        np.testing.assert_allclose(val, want_val, rtol=1e-5)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    if case == "causal":  # jax.nn's own GQA: (B, T, N, H), Hkv heads
        ref = jax.nn.dot_product_attention(
            q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2), is_causal=case == "causal"
        ).swapaxes(1, 2)
        got = jax.jit(lambda q, k, v: pa.attention(q, k, v, **options))(q, k, v)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


# Every option through jax.grad under jax.jit, as on torch.
JAX_GRAD_CASES = GRAD_CASES


def _jax_options(case: str, rng: np.random.Generator) -> dict[str, Any]:
    """``OPTIONS[case]`` as JAX arrays (float32 where floating), the block mask built by JAX."""
    import jax.numpy as jnp

    from conftest import get_backend

    out: dict[str, Any] = {}
    for name, x in OPTIONS[case](get_backend("numpy"), rng).items():
        if name == "block_mask":
            out[name] = pa.create_block_mask(_head_mask, B, H, LQ, LK, block_size=(2, 3), xp=jnp)
        elif isinstance(x, np.ndarray):
            out[name] = jnp.asarray(x, jnp.float32) if x.dtype.kind == "f" else jnp.asarray(x)
        else:
            out[name] = x
    return out


@pytest.mark.parametrize("case", _cases(JAX_GRAD_CASES))
def test_jax_grads_every_option_match_repeated_keys(case):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    rng = np.random.default_rng(11)
    q, k, v = (jnp.asarray(x, jnp.float32) for x in _inputs(rng))
    options = _jax_options(case, rng)

    def grads(impl: str, repeat: bool) -> Any:
        def f(q: Any, k: Any, v: Any) -> Any:
            if repeat:
                k, v = jnp.repeat(k, G, axis=1), jnp.repeat(v, G, axis=1)
            return jnp.sum(jnp.sin(pa.attention(q, k, v, impl=impl, **options)))

        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)

    want = grads("materialize", True)
    for impl in ("materialize", "blockwise", "auto"):
        for g, w in zip(grads(impl, False), want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_torch_lse_grads_match_repeated_keys():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    q, k, v = (torch.from_numpy(x) for x in _inputs(rng))
    d_out = torch.from_numpy(rng.standard_normal((B, H, LQ, DV)))
    d_lse = torch.from_numpy(rng.standard_normal((B, H, LQ)))

    def grads(impl: str, *, repeat: bool) -> list[Any]:
        arrays = [x.clone().requires_grad_() for x in (q, k, v)]
        qq, kk, vv = arrays
        if repeat:
            kk, vv = (x.repeat_interleave(G, dim=1) for x in (kk, vv))
        out, lse = pa.attention(qq, kk, vv, impl=impl, causal="bottom_right", return_lse=True)
        return list(torch.autograd.grad((out, lse), arrays, (d_out, d_lse)))

    want = grads("materialize", repeat=True)
    for impl in ("materialize", "blockwise", "auto"):
        for g, w in zip(grads(impl, repeat=False), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


# --- no copies of K and V ------------------------------------------------------------------

# A decode step: 32 query heads over 4 key/value heads of a 4096-key cache.
COPY_Q, COPY_KV = (2, 32, 1, 64), (2, 4, 4096, 64)


@pytest.mark.parametrize("impl", ["materialize", "blockwise", "auto"])
def test_numpy_call_never_holds_repeated_keys(impl):
    """Peak extra memory stays below two copies of K (16 MiB), a quarter of K repeated (64 MiB).

    Scores and weights are (2, 32, 1, 4096): 1 MiB each; the blockwise path
    may lay K out once for its tiles (8 MiB). Repeating K or V per query
    head, by broadcast_to and reshape or by np.repeat, allocates 64 MiB.
    """
    import tracemalloc

    rng = np.random.default_rng(13)
    q = rng.standard_normal(COPY_Q, dtype=np.float32)
    k, v = (rng.standard_normal(COPY_KV, dtype=np.float32) for _ in range(2))
    repeated_bytes = k.nbytes * (COPY_Q[1] // COPY_KV[1])
    pa.attention(q, k, v, impl=impl)  # plans, pools, first imports: not the call's memory
    tracemalloc.start()
    try:
        for kw in ({}, {"causal": "bottom_right"}, {"return_lse": True}):
            tracemalloc.reset_peak()
            pa.attention(q, k, v, impl=impl, **kw)
            peak = tracemalloc.get_traced_memory()[1]
            assert peak < 2 * k.nbytes < repeated_bytes / 2, (kw, peak, repeated_bytes)
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("impl", ["materialize", "blockwise", "native", "auto"])
def test_torch_call_and_backward_never_make_a_tensor_the_size_of_repeated_keys(impl):
    """Every tensor any op makes, forward and backward, stays below K repeated per head.

    A TorchDispatchMode sees each op's outputs: an ``expand`` is a view and
    free, but the ``reshape`` (or ``repeat_interleave``) that follows it
    makes a (B, H, Lk, d) tensor, G times K's size.
    """
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.largest = (0, "")

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > self.largest[0]:
                    self.largest = (t.untyped_storage().nbytes(), str(func))
            return out

    rng = np.random.default_rng(14)
    q = torch.from_numpy(rng.standard_normal(COPY_Q, dtype=np.float32)).requires_grad_()
    k, v = (
        torch.from_numpy(rng.standard_normal(COPY_KV, dtype=np.float32)).requires_grad_()
        for _ in range(2)
    )
    repeated_bytes = k.numel() * k.element_size() * (COPY_Q[1] // COPY_KV[1])
    for kw in ({}, {"causal": "bottom_right"}):
        spy = Largest()
        with spy:
            out = pa.attention(q, k, v, impl=impl, **kw)
            torch.autograd.grad(out.sum(), (q, k, v))
        assert spy.largest[0] <= k.numel() * k.element_size(), (kw, spy.largest, repeated_bytes)
