"""The ready-made mods of ``portattn.mods``: values against dense float64 formulas, torch's
own flex_attention, and transformers' own T5 buckets and ALiBi slopes."""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn import mods
from portattn._core._modspec import apply_mask_mod, apply_score_mod, tile_indices
from portattn.testing import to_numpy

from conftest import Backend, jitted

LQ, LK, H, B = 37, 41, 3, 2
I = np.arange(LQ)[:, None]  # noqa: E741
J = np.arange(LK)[None, :]
DOC = np.repeat(np.arange(6), [5, 9, 1, 13, 8, 5])  # 41 positions, ragged documents


def mask_cases(backend: Backend) -> list[tuple[str, object, np.ndarray]]:
    """(name, mask_mod on ``backend``, the (B, H, LQ, LK) pairs it allows, by formula)."""
    ids = backend.asarray(DOC)
    rows = np.stack([DOC, np.roll(DOC, 3)])
    per_row = np.array([4, 30])
    cases = [
        ("causal", mods.causal, I >= J),
        ("sliding_window(5)", mods.sliding_window(5), (I - J <= 5) & (I >= J)),
        ("sliding_window(2, 3)", mods.sliding_window(2, 3), (I - J <= 2) & (J - I <= 3)),
        ("chunked(8)", mods.chunked(8), I // 8 == J // 8),
        ("documents", mods.documents(ids), DOC[:LQ][:, None] == DOC[None, :]),
        (
            "documents (B, L)",
            mods.documents(backend.asarray(rows)),
            rows[:, None, :LQ, None] == rows[:, None, None, :],
        ),
        (
            "documents kv_ids",
            mods.documents(ids[:LQ], backend.asarray(DOC[::-1].copy())),
            DOC[:LQ][:, None] == DOC[::-1][None, :],
        ),
        ("prefix_lm(10)", mods.prefix_lm(10), (J < 10) | (I >= J)),
        (
            "prefix_lm per row",
            mods.prefix_lm(backend.asarray(per_row)),
            (per_row[:, None, None, None] > J) | (I >= J),
        ),
        (
            "and(causal, documents)",
            pa.and_masks(mods.causal, mods.documents(ids)),
            (I >= J) & (DOC[:LQ][:, None] == DOC[None, :]),
        ),
    ]
    return [(n, m, np.broadcast_to(w, (B, H, LQ, LK))) for n, m, w in cases]


@pytest.mark.jax32  # JAX without x64: int32 ids and index arrays
def test_mask_mods_equal_their_formulas(backend: Backend):
    idx = tile_indices(
        range(B), range(H), range(LQ), range(LK), xp=backend.xp, device=backend.device
    )
    for name, mod, want in mask_cases(backend):
        got = apply_mask_mod(mod, idx, xp=backend.xp)
        got = np.broadcast_to(to_numpy(got), want.shape)
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.jax32  # JAX without x64: int32 ids and index arrays
def test_mask_mods_on_a_tile_see_absolute_positions(backend: Backend):
    """A tile in the middle of the grid: the mod must read positions, not tile offsets."""
    idx = tile_indices(
        range(1, 2), range(2, 3), range(20, 30), range(5, 40), xp=backend.xp, device=backend.device
    )
    for name, mod, want in mask_cases(backend):
        got = to_numpy(apply_mask_mod(mod, idx, xp=backend.xp))
        np.testing.assert_array_equal(
            np.broadcast_to(got, (1, 1, 10, 35)), want[1:2, 2:3, 20:30, 5:40], err_msg=name
        )


def hf_t5_buckets(
    relative: np.ndarray, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> np.ndarray:
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    got = t5.T5Attention._relative_position_bucket(
        torch.from_numpy(relative),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    return got.numpy()


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 40), (8, 9)])
def test_t5_buckets_equal_transformers(bidirectional, num_buckets, max_distance):
    relative = np.arange(-3000, 3001)
    want = hf_t5_buckets(
        relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    got = mods.t5_buckets(
        relative, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional
    )
    np.testing.assert_array_equal(got, want)


def test_alibi_slopes_equal_transformers_bloom():
    torch = pytest.importorskip("torch")
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    for heads in (1, 2, 3, 4, 6, 8, 12, 16, 20, 32):  # BLOOM rounds its powers in float32
        ones = torch.ones(1, 2)
        alibi = bloom.build_alibi_tensor(
            ones, heads, torch.float32
        )  # (heads, 1, 2): slope * position
        np.testing.assert_allclose(
            mods.alibi_slopes(heads), alibi[:, 0, 1].numpy(), rtol=1e-6, err_msg=str(heads)
        )


def score_cases(backend: Backend, rng: np.random.Generator) -> list[tuple[str, object, object]]:
    """(name, score_mod on ``backend``, the float64 formula of (score) -> modified score)."""
    slopes = rng.uniform(0.01, 0.5, H)
    table = rng.standard_normal((32, H))
    table_uni = rng.standard_normal((16, H))
    dist = np.abs(I - J)
    bucket = hf_t5_buckets(J - I, bidirectional=True, num_buckets=32, max_distance=128)
    bucket_uni = hf_t5_buckets(J - I, bidirectional=False, num_buckets=16, max_distance=20)
    return [
        ("alibi", mods.alibi(backend.asarray(slopes)), lambda s: s - slopes[:, None, None] * dist),
        ("softcap(3)", mods.softcap(3.0), lambda s: 3.0 * np.tanh(s / 3.0)),
        (
            "t5 encoder",
            mods.t5_relative_bias(backend.asarray(table)),
            lambda s: s + np.moveaxis(table[bucket], -1, 0),
        ),
        (
            "t5 decoder",
            mods.t5_relative_bias(backend.asarray(table_uni), bidirectional=False, max_distance=20),
            lambda s: s + np.moveaxis(table_uni[bucket_uni], -1, 0),
        ),
    ]


def test_score_mods_equal_their_formulas(backend: Backend, rng):
    xp = backend.xp
    score = rng.standard_normal((B, H, LQ, LK)) * 4
    idx = tile_indices(range(B), range(H), range(LQ), range(LK), xp=xp, device=backend.device)
    for name, mod, formula in score_cases(backend, rng):
        for dtype in (xp.float64, xp.float32):
            got = apply_score_mod(mod, backend.asarray(score, dtype), idx, xp=xp)
            assert got.dtype == dtype, name
            tol = 1e-12 if dtype == xp.float64 else 1e-5
            np.testing.assert_allclose(
                to_numpy(got), formula(score), rtol=tol, atol=tol, err_msg=name
            )


def test_alibi_keeps_float32_on_numpy():
    """The distance is cast before the product: NumPy would otherwise compute in float64."""
    mod = mods.alibi(mods.alibi_slopes(4))
    b, h, q, kv = tile_indices(range(1), range(4), range(8), range(8), xp=pa_numpy(), device=None)
    out = mod(np.zeros((1, 4, 8, 8), dtype=np.float32), b, h, q, kv)
    assert out.dtype == np.float32


@pytest.fixture
def fresh_dynamo():
    """torch's eager flex_attention compiles its mods with dynamo; after another test's
    mods, a recompile can fail inside dynamo while it words the recompilation reason
    (IndexError in recompilation_reason_for_no_tensor_aliasing_guard, torch 2.13)."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pa_numpy():
    from portattn._lib._compat import resolve_namespace

    return resolve_namespace(None)


def test_captured_tables_receive_gradients():
    torch = pytest.importorskip("torch")
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    table = torch.zeros(32, 2, dtype=torch.float64, requires_grad=True)
    idx = tile_indices(range(1), range(2), range(4), range(4), xp=pa_torch(), device="cpu")
    s = torch.zeros(1, 2, 4, 4, dtype=torch.float64)
    out = mods.t5_relative_bias(table)(mods.alibi(slopes)(s, *idx), *idx)
    out.sum().backward()
    dist = np.abs(np.arange(4)[:, None] - np.arange(4)[None, :])
    np.testing.assert_allclose(slopes.grad.numpy(), [-dist.sum()] * 2)
    bucket = mods.t5_buckets(
        np.arange(4)[None, :] - np.arange(4)[:, None],
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
    )
    want = np.bincount(bucket.ravel(), minlength=32)
    np.testing.assert_array_equal(table.grad.numpy(), np.stack([want, want], axis=1))


def pa_torch():
    import torch

    from portattn._lib._compat import resolve_namespace

    return resolve_namespace(torch)


def dense_attention(q, k, v, allowed, score_fn):
    """Float64 attention by formula: scores, the score formula, the mask, softmax."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(allowed, score_fn(s), -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_mods_serve_torch_flex_attention(rng, fresh_dynamo):
    """Every ready-made mod runs unchanged in torch's own flex_attention and gives the formula."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import flex_attention as fa

    from conftest import get_backend

    on_torch = get_backend("torch")
    q, k, v = (rng.standard_normal((B, H, n, 16)) for n in (LQ, LK, LK))
    tq, tk, tv = (torch.from_numpy(a).float() for a in (q, k, v))
    masks = mask_cases(on_torch)
    for (name, mod, allowed), (sname, smod, formula) in zip(
        masks, score_cases(on_torch, rng) * 3, strict=False
    ):
        block = fa.create_block_mask(mod, B, H, LQ, LK, device="cpu", BLOCK_SIZE=16)
        with torch.no_grad():
            got = fa.flex_attention(tq, tk, tv, score_mod=smod, block_mask=block)
        want = dense_attention(q, k, v, allowed, formula)
        np.testing.assert_allclose(
            got.numpy(), want, rtol=2e-5, atol=2e-5, err_msg=f"{name} + {sname}"
        )


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_mods_serve_flex_attention_cold_and_with_changing_floats(rng, fresh_dynamo, monkeypatch):
    """torch 2.15 refused two things inside flex_attention's traced mod: a namespace lookup
    that filled portattn's cache ("Unsafe side effect"), and a captured float that changed
    between calls (dynamo made it a SymFloat). Both happen on a cold cache and a new cap."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import flex_attention as fa

    from portattn._lib import _compat

    monkeypatch.setattr(_compat, "_NAMESPACE_BY_TYPES", {})
    q, k, v = (rng.standard_normal((1, 2, 24, 8)) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(a).float() for a in (q, k, v))
    block = fa.create_block_mask(mods.causal, 1, None, 24, 24, device="cpu", BLOCK_SIZE=8)
    causal = np.arange(24)[:, None] >= np.arange(24)[None, :]
    for cap in (2.0, 3.5, 0.75):
        with torch.no_grad():
            got = fa.flex_attention(tq, tk, tv, score_mod=mods.softcap(cap), block_mask=block)
        want = dense_attention(q, k, v, causal, lambda s, c=cap: c * np.tanh(s / c))
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-5, err_msg=f"cap={cap}")


def test_errors_name_what_was_expected_and_got():
    with pytest.raises(ValueError, match="expected left to be a non-negative int, got -1"):
        mods.sliding_window(-1)
    with pytest.raises(ValueError, match="expected chunk_size to be a positive int, got 0"):
        mods.chunked(0)
    with pytest.raises(TypeError, match="expected ids to be an integer array, got float64"):
        mods.documents(np.zeros(4))
    with pytest.raises(TypeError, match=r"expected ids to be an array, got \[0, 0, 1\]"):
        mods.documents([0, 0, 1])
    with pytest.raises(ValueError, match="expected kv_ids to be 2-D, got shape"):
        mods.documents(np.zeros((2, 4), dtype=int), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="as many batch rows as ids, got 3 and 2"):
        mods.documents(np.zeros((2, 4), dtype=int), np.zeros((3, 4), dtype=int))
    with pytest.raises(
        ValueError, match="expected prefix to be a non-negative int or an integer array, got True"
    ):
        mods.prefix_lm(True)
    with pytest.raises(ValueError, match="expected prefix to be 1-D"):
        mods.prefix_lm(np.zeros((2, 2), dtype=int))
    with pytest.raises(ValueError, match="expected cap to be a finite real number > 0"):
        mods.softcap(0.0)
    with pytest.raises(TypeError, match="expected slopes to be a real floating array, got int64"):
        mods.alibi(np.arange(3))
    with pytest.raises(ValueError, match="expected num_heads to be a positive int, got 0"):
        mods.alibi_slopes(0)
    with pytest.raises(ValueError, match="expected table to be 2-D"):
        mods.t5_relative_bias(np.zeros(32))
    with pytest.raises(ValueError, match="at least 4 buckets"):
        mods.t5_relative_bias(np.zeros((2, 1)))
    with pytest.raises(ValueError, match="expected bidirectional to be True or False"):
        mods.t5_relative_bias(np.zeros((32, 1)), bidirectional="yes")  # type: ignore[arg-type]


def test_block_masks_of_ready_made_mods_equal_brute_force():
    """create_block_mask over each mod equals the tiles read off the formula."""
    from conftest import get_backend

    for name, mod, allowed in mask_cases(get_backend("numpy")):
        bm = pa.create_block_mask(mod, B, H, LQ, LK, block_size=8)
        for i in range(bm.num_blocks[0]):
            for j in range(bm.num_blocks[1]):
                tile = allowed[:, :, i * 8 : (i + 1) * 8, j * 8 : (j + 1) * 8]
                for b in range(B):
                    for h in range(H):
                        t = tile[b, h]
                        want = (
                            pa.BlockMask.FULL
                            if t.all()
                            else pa.BlockMask.PARTIAL
                            if t.any()
                            else pa.BlockMask.EMPTY
                        )
                        assert bm.tile_kind(i, j, b=b, h=h) == want, name


def dense_attention_or_zero(q, k, v, allowed, score_fn):
    """:func:`dense_attention`, with 0 for a row that sees no key (as portattn and flex give)."""
    seen = allowed.any(axis=-1, keepdims=True)
    safe = np.where(seen, allowed, True)
    return np.where(seen, dense_attention(q, k, v, safe, score_fn), 0.0)


@pytest.mark.parametrize("impl", ["materialize", "blockwise", "auto"])
def test_ready_made_mods_through_attention_equal_the_formula(backend: Backend, rng, impl):
    """Every mask mod with a score mod, through pa.attention, against float64 formulas."""
    xp = backend.xp
    q, k, v = (rng.standard_normal((B, H, n, 8)) for n in (LQ, LK, LK))
    args = [backend.asarray(a, xp.float64) for a in (q, k, v)]
    scores = score_cases(backend, rng) * 3
    for (name, mod, allowed), (sname, smod, formula) in zip(
        mask_cases(backend), scores, strict=False
    ):
        mask = pa.create_block_mask(mod, B, H, LQ, LK, block_size=16, xp=xp, device=backend.device)
        got = jitted(
            backend,
            lambda q, k, v, smod=smod, mask=mask: pa.attention(
                q, k, v, score_mod=smod, block_mask=mask, impl=impl, block_size=16
            ),
        )(*args)
        want = dense_attention_or_zero(q, k, v, allowed, formula)
        np.testing.assert_allclose(
            to_numpy(got), want, rtol=1e-10, atol=1e-12, err_msg=f"{name} + {sname}"
        )


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
def test_ready_made_mods_through_attention_equal_flex_attention(rng, impl, fresh_dynamo):
    """The same mods through pa.attention and through torch's flex_attention (eager, no grad)."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import flex_attention as fa

    from conftest import get_backend

    on_torch = get_backend("torch")
    tq, tk, tv = (torch.randn(B, H, n, 16) for n in (LQ, LK, LK))
    scores = score_cases(on_torch, rng) * 3
    for (name, mod, _), (sname, smod, _) in zip(mask_cases(on_torch), scores, strict=False):
        theirs_mask = fa.create_block_mask(mod, B, H, LQ, LK, device="cpu", BLOCK_SIZE=16)
        ours_mask = pa.create_block_mask(mod, B, H, LQ, LK, block_size=16, xp=torch)
        with torch.no_grad():
            want = fa.flex_attention(tq, tk, tv, score_mod=smod, block_mask=theirs_mask)
        got = pa.attention(tq, tk, tv, score_mod=smod, block_mask=ours_mask, impl=impl)
        np.testing.assert_allclose(
            got.numpy(), want.numpy(), rtol=2e-5, atol=2e-5, err_msg=f"{name} + {sname}"
        )


@pytest.mark.jax32
def test_captured_arrays_are_checked_against_the_call_on_every_library(backend: Backend, rng):
    """Too few (or, per head, too many) entries are refused before any tile is indexed.

    JAX clamps an index past the end (a wrong answer, no error); NumPy and
    torch raise a bare IndexError: every library gets the same named error.
    """
    xp = backend.xp
    q = backend.asarray(rng.standard_normal((B, H, LQ, 4)), xp.float32)
    k = backend.asarray(rng.standard_normal((B, H, LK, 4)), xp.float32)
    score_cases = [
        (mods.alibi(backend.asarray(np.ones(H - 1), xp.float32)), "slopes.*H=3, got 2"),
        (mods.alibi(backend.asarray(np.ones(H + 1), xp.float32)), "slopes.*H=3, got 4"),
        (mods.t5_relative_bias(backend.asarray(np.ones((32, H - 1)), xp.float32)), "H=3, got 2"),
        (mods.t5_relative_bias(backend.asarray(np.ones((32, H + 2)), xp.float32)), "H=3, got 5"),
    ]
    for mod, match in score_cases:
        for impl in ("auto", "materialize", "blockwise"):
            with pytest.raises(ValueError, match=match):
                pa.attention(q, k, k, score_mod=mod, impl=impl)
        with pytest.raises(ValueError, match=match):
            pa.attention_weights(q, k, score_mod=mod)
    short = backend.asarray(DOC[: LQ - 1])
    mask_cases = [
        (mods.documents(short), "ids captured by mods.documents.*Lq=37, got 36"),
        (mods.documents(backend.asarray(DOC), short), "kv_ids.*Lk=41, got 36"),
        (pa.and_masks(mods.causal, mods.documents(short)), "Lq=37, got 36"),
        (pa.or_masks(mods.documents(backend.asarray(np.stack([DOC]))), mods.causal), "B=2, got 1"),
        (mods.prefix_lm(backend.asarray(np.array([3]))), "prefix.*B=2, got 1"),
    ]
    for mod, match in mask_cases:
        with pytest.raises(ValueError, match=match):
            pa.create_block_mask(mod, B, None, LQ, LK, xp=xp, device=backend.device)


def test_t5_max_distance_must_pass_the_exact_buckets():
    # 32 bidirectional buckets: 8 exact ones per side; log(8 / 8) = 0 would divide by zero.
    with pytest.raises(ValueError, match="max_distance=8"):
        mods.t5_relative_bias(np.zeros((32, 1)), max_distance=8)
    with pytest.raises(ValueError, match="max_distance=16"):
        mods.t5_relative_bias(np.zeros((32, 1)), bidirectional=False, max_distance=16)
    mod = mods.t5_relative_bias(np.arange(32.0)[:, None], max_distance=9)
    kv = np.arange(-40, 41).reshape(1, 1, 1, -1)
    zero = np.zeros((1, 1, 1, 1), dtype=np.int64)
    got = mod(np.zeros((1, 1, 1, 81)), zero, zero, zero, kv).ravel()
    assert got.min() >= 0 and got.max() <= 31  # every bucket a row of the table


def test_a_custom_mod_indexing_past_its_array_is_named(rng):
    ids = np.zeros(10, dtype=np.int64)

    def my_docs(b, h, q, kv):
        return ids[q] == ids[kv]

    with pytest.raises(ValueError, match=r"mask_mod my_docs captures to cover.*16 queries"):
        pa.create_block_mask(my_docs, None, None, 16, 16, block_size=16)
    q = rng.standard_normal((1, 2, 16, 4))
    slopes = np.ones(1)
    with pytest.raises(ValueError, match=r"score_mod <lambda> captures to cover.*2 heads"):
        pa.attention(q, q, q, score_mod=lambda s, b, h, qi, kv: s - slopes[h])
