"""The blockwise path against the materialising one on the cases where tiling can go wrong."""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn._core._prepare import prepare
from portattn._core._problem import Problem
from portattn._paths import _blockwise
from portattn.testing import assert_close, to_numpy

from conftest import Backend, jitted, make_qkv, rtol_for
from reference import attention_ref

# Blocks that divide nothing below, so every tile edge is ragged somewhere.
BLOCKS = [(1, 1), (3, 4), (5, 2), (7, 16), (64, 64)]


CASES = {
    "plain": ({}, {}, 11, 13),
    "causal_square": ({"causal": True}, {"causal": True}, 12, 12),
    "top_left_short_q": ({"causal": "top_left"}, {"causal": "top_left"}, 5, 13),
    "bottom_right_short_q": ({"causal": "bottom_right"}, {"causal": "bottom_right"}, 5, 13),
    "top_left_long_q": ({"causal": "top_left"}, {"causal": "top_left"}, 13, 5),
    # Lq > Lk bottom-right: the first Lq - Lk rows see nothing and must be 0.
    "bottom_right_long_q": ({"causal": "bottom_right"}, {"causal": "bottom_right"}, 13, 5),
    "window": ({"window": (2, 3)}, {"window": (2, 3)}, 14, 14),
    "window_causal_br": (
        {"window": (3, 0), "causal": "bottom_right"},
        {"window": (3, 0), "causal": "bottom_right"},
        6,
        15,
    ),
    "window_zero": ({"window": 0}, {"window": 0}, 9, 9),
}


@pytest.mark.parametrize("block", BLOCKS, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_blockwise_matches_reference_and_materialize(backend: Backend, rng, name, block):
    xp = backend.xp
    kw, ref_kw, lq, lk = CASES[name]
    q, k, v = make_qkv(rng, lq, lk, d=5, dv=6, batch=(2, 3))
    args = [backend.asarray(a, xp.float64) for a in (q, k, v)]
    got, lse = pa.attention(*args, impl="blockwise", block_size=block, return_lse=True, **kw)
    mat, mat_lse = pa.attention(*args, impl="materialize", return_lse=True, **kw)
    want, _ = attention_ref(q, k, v, **ref_kw)
    rtol = rtol_for(backend, xp.float64)
    assert_close(got, want, rtol=rtol, xp=xp, dtype=xp.float64, device=backend.device)
    assert_close(got, mat, rtol=rtol, xp=xp, dtype=xp.float64)
    # lse: -inf in the same rows, equal elsewhere
    a, b = to_numpy(lse), to_numpy(mat_lse)
    np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b))
    np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=1e-12)


@pytest.mark.parametrize("block", [(2, 3), (4, 4)], ids=str)
def test_lengths_and_mask_and_bias_combine(backend: Backend, rng, block):
    xp = backend.xp
    q, k, v = make_qkv(rng, 9, 10, d=5, dv=6, batch=(2, 3))
    mask = rng.random((3, 9, 10)) < 0.6
    bias = rng.standard_normal((9, 10))
    kl, ql = np.array([[10], [3]]), np.array([[9], [0]])
    want, _ = attention_ref(
        q, k, v, mask=mask, bias=bias, key_lengths=kl, query_lengths=ql, causal="bottom_right"
    )
    got = pa.attention(
        *(backend.asarray(a, xp.float64) for a in (q, k, v)),
        mask=backend.asarray(mask),
        bias=backend.asarray(bias, xp.float64),
        key_lengths=backend.asarray(kl),
        query_lengths=backend.asarray(ql),
        causal="bottom_right",
        impl="blockwise",
        block_size=block,
    )
    assert_close(got, want, rtol=rtol_for(backend, xp.float64), xp=xp, dtype=xp.float64)


@pytest.mark.parametrize("block", [(1, 1), (3, 4), (4, 3)], ids=str)
@pytest.mark.parametrize("causal", [True, "bottom_right"])
def test_future_inf_stays_bit_exact(backend: Backend, rng, block, causal):
    """Key blocks in a query block's future are never read: inf there changes nothing, bitwise.

    Rows whose query block reaches the poisoned key in a partly hidden tile
    are excluded for inf (0 * inf is NaN in any matmul) but not for a huge
    finite value, which must leave every earlier row bit-for-bit unchanged.
    """
    xp = backend.xp
    lq, lk = (8, 8) if causal is True else (5, 8)
    offset = lk - lq
    q, k, v = make_qkv(rng, lq, lk, d=5, dv=6, batch=(2, 3))
    args = [backend.asarray(a, xp.float32) for a in (q, k, v)]
    before = to_numpy(pa.attention(*args, causal=causal, impl="blockwise", block_size=block))
    bq = block[0]
    # query blocks whose last row (q1 - 1) cannot see the last key
    untouched = max(
        (q0 for q0 in range(0, lq, bq) if min(q0 + bq, lq) + offset <= lk - 1), default=-1
    )
    untouched = min(untouched + bq, lq) if untouched >= 0 else 0
    for poison, rows in ((np.inf, untouched), (1e6, lq - 1)):
        k2, v2 = k.copy(), v.copy()
        k2[..., -1, :] = poison
        v2[..., -1, :] = -poison
        args2 = [backend.asarray(a, xp.float32) for a in (q, k2, v2)]
        # The last row does see the poisoned key, and may be NaN with a flag.
        with np.errstate(all="ignore"):
            after = pa.attention(*args2, causal=causal, impl="blockwise", block_size=block)
        np.testing.assert_array_equal(to_numpy(after)[..., :rows, :], before[..., :rows, :])


def test_fully_masked_rows_are_zero_with_lse_neg_inf(backend: Backend, rng):
    xp = backend.xp
    q, k, v = make_qkv(rng, 6, 7, d=5, dv=6, batch=(2, 3))
    mask = np.ones((6, 7), dtype=bool)
    mask[2] = False
    mask[4, :5] = False  # seen only in the last key block
    with np.errstate(all="raise"):
        out, lse = pa.attention(
            *(backend.asarray(a, xp.float32) for a in (q, k, v)),
            mask=backend.asarray(mask),
            impl="blockwise",
            block_size=(2, 5),
            return_lse=True,
        )
    o, ls = to_numpy(out), to_numpy(lse)
    assert not np.isnan(o).any()
    np.testing.assert_array_equal(o[..., 2, :], 0.0)
    assert np.isneginf(ls[..., 2]).all()
    assert np.isfinite(ls[..., 4]).all()
    want, _ = attention_ref(q, k, v, mask=mask)
    assert_close(out, want, rtol=rtol_for(backend, xp.float32), xp=xp, dtype=xp.float32)


def test_underflowing_weights_raise_no_flag(backend: Backend, rng):
    """Peaky rows (score spread beyond float32's exp range) take the clamped exp, silently."""
    xp = backend.xp
    q, k, v = make_qkv(rng, 8, 9, d=4, dv=6, batch=(2, 3))
    q, k = q * 12.0, k * 12.0  # spread of scores ~ 300: exp(s - max) would underflow
    with np.errstate(all="raise"):
        got = pa.attention(
            *(backend.asarray(a, xp.float32) for a in (q, k, v)), impl="blockwise", block_size=3
        )
    want, _ = attention_ref(q, k, v)
    assert_close(got, want, rtol=1e-4, xp=xp, dtype=xp.float32)


def test_unreadable_values_keep_the_clamp(backend: Backend, rng, monkeypatch):
    """Where the host cannot read values, nothing bounds the scores, so the clamped exp runs."""

    def unreadable(x):
        raise RuntimeError("no values to read")  # as torch says for "meta" tensors

    monkeypatch.setattr(_blockwise, "host_float", unreadable)
    xp = backend.xp
    q, k, v = make_qkv(rng, 8, 9, d=4, dv=6, batch=(2, 3))
    q, k = q * 12.0, k * 12.0  # spread of scores ~ 300: exp(s - max) would underflow
    arrays = [backend.asarray(a, xp.float32) for a in (q, k, v)]
    assert not _blockwise.exp_cannot_underflow(prepare(*arrays, xp=xp), xp=xp)
    with np.errstate(all="raise"):
        got = pa.attention(*arrays, impl="blockwise", block_size=3)
    want, _ = attention_ref(q, k, v)
    assert_close(got, want, rtol=1e-4, xp=xp, dtype=xp.float32)


def _count_tiles(monkeypatch) -> list[tuple[int, int, int, int]]:
    """Record every (q0, q1, k0, k1) tile whose mask the blockwise path asks for."""
    seen: list[tuple[int, int, int, int]] = []
    original = Problem.allowed

    def spy(self, q0, q1, k0, k1, *, xp):
        seen.append((q0, q1, k0, k1))
        return original(self, q0, q1, k0, k1, xp=xp)

    monkeypatch.setattr(Problem, "allowed", spy)
    return seen


@pytest.mark.parametrize(
    ("kw", "lq", "lk", "block", "expected"),
    [
        ({}, 8, 8, (4, 4), 4),  # 2 x 2 tiles
        ({"causal": True}, 8, 8, (4, 4), 3),  # the upper-right tile is skipped
        # rows 0-1 see keys 0..9 (3 key blocks), rows 2-3 see all 12 (3 blocks)
        ({"causal": "bottom_right"}, 4, 12, (2, 4), 6),
        # a band of width 3: each 4-row block reads keys [q0-1, q0+5), 2 key blocks
        ({"window": (1, 1)}, 16, 16, (4, 4), 8),
    ],
    ids=["full", "causal", "bottom_right", "window"],
)
def test_hidden_tiles_are_skipped(backend: Backend, rng, monkeypatch, kw, lq, lk, block, expected):
    xp = backend.xp
    q, k, v = make_qkv(rng, lq, lk, d=5, dv=6)
    tiles = _count_tiles(monkeypatch)
    pa.attention(
        *(backend.asarray(a, xp.float64) for a in (q, k, v)),
        impl="blockwise",
        block_size=block,
        **kw,
    )
    assert len(tiles) == expected == _expected_tiles(lq, lk, block, kw)
    assert len(tiles) == len(set(tiles))


def _expected_tiles(lq, lk, block, kw):
    """Tiles the reference mask has any allowed pair in (computed from the reference mask)."""
    from reference import allowed_pairs

    causal = kw.get("causal", False)
    ok = allowed_pairs(lq, lk, causal=causal, window=kw.get("window"))
    bq, bk = block
    count = 0
    for q0 in range(0, lq, bq):
        cols = np.flatnonzero(ok[q0 : q0 + bq].any(axis=0))
        if cols.size == 0:
            continue
        lo, hi = cols.min(), cols.max() + 1
        count += len(range(lo, hi, bk))
    return count


def test_skipped_tiles_are_never_read(backend: Backend, rng):
    """NaN poison in every key and value a causal query never sees leaves the output finite."""
    xp = backend.xp
    lq = lk = 12
    q, k, v = make_qkv(rng, lq, lk, d=5, dv=6, batch=(2,))
    clean = pa.attention(
        *(backend.asarray(a, xp.float64) for a in (q, k, v)),
        causal=True,
        impl="blockwise",
        block_size=(4, 4),
    )
    # Query block [0, 4) reads key block [0, 4) only; poison keys 4.. and
    # check rows 0..3, which must not change at all.
    k2, v2 = k.copy(), v.copy()
    k2[..., 4:, :] = np.nan
    v2[..., 4:, :] = np.nan
    got = pa.attention(
        *(backend.asarray(a, xp.float64) for a in (q, k2, v2)),
        causal=True,
        impl="blockwise",
        block_size=(4, 4),
    )
    np.testing.assert_array_equal(to_numpy(got)[..., :4, :], to_numpy(clean)[..., :4, :])


def test_batch_axes_from_mask_only(backend: Backend, rng):
    """A mask with a batch axis the inputs lack broadcasts the output, across query blocks."""
    xp = backend.xp
    q, k, v = make_qkv(rng, 7, 6, d=5, dv=6)
    mask = rng.random((4, 7, 6)) < 0.7
    want, _ = attention_ref(q, k, v, mask=mask)
    for block in [(3, 4), (16, 2)]:
        got = jitted(
            backend,
            lambda q, k, v, m, block=block: pa.attention(
                q, k, v, mask=m, impl="blockwise", block_size=block
            ),
        )(*(backend.asarray(a, xp.float64) for a in (q, k, v)), backend.asarray(mask))
        assert_close(got, want, rtol=rtol_for(backend, xp.float64), xp=xp, shape=(4, 7, 6))


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_default_block_sizes_path(backend: Backend, rng, dtype_name):
    """The tuned defaults (several query blocks, key blocks of hundreds) against the reference."""
    xp = backend.xp
    dtype = getattr(xp, dtype_name)
    q, k, v = make_qkv(rng, 300, 1100, d=8, batch=(1, 2))
    want, _ = attention_ref(q, k, v, causal="bottom_right")
    got = pa.attention(
        *(backend.asarray(a, dtype) for a in (q, k, v)), causal="bottom_right", impl="blockwise"
    )
    assert_close(got, want, rtol=rtol_for(backend, dtype), xp=xp, dtype=dtype)


def test_block_sizes_defaults_and_validation(backend: Backend):
    xp = backend.xp
    bq, bk = _blockwise.block_sizes(None, xp=xp, batch=(1, 8))
    assert bq & (bq - 1) == 0
    assert bk >= 256
    small_batch = _blockwise.block_sizes(None, xp=xp, batch=(1,))[0]
    large_batch = _blockwise.block_sizes(None, xp=xp, batch=(64, 32))[0]
    assert small_batch >= bq >= large_batch >= 16
    assert _blockwise.block_sizes(5, xp=xp) == (5, 5)
    assert _blockwise.block_sizes((2, 7), xp=xp) == (2, 7)
    for bad in (0, -1, (1, 0), (1, 2, 3), True, 1.5, (1, True)):
        with pytest.raises(ValueError, match="block_size"):
            _blockwise.block_sizes(bad, xp=xp)  # type: ignore[arg-type]


def test_auto_picks_blockwise_above_threshold(backend: Backend, rng, monkeypatch):
    from portattn import _attention
    from portattn._paths import _auto

    calls = []
    original = _attention.blockwise_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(_attention, "blockwise_attention", spy)
    xp = backend.xp

    monkeypatch.setattr(_auto, "MATERIALIZE_MAX_PAIRS", 6 * 6)
    # softcap keeps auto on the generic paths on torch too (SDPA has none)
    small = [backend.asarray(a, xp.float32) for a in make_qkv(rng, 6, 6, d=5, dv=6, batch=(2, 3))]
    pa.attention(*small, softcap=30.0)
    assert not calls
    big = [backend.asarray(a, xp.float32) for a in make_qkv(rng, 6, 7, d=5, dv=6, batch=(2, 3))]
    pa.attention(*big, softcap=30.0)
    assert calls


def test_default_tiles_grow_on_an_accelerator():
    """CPU-sized tiles leave a GPU launch-bound (20x slower on an H200): larger tiles there."""
    from types import SimpleNamespace

    from array_api_compat import array_namespace

    from portattn._paths._blockwise import block_sizes

    xp = array_namespace(np.empty(0))
    cpu = block_sizes(None, xp=xp, batch=(1, 8), device="cpu")
    gpu = block_sizes(None, xp=xp, batch=(1, 8), device=SimpleNamespace(type="cuda"))
    assert gpu[0] * gpu[1] >= 16 * cpu[0] * cpu[1]
    assert gpu == (1024, 4096)
    assert block_sizes((3, 5), xp=xp, device=SimpleNamespace(type="cuda")) == (3, 5)
