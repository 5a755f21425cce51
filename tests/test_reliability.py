"""Issue 8: no silent wrong answer, no lost state, one clear error per bad argument.

Each section is one class of the issue; every test here failed before the fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend

SRC = str(Path(pa.__file__).resolve().parents[1])  # the portattn under test


# --- 7. the CLI on closed pipes and failing writes ------------------------------


def _cli(shell_redirect: str | None = None, **kwargs) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "portattn", "--backend", "numpy", "--no-color"]
    if shell_redirect is not None:
        line = " ".join(cmd) + " " + shell_redirect
        return subprocess.run(
            ["/bin/sh", "-c", line], capture_output=True, text=True, env=env, timeout=300
        )
    return subprocess.run(cmd, text=True, env=env, timeout=300, **kwargs)


def test_cli_exits_quietly_when_the_reader_has_gone():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write is EPIPE
    try:
        run = _cli(stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert run.stderr == ""
    assert run.returncode == 141


def test_cli_with_stdout_closed_says_so_in_one_line():
    run = _cli(">&-")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "python -m portattn: cannot write the report: standard output is closed"
    ]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="this OS has no /dev/full")
def test_cli_on_a_full_device_says_so_in_one_line():
    run = _cli(">/dev/full")
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write the report: No space left" in lines[0]


# --- 9. KVCache shared between threads ----------------------------------------


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


# --- 11. arguments checked whatever the path ------------------------------------


@pytest.mark.parametrize("causal", [0, 1, None, "yes"])
def test_linear_attention_causal_is_a_bool(backend: Backend, rng, causal):
    x = backend.asarray(rng.standard_normal((3, 2)))
    with pytest.raises(ValueError, match=r"expected causal to be True or False, got"):
        pa.linear_attention(x, x, x, causal=causal)


def test_linear_attention_accepts_numpy_bools(backend: Backend, rng):
    x = backend.asarray(rng.standard_normal((3, 2)))
    want = to_numpy(pa.linear_attention(x, x, x, causal=True))
    np.testing.assert_array_equal(to_numpy(pa.linear_attention(x, x, x, causal=np.True_)), want)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk_size", [0, -1, "4", 2.0, True])
def test_linear_attention_chunk_size_checked_in_both_forms(
    backend: Backend, rng, causal, chunk_size
):
    x = backend.asarray(rng.standard_normal((3, 2)))
    with pytest.raises(ValueError, match=r"expected chunk_size to be a positive int, got"):
        pa.linear_attention(x, x, x, causal=causal, chunk_size=chunk_size)


def test_linear_attention_step_bad_states_are_named(backend: Backend, rng):
    xp = backend.xp
    q = backend.asarray(rng.standard_normal((2, 3)))
    v = backend.asarray(rng.standard_normal((2, 4)))
    _, good = pa.linear_attention_step(q, q, v)
    cases = [
        (TypeError, r"expected state to be a LinearAttentionState .* got \(1, 2\)", (1, 2)),
        (TypeError, r"expected state to be a LinearAttentionState .* got ndarray", np.ones(3)),
        (
            TypeError,
            r"expected state.kv to be an array, got \[1\]",
            pa.LinearAttentionState([1], good.normalizer),
        ),
        (
            ValueError,
            r"expected state.kv of shape \(\.\.\., d=3, dv=4\), got shape \(2, 4, 3\)",
            pa.LinearAttentionState(xp.matrix_transpose(good.kv), good.normalizer),
        ),
        (
            ValueError,
            r"expected state.normalizer of shape \(2, 3\) .* got shape \(2, 4\)",
            pa.LinearAttentionState(
                good.kv, xp.zeros((2, 4), dtype=xp.float64, device=backend.device)
            ),
        ),
        (
            TypeError,
            r"expected state.kv in the compute dtype float64, got float32",
            pa.LinearAttentionState(xp.astype(good.kv, xp.float32), good.normalizer),
        ),
        (
            ValueError,
            r"expected state to be broadcastable",
            pa.LinearAttentionState(
                xp.zeros((5, 3, 4), dtype=xp.float64, device=backend.device),
                xp.zeros((5, 3), dtype=xp.float64, device=backend.device),
            ),
        ),
    ]
    for exc, pattern, state in cases:
        with pytest.raises(exc, match=pattern):
            pa.linear_attention_step(q, q, v, state)


def test_linear_attention_step_state_from_another_library(rng):
    import torch

    q = rng.standard_normal((2, 3))
    v = rng.standard_normal((2, 4))
    _, state = pa.linear_attention_step(
        torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(v)
    )
    with pytest.raises(
        TypeError, match=r"state.kv to come from the inputs' library numpy, got .* torch"
    ):
        pa.linear_attention_step(q, q, v, state)


def test_window_mask_causal_is_a_bool():
    with pytest.raises(ValueError, match=r"expected causal to be True or False, got 'no'"):
        pa.window_mask(3, 3, window=1, causal="no")
    with pytest.raises(ValueError, match=r"expected causal to be True or False, got 1"):
        pa.window_mask(3, 3, window=1, causal=1)


def test_window_mask_huge_window_means_unbounded():
    np.testing.assert_array_equal(pa.window_mask(3, 4, window=2**63), np.ones((3, 4), bool))
    np.testing.assert_array_equal(pa.window_mask(3, 4, window=(2**70, 0)), pa.causal_mask(3, 4))


@pytest.mark.parametrize("window", [True, None, 1.0, (1, True), "2"])
def test_window_mask_bad_window(window):
    with pytest.raises(ValueError, match=r"expected window to be a non-negative int"):
        pa.window_mask(3, 3, window=window)


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


def test_sinusoidal_encoding_foreign_dtype_is_refused():
    import torch

    with pytest.raises(
        TypeError, match=r"dtype of numpy, such as numpy.float32, got float32 \(from torch\)"
    ):
        pa.sinusoidal_encoding(4, 4, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"dtype of numpy.*got 'float64'"):
        pa.sinusoidal_encoding(np.arange(4), 4, dtype="float64")


def test_assert_close_takes_a_list_as_reference(backend: Backend):
    x = backend.asarray(np.array([1.0, 2.0]))
    assert_close(x, [1.0, 2.0], rtol=0, xp=backend.xp)
    with pytest.raises(AssertionError, match=r"max relative error"):
        assert_close(x, [1.0, 2.5], rtol=1e-3)


def test_assert_close_refuses_a_list_as_the_result():
    with pytest.raises(TypeError, match=r"expected actual to be an array .* got \[1\.0, 2\.0\]"):
        assert_close([1.0, 2.0], np.array([1.0, 2.0]), rtol=0)
    with pytest.raises(ValueError, match=r"expected rtol to be a finite real number >= 0, got"):
        assert_close(np.ones(2), np.ones(2), rtol="0")


# --- 12. NumPy scalars where Python numbers are accepted --------------------------


def test_numpy_scalars_are_numbers(backend: Backend, rng):
    xp = backend.xp
    x = backend.asarray(rng.standard_normal((2, 3)))
    np.testing.assert_array_equal(
        to_numpy(pa.softmax(x, axis=np.int64(0))), to_numpy(pa.softmax(x, axis=0))
    )
    np.testing.assert_array_equal(pa.causal_mask(np.int64(2), np.int32(3)), pa.causal_mask(2, 3))
    np.testing.assert_array_equal(
        pa.window_mask(np.int64(4), 4, window=(np.int64(1), np.uint8(0))),
        pa.window_mask(4, 4, window=(1, 0)),
    )
    np.testing.assert_array_equal(
        to_numpy(pa.sinusoidal_encoding(np.int64(3), np.int64(4), base=np.float32(100.0))),
        to_numpy(pa.sinusoidal_encoding(3, 4, base=100.0)),
    )
    q = backend.asarray(rng.standard_normal((4, 2)))
    rot = pa.apply_rope(q, base=np.float32(500.0))
    np.testing.assert_array_equal(to_numpy(rot), to_numpy(pa.apply_rope(q, base=500.0)))
    np.testing.assert_array_equal(pa.rope_positions(np.int64(3), offset=np.int8(2)), [2, 3, 4])
    a = pa.linear_attention(q, q, q, causal=True, eps=np.float32(0.5), chunk_size=np.int64(2))
    b = pa.linear_attention(q, q, q, causal=True, eps=0.5, chunk_size=2)
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    cache = pa.KVCache(
        np.int64(2),
        np.int64(4),
        batch_shape=(np.int64(1),),
        capacity=np.int64(3),
        xp=xp,
        device=backend.device,
    )
    assert (cache.num_kv_heads, cache.d_head, cache.batch_shape, cache.capacity) == (2, 4, (1,), 3)
    assert all(type(n) is int for n in (cache.num_kv_heads, cache.capacity, *cache.batch_shape))


@pytest.mark.parametrize("base", [True, 1, 0.5, float("inf"), "10000"])
def test_bad_base(base):
    with pytest.raises(ValueError, match=r"expected base to be a finite real number > 1, got"):
        pa.sinusoidal_encoding(3, 4, base=base)


# --- 13. softmax at the ends of the range ------------------------------------------


def test_softmax_finite_extremes_are_in_range(backend: Backend):
    xp = backend.xp
    big = float(np.finfo(np.float32).max)
    x = backend.asarray(np.array([[big, -big], [-big, -big], [-big, big]]), dtype=xp.float32)
    with np.errstate(all="raise"):
        got = to_numpy(pa.softmax(x))
    np.testing.assert_array_equal(got, [[1, 0], [0.5, 0.5], [0, 1]])
    tiny = float(np.finfo(np.float64).max)
    y = backend.asarray(np.array([tiny, 0.0, -tiny]))
    with np.errstate(all="raise"):
        np.testing.assert_array_equal(to_numpy(pa.softmax(y)), [1, 0, 0])


def test_softmax_documented_non_finite_inputs(backend: Backend):
    x = backend.asarray(
        np.array([[np.inf, 0.0], [np.nan, 0.0], [-np.inf, -np.inf], [-np.inf, 1.0]])
    )
    with np.errstate(all="ignore"):
        got = to_numpy(pa.softmax(x))
    assert np.isnan(got[:2]).all()  # +inf or NaN in a slice: all of it NaN, as documented
    np.testing.assert_array_equal(got[2:], [[0, 0], [0, 1]])


# --- 14. merge_attention in the wider dtype -------------------------------------------


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
