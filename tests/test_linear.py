"""Linear attention (Katharopoulos et al. 2020) against torch transcriptions of the paper."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend, assert_close_on, make_qkv

B, H, L, D, DV = 2, 3, 23, 5, 4


def _phi(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.elu(x) + 1


def oracle_noncausal(q, k, v, eps):
    """The reference code's einsums (fast-transformers LinearAttention), layout (N, L, H, d)."""
    Q, K, V = (
        _phi(torch.from_numpy(a).transpose(1, 2)) if i < 2 else torch.from_numpy(a).transpose(1, 2)
        for i, a in enumerate((q, k, v))
    )
    KV = torch.einsum("nshd,nshm->nhmd", K, V)
    Z = 1 / (torch.einsum("nlhd,nhd->nlh", Q, K.sum(dim=1)) + eps)
    out = torch.einsum("nlhd,nhmd,nlh->nlhm", Q, KV, Z)
    return out.transpose(1, 2).numpy()


def oracle_causal(q, k, v, eps):
    """The causal form written quadratically: A = tril(phi(Q) phi(K)^T), out = A V / (A 1 + eps)."""
    Q, K, V = _phi(torch.from_numpy(q)), _phi(torch.from_numpy(k)), torch.from_numpy(v)
    A = torch.tril(Q @ K.transpose(-1, -2))
    return ((A @ V) / (A.sum(-1, keepdim=True) + eps)).numpy()


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_matches_paper_oracle(backend: Backend, rng, causal):
    q, k, v = make_qkv(rng, L if causal else 7, L, d=D, dv=DV, batch=(B, H))
    for eps in (1e-6, 0.0):
        want = (oracle_causal if causal else oracle_noncausal)(q, k, v, eps)
        for dtype in backend.float_dtypes:
            args = [backend.asarray(a, dtype) for a in (q, k, v)]
            got = pa.linear_attention(*args, causal=causal, eps=eps)
            assert_close_on(backend, got, want, dtype=dtype)


@pytest.mark.parametrize("chunk_size", [1, 4, 64, 1000])
def test_recurrent_form_equals_causal_parallel_form(backend: Backend, rng, chunk_size):
    q, k, v = make_qkv(rng, L, d=D, dv=DV, batch=(B, H))
    qa, ka, va = (backend.asarray(a) for a in (q, k, v))
    parallel = pa.linear_attention(qa, ka, va, causal=True, chunk_size=chunk_size)
    state = None
    outs = []
    for t in range(L):
        out, state = pa.linear_attention_step(qa[..., t, :], ka[..., t, :], va[..., t, :], state)
        outs.append(out)
    recurrent = backend.xp.stack(outs, axis=-2)
    assert_close(recurrent, to_numpy(parallel), rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64)
    # The state is the sum of all outer products phi(k) v^T.
    kv = np.einsum("bhld,bhlm->bhdm", to_numpy(pa.elu_feature_map(ka)), v)
    assert_close(state.kv, kv, rtol=1e-12, xp=backend.xp)


def test_causal_rows_ignore_the_future(backend: Backend, rng):
    q, k, v = make_qkv(rng, L, d=D, dv=DV, batch=(B, H))
    before = to_numpy(pa.linear_attention(*(backend.asarray(a) for a in (q, k, v)), causal=True))
    k2, v2 = k.copy(), v.copy()
    k2[..., 10:, :] *= 1e3
    v2[..., 10:, :] = 0
    after = to_numpy(pa.linear_attention(*(backend.asarray(a) for a in (q, k2, v2)), causal=True))
    np.testing.assert_array_equal(after[..., :10, :], before[..., :10, :])
    assert np.abs(after[..., 10:, :] - before[..., 10:, :]).max() > 1e-3


def test_step_state_is_not_modified(backend: Backend, rng):
    q, k, v = (backend.asarray(rng.standard_normal(n)) for n in (D, D, DV))
    _, s1 = pa.linear_attention_step(q, k, v)
    kv1 = to_numpy(s1.kv)
    _, s2 = pa.linear_attention_step(q, k, v, s1)
    np.testing.assert_array_equal(to_numpy(s1.kv), kv1)
    np.testing.assert_allclose(to_numpy(s2.kv), 2 * kv1, rtol=1e-15)


def test_elu_feature_map_matches_torch(backend: Backend, rng):
    x = rng.standard_normal(50) * 5
    x[:3] = [-800.0, 0.0, 800.0]  # exp must neither overflow nor warn
    want = (torch.nn.functional.elu(torch.from_numpy(x)) + 1).numpy()
    with np.errstate(all="raise"):
        got = pa.elu_feature_map(backend.asarray(x))
    assert_close(got, want, rtol=1e-15, xp=backend.xp, dtype=backend.xp.float64)
    assert np.all(to_numpy(got) >= 0)


def test_inputs_are_not_mutated(backend: Backend, rng):
    arrays = make_qkv(rng, L, d=D, dv=DV, batch=(B, H))
    xs = [backend.asarray(a) for a in arrays]
    pa.linear_attention(*xs, causal=True)
    pa.linear_attention(*xs)
    for x, a in zip(xs, arrays, strict=True):
        np.testing.assert_array_equal(to_numpy(x), a)


def test_errors_say_what_was_expected():
    q = np.ones((4, 3))
    with pytest.raises(ValueError, match="Lq == Lk for causal linear attention, got Lq=4, Lk=5"):
        pa.linear_attention(q, np.ones((5, 3)), np.ones((5, 2)), causal=True)
    with pytest.raises(ValueError, match=r"feature size d=3 like query.*got key shape \(5, 2\)"):
        pa.linear_attention(q, np.ones((5, 2)), np.ones((5, 2)))
    with pytest.raises(ValueError, match=r"Lk=5 rows like key.*got value shape \(4, 2\)"):
        pa.linear_attention(q, np.ones((5, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="eps to be a finite real number >= 0, got -1"):
        pa.linear_attention(q, q, q, eps=-1)
    with pytest.raises(ValueError, match="chunk_size to be a positive int, got 0"):
        pa.linear_attention(q, q, q, causal=True, chunk_size=0)
    with pytest.raises(TypeError, match="real floating dtype, got int64"):
        pa.linear_attention(q, q, np.ones((4, 3), dtype=np.int64))
    _, state = pa.linear_attention_step(np.ones(3), np.ones(3), np.ones(2))
    with pytest.raises(
        ValueError, match=r"state.kv of shape \(\.\.\., d=3, dv=4\), got shape \(3, 2\)"
    ):
        pa.linear_attention_step(np.ones(3), np.ones(3), np.ones(4), state)


# --- arguments checked on both forms --------------------------------------------------


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
