"""The mod protocol (index arrays, and_masks/or_masks) and create_block_mask's tile record."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import portattn as pa
from portattn._core import _block_mask
from portattn._core._modspec import apply_mask_mod, apply_score_mod, tile_indices
from portattn.testing import to_numpy

from conftest import Backend

EMPTY, PARTIAL, FULL = pa.BlockMask.EMPTY, pa.BlockMask.PARTIAL, pa.BlockMask.FULL


def dense_kinds(
    allowed: np.ndarray, bq: int, bk: int
) -> np.ndarray:  # allowed: (B, H, Lq, Lk) bool
    """Tile kinds by brute force, one tile at a time."""
    nb, nh, lq, lk = allowed.shape
    out = np.zeros((nb, nh, -(-lq // bq), -(-lk // bk)), dtype=np.int8)
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            tile = allowed[:, :, i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
            out[:, :, i, j] = np.where(
                tile.all(axis=(2, 3)), FULL, np.where(tile.any(axis=(2, 3)), PARTIAL, EMPTY)
            )
    return out


def grid(nb: int, nh: int, lq: int, lk: int) -> tuple[np.ndarray, ...]:
    return (
        np.arange(nb).reshape(nb, 1, 1, 1),
        np.arange(nh).reshape(1, nh, 1, 1),
        np.arange(lq).reshape(1, 1, lq, 1),
        np.arange(lk).reshape(1, 1, 1, lk),
    )


def mods_on(backend: Backend) -> dict[str, object]:
    """Mask mods written with operators and indexing only, capturing arrays of ``backend``."""
    doc = backend.asarray(np.repeat(np.arange(5), [7, 30, 1, 50, 12]))  # ragged documents
    prefix = backend.asarray(np.array([16, 40]))
    return {
        "causal": lambda b, h, q, kv: q >= kv,
        "documents": lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv),
        "window": lambda b, h, q, kv: (q - kv <= 9) & (kv - q <= 3),
        "per_head": lambda b, h, q, kv: q - kv >= 20 * h - 20,
        "prefix_per_batch": lambda b, h, q, kv: (kv < prefix[b]) | (q >= kv),
        "nothing": lambda b, h, q, kv: q < 0,
    }


@pytest.mark.jax32  # JAX without x64: int32 index arrays
@pytest.mark.parametrize("block_size", [16, (8, 32), 100])
def test_kinds_equal_brute_force(backend: Backend, block_size):
    np_mods = mods_on_numpy()  # the oracle, evaluated densely
    for name, mod in mods_on(backend).items():
        nb, nh = (2, 3) if name in ("per_head", "prefix_per_batch") else (1, 1)
        bm = pa.create_block_mask(
            mod, nb, nh, 100, 100, block_size=block_size, xp=backend.xp, device=backend.device
        )
        allowed = np.broadcast_to(np_mods[name](*grid(nb, nh, 100, 100)), (nb, nh, 100, 100))
        bq, bk = (block_size, block_size) if isinstance(block_size, int) else block_size
        want = dense_kinds(allowed, bq, bk)
        np.testing.assert_array_equal(bm.kinds, want, err_msg=name)
        assert bm.block_size == (bq, bk)
        assert bm.shape == (nb, nh, 100, 100)
        assert bm.mask_mod is mod
        visited = np.repeat(np.repeat(want != EMPTY, bq, axis=2), bk, axis=3)[:, :, :100, :100]
        assert bm.density == pytest.approx(visited.mean(), rel=1e-12)
        np.testing.assert_array_equal(bm.to_dense(), want != EMPTY)


def mods_on_numpy() -> dict[str, object]:
    from portattn._lib._backends import load

    got = load("numpy")
    return mods_on(Backend("numpy", got.xp, got.device, got.half_dtypes, got.from_numpy))


def test_reduction_over_batch_and_heads():
    """EMPTY only if empty for every (b, h), FULL only if full for every one."""
    bm = pa.create_block_mask(
        lambda b, h, q, kv: q - kv >= 20 * h - 20, None, 3, 64, 64, block_size=16
    )
    per = bm.kinds[0]
    for i in range(4):
        want_keys = tuple(j for j in range(4) if (per[:, i, j] != EMPTY).any())
        assert bm.key_blocks(i) == want_keys
        for j in range(4):
            col = per[:, i, j]
            want = FULL if (col == FULL).all() else EMPTY if (col == EMPTY).all() else PARTIAL
            assert bm.tile_kind(i, j) == want
            for h in range(3):
                assert bm.tile_kind(i, j, b=0, h=h) == col[h]
                assert bm.tile_kind(i, j, b=5, h=h) == col[h]  # B=None broadcasts
        assert bm.key_blocks(i, b=0, h=2) == tuple(j for j in range(4) if per[2, i, j] != EMPTY)
    with pytest.raises(ValueError, match="both given or both None"):
        bm.tile_kind(0, 0, b=0)


def test_chunked_evaluation_equals_one_pass(monkeypatch):
    """A small budget forces many ragged chunks; the record must not change."""
    doc = np.repeat(np.arange(6), [100, 3, 77, 200, 1, 119])
    mod = pa.and_masks(lambda b, h, q, kv: doc[q] == doc[kv], lambda b, h, q, kv: q >= kv)
    whole = pa.create_block_mask(mod, None, None, 500, 500, block_size=(32, 48))
    monkeypatch.setattr(_block_mask, "_BUDGET", 1)
    chunked = pa.create_block_mask(mod, None, None, 500, 500, block_size=(32, 48))
    np.testing.assert_array_equal(chunked.kinds, whole.kinds)
    allowed = (doc[:, None] == doc[None, :]) & np.tri(500, dtype=bool)
    np.testing.assert_array_equal(whole.kinds[0, 0], dense_kinds(allowed[None, None], 32, 48)[0, 0])


@pytest.mark.parametrize("block_size", [16, 64])
def test_kinds_equal_flex_attention_create_block_mask(block_size):
    torch = pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import create_block_mask as flex_block_mask

    doc = torch.repeat_interleave(torch.arange(4), torch.tensor([64, 64, 128, 256]))
    mods = [
        lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv),
        lambda b, h, q, kv: q - kv <= 40 * (h + 1),
        pa.or_masks(lambda b, h, q, kv: kv < 64, lambda b, h, q, kv: q >= kv),
    ]
    for mod in mods:
        theirs = flex_block_mask(mod, 2, 2, 512, 512, device="cpu", BLOCK_SIZE=block_size)
        ours = pa.create_block_mask(mod, 2, 2, 512, 512, block_size=block_size, xp=torch)
        partial = (ours.kinds == PARTIAL).sum(axis=-1)
        full = (ours.kinds == FULL).sum(axis=-1)
        np.testing.assert_array_equal(partial, theirs.kv_num_blocks.numpy())
        np.testing.assert_array_equal(full, theirs.full_kv_num_blocks.numpy())
        np.testing.assert_array_equal(ours.to_dense(), theirs.to_dense().numpy() > 0)


@pytest.mark.jax32  # JAX without x64: int32 index arrays
def test_and_or_masks(backend: Backend):
    xp = backend.xp
    b, h, q, kv = tile_indices(range(1), range(1), range(6), range(6), xp=xp, device=backend.device)
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    near = lambda b, h, q, kv: q - kv <= 2  # noqa: E731
    first = lambda b, h, q, kv: kv == 0  # noqa: E731
    qn, kn = np.arange(6)[:, None], np.arange(6)[None, :]
    got = to_numpy(pa.and_masks(causal, near)(b, h, q, kv))[0, 0]
    np.testing.assert_array_equal(got, (qn >= kn) & (qn - kn <= 2))
    got = to_numpy(pa.or_masks(pa.and_masks(causal, near), first)(b, h, q, kv))[0, 0]
    np.testing.assert_array_equal(got, ((qn >= kn) & (qn - kn <= 2)) | (kn == 0))
    assert bool(xp.all(pa.and_masks()(b, h, q, kv)))
    assert not bool(xp.any(pa.or_masks()(b, h, q, kv)))


def test_and_masks_serve_flex_attention():
    """Composed mods use operators alone, so torch's vmap'd create_block_mask takes them."""
    pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import create_block_mask as flex_block_mask

    mod = pa.and_masks(lambda b, h, q, kv: q >= kv, lambda b, h, q, kv: q - kv < 32)
    theirs = flex_block_mask(mod, None, None, 256, 256, device="cpu", BLOCK_SIZE=32)
    ours = pa.create_block_mask(mod, None, None, 256, 256, block_size=32)
    np.testing.assert_array_equal((ours.kinds == FULL).sum(-1), theirs.full_kv_num_blocks.numpy())


@pytest.mark.jax32  # JAX without x64: int32 index arrays
def test_tile_indices_are_absolute_positions_in_the_default_integer(backend: Backend):
    xp = backend.xp
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idx = tile_indices(
            range(2, 4), range(1, 4), range(5, 9), range(3), xp=xp, device=backend.device
        )
    shapes = [tuple(a.shape) for a in idx]
    assert shapes == [(2, 1, 1, 1), (1, 3, 1, 1), (1, 1, 4, 1), (1, 1, 1, 3)]
    want = xp.__array_namespace_info__().default_dtypes(device=backend.device)["integral"]
    for a, values in zip(idx, ([2, 3], [1, 2, 3], [5, 6, 7, 8], [0, 1, 2]), strict=True):
        assert a.dtype == want
        np.testing.assert_array_equal(to_numpy(a).ravel(), values)
    if backend.name.startswith("jax"):  # the fixture sets x64 on for "jax", off for "jax32"
        assert want == (xp.int32 if backend.name == "jax32" else xp.int64)


def test_apply_score_mod_casts_back_and_broadcasts(backend: Backend):
    xp = backend.xp
    idx = tile_indices(range(1), range(2), range(3), range(4), xp=xp, device=backend.device)
    score = xp.zeros((1, 2, 3, 4), dtype=xp.float32, device=backend.device)
    wide = lambda s, b, h, q, kv: s + xp.astype(q - kv, xp.float64)  # noqa: E731
    got = apply_score_mod(wide, score, idx, xp=xp)  # promoted to float64
    assert got.dtype == xp.float32
    np.testing.assert_array_equal(
        to_numpy(got)[0, 1], np.arange(3)[:, None] - np.arange(4)[None, :]
    )
    got = apply_score_mod(lambda s, b, h, q, kv: xp.astype(q + kv, xp.float32), score, idx, xp=xp)
    assert tuple(got.shape) == (1, 2, 3, 4)  # no h in the result: broadcast
    assert tuple(got.shape) == (1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"score's shape \(1, 2, 3, 4\), got shape \(1, 2, 3, 5\)"):
        apply_score_mod(
            lambda s, b, h, q, kv: xp.concat((s, s[..., :1]), axis=-1), score, idx, xp=xp
        )
    with pytest.raises(TypeError, match="to return a real array shaped like the score, got bool"):
        apply_score_mod(lambda s, b, h, q, kv: q >= kv, score, idx, xp=xp)


def test_errors_name_what_was_expected_and_got():
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    with pytest.raises(TypeError, match="expected mask_mod to be a callable"):
        pa.create_block_mask("causal", None, None, 8, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected B to be a positive int, got 0"):
        pa.create_block_mask(causal, 0, None, 8, 8)
    with pytest.raises(ValueError, match=r"expected H to be a positive int, got 2\.0"):
        pa.create_block_mask(causal, None, 2.0, 8, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected q_len to be a non-negative int, got -1"):
        pa.create_block_mask(causal, None, None, -1, 8)
    with pytest.raises(ValueError, match="expected block_size to be a positive int or a pair"):
        pa.create_block_mask(causal, None, None, 8, 8, block_size=[4, 4])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"expected block_size\[1\] to be a positive int, got 0"):
        pa.create_block_mask(causal, None, None, 8, 8, block_size=(4, 0))
    with pytest.raises(TypeError, match=r"mask_mod <lambda> to return a boolean array .*got int64"):
        pa.create_block_mask(lambda b, h, q, kv: q - kv, None, None, 8, 8)
    with pytest.raises(
        ValueError,
        match=r"broadcastable to the tile shape \(1, 1, 1, 1\), got shape \(2, 1, 1, 1, 1\)",
    ):
        pa.create_block_mask(
            lambda b, h, q, kv: (q >= kv)[None] | np.zeros((2, 1, 1, 1, 1), bool), None, None, 8, 8
        )
    with pytest.raises(
        TypeError, match=r"every argument of and_masks to be a mask_mod.*int at position 1"
    ):
        pa.and_masks(causal, 3)  # type: ignore[arg-type]
    dask = pytest.importorskip("dask.array")
    with pytest.raises(ValueError, match="got dask; pass xp=None"):
        pa.create_block_mask(causal, None, None, 8, 8, xp=dask)


def test_empty_extents_and_immutability():
    bm = pa.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 0, 5, block_size=4)
    assert bm.kinds.shape == (1, 1, 0, 2)
    assert bm.density == 0.0
    bm = pa.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 8, 8, block_size=4)
    with pytest.raises(ValueError, match="read-only"):
        bm.kinds[0, 0, 0, 0] = EMPTY
    assert "density=0.750" in repr(bm) and "1 full, 2 partial, 1 empty" in repr(bm)


def test_mask_mod_result_may_be_lower_rank(backend: Backend):
    xp = backend.xp
    idx = tile_indices(range(2), range(2), range(3), range(3), xp=xp, device=backend.device)
    got = apply_mask_mod(lambda b, h, q, kv: xp.reshape(q >= kv, (3, 3)), idx, xp=xp)
    assert tuple(got.shape) == (1, 1, 3, 3)
