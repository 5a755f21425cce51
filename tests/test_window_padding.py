"""Sliding windows and padding lengths against jax.nn.dot_product_attention and torch SDPA.

jax computes its softmax in float32 even with x64 enabled (``_dot_product_attention_core``
casts the logits), so it agrees with float64 results to ~1e-7 only; the float64
bound (1e-12) is checked against torch SDPA with a mask built here by loops.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend, assert_close_on, impls_for, make_qkv
from reference import attention_ref

B, H, D = 2, 3, 4  # values have D features too: jax needs dv == d
JAX_RTOL = 1e-6  # jax's float32 softmax, see the module docstring

IMPLS = [
    pytest.param({"impl": "materialize"}, id="materialize"),
    pytest.param({"impl": "blockwise", "block_size": (3, 2)}, id="blockwise"),
]


def _jax():
    import jax  # in the test dependency group: the oracle for windows and seq lengths

    jax.config.update("jax_enable_x64", True)
    return jax


def _jax_attention(q, k, v, **kw):
    """jax takes (B, T, N, H); ours is (B, N, T, H)."""
    jax = _jax()
    jnp = jax.numpy
    lengths = {n: jnp.asarray(a, dtype=jnp.int32) for n, a in kw.pop("lengths", {}).items()}
    out = jax.nn.dot_product_attention(
        *(jnp.asarray(a.swapaxes(1, 2)) for a in (q, k, v)), **kw, **lengths, implementation="xla"
    )
    return np.asarray(out).swapaxes(1, 2)


def allowed_by_loops(lq, lk, *, window, causal=False, align="top_left"):
    left, right = (window, window) if isinstance(window, int) else window
    off = lk - lq if align == "bottom_right" else 0
    out = np.zeros((lq, lk), dtype=bool)
    for i in range(lq):
        for j in range(lk):
            ok = i + off - left <= j <= i + off + right
            if causal:
                ok = ok and j <= i + off
            out[i, j] = ok
    return out


def _torch_sdpa(q, k, v, allowed):
    """float64 SDPA with an explicit boolean mask; rows that see nothing -> 0 (torch gives NaN)."""
    allowed = np.broadcast_to(allowed, (*q.shape[:-1], k.shape[-2]))
    with torch.no_grad():
        out = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)),
            attn_mask=torch.from_numpy(np.ascontiguousarray(allowed)),
        ).numpy()
    return np.where(allowed.any(-1, keepdims=True), out, 0.0)


WINDOWS = [2, (2, 1), (0, 0), (1, 5), (0, 3), (10, 10)]


@pytest.mark.parametrize("opts", IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["window", "causal+window"])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_window_matches_explicit_mask_torch(backend: Backend, rng, window, causal, opts):
    q, k, v = make_qkv(rng, 9, 9, d=D, batch=(B, H))
    want = _torch_sdpa(q, k, v, allowed_by_loops(9, 9, window=window, causal=causal))
    for dtype in backend.float_dtypes:
        args = [backend.asarray(a, dtype) for a in (q, k, v)]
        got = pa.attention(*args, window=window, causal=causal, **opts)
        assert_close_on(backend, got, want, dtype=dtype)


@pytest.mark.parametrize("opts", IMPLS)
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(("lq", "lk"), [(4, 9), (9, 4)])
def test_window_with_unequal_lengths_is_aligned_like_causal(
    backend: Backend, rng, lq, lk, align, opts
):
    q, k, v = make_qkv(rng, lq, lk, d=D, batch=(B, H))
    want = _torch_sdpa(q, k, v, allowed_by_loops(lq, lk, window=(2, 0), causal=True, align=align))
    got = pa.attention(
        *(backend.asarray(a) for a in (q, k, v)), window=(2, 0), causal=align, **opts
    )
    assert_close(got, want, rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64)
    mask = pa.window_mask(lq, lk, window=(2, 0), causal=True, align=align)
    np.testing.assert_array_equal(
        mask, allowed_by_loops(lq, lk, window=(2, 0), causal=True, align=align)
    )


@pytest.mark.parametrize("causal", [False, True], ids=["window", "causal+window"])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_window_matches_jax_local_window_size(backend: Backend, rng, window, causal):
    q, k, v = make_qkv(rng, 9, 9, d=D, batch=(B, H))
    want = _jax_attention(q, k, v, local_window_size=window, is_causal=causal)
    got = pa.attention(*(backend.asarray(a) for a in (q, k, v)), window=window, causal=causal)
    assert_close(got, want, rtol=JAX_RTOL, xp=backend.xp, dtype=backend.xp.float64)


def test_window_with_unequal_lengths_matches_jax_top_left(backend: Backend, rng):
    """jax aligns a window top-left when T != S; portattn needs that said explicitly."""
    q, k, v = make_qkv(rng, 5, 8, d=D, batch=(B, H))
    want = _jax_attention(q, k, v, local_window_size=(1, 0), is_causal=True)
    got = pa.attention(*(backend.asarray(a) for a in (q, k, v)), window=(1, 0), causal="top_left")
    assert_close(got, want, rtol=JAX_RTOL, xp=backend.xp)


LENGTHS = {
    "keys": {"key_lengths": [7, 3]},
    "queries": {"query_lengths": [2, 6]},
    "both": {"key_lengths": [4, 7], "query_lengths": [6, 1]},
}


def _allowed_with_lengths(lq, lk, lengths, extra):
    allowed = np.ones((B, 1, lq, lk), dtype=bool)
    if extra.get("causal"):
        allowed &= np.tril(np.ones((lq, lk), dtype=bool))
    if "window" in extra:
        allowed &= allowed_by_loops(lq, lk, window=extra["window"])
    kl = np.array(lengths.get("key_lengths", [lk] * B))
    ql = np.array(lengths.get("query_lengths", [lq] * B))
    allowed &= (np.arange(lk)[None, :] < kl[:, None])[:, None, None, :]
    allowed &= (np.arange(lq)[None, :] < ql[:, None])[:, None, :, None]
    return allowed


@pytest.mark.parametrize("opts", IMPLS)
@pytest.mark.parametrize(
    "extra", [{}, {"causal": True}, {"window": (2, 1)}], ids=["plain", "causal", "window"]
)
@pytest.mark.parametrize("which", list(LENGTHS))
def test_lengths_match_torch(backend: Backend, rng, which, extra, opts):
    lengths = LENGTHS[which]
    q, k, v = make_qkv(rng, 7 if extra else 6, 7, d=D, batch=(B, H))
    # torch: the same padding as an explicit mask, padded query rows zeroed afterwards
    allowed = _allowed_with_lengths(q.shape[-2], k.shape[-2], lengths, extra)
    want = _torch_sdpa(q, k, v, allowed)
    ours = {
        n: backend.asarray(np.array(a)[:, None]) for n, a in lengths.items()
    }  # (B, 1): over heads
    got = pa.attention(*(backend.asarray(a) for a in (q, k, v)), **ours, **extra, **opts)
    assert_close_on(backend, got, want, dtype=backend.xp.float64)
    # padded query rows output exactly 0
    assert np.all(to_numpy(got)[np.broadcast_to(~allowed.any(-1, keepdims=True), got.shape)] == 0)


@pytest.mark.parametrize(
    "extra", [{}, {"causal": True}, {"window": (2, 1)}], ids=["plain", "causal", "window"]
)
@pytest.mark.parametrize("which", list(LENGTHS))
def test_lengths_match_jax_seq_lengths(backend: Backend, rng, which, extra):
    lengths = LENGTHS[which]
    q, k, v = make_qkv(rng, 7 if extra else 6, 7, d=D, batch=(B, H))
    jax_names = {"key_lengths": "key_value_seq_lengths", "query_lengths": "query_seq_lengths"}
    jkw = {"local_window_size": extra["window"]} if "window" in extra else {}
    want = _jax_attention(
        q,
        k,
        v,
        is_causal=bool(extra.get("causal")),
        lengths={jax_names[n]: np.array(a) for n, a in lengths.items()},
        **jkw,
    )
    # A row that sees no key at all (window beyond the valid keys) gets uniform
    # weights from jax's large-finite-negative masking, and 0 by portattn's contract.
    sees = _allowed_with_lengths(q.shape[-2], k.shape[-2], lengths, extra).any(-1, keepdims=True)
    want = np.where(sees, want, 0.0)
    ours = {n: backend.asarray(np.array(a)[:, None]) for n, a in lengths.items()}
    got = pa.attention(*(backend.asarray(a) for a in (q, k, v)), **ours, **extra)
    assert_close(got, want, rtol=JAX_RTOL, xp=backend.xp, dtype=backend.xp.float64)


def test_zero_key_length_gives_zero_rows(backend: Backend, rng):
    """jax gives uniform weights here (it masks with a large finite negative); portattn gives 0."""
    q, k, v = make_qkv(rng, 4, 5, d=D, batch=(B, H))
    got = to_numpy(
        pa.attention(
            *(backend.asarray(a) for a in (q, k, v)),
            key_lengths=backend.asarray(np.array([[0], [5]])),
        )
    )
    assert np.all(got[0] == 0)
    np.testing.assert_allclose(got[1], to_numpy(pa.attention(q[1], k[1], v[1])), rtol=1e-12)


def test_lengths_broadcast_per_head(backend: Backend, rng):
    q, k, v = make_qkv(rng, 4, 5, d=D, batch=(B, H))
    kl = np.array([[5, 2, 3], [1, 4, 5]])  # (B, H): a length per head too
    got = to_numpy(
        pa.attention(*(backend.asarray(a) for a in (q, k, v)), key_lengths=backend.asarray(kl))
    )
    for b in range(B):
        for h in range(H):
            n = kl[b, h]
            np.testing.assert_allclose(
                got[b, h], to_numpy(pa.attention(q[b, h], k[b, h, :n], v[b, h, :n])), rtol=1e-12
            )


@pytest.mark.parametrize("window", [-1, (-1, 2), (2, -3), (1.5, 2), (1, 2, 3), True])
def test_bad_windows_are_refused(window):
    x = np.ones((4, 2))
    with pytest.raises(ValueError, match="expected window"):
        pa.attention(x, x, x, window=window)


def test_window_with_unequal_lengths_needs_an_alignment():
    q, k = np.ones((3, 2)), np.ones((5, 2))
    with pytest.raises(ValueError, match=r"window with Lq != Lk is ambiguous.*Lq=3, Lk=5"):
        pa.attention(q, k, k, window=1)


def test_mha_window_and_key_lengths(backend: Backend, rng):
    """MultiHeadAttention passes window and key_lengths through to every head."""
    mha = pa.MultiHeadAttention.random(
        8, 4, num_kv_heads=2, dtype=backend.xp.float64, xp=backend.xp, device=backend.device
    )
    x = rng.standard_normal((B, 9, 8))
    w = {n: to_numpy(getattr(mha, n)) for n in ("wq", "wk", "wv", "wo")}
    q = (x @ w["wq"]).reshape(B, 9, 4, 2).swapaxes(1, 2)
    k = np.repeat((x @ w["wk"]).reshape(B, 9, 2, 2).swapaxes(1, 2), 2, axis=1)  # oracle may repeat
    v = np.repeat((x @ w["wv"]).reshape(B, 9, 2, 2).swapaxes(1, 2), 2, axis=1)
    kl = np.array([9, 5])
    allowed = (
        allowed_by_loops(9, 9, window=(3, 0), causal=True)
        & (np.arange(9)[None, :] < kl[:, None])[:, None, None, :]
    )
    want = _torch_sdpa(q, k, v, allowed).swapaxes(1, 2).reshape(B, 9, 8) @ w["wo"]
    got = mha(backend.asarray(x), causal=True, window=(3, 0), key_lengths=backend.asarray(kl))
    assert_close(got, want, rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64)


# --- narrow integer lengths -----------------------------------------------------------


@pytest.mark.parametrize("int_dtype", ["int8", "uint8", "int16", "uint16"])
def test_narrow_integer_lengths_do_not_wrap(backend: Backend, rng, int_dtype):
    xp = backend.xp
    if not hasattr(xp, int_dtype):
        pytest.fail(f"{backend.name} has no {int_dtype}")
    q, k, v = make_qkv(rng, 5, 300, d=4, batch=(2,), backend=backend, dtype=xp.float32)
    lengths = np.array([100, 120])
    wide = backend.asarray(lengths)
    narrow_lengths = backend.asarray(lengths, getattr(xp, int_dtype))
    for impl in impls_for(backend):
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


# --- what lies beyond key_lengths never reaches the output ----------------------------


@pytest.mark.parametrize("garbage", [np.nan, np.inf, -np.inf])
def test_non_finite_padding_never_reaches_the_output(backend: Backend, rng, garbage):
    xp = backend.xp
    q, k, v = make_qkv(rng, 5, 40, d=4, batch=(2,), backend=backend, dtype=xp.float32)
    lengths = backend.asarray(np.array([30, 12]))
    k_np, v_np = to_numpy(k), to_numpy(v)
    k_bad, v_bad = k_np.copy(), v_np.copy()
    k_bad[0, 30:], v_bad[0, 30:] = garbage, garbage
    k_bad[1, 12:], v_bad[1, 12:] = garbage, garbage
    for impl in impls_for(backend):
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


# --- windows wider than any sequence, numpy integers ----------------------------------


def test_huge_window_means_unbounded(backend: Backend, rng):
    q = backend.asarray(rng.standard_normal((5, 4)))
    want = to_numpy(pa.attention(q, q, q, causal=True))
    for impl in impls_for(backend):
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


# --- integer widths: every dtype, extreme values, JAX with x64 on and off -------------

INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def _int_dtypes(backend: Backend) -> list[str]:
    """What the backend holds: no 64-bit integers on JAX without x64; torch's uint64 cannot
    be compared at all (test_torch_uint64_lengths covers it)."""
    names = [n for n in INT_DTYPES if hasattr(backend.xp, n)]
    if backend.name == "jax32":
        names = [n for n in names if "64" not in n]
    if backend.name.startswith("torch"):
        names.remove("uint64")
    return names


@pytest.mark.jax32
def test_lengths_compare_correctly_in_every_integer_dtype(backend: Backend, rng):
    """A length at its dtype's maximum shows every key (uint32's 0xFFFFFFFF too, which an
    int32 cast would make -1), a negative one none, whatever JAX's x64 setting."""
    xp = backend.xp
    q, k, v = make_qkv(rng, 4, 5, d=3, batch=(3,))
    for name in _int_dtypes(backend):
        info = np.iinfo(name)
        lengths = np.array([info.max, 2, info.min], dtype=name)
        want, _ = attention_ref(q, k, v, key_lengths=np.clip(lengths.astype(np.float64), 0, 5))
        for impl in impls_for(backend):
            got = pa.attention(
                *(backend.asarray(a, xp.float32) for a in (q, k, v)),
                key_lengths=backend.asarray(lengths),
                query_lengths=backend.asarray(lengths),
                impl=impl,
            )
            rows = np.arange(4) < np.clip(lengths.astype(np.float64), 0, 4)[:, None]
            assert_close(got, np.where(rows[..., None], want, 0.0), rtol=1e-5)


@pytest.mark.jax32
@pytest.mark.parametrize(
    "opts",
    [{"causal": True}, {"causal": "bottom_right"}, {"window": (2, 1)}, {"key_lengths": "kl"}],
    ids=["causal", "bottom_right", "window", "key_lengths"],
)
def test_position_options_agree_and_never_warn(backend: Backend, rng, opts):
    """portattn's own position arithmetic stays in the namespace's index dtype: no warning
    (JAX without x64 warns when asked for int64; warnings are errors here)."""
    xp = backend.xp
    lq, lk = (5, 7) if opts.get("causal") == "bottom_right" else (6, 6)
    q, k, v = make_qkv(rng, lq, lk, d=3, batch=(2,))
    ref_opts = {"key_lengths": np.array([lk, 3])} if "key_lengths" in opts else dict(opts)
    ours = {"key_lengths": backend.asarray(np.array([lk, 3], dtype=np.int32))}
    ours = ours if "key_lengths" in opts else dict(opts)
    want, _ = attention_ref(q, k, v, **ref_opts)
    for impl in impls_for(backend):
        got = pa.attention(*(backend.asarray(a, xp.float32) for a in (q, k, v)), impl=impl, **ours)
        assert_close(got, want, rtol=1e-5)
