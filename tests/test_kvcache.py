"""KV-cache decoding equals the full causal forward pass, on every backend, with GQA and RoPE on."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend

B, L, D = 2, 17, 12  # L > 16 makes the growing cache reallocate (once, at step 17)


def _model(backend: Backend, *, rope="half", num_kv_heads=2, dtype=None):
    return pa.MultiHeadAttention.random(
        D,
        6,
        num_kv_heads=num_kv_heads,
        d_head=4,
        bias=True,
        rope=rope,
        seed=11,
        xp=backend.xp,
        dtype=backend.xp.float64 if dtype is None else dtype,
        device=backend.device,
    )


@pytest.mark.parametrize("capacity", [L, None], ids=["fixed", "growing"])
@pytest.mark.parametrize("rope", ["half", "interleaved", None])
@pytest.mark.parametrize("num_kv_heads", [6, 2, 1], ids=lambda n: f"hkv{n}")
def test_token_by_token_decode_equals_full_causal_forward(
    backend: Backend, rng, capacity, rope, num_kv_heads
):
    mha = _model(backend, rope=rope, num_kv_heads=num_kv_heads)
    x = rng.standard_normal((B, L, D))
    full = to_numpy(mha(backend.asarray(x), causal=True))
    cache = mha.new_cache(batch_shape=(B,), capacity=capacity)
    steps = [mha(backend.asarray(x[:, t : t + 1]), causal=True, cache=cache) for t in range(L)]
    got = backend.xp.concat(steps, axis=-2)
    assert cache.length == L
    assert_close(
        got, full, rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64, device=backend.device
    )


@pytest.mark.parametrize("capacity", [L, None], ids=["fixed", "growing"])
def test_prefill_then_decode_equals_full_forward(backend: Backend, rng, capacity):
    mha = _model(backend)
    x = rng.standard_normal((B, L, D))
    full = to_numpy(mha(backend.asarray(x), causal=True))
    cache = mha.new_cache(batch_shape=(B,), capacity=capacity)
    prefill = mha(backend.asarray(x[:, :8]), causal=True, cache=cache)
    chunk = mha(
        backend.asarray(x[:, 8:11]), causal=True, cache=cache
    )  # a multi-token step: bottom-right
    rest = [mha(backend.asarray(x[:, t : t + 1]), causal=True, cache=cache) for t in range(11, L)]
    got = backend.xp.concat([prefill, chunk, *rest], axis=-2)
    assert_close(got, full, rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64)


def test_decode_with_sliding_window_equals_full_forward(backend: Backend, rng):
    mha = _model(backend)
    x = rng.standard_normal((B, L, D))
    full = to_numpy(mha(backend.asarray(x), causal=True, window=(4, 0)))
    cache = mha.new_cache(batch_shape=(B,))
    steps = [
        mha(backend.asarray(x[:, t : t + 1]), causal=True, window=(4, 0), cache=cache)
        for t in range(L)
    ]
    assert_close(backend.xp.concat(steps, axis=-2), full, rtol=1e-12, xp=backend.xp)


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
def test_decode_in_float32(backend: Backend, rng):
    mha = _model(backend, dtype=backend.xp.float32)
    x = rng.standard_normal((B, L, D))
    full = to_numpy(mha(backend.asarray(x, backend.xp.float32), causal=True))
    cache = mha.new_cache(batch_shape=(B,), capacity=L)
    steps = [
        mha(backend.asarray(x[:, t : t + 1], backend.xp.float32), causal=True, cache=cache)
        for t in range(L)
    ]
    assert_close(
        backend.xp.concat(steps, axis=-2), full, rtol=1e-5, xp=backend.xp, dtype=backend.xp.float32
    )


def test_decoding_without_bottom_right_alignment_would_differ(backend: Backend, rng):
    """Top-left alignment lets the new token see only the first key: the cache must not do that."""
    mha = _model(backend)
    x = rng.standard_normal((1, 6, D))
    cache = mha.new_cache(batch_shape=(1,))
    mha(backend.asarray(x[:, :5]), causal=True, cache=cache)
    bottom = to_numpy(mha(backend.asarray(x[:, 5:]), causal=True, cache=cache))
    full = to_numpy(mha(backend.asarray(x), causal=True))[:, 5:]
    np.testing.assert_allclose(bottom, full, rtol=1e-12)
    cache2 = mha.new_cache(batch_shape=(1,))
    mha(backend.asarray(x[:, :5]), causal=True, cache=cache2)
    top = to_numpy(mha(backend.asarray(x[:, 5:]), causal="top_left", cache=cache2))
    assert np.abs(top - full).max() > 1e-3


def test_cache_append_stores_and_returns_everything(backend: Backend, rng):
    xp = backend.xp
    cache = pa.KVCache(3, 4, batch_shape=(2,), xp=xp, dtype=xp.float64, device=backend.device)
    ks = [rng.standard_normal((2, 3, n, 4)) for n in (5, 1, 14, 2)]  # crosses the growth point
    for i, k in enumerate(ks):
        keys, values = cache.append(backend.asarray(k), backend.asarray(-k))
        want = np.concatenate(ks[: i + 1], axis=-2)
        assert_close(keys, want, rtol=0, xp=xp, dtype=xp.float64, device=backend.device)
        assert_close(values, -want, rtol=0, xp=xp)
    assert cache.length == 22
    assert cache.capacity is None


def test_fixed_cache_overflow_raises_and_leaves_cache_unchanged(backend: Backend, rng):
    xp = backend.xp
    cache = pa.KVCache(2, 4, capacity=5, xp=xp, dtype=xp.float64, device=backend.device)
    k = backend.asarray(rng.standard_normal((2, 4, 4)))
    cache.append(k, k)
    before = to_numpy(cache.keys)
    with pytest.raises(ValueError, match="overflow: capacity is 5 tokens, it holds 4, and 2 more"):
        cache.append(backend.asarray(np.ones((2, 2, 4))), backend.asarray(np.ones((2, 2, 4))))
    assert cache.length == 4
    np.testing.assert_array_equal(to_numpy(cache.keys), before)
    mha = _model(backend, num_kv_heads=1, rope=None)
    mcache = mha.new_cache(capacity=3)
    mha(backend.asarray(rng.standard_normal((3, D))), causal=True, cache=mcache)
    with pytest.raises(ValueError, match="overflow"):
        mha(backend.asarray(rng.standard_normal((1, D))), causal=True, cache=mcache)


def test_cache_mismatches_are_clear_errors(backend: Backend, rng):
    xp = backend.xp
    mha = _model(backend)  # Hkv = 2, d_head = 4, float64
    x = backend.asarray(rng.standard_normal((B, 1, D)))
    with pytest.raises(
        ValueError,
        match=r"shape \(\*batch, Hkv, n, d_head\) = \(2, 3, 'n', 4\).*got shape \(2, 2, 1, 4\)",
    ):
        mha(
            x,
            causal=True,
            cache=pa.KVCache(
                3, 4, batch_shape=(B,), xp=xp, dtype=xp.float64, device=backend.device
            ),
        )
    with pytest.raises(ValueError, match=r"= \(2, 'n', 4\).*got shape \(2, 2, 1, 4\)"):
        mha(x, causal=True, cache=mha.new_cache())  # batch shape () but x has a batch
    wrong_dtype = pa.KVCache(2, 4, batch_shape=(B,), xp=xp, dtype=xp.float32, device=backend.device)
    with pytest.raises(TypeError, match="keys of dtype float32 like the cache, got float64"):
        mha(x, causal=True, cache=wrong_dtype)
    assert wrong_dtype.length == 0
    with pytest.raises(ValueError, match="cache=None with a context"):
        mha(x, x, cache=mha.new_cache(batch_shape=(B,)))
    with pytest.raises(ValueError, match="capacity to be a non-negative int, got -1"):
        pa.KVCache(2, 4, capacity=-1)
    with pytest.raises(ValueError, match="keys and values of one shape"):
        pa.KVCache(1, 2).append(np.ones((1, 3, 2), np.float32), np.ones((1, 2, 2), np.float32))


@pytest.mark.parametrize("bad", [None, [[[1.0, 2.0]]]])
def test_append_names_what_is_not_an_array(bad):
    cache = pa.KVCache(1, 2)
    k = np.ones((1, 1, 2), np.float32)
    with pytest.raises(TypeError, match="expected values to be an array"):
        cache.append(k, bad)
    with pytest.raises(TypeError, match="expected keys to be an array"):
        cache.append(bad, k)
    assert cache.length == 0


def test_clear_never_overwrites_arrays_returned_earlier(backend: Backend):
    xp = backend.xp
    cache = pa.KVCache(1, 2, capacity=4, xp=xp, dtype=xp.float64, device=backend.device)
    keys, _ = cache.append(backend.asarray(np.ones((1, 2, 2))), backend.asarray(np.ones((1, 2, 2))))
    cache.clear()
    assert cache.length == 0
    cache.append(backend.asarray(np.zeros((1, 2, 2))), backend.asarray(np.zeros((1, 2, 2))))
    np.testing.assert_array_equal(to_numpy(keys), np.ones((1, 2, 2)))


def test_decode_does_not_mutate_inputs(backend: Backend, rng):
    mha = _model(backend)
    xn = rng.standard_normal((B, 3, D))
    x = backend.asarray(xn)
    cache = mha.new_cache(batch_shape=(B,))
    mha(x, causal=True, cache=cache)
    np.testing.assert_array_equal(to_numpy(x), xn)


# --- a KVCache shared between threads -------------------------------------------------


@pytest.mark.parametrize("capacity", [None, 2 * 8 * 200], ids=["growing", "fixed"])
def test_concurrent_appends_lose_and_duplicate_nothing(capacity):
    cache = pa.KVCache(1, 2, capacity=capacity)
    n_threads, n_appends = 8, 200
    start = threading.Barrier(n_threads)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up

    def work(t: int) -> None:
        start.wait()
        for i in range(n_appends):
            tok = np.full((1, 2, 2), t * 1000 + i, dtype=np.float32)  # two tokens per append
            cache.append(tok, -tok)

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    keys = to_numpy(cache.keys)[0, :, 0]
    assert cache.length == 2 * n_threads * n_appends
    want = sorted(float(t * 1000 + i) for t in range(n_threads) for i in range(n_appends))
    assert sorted(keys[::2].tolist()) == want
    assert np.array_equal(keys[::2], keys[1::2])  # each append's two tokens stay together
    assert np.array_equal(to_numpy(cache.values), -to_numpy(cache.keys))


# --- dtypes a KVCache refuses ---------------------------------------------------------


def test_kvcache_dtype_strings_and_foreign_dtypes_are_refused():
    import torch

    with pytest.raises(
        TypeError, match=r"expected dtype to be a real floating dtype of numpy.*got 'float32'"
    ):
        pa.KVCache(1, 2, dtype="float32")
    with pytest.raises(
        TypeError, match=r"dtype of torch, such as torch.float32, got float32 \(from numpy\)"
    ):
        pa.KVCache(1, 2, xp=torch, dtype=np.float32)
    with pytest.raises(TypeError, match=r"dtype of numpy.*got int64"):
        pa.KVCache(1, 2, dtype=np.int64)
