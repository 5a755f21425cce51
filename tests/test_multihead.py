"""MultiHeadAttention against torch.nn.MultiheadAttention and torch SDPA(enable_gqa=True).

The oracles run in float64 on CPU from NumPy copies of the weights and inputs;
portattn runs on each backend in the matrix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import portattn as pa
from portattn import _attention
from portattn._lib import _compat
from portattn._paths import _auto
from portattn.testing import assert_close, to_numpy

from conftest import Backend, assert_close_on, rtol_for

B, LQ, LK, D = 2, 5, 7, 12


def _torch(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float64, copy=True))


def _torch_mha(d_model, heads, *, bias, kdim=None, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(
        d_model, heads, bias=bias, batch_first=True, kdim=kdim, vdim=kdim, dtype=torch.float64
    )
    if bias:  # torch initialises biases to zero; make them matter
        with torch.no_grad():
            m.in_proj_bias.normal_()
            m.out_proj.bias.normal_()
    return m.eval()


def _torch_out(m, x, ctx, **kw):
    with torch.no_grad():
        out, _ = m(_torch(x), _torch(ctx), _torch(ctx), need_weights=False, **kw)
    return out.numpy()


CASES = {
    "self": {"cross": False},
    "cross": {"cross": True},
    "key_padding_mask": {"cross": False, "kpm": True},
    "attn_mask": {"cross": False, "attn_mask": True},
    "cross+both_masks": {"cross": True, "kpm": True, "attn_mask": True},
}


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_matches_torch_multihead_attention(backend: Backend, rng, bias, case, precision):
    opts = CASES[case]
    cross = opts["cross"]
    d_ctx = 8 if cross else D
    m = _torch_mha(D, 3, bias=bias, kdim=d_ctx if cross else None)
    lk = LK if cross else LQ
    x = rng.standard_normal((B, LQ, D))
    ctx = rng.standard_normal((B, lk, d_ctx)) if cross else x
    torch_kw, our_mask = {}, None
    if opts.get("kpm"):
        kpm = np.zeros((B, lk), dtype=bool)
        kpm[0, -2:] = True  # batch 0 has two padded keys
        torch_kw["key_padding_mask"] = torch.from_numpy(kpm)
        our_mask = ~kpm[:, None, :]  # (B, 1, Lk)
    if opts.get("attn_mask"):
        hidden = rng.random((LQ, lk)) < 0.4
        hidden[:, 0] = False  # every row keeps a key: torch gives NaN for empty rows
        torch_kw["attn_mask"] = torch.from_numpy(hidden)
        our_mask = ~hidden if our_mask is None else our_mask & ~hidden
    want = _torch_out(m, x, ctx, **torch_kw)

    dtype = getattr(backend.xp, precision)
    mha = pa.MultiHeadAttention.from_torch(m, xp=backend.xp, dtype=dtype, device=backend.device)
    args = (backend.asarray(x, dtype),) + ((backend.asarray(ctx, dtype),) if cross else ())
    mask = None if our_mask is None else backend.asarray(our_mask)
    got = mha(*args, mask=mask)
    assert_close_on(backend, got, want, dtype=dtype)


def test_key_lengths_match_torch_key_padding_mask(backend: Backend, rng):
    m = _torch_mha(D, 4, bias=True)
    x = rng.standard_normal((B, LQ, D))
    lengths = np.array([LQ, 2])
    kpm = np.arange(LQ)[None, :] >= lengths[:, None]
    want = _torch_out(m, x, x, key_padding_mask=torch.from_numpy(kpm))
    mha = pa.MultiHeadAttention.from_torch(
        m, xp=backend.xp, dtype=backend.xp.float64, device=backend.device
    )
    got = mha(backend.asarray(x), key_lengths=backend.asarray(lengths))
    assert_close(got, want, rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64)


def test_causal_matches_torch_triangular_attn_mask(backend: Backend, rng):
    m = _torch_mha(D, 2, bias=False)
    x = rng.standard_normal((B, LQ, D))
    future = np.triu(np.ones((LQ, LQ), dtype=bool), 1)
    want = _torch_out(m, x, x, attn_mask=torch.from_numpy(future))
    mha = pa.MultiHeadAttention.from_torch(
        m, xp=backend.xp, dtype=backend.xp.float64, device=backend.device
    )
    assert_close(mha(backend.asarray(x), causal=True), want, rtol=1e-12, xp=backend.xp)


# ----------------------------------------------------------------------------- GQA / MQA


def _sdpa_oracle(mha, x, ctx, *, causal):
    """Project in NumPy, attend with torch SDPA(enable_gqa=True), project out."""
    w = {n: to_numpy(getattr(mha, n)).astype(np.float64) for n in ("wq", "wk", "wv", "wo")}
    h, hkv, dh = mha.num_heads, mha.num_kv_heads, mha.d_head

    def heads(a, n):  # (B, L, n*dh) -> (B, n, L, dh)
        return _torch(a.reshape(*a.shape[:-1], n, dh).swapaxes(-2, -3))

    q, k, v = heads(x @ w["wq"], h), heads(ctx @ w["wk"], hkv), heads(ctx @ w["wv"], hkv)
    with torch.no_grad():
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=True
        )
    o = o.numpy().swapaxes(-2, -3).reshape(*x.shape[:-1], h * dh)
    return o @ w["wo"]


@pytest.mark.parametrize("num_kv_heads", [6, 3, 2, 1], ids=lambda n: f"hkv{n}")
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_gqa_mqa_match_torch_sdpa_enable_gqa(backend: Backend, rng, num_kv_heads, cross):
    for dtype in (backend.xp.float64, backend.xp.float32):
        mha = pa.MultiHeadAttention.random(
            D,
            6,
            num_kv_heads=num_kv_heads,
            d_head=4,
            seed=3,
            xp=backend.xp,
            dtype=dtype,
            device=backend.device,
        )
        x = rng.standard_normal((B, LQ, D))
        ctx = rng.standard_normal((B, LK, D)) if cross else x
        want = _sdpa_oracle(mha, x, ctx, causal=not cross)
        args = (backend.asarray(x, dtype),) + ((backend.asarray(ctx, dtype),) if cross else ())
        got = mha(*args, causal=not cross)
        assert_close(
            got, want, rtol=rtol_for(backend, dtype), xp=backend.xp, dtype=dtype, shape=(B, LQ, D)
        )


def test_gqa_never_repeats_keys_or_values(backend: Backend, rng, monkeypatch):
    """The core gets the Hkv key/value heads and groups the query heads on them, never H copies."""
    seen = []
    real = _attention.solve

    def spy(p, **kw):
        seen.append((tuple(p.q.shape), tuple(p.k.shape), tuple(p.v.shape), p.groups))
        return real(p, **kw)

    monkeypatch.setattr(_attention, "solve", spy)  # attend's second half
    # An empty plan memo: a repeat of these shapes (another backend's case in
    # this worker) would go to the kernel from its plan, past solve, with the
    # same k and v (the shortcut repeats nothing either: test_auto pins it).
    _auto.forget_plans()
    mha = pa.MultiHeadAttention.random(
        D, 6, num_kv_heads=2, d_head=4, xp=backend.xp, device=backend.device
    )
    mha(backend.asarray(rng.standard_normal((B, LQ, D)), backend.xp.float32))
    assert seen == [((B, 6, LQ, 4), (B, 2, LQ, 4), (B, 2, LQ, 4), 3)]


def test_query_head_reads_kv_head_by_integer_division(rng):
    """Head h reads KV head h // G: zeroing KV head 1's values zeroes exactly heads 2 and 3."""
    mha = pa.MultiHeadAttention.random(8, 4, num_kv_heads=2, d_head=2, dtype=np.float64)
    wv = np.array(mha.wv, copy=True)
    wv[:, 2:4] = 0  # KV head 1
    zeroed = pa.MultiHeadAttention(mha.wq, mha.wk, wv, mha.wo, num_heads=4, num_kv_heads=2)
    x = rng.standard_normal((3, 8))
    q = (x @ mha.wq).reshape(3, 4, 2).swapaxes(0, 1)  # (H, L, dh)
    k = (x @ mha.wk).reshape(3, 2, 2).swapaxes(0, 1)
    v = (x @ wv).reshape(3, 2, 2).swapaxes(0, 1)
    per_head = np.stack([pa.attention(q[h], k[h // 2], v[h // 2]) for h in range(4)])
    assert np.all(per_head[2:] == 0)
    assert np.all(np.abs(per_head[:2]) > 0)
    want = per_head.swapaxes(0, 1).reshape(3, 8) @ mha.wo
    np.testing.assert_allclose(zeroed(x), want, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ converters, construction


def test_user_loads_torch_module_and_runs_on_numpy(rng):
    """The issue's promise: a float32 torch module, loaded into portattn, run on NumPy arrays."""
    torch.manual_seed(1)
    m = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    with torch.no_grad():
        want, _ = m(
            torch.from_numpy(x), torch.from_numpy(x), torch.from_numpy(x), need_weights=False
        )
    mha = pa.MultiHeadAttention.from_torch(m)
    got = mha(x)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    # The same from a state_dict held as NumPy arrays, without torch objects.
    sd = {k: v.numpy() for k, v in m.state_dict().items()}
    mha2 = pa.MultiHeadAttention.from_torch_weights(
        sd["in_proj_weight"],
        sd["out_proj.weight"],
        num_heads=4,
        in_proj_bias=sd["in_proj_bias"],
        out_proj_bias=sd["out_proj.bias"],
    )
    np.testing.assert_array_equal(mha2(x), got)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kdim", [None, 5])
def test_to_torch_round_trip(rng, bias, kdim):
    m = _torch_mha(D, 3, bias=bias, kdim=kdim)
    mha = pa.MultiHeadAttention.from_torch(m)
    back = mha.to_torch()
    for (name, a), (name2, b) in zip(
        m.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert name == name2
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ours = pa.MultiHeadAttention.random(D, 4, bias=bias, dtype=np.float64, seed=7)
    x = rng.standard_normal((2, LQ, D))
    np.testing.assert_allclose(
        _torch_out(ours.to_torch().eval(), x, x), ours(x), rtol=1e-12, atol=1e-14
    )


def test_random_is_deterministic_and_bit_identical_across_backends(backend: Backend):
    for dtype_name in ("float32", "float64"):
        ref = pa.MultiHeadAttention.random(
            12, 4, num_kv_heads=2, bias=True, seed=5, dtype=getattr(np, dtype_name)
        )
        got = pa.MultiHeadAttention.random(
            12,
            4,
            num_kv_heads=2,
            bias=True,
            seed=5,
            xp=backend.xp,
            dtype=getattr(backend.xp, dtype_name),
            device=backend.device,
        )
        for name in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
            np.testing.assert_array_equal(to_numpy(getattr(got, name)), getattr(ref, name))
    other = pa.MultiHeadAttention.random(12, 4, seed=6, xp=backend.xp, device=backend.device)
    assert not np.array_equal(to_numpy(other.wq), to_numpy(got.wq).astype(np.float32))


def test_random_distribution_is_as_documented():
    mha = pa.MultiHeadAttention.random(64, 8, dtype=np.float64, seed=0)
    assert mha.wq.shape == (64, 64)
    assert mha.d_head == 8
    assert abs(np.std(mha.wq) * np.sqrt(64) - 1) < 0.05  # N(0, 1/d_model)
    assert abs(np.mean(mha.wq)) < 0.01


def test_defaults_float32_numpy_and_shapes():
    mha = pa.MultiHeadAttention.random(8, 2, num_kv_heads=1)
    assert mha.wq.dtype == np.float32
    assert (mha.wq.shape, mha.wk.shape, mha.wo.shape) == ((8, 8), (8, 4), (8, 8))
    assert mha(np.ones((3, 8), dtype=np.float32)).shape == (3, 8)
    assert mha.weights(np.ones((3, 8), dtype=np.float32)).shape == (2, 3, 3)


def test_weights_rows_sum_to_one_and_match_call(backend: Backend, rng):
    mha = pa.MultiHeadAttention.random(
        D, 3, xp=backend.xp, dtype=backend.xp.float64, device=backend.device
    )
    x = backend.asarray(rng.standard_normal((B, LQ, D)))
    w = to_numpy(mha.weights(x, causal=True))
    assert w.shape == (B, 3, LQ, LQ)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-12)
    assert np.all(np.triu(w, 1) == 0)
    xn = to_numpy(x)
    v = (xn @ to_numpy(mha.wv)).reshape(B, LQ, 3, 4).swapaxes(1, 2)  # (B, H, L, dh)
    want = (w @ v).swapaxes(1, 2).reshape(B, LQ, D) @ to_numpy(mha.wo)
    assert_close(mha(x, causal=True), want, rtol=1e-12, xp=backend.xp)


def test_inputs_are_not_mutated(backend: Backend, rng):
    mha = pa.MultiHeadAttention.random(D, 3, bias=True, xp=backend.xp, device=backend.device)
    xn = rng.standard_normal((B, LQ, D)).astype(np.float32)
    x = backend.asarray(xn, backend.xp.float32)
    wq = to_numpy(mha.wq)
    mha(x, causal=True)
    mha(x, backend.asarray(xn, backend.xp.float32), mask=backend.asarray(np.ones((LQ, LQ), bool)))
    np.testing.assert_array_equal(to_numpy(x), xn)
    np.testing.assert_array_equal(to_numpy(mha.wq), wq)


def test_one_namespace_lookup_per_call(backend: Backend, rng, monkeypatch):
    mha = pa.MultiHeadAttention.random(D, 3, rope="half", xp=backend.xp, device=backend.device)
    calls = []
    real = _compat.array_namespace

    def counting(*arrays, **names):
        calls.append(len(arrays))
        return real(*arrays, **names)

    for module in (
        "_layers._multihead",
        "_attention",
        "_layers._positions",
        "_layers._kvcache",
        "_layers._head",
    ):
        monkeypatch.setattr(f"portattn.{module}.array_namespace", counting)
    monkeypatch.setattr(_compat, "array_namespace", counting)
    x = backend.asarray(rng.standard_normal((B, LQ, D)), backend.xp.float32)
    mha(x, causal=True)
    assert len(calls) == 1


# ------------------------------------------------------------------------------- errors


def test_num_heads_must_divide_d_model_without_d_head():
    with pytest.raises(ValueError, match=r"num_heads to divide d_model.*d_model=10, num_heads=3"):
        pa.MultiHeadAttention.random(10, 3)
    assert pa.MultiHeadAttention.random(10, 3, d_head=4).wq.shape == (10, 12)


def test_num_kv_heads_must_divide_num_heads():
    with pytest.raises(
        ValueError, match=r"num_kv_heads to divide num_heads.*num_heads=6, num_kv_heads=4"
    ):
        pa.MultiHeadAttention.random(12, 6, num_kv_heads=4)
    w = np.zeros((12, 12))
    with pytest.raises(ValueError, match="num_kv_heads to divide num_heads"):
        pa.MultiHeadAttention(w, w[:, :8], w[:, :8], w, num_heads=6, num_kv_heads=4)


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((8, 8), (8, 8), (8, 8), (8, 6)), r"expected wo of shape \(8, 8\).*got shape \(8, 6\)"),
        (((8, 8), (8, 4), (8, 8), (8, 8)), r"expected wk of shape \(8, 8\).*got shape \(8, 4\)"),
        (((8, 9), (8, 9), (8, 9), (9, 8)), r"num_heads=2 dividing its 9 columns"),
    ],
)
def test_weight_shapes_are_checked(shapes, match):
    ws = [np.zeros(s) for s in shapes]
    with pytest.raises(ValueError, match=match):
        pa.MultiHeadAttention(*ws, num_heads=2)


def test_bad_inputs_name_what_was_expected():
    mha = pa.MultiHeadAttention.random(8, 2)
    with pytest.raises(
        ValueError, match=r"x of shape \(\.\.\., Lq, d_model=8\), got shape \(3, 7\)"
    ):
        mha(np.ones((3, 7), dtype=np.float32))
    with pytest.raises(TypeError, match="x to have a real floating dtype, got int64"):
        mha(np.ones((3, 8), dtype=np.int64))
    with pytest.raises(ValueError, match=r"context of shape \(\.\.\., Lk, d_context=8\)"):
        mha(np.ones((3, 8), dtype=np.float32), np.ones((4, 5), dtype=np.float32))
    with pytest.raises(
        ValueError, match="positions=None for a MultiHeadAttention built with rope=None"
    ):
        mha(np.ones((3, 8), dtype=np.float32), positions=np.arange(3))
    with pytest.raises(TypeError, match="one library"):
        mha(torch.ones(3, 8))
    roped = pa.MultiHeadAttention.random(8, 2, rope="half")
    with pytest.raises(ValueError, match="context=None with rope"):
        roped(np.ones((3, 8), dtype=np.float32), np.ones((4, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"positions of shape \(\.\.\., Lq=3\).*got shape \(4,\)"):
        roped(np.ones((3, 8), dtype=np.float32), positions=np.arange(4))
    with pytest.raises(ValueError, match="even d_head"):
        pa.MultiHeadAttention.random(9, 3, rope="half")
    with pytest.raises(ValueError, match="GQA"):
        pa.MultiHeadAttention.random(8, 4, num_kv_heads=2).to_torch()


# --- refused modules ------------------------------------------------------------------


def test_from_torch_refuses_other_modules():
    import torch

    with pytest.raises(TypeError, match=r"expected a torch.nn.MultiheadAttention, got Linear"):
        pa.MultiHeadAttention.from_torch(torch.nn.Linear(4, 4))


# --- a failed call with a cache appends nothing ---------------------------------------


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


# --- torch / Hugging Face mask and lengths layouts ------------------------------------


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


def test_a_cache_that_is_not_a_kvcache_is_named():
    mha = pa.MultiHeadAttention.random(8, 2)
    with pytest.raises(TypeError, match=r"expected cache to be a KVCache or None, got dict"):
        mha(np.ones((3, 8), dtype=np.float32), causal=True, cache={})


def test_arguments_that_are_not_arrays_are_named():
    mha = pa.MultiHeadAttention.random(8, 2)
    x = np.ones((3, 8), dtype=np.float32)
    for name in ("mask", "key_lengths"):
        with pytest.raises(TypeError, match=rf"expected {name} to be an array, got \[3\]"):
            mha(x, **{name: [3]})
    with pytest.raises(TypeError, match=r"expected x to be an array, got \[1.0\]"):
        mha.weights([1.0])


def test_weights_that_are_not_arrays_are_named():
    w = np.eye(4)
    with pytest.raises(TypeError, match=r"expected wk to be an array, got \[\[1.0\]\]"):
        pa.MultiHeadAttention(w, [[1.0]], w, w, num_heads=2)
    with pytest.raises(TypeError, match="expected bv to be an array, got 3"):
        pa.MultiHeadAttention(w, w, w, w, num_heads=2, bv=3)
    with pytest.raises(TypeError, match="expected in_proj_bias to be an array, got 3"):
        pa.MultiHeadAttention.from_torch_weights(np.ones((12, 4)), w, num_heads=2, in_proj_bias=3)
    with pytest.raises(TypeError, match="expected out_proj_weight to be an array"):
        pa.MultiHeadAttention.from_torch_weights(np.ones((12, 4)), None, num_heads=2)


def test_rope_base_is_refused_when_the_layer_is_built():
    w = np.zeros((8, 8))
    with pytest.raises(ValueError, match=r"expected rope_base to be a finite real number > 1"):
        pa.MultiHeadAttention(w, w, w, w, num_heads=2, rope="half", rope_base=0)


@pytest.mark.parametrize("integer", [np.int64, np.int32, np.uint8, torch.tensor])
def test_sizes_accept_any_integer_scalar(integer):
    """As docs/errors.md promises: any integer where an int is meant, NumPy's np.int64 included."""
    got = pa.MultiHeadAttention.random(integer(8), integer(4), num_kv_heads=integer(2))
    want = pa.MultiHeadAttention.random(8, 4, num_kv_heads=2)
    assert (got.num_heads, got.num_kv_heads, got.d_head) == (4, 2, 2)
    assert type(got.num_heads) is int
    np.testing.assert_array_equal(got.wq, want.wq)
    assert pa.MultiHeadAttention.random(8, 2, d_head=integer(3)).d_head == 3
    built = pa.MultiHeadAttention(
        want.wq, want.wk, want.wv, want.wo, num_heads=integer(4), num_kv_heads=integer(2)
    )
    assert (built.num_heads, built.group_size) == (4, 2)


@pytest.mark.parametrize("bad", [True, np.True_, 2.0, "4", np.array([4])])
def test_sizes_refuse_what_is_not_an_integer_scalar(bad):
    with pytest.raises(ValueError, match="expected num_heads to be a positive int"):
        pa.MultiHeadAttention.random(8, bad)


def test_random_bias_is_a_flag():
    with pytest.raises(ValueError, match="expected bias to be True or False, got 1"):
        pa.MultiHeadAttention.random(8, 2, bias=1)


@pytest.mark.parametrize(
    ("option", "match"),
    [
        (
            {"key_lengths": np.array([5, 5, 5])},
            r"key_lengths .* broadcastable to x's batch shape \(2,\), got shape \(3,\)$",
        ),
        (
            {"mask": np.ones((3, 5, 5), dtype=bool)},
            r"\(Lq, Lk\) = \(5, 5\) and a batch broadcastable with x's \(2,\) .* got mask "
            r"shape \(3, 5, 5\)$",
        ),
        ({"mask": np.ones((2, 5, 6), dtype=bool)}, r"got mask shape \(2, 5, 6\)$"),
        ({"mask": np.ones((2, 2, 5, 6), dtype=bool)}, r"got mask shape \(2, 2, 5, 6\)$"),
    ],
)
def test_shape_errors_show_the_users_shapes(option, match):
    """Never the grouped (..., Hkv, G, Lq, Lk) shapes the heads run in internally."""
    mha = pa.MultiHeadAttention.random(8, 2)
    with pytest.raises(ValueError, match=match) as info:
        mha(np.ones((2, 5, 8), dtype=np.float32), **option)
    assert "(2, 2, 1" not in str(info.value)


def test_mask_with_a_cache_covers_every_cached_key():
    mha = pa.MultiHeadAttention.random(8, 2)
    cache = mha.new_cache(batch_shape=(2,))
    x = np.ones((2, 5, 8), dtype=np.float32)
    mha(x, causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"\(Lq, Lk\) = \(5, 10\).*got mask shape \(2, 5, 5\)"):
        mha(x, mask=np.ones((2, 5, 5), dtype=bool), causal=True, cache=cache)
    assert cache.length == 5
    full = mha(x, mask=np.ones((2, 5, 10), dtype=bool), causal=True, cache=cache)
    assert full.shape == (2, 5, 8) and cache.length == 10
