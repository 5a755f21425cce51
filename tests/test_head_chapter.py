"""Head, and the chapter's three properties on every backend."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import portattn as pa
from portattn import chapter
from portattn.testing import assert_close, to_numpy

from conftest import Backend
from reference import attention_ref


def test_random_weights_are_bit_identical_across_backends(backend: Backend):
    ref = pa.Head.random(6, 4, seed=3)  # NumPy, float32
    for dtype in (backend.xp.float32, backend.xp.float64):
        head = pa.Head.random(6, 4, seed=3, xp=backend.xp, dtype=dtype, device=backend.device)
        numpy_dtype = np.float32 if dtype == backend.xp.float32 else np.float64
        ref_w = pa.Head.random(6, 4, seed=3, dtype=numpy_dtype)
        for name in ("wq", "wk", "wv"):
            got = getattr(head, name)
            assert got.dtype == dtype
            assert to_numpy(got).tobytes() == to_numpy(getattr(ref_w, name)).tobytes()
    assert head.d_model == 6 and head.d_head == 4
    default = pa.Head.random(6, 4, seed=3, xp=backend.xp, device=backend.device)
    assert default.wq.dtype == backend.xp.float32
    assert to_numpy(default.wq).tobytes() == to_numpy(ref.wq).tobytes()


def test_random_weights_follow_the_documented_distribution():
    head = pa.Head.random(200, 100, seed=0, std=0.5, dtype=np.float64)
    w = np.concatenate([head.wq.ravel(), head.wk.ravel(), head.wv.ravel()])
    # 60,000 N(0, 0.25) draws: mean within 5 standard errors, std within 2%
    assert abs(w.mean()) < 5 * 0.5 / math.sqrt(w.size)
    assert abs(w.std() - 0.5) < 0.01
    expected = np.random.Generator(np.random.PCG64(0)).standard_normal((3, 200, 100)) * 0.5
    np.testing.assert_array_equal(head.wq, expected[0])
    other = pa.Head.random(200, 100, seed=1, dtype=np.float64)
    assert not np.array_equal(other.wq, head.wq)


def test_identity_head(backend: Backend, rng):
    head = pa.Head.identity(4, xp=backend.xp, dtype=backend.xp.float64, device=backend.device)
    x = rng.standard_normal((5, 4))
    want, w_want = attention_ref(x, x, x)
    assert_close(head(backend.asarray(x)), want, rtol=1e-12, xp=backend.xp)
    assert_close(head.weights(backend.asarray(x)), w_want, rtol=1e-12)
    assert_close(head.scores(backend.asarray(x), scaled=False), x @ x.T, rtol=1e-12)


@pytest.mark.parametrize("integer", [np.int64, np.uint16, torch.tensor])
def test_identity_accepts_any_integer_scalar(integer):
    np.testing.assert_array_equal(pa.Head.identity(integer(3)).wq, np.eye(3))


@pytest.mark.parametrize("bad", [True, 3.0, np.array([3])])
def test_identity_refuses_what_is_not_an_integer_scalar(bad):
    with pytest.raises(ValueError, match="expected d to be a positive int"):
        pa.Head.identity(bad)


def test_arguments_that_are_not_arrays_are_named():
    head = pa.Head.identity(2)
    for method in (head, head.weights, head.scores):
        with pytest.raises(TypeError, match=r"expected x to be an array, got \[\[1.0, 2.0\]\]"):
            method([[1.0, 2.0]])
    with pytest.raises(TypeError, match="expected wv to be an array, got None"):
        pa.Head(head.wq, head.wk, None)


@pytest.mark.parametrize("flag", [1, 0, None, "no"])
def test_scores_scaled_is_a_flag(flag):
    x = np.ones((2, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="expected scaled to be True or False"):
        pa.Head.identity(4).scores(x, scaled=flag)


def test_head_pieces_agree_with_reference(backend: Backend, rng):
    head = pa.Head.random(
        8, 4, seed=1, xp=backend.xp, dtype=backend.xp.float64, device=backend.device
    )
    wq, wk, wv = (to_numpy(w) for w in (head.wq, head.wk, head.wv))
    x = rng.standard_normal((2, 5, 8))
    xb = backend.asarray(x)
    q, k, v = x @ wq, x @ wk, x @ wv
    raw = q @ np.swapaxes(k, -1, -2)
    assert_close(head.scores(xb, scaled=False), raw, rtol=1e-12)
    assert_close(head.scores(xb), raw / 2.0, rtol=1e-12)  # sqrt(d_head) = 2
    for causal in (False, True):
        want, w_want = attention_ref(q, k, v, causal=causal)
        assert_close(head(xb, causal=causal), want, rtol=1e-12, shape=(2, 5, 4))
        assert_close(head.weights(xb, causal=causal), w_want, rtol=1e-12)


def test_head_call_equals_attention_on_projections(backend: Backend, rng):
    head = pa.Head.random(8, 4, seed=2, xp=backend.xp, device=backend.device)
    x = backend.asarray(rng.standard_normal((6, 8)), backend.xp.float32)
    q, k, v = x @ head.wq, x @ head.wk, x @ head.wv
    got = to_numpy(head(x, causal=True))
    assert got.tobytes() == to_numpy(pa.attention(q, k, v, causal=True)).tobytes()


# --- the chapter's three properties ------------------------------------------


@pytest.mark.parametrize("perm", [(2, 1, 0, 3), (3, 2, 1, 0), (1, 2, 3, 0)])
def test_permutation_equivariance(backend: Backend, perm):
    for dtype, tol in ((backend.xp.float32, 1e-6), (backend.xp.float64, 1e-14)):
        report = chapter.permutation_check(perm=perm, xp=backend.xp, dtype=dtype)
        assert report.perm == perm
        assert report.max_abs_diff <= tol
        assert report.max_ulp <= 8


def test_permutation_check_detects_a_position_dependent_model(monkeypatch):
    """The check is not vacuous: adding a position signal makes it fail."""
    real = pa.Head.__call__

    def with_positions(self, x, /, *, causal=False):
        out = real(self, x, causal=causal)
        return out + np.arange(out.shape[0], dtype=out.dtype)[:, None]

    monkeypatch.setattr(pa.Head, "__call__", with_positions)
    assert chapter.permutation_check().max_abs_diff > 0.5


def test_causality_is_bit_exact_with_the_mask_only(backend: Backend):
    for dtype in (backend.xp.float32, backend.xp.float64):
        for factor in (2.0, 1e6):
            report = chapter.causality_check(xp=backend.xp, dtype=dtype, factor=factor)
            assert report.changed_bits_masked == (0, 0, 0)
            assert all(bits > 0 for bits in report.changed_bits_unmasked)
    for dtype in backend.half_dtypes:  # 1e6 is not representable there; rewrite moderately
        report = chapter.causality_check(xp=backend.xp, dtype=dtype, factor=50.0)
        assert report.changed_bits_masked == (0, 0, 0)


def test_sqrt_d_sharpening(backend: Backend):
    rows = chapter.scaling_table((8, 32, 64, 256), xp=backend.xp)
    assert [r.d for r in rows] == [8, 32, 64, 256]
    unscaled = [r.unscaled for r in rows]
    assert unscaled == sorted(unscaled), "unscaled attention must sharpen as d grows"
    assert unscaled[-1] > 0.9 and unscaled[0] < 0.6
    for r in rows:
        assert 1 / 6 <= r.scaled <= r.unscaled <= 1
    flat = chapter.scaling_table((8, 32, 64, 256), init="scaled", xp=backend.xp)
    spread = max(r.scaled for r in flat) - min(r.scaled for r in flat)
    assert spread < 0.1, "with 1/sqrt(d) weights the scaled curve stays flat"
    assert flat[-1].unscaled > flat[-1].scaled + 0.3


def test_chapter_numbers_agree_across_backends(backend: Backend):
    ref = chapter.scaling_table((8, 64))
    got = chapter.scaling_table((8, 64), xp=backend.xp)
    for a, b in zip(ref, got, strict=True):
        assert a.d == b.d
        assert abs(a.unscaled - b.unscaled) < 1e-5 and abs(a.scaled - b.scaled) < 1e-5


def test_demo_weights(backend: Backend):
    tokens = chapter.DEMO_TOKENS
    on = to_numpy(chapter.demo_weights(tokens, xp=backend.xp))
    off = to_numpy(chapter.demo_weights(tokens, causal=False, xp=backend.xp))
    assert on.shape == off.shape == (5, 5)
    np.testing.assert_allclose(on.sum(axis=1), 1, rtol=1e-6)
    upper = np.triu(np.ones((5, 5), bool), 1)
    assert np.all(on[upper] == 0) and np.all(off[upper] > 0)
    np.testing.assert_allclose(on[-1], off[-1], rtol=1e-6)  # the last token sees everything anyway
    np.testing.assert_allclose(on, to_numpy(chapter.demo_weights(tokens)), rtol=1e-6)
    sentence = chapter.describe_row(tokens, on, 2)
    assert sentence.startswith("sat attends to The ")
    for tok, p in zip(tokens[:3], on[2, :3], strict=True):
        assert f"{tok} {round(100 * p)}%" in sentence
    assert "on " not in sentence and "mat" not in sentence


# --- Head.random's arguments ----------------------------------------------------------


def test_head_random_std_must_be_a_real_number():
    with pytest.raises(ValueError, match=r"expected std to be a finite real number >= 0, got '1'"):
        pa.Head.random(4, 2, std="1")
    head = pa.Head.random(4, 2, std=np.float32(0.5))
    assert head.wq.shape == (4, 2)
