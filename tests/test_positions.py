"""Sinusoidal encodings and RoPE: against formulas written independently here, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend, rtol_for

L, D = 9, 8


def rope_complex(
    x: np.ndarray, positions: np.ndarray, layout: str, base: float = 10000.0
) -> np.ndarray:
    """RoPE as complex multiplication z * exp(i p theta), in complex128 NumPy."""
    d = x.shape[-1]
    theta = base ** (-np.arange(d // 2) * 2.0 / d)
    if layout == "half":
        z = x[..., : d // 2] + 1j * x[..., d // 2 :]
    else:
        z = x[..., 0::2] + 1j * x[..., 1::2]
    r = z * np.exp(1j * positions[..., None] * theta)
    if layout == "half":
        return np.concatenate([r.real, r.imag], axis=-1)
    out = np.empty(x.shape)
    out[..., 0::2], out[..., 1::2] = r.real, r.imag
    return out


def sinusoidal_loops(positions: np.ndarray, d: int, base: float = 10000.0) -> np.ndarray:
    """Vaswani et al. eq. (5), entry by entry."""
    out = np.empty((*positions.shape, d))
    for idx in np.ndindex(positions.shape):
        p = float(positions[idx])
        for i in range(d // 2):
            out[(*idx, 2 * i)] = np.sin(p / base ** (2 * i / d))
            out[(*idx, 2 * i + 1)] = np.cos(p / base ** (2 * i / d))
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_matches_complex_formula(backend: Backend, rng, layout):
    x = rng.standard_normal((2, 3, L, D))
    pos = rng.integers(0, 500, size=(2, 1, L))  # per batch, broadcast over heads
    want = rope_complex(x, pos, layout)
    for dtype in backend.float_dtypes:
        got = pa.apply_rope(backend.asarray(x, dtype), backend.asarray(pos), layout=layout)
        # float32 angles p * theta for p < 500 carry up to ~3e-5 rad of rounding
        rtol = rtol_for(backend, dtype) * (10 if dtype == backend.xp.float32 else 1)
        assert_close(got, want, rtol=rtol, xp=backend.xp, dtype=dtype, device=backend.device)
    default = pa.apply_rope(backend.asarray(x), layout=layout)
    assert_close(default, rope_complex(x, np.arange(L), layout), rtol=1e-12, xp=backend.xp)


def test_rope_layouts_differ_by_a_feature_permutation(backend: Backend, rng):
    x = rng.standard_normal((L, D))
    perm = np.stack(
        [np.arange(D // 2), np.arange(D // 2) + D // 2], axis=-1
    ).ravel()  # 0, 4, 1, 5, ...
    half = to_numpy(pa.apply_rope(backend.asarray(x), layout="half"))
    inter = to_numpy(pa.apply_rope(backend.asarray(x[:, perm]), layout="interleaved"))
    np.testing.assert_allclose(inter, half[:, perm], rtol=0, atol=1e-15)
    assert not np.allclose(half, to_numpy(pa.apply_rope(backend.asarray(x), layout="interleaved")))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_scores_depend_only_on_relative_offset(backend: Backend, rng, layout):
    q, k = rng.standard_normal((L, D)), rng.standard_normal((L, D))
    pos = np.arange(L)
    for dtype in (backend.xp.float64, backend.xp.float32):
        scores = []
        for shift in (0, 37, 1000):
            p = backend.asarray(pos + shift)
            qr = pa.apply_rope(backend.asarray(q, dtype), p, layout=layout)
            kr = pa.apply_rope(backend.asarray(k, dtype), p, layout=layout)
            scores.append(to_numpy(qr @ backend.xp.matrix_transpose(kr)).astype(np.float64))
        rtol = 1e-10 if dtype == backend.xp.float64 else 1e-3
        for s in scores[1:]:
            np.testing.assert_allclose(s, scores[0], rtol=0, atol=rtol * np.abs(scores[0]).max())
        # ... and they do depend on the offset: the same pair at another gap scores differently.
        unrotated = q @ k.T
        assert np.abs(scores[0] - unrotated).max() > 0.1


def test_rope_preserves_norms_and_position_zero_is_identity(backend: Backend, rng):
    x = rng.standard_normal((L, D))
    r = to_numpy(pa.apply_rope(backend.asarray(x), backend.asarray(rng.integers(0, 99, L))))
    np.testing.assert_allclose(np.linalg.norm(r, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)
    zero = pa.apply_rope(backend.asarray(x), backend.asarray(np.zeros(L, dtype=np.int64)))
    np.testing.assert_array_equal(to_numpy(zero), x)


def test_sinusoidal_matches_paper_formula(backend: Backend):
    want = sinusoidal_loops(np.arange(L), D)
    got = pa.sinusoidal_encoding(
        L, D, xp=backend.xp, dtype=backend.xp.float64, device=backend.device
    )
    assert_close(
        got, want, rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64, device=backend.device
    )
    pos = np.array([[3, 1, 4], [1, 5, 9]])
    got = pa.sinusoidal_encoding(backend.asarray(pos), D, dtype=backend.xp.float64)
    assert_close(got, sinusoidal_loops(pos, D), rtol=1e-12, xp=backend.xp, shape=(2, 3, D))
    default = pa.sinusoidal_encoding(L, D, xp=backend.xp, device=backend.device)
    assert_close(default, want, rtol=1e-5, xp=backend.xp, dtype=backend.xp.float32)


def _permutation_gap(attend, x, perm):
    return np.abs(attend(x[perm]) - attend(x)[perm]).max()


def test_positions_break_permutation_equivariance(rng):
    """The chapter's point 2: plain attention commutes with reordering; positions stop that."""
    x = rng.standard_normal((L, D))
    perm = rng.permutation(L)
    head = pa.Head.random(D, D, seed=1, std=D**-0.5, dtype=np.float64)
    plain = _permutation_gap(head, x, perm)
    pe = pa.sinusoidal_encoding(L, D, dtype=np.float64)
    with_pe = _permutation_gap(lambda t: head(t + pe), x, perm)
    mha = pa.MultiHeadAttention.random(D, 2, dtype=np.float64, seed=1)
    roped = pa.MultiHeadAttention(mha.wq, mha.wk, mha.wv, mha.wo, num_heads=2, rope="half")
    mha_plain = _permutation_gap(mha, x, perm)
    mha_rope = _permutation_gap(roped, x, perm)
    assert plain < 1e-12
    assert mha_plain < 1e-12
    assert with_pe > 1e-3
    assert mha_rope > 1e-3


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mha_with_rope_matches_rotated_sdpa(backend: Backend, rng, layout):
    """MHA(rope) == torch SDPA on projections rotated by the complex formula."""
    mha = pa.MultiHeadAttention.random(
        D,
        4,
        num_kv_heads=2,
        rope=layout,
        dtype=backend.xp.float64,
        xp=backend.xp,
        device=backend.device,
    )
    x = rng.standard_normal((2, L, D))
    pos = np.stack([np.arange(L), np.arange(L) + 11])  # (B, L): each sequence its own offset
    w = {n: to_numpy(getattr(mha, n)) for n in ("wq", "wk", "wv", "wo")}

    def heads(a, n):
        return a.reshape(2, L, n, 2).swapaxes(1, 2)  # (B, n, L, dh)

    q = rope_complex(heads(x @ w["wq"], 4), pos[:, None, :], layout)
    k = rope_complex(heads(x @ w["wk"], 2), pos[:, None, :], layout)
    v = heads(x @ w["wv"], 2)
    with torch.no_grad():
        o = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)),
            is_causal=True,
            enable_gqa=True,
        ).numpy()
    want = o.swapaxes(1, 2).reshape(2, L, D) @ w["wo"]
    got = mha(backend.asarray(x), causal=True, positions=backend.asarray(pos))
    assert_close(got, want, rtol=1e-12, xp=backend.xp, dtype=backend.xp.float64)
    # default positions are 0..L-1
    want0 = to_numpy(mha(backend.asarray(x), causal=True, positions=backend.asarray(np.arange(L))))
    assert_close(mha(backend.asarray(x), causal=True), want0, rtol=0, xp=backend.xp)


def test_position_errors_say_what_was_expected():
    x = np.ones((L, D))
    with pytest.raises(
        ValueError, match=rf"positions to have length {L}.*got positions shape \(4,\)"
    ):
        pa.apply_rope(x, np.arange(4))
    with pytest.raises(ValueError, match=r"broadcastable to \(9,\), got shape \(2, 9\)"):
        pa.apply_rope(x, np.zeros((2, L), dtype=np.int64))
    with pytest.raises(ValueError, match=r"even feature size d.*got d=7"):
        pa.apply_rope(np.ones((L, 7)))
    with pytest.raises(ValueError, match="layout to be 'half' or 'interleaved', got 'pairs'"):
        pa.apply_rope(x, layout="pairs")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match="positions to be an integer or real floating array, got bool"
    ):
        pa.apply_rope(x, np.ones(L, dtype=bool))
    with pytest.raises(TypeError, match="real floating dtype, got int64"):
        pa.apply_rope(np.ones((L, D), dtype=np.int64))
    with pytest.raises(ValueError, match=r"d_model to be a positive even int.*got 5"):
        pa.sinusoidal_encoding(3, 5)
    with pytest.raises(ValueError, match="non-negative length, got -1"):
        pa.sinusoidal_encoding(-1, 4)
    with pytest.raises(ValueError, match=r"base to be a finite real number > 1, got 1\.0"):
        pa.apply_rope(x, base=1.0)


def test_rope_does_not_mutate_inputs(backend: Backend, rng):
    xn = rng.standard_normal((L, D))
    x, pos = backend.asarray(xn), backend.asarray(np.arange(L) + 3)
    pa.apply_rope(x, pos, layout="interleaved")
    pa.apply_rope(x, pos, layout="half")
    np.testing.assert_array_equal(to_numpy(x), xn)


# --- positions' arguments -------------------------------------------------------------


def test_sinusoidal_encoding_foreign_dtype_is_refused():
    import torch

    with pytest.raises(
        TypeError, match=r"dtype of numpy, such as numpy.float32, got float32 \(from torch\)"
    ):
        pa.sinusoidal_encoding(4, 4, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"dtype of numpy.*got 'float64'"):
        pa.sinusoidal_encoding(np.arange(4), 4, dtype="float64")


@pytest.mark.parametrize("base", [True, 1, 0.5, float("inf"), "10000"])
def test_bad_base(base):
    with pytest.raises(ValueError, match=r"expected base to be a finite real number > 1, got"):
        pa.sinusoidal_encoding(3, 4, base=base)
