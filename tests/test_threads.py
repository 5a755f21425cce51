"""The NumPy thread pool (_lib._threads): same numbers, off when asked, safe under threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import portattn as pa
from portattn._lib import _threads

from conftest import make_qkv

SHAPE = (1, 4, 512, 32)  # 4 query blocks of 128 rows with NumPy's default tiles


@pytest.fixture
def qkv(rng):
    *batch, n, d = SHAPE
    return list(make_qkv(rng, n, d=d, batch=tuple(batch), draw_dtype=np.float32))


@pytest.fixture
def pooled(monkeypatch):
    """Lower the size threshold so that test-sized calls engage the pool; count pooled calls."""
    monkeypatch.setattr(_threads, "_MIN_WORK", 1)
    monkeypatch.delenv(_threads.ENV, raising=False)
    calls = []
    real = _threads.ThreadPoolExecutor

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(_threads, "ThreadPoolExecutor", counting)
    return calls


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def _sequential(q, k, v, **kw):
    with threadpool_limits(limits=1, user_api="blas"):  # also turns the pool off
        return pa.attention(q, k, v, impl="blockwise", block_size=(128, 128), **kw)


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window": (100, 3)}])
def test_pool_gives_the_sequential_numbers(qkv, pooled, kw):
    before = _blas_threads()
    want = _sequential(*qkv, **kw)
    assert not pooled
    got = pa.attention(*qkv, impl="blockwise", block_size=(128, 128), **kw)
    if max(before, default=1) > 1:
        assert pooled, "the pool should have run"
    np.testing.assert_array_equal(got, want)  # same tiles, same order: bit for bit
    assert _blas_threads() == before  # BLAS limits restored


def test_environment_variable_turns_the_pool_off(qkv, pooled, monkeypatch):
    monkeypatch.setenv(_threads.ENV, "1")
    pa.attention(*qkv, impl="blockwise", block_size=(128, 128))
    assert not pooled
    monkeypatch.setenv(_threads.ENV, "zero")
    with pytest.raises(ValueError, match="PORTATTN_NUM_THREADS"):
        pa.attention(*qkv, impl="blockwise", block_size=(128, 128))


def test_a_callers_threadpool_limit_turns_the_pool_off(qkv, pooled):
    with threadpool_limits(limits=1, user_api="blas"):
        pa.attention(*qkv, impl="blockwise", block_size=(128, 128))
    assert not pooled


def test_torch_never_uses_the_pool(qkv, pooled):
    torch = pytest.importorskip("torch")
    pa.attention(*(torch.from_numpy(x) for x in qkv), impl="blockwise", block_size=(128, 128))
    assert not pooled


def test_concurrent_callers_get_right_answers_and_limits_come_back(rng, pooled):
    before = _blas_threads()
    inputs = [[rng.standard_normal(SHAPE, dtype=np.float32) for _ in range(3)] for _ in range(6)]
    wants = [_sequential(*x, causal=True) for x in inputs]
    gots: list[np.ndarray | None] = [None] * len(inputs)

    def call(i: int) -> None:
        gots[i] = pa.attention(*inputs[i], impl="blockwise", block_size=(128, 128), causal=True)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(gots, wants, strict=True):
        # a call that found the pool busy ran with whatever BLAS threads were in
        # effect, and BLAS may split its sums differently: close, not bitwise
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _blas_threads() == before
