"""A call that raises leaves the KVCache and LinearAttentionState it was given byte-identical."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portattn as pa
from portattn.testing import to_numpy

HKV, DH = 2, 3

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _snapshot(cache: pa.KVCache) -> tuple[Any, ...]:
    """Everything a cache holds: its tokens as bytes, its length, capacity and buffer size.

    Bytes beyond ``length`` are scratch space (an append stages its tokens
    there before committing them), so they are not part of the state.
    """
    return (
        cache.length,
        cache.capacity,
        cache.batch_shape,
        str(cache.dtype),
        to_numpy(cache.keys).tobytes(),
        to_numpy(cache.values).tobytes(),
        tuple(cache._k.shape),  # the buffers themselves: not regrown, not replaced
    )


def _tokens(shape: tuple[int, ...], dtype: Any, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# One bad (or, to keep the property honest, good) argument per draw.
APPEND_CASES = [
    "ok",
    "dtype",
    "int_dtype",
    "batch",
    "heads",
    "d_head",
    "rank",
    "kv_differ",
    "overflow",
    "library",
    "not_array",
    "nan_tokens",
]


def _append_args(case: str, n: int, seed: int) -> tuple[Any, Any]:
    shape = (1, HKV, n, DH)
    k = _tokens(shape, np.float32, seed)
    v = _tokens(shape, np.float32, seed + 1)
    if case == "dtype":
        k = k.astype(np.float64)
    elif case == "int_dtype":
        v = v.astype(np.int32)
    elif case == "batch":
        k = v = _tokens((2, HKV, n, DH), np.float32, seed)
    elif case == "heads":
        k = v = _tokens((1, HKV + 1, n, DH), np.float32, seed)
    elif case == "d_head":
        v = _tokens((1, HKV, n, DH + 1), np.float32, seed)
    elif case == "rank":
        k = v = _tokens((HKV, n, DH), np.float32, seed)
    elif case == "kv_differ":
        v = _tokens((1, HKV, n + 1, DH), np.float32, seed)
    elif case == "overflow":
        k = v = _tokens((1, HKV, 64, DH), np.float32, seed)
    elif case == "library":
        import torch

        k = torch.from_numpy(k)
        v = torch.from_numpy(v)
    elif case == "not_array":
        k = k.tolist()
    elif case == "nan_tokens":
        k = np.full(shape, np.nan, np.float32)
    return k, v


@SETTINGS
@given(
    capacity=st.sampled_from([None, 8, 40]),
    prefill=st.integers(0, 8),
    calls=st.lists(st.tuples(st.sampled_from(APPEND_CASES), st.integers(0, 5)), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_a_failed_append_leaves_the_cache_byte_identical(capacity, prefill, calls, seed):
    cache = pa.KVCache(HKV, DH, batch_shape=(1,), capacity=capacity)
    if prefill:
        k = _tokens((1, HKV, prefill, DH), np.float32, seed)
        cache.append(k, -k)
    for i, (case, n) in enumerate(calls):
        k, v = _append_args(case, n, seed + 7 * i)
        before = _snapshot(cache)
        try:
            cache.append(k, v)
        except (TypeError, ValueError):
            assert _snapshot(cache) == before, f"{case} raised and changed the cache"
        else:
            assert case in ("ok", "nan_tokens") or (case == "overflow" and capacity is None)


STEP_CASES = [
    "ok",
    "eps_negative",
    "eps_string",
    "eps_nan",
    "query_int",
    "key_width",
    "state_kv_transposed",
    "state_dtype",
    "state_normalizer",
    "state_batch",
    "state_tuple",
    "value_0d",
]


def _state_bytes(state: pa.LinearAttentionState) -> tuple[bytes, bytes, str, str]:
    kv, z = to_numpy(state.kv), to_numpy(state.normalizer)
    return kv.tobytes(), z.tobytes(), str(kv.shape), str(z.shape)


@SETTINGS
@given(
    steps=st.integers(1, 3),
    calls=st.lists(st.sampled_from(STEP_CASES), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_a_failed_step_leaves_the_state_byte_identical(steps, calls, seed):
    rng = np.random.default_rng(seed)
    d, dv = 3, 4
    state = None
    for _ in range(steps):
        q, v = rng.standard_normal((2, d)), rng.standard_normal((2, dv))
        _, state = pa.linear_attention_step(q, q, v, state)
    assert state is not None
    for case in calls:
        q, k, v = (
            rng.standard_normal((2, d)),
            rng.standard_normal((2, d)),
            rng.standard_normal((2, dv)),
        )
        arg_state: Any = state
        eps: Any = 1e-6
        if case == "eps_negative":
            eps = -1.0
        elif case == "eps_string":
            eps = "1e-6"
        elif case == "eps_nan":
            eps = float("nan")
        elif case == "query_int":
            q = q.astype(np.int64)
        elif case == "key_width":
            k = rng.standard_normal((2, d + 1))
        elif case == "state_kv_transposed":
            arg_state = pa.LinearAttentionState(np.swapaxes(state.kv, -1, -2), state.normalizer)
        elif case == "state_dtype":
            arg_state = pa.LinearAttentionState(state.kv.astype(np.float32), state.normalizer)
        elif case == "state_normalizer":
            arg_state = pa.LinearAttentionState(state.kv, state.normalizer[..., :1])
        elif case == "state_batch":
            v = rng.standard_normal(
                (3, 2, dv)
            )  # batch (3, 2) against the state's (2,)... broadcasts
            q = rng.standard_normal((3, 1, d))
            k = rng.standard_normal((3, 1, d))
            arg_state = pa.LinearAttentionState(np.zeros((5, d, dv)), np.zeros((5, d)))
        elif case == "state_tuple":
            arg_state = (state.kv, state.normalizer)
        elif case == "value_0d":
            v = np.float64(1.0)
        before = _state_bytes(state)
        try:
            pa.linear_attention_step(q, k, v, arg_state, eps=eps)
        except (TypeError, ValueError):
            assert _state_bytes(state) == before, f"{case} raised and changed the state"
        else:
            assert case == "ok", f"{case} should have raised"
            assert _state_bytes(state) == before  # a good step returns a new state too


@pytest.mark.parametrize("case", APPEND_CASES[1:-1])
def test_each_bad_append_raises(case):
    cache = pa.KVCache(HKV, DH, batch_shape=(1,), capacity=8)
    k, v = _append_args(case, 2, 0)
    with pytest.raises((TypeError, ValueError)):
        cache.append(k, v)


MHA_BAD = {
    "ok": {},
    "window": {"window": -1},
    "causal": {"causal": "yes"},
    "mask_shape": {"mask": np.ones((1, 9), dtype=bool)},
    "mask_dtype": {"mask": np.ones((1, 1))},
    "lengths_dtype": {"key_lengths": np.array([1.5])},
    "lengths_layout": {"key_lengths": np.array([[3]])},
    "positions": {"positions": np.arange(7)},
    "x_width": {"x_width": 5},
    "x_dtype": {"x_dtype": np.float64},
}


@SETTINGS
@given(
    prefill=st.integers(1, 5),
    calls=st.lists(st.tuples(st.sampled_from(sorted(MHA_BAD)), st.integers(1, 3)), max_size=5),
    capacity=st.sampled_from([None, 12]),
    seed=st.integers(0, 2**16),
)
def test_a_failed_multihead_call_leaves_its_cache_byte_identical(prefill, calls, capacity, seed):
    mha = pa.MultiHeadAttention.random(8, 4, num_kv_heads=2, rope="half", seed=1)
    cache = mha.new_cache(batch_shape=(1,), capacity=capacity)
    rng = np.random.default_rng(seed)
    mha(rng.standard_normal((1, prefill, 8)).astype(np.float32), causal=True, cache=cache)
    for case, n in calls:
        kwargs = dict(MHA_BAD[case])
        width = kwargs.pop("x_width", 8)
        dtype = kwargs.pop("x_dtype", np.float32)
        x = rng.standard_normal((1, n, width)).astype(dtype)
        before = _snapshot(cache)
        try:
            mha(x, causal=True, cache=cache, **kwargs)
        except (TypeError, ValueError):
            assert _snapshot(cache) == before, f"{case} raised and changed the cache"
        else:
            assert case == "ok" or (case == "mask_shape" and cache.length == 9)
