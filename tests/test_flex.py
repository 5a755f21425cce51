"""Programmable attention: ``score_mod``, ``block_mask`` and ``sinks`` on every impl and library.

Oracles: a float64 formula (``reference.flex_ref``) and torch's own
``flex_attention`` (eager, forward) on the same mods.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import portattn as pa
from portattn.testing import load_backend, to_numpy

from conftest import Backend, assert_close_on, impls_for, jitted
from reference import flex_ref

B, H, L, D = 2, 4, 70, 8
BLOCK = (16, 16)
DOC = 23  # packed documents of 23 tokens: block edges fall inside documents


# --- mods, written once as plain array code ------------------------------------------


def alibi(slopes: Any, xp: Any = np) -> Any:
    # The distance is cast to the scores' dtype: array_api_strict refuses
    # float32 * int64 (NumPy would promote; test_promoting_mod checks that).
    return lambda s, b, h, q, kv: s - slopes[h] * xp.astype(abs(q - kv), s.dtype)


def documents(doc: Any) -> Any:
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)


def prefix_lm(prefix: int) -> Any:
    return lambda b, h, q, kv: (kv < prefix) | (q >= kv)


def per_batch(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return (kv <= q + 5 * b) & (h != 3)  # batch entry 1 sees further; head 3 sees nothing


def _inputs(
    backend: Backend, rng: np.random.Generator, *, hkv: int = H, dtype: Any = None
) -> tuple[Any, ...]:
    arrs = (
        rng.standard_normal((B, H, L, D)),
        rng.standard_normal((B, hkv, L, D)),
        rng.standard_normal((B, hkv, L, D)),
    )
    dt = backend.xp.float32 if dtype is None else dtype
    return tuple(backend.asarray(a, dt) for a in arrs), arrs


CASES: dict[str, dict[str, Any]] = {
    "alibi": {"score": "alibi"},
    "documents": {"mask": "documents"},
    "alibi-documents-sinks": {"score": "alibi", "mask": "documents", "sinks": True},
    "prefix-causal": {"mask": "prefix", "causal": True},
    "per-batch-head": {"mask": "per_batch", "bh": True, "sinks": True},
    "window-softcap-bias": {
        "score": "alibi",
        "mask": "documents",
        "window": 9,
        "softcap": 2.0,
        "bias": True,
    },
    "gqa": {"score": "alibi", "mask": "documents", "hkv": 2, "sinks": True},
    "scale-lengths": {"mask": "prefix", "scale": 0.3, "key_lengths": True},
}


def _case(
    backend: Backend, rng: np.random.Generator, case: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], tuple[Any, ...]]:
    """(portattn kwargs, reference kwargs, numpy inputs) for one case."""
    slopes = np.linspace(0.05, 0.4, H)
    doc = np.arange(L) // DOC
    xp = backend.xp
    mods = {
        "alibi": (alibi(backend.asarray(slopes, xp.float32), xp), alibi(slopes)),
        "documents": (documents(backend.asarray(doc)), documents(doc)),
        "prefix": (prefix_lm(20), prefix_lm(20)),
        "per_batch": (per_batch, per_batch),
    }
    (q, k, v), arrs = _inputs(backend, rng, hkv=case.get("hkv", H))
    kw: dict[str, Any] = {}
    ref: dict[str, Any] = {}
    if "score" in case:
        kw["score_mod"], ref["score_mod"] = mods[case["score"]]
    if "mask" in case:
        mine, theirs = mods[case["mask"]]
        nb, nh = (B, H) if case.get("bh") else (None, None)
        kw["block_mask"] = pa.create_block_mask(
            mine, nb, nh, L, L, block_size=BLOCK, xp=xp, device=backend.device
        )
        ref["mask_mod"] = theirs
    if case.get("sinks"):
        s = rng.standard_normal(H)
        kw["sinks"], ref["sinks"] = backend.asarray(s, xp.float32), s
    allowed = np.ones((B, H, L, L), dtype=bool)
    if case.get("causal"):
        kw["causal"] = True
        allowed &= np.tril(np.ones((L, L), dtype=bool))
    if "window" in case:
        w = case["window"]
        kw["window"] = w
        i, j = np.arange(L)[:, None], np.arange(L)[None, :]
        allowed &= abs(i - j) <= w
    if "softcap" in case:
        kw["softcap"] = ref["softcap"] = case["softcap"]
    if case.get("bias"):
        bias = rng.standard_normal((L, L))
        kw["bias"], ref["bias"] = backend.asarray(bias, xp.float32), bias
    if "scale" in case:
        kw["scale"] = ref["scale"] = case["scale"]
    if case.get("key_lengths"):
        kw["key_lengths"] = backend.asarray(np.array([[L], [31]]))
        allowed &= np.arange(L) < np.array([L, 31])[:, None, None, None]
    ref["allowed"] = allowed
    return kw, ref, arrs, (q, k, v)


@pytest.mark.parametrize("impl", ["materialize", "blockwise", "auto"])
@pytest.mark.parametrize("name", list(CASES))
def test_mods_equal_the_formula(
    backend: Backend, rng: np.random.Generator, impl: str, name: str
) -> None:
    kw, ref, arrs, (q, k, v) = _case(backend, rng, CASES[name])
    out, lse = jitted(
        backend, lambda q, k, v: pa.attention(q, k, v, impl=impl, return_lse=True, **kw)
    )(q, k, v)
    want, weights, want_lse = flex_ref(*arrs, **ref)
    assert_close_on(backend, out, want, dtype=backend.xp.float32)
    assert_close_on(backend, lse, want_lse, dtype=backend.xp.float32)
    got_w = jitted(backend, lambda q, k: pa.attention_weights(q, k, **kw))(q, k)
    assert_close_on(backend, got_w, weights, dtype=backend.xp.float32)


@pytest.mark.parametrize("impl", ["materialize", "blockwise", "auto"])
def test_distant_and_minus_inf_scores_weigh_exactly_nothing(
    backend: Backend, rng: np.random.Generator, impl: str
) -> None:
    """Steep ALiBi sends most scores far below their row's max, and a mod's -inf hides keys.

    Neither raises a floating-point flag, the result is the formula's, and
    keys a score_mod scores -inf weigh exactly 0: a huge finite value there
    leaves the output bit-for-bit unchanged (the blockwise path never hands
    ``exp`` such inputs, see ``_softmax.floored_exp``).
    """
    xp = backend.xp
    slopes = np.array([0.5, 2.0, 8.0, 32.0])

    def steep(mod_xp: Any, s_arr: Any) -> Any:
        def mod(s: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
            far = s - s_arr[h] * mod_xp.astype(abs(q - kv), s.dtype)
            return mod_xp.where(kv % 5 == 3, -mod_xp.inf, far)  # every fifth key hidden

        return mod

    (q, k, v), arrs = _inputs(backend, rng)
    mine = steep(xp, backend.asarray(slopes, xp.float32))
    want, _, want_lse = flex_ref(*arrs, score_mod=steep(np, slopes))
    with np.errstate(all="raise"):
        out, lse = pa.attention(q, k, v, impl=impl, return_lse=True, score_mod=mine)
    assert_close_on(backend, out, want, dtype=xp.float32)
    assert_close_on(backend, lse, want_lse, dtype=xp.float32)
    poisoned = arrs[2].copy()
    poisoned[..., 3::5, :] = 1e30  # only on keys the mod scores -inf
    with np.errstate(all="raise"):
        again = pa.attention(q, k, backend.asarray(poisoned, xp.float32), impl=impl, score_mod=mine)
    np.testing.assert_array_equal(to_numpy(again), to_numpy(out))


# --- torch's own flex_attention as the oracle --------------------------------------------


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_equals_torch_flex_attention(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")  # in the test dependency group: present
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n, hkv = 96, 2
    q = torch.tensor(rng.standard_normal((B, H, n, D)), dtype=torch.float32)
    k, v = (torch.tensor(rng.standard_normal((B, hkv, n, D)), dtype=torch.float32) for _ in "kv")
    slopes = torch.linspace(0.05, 0.4, H)
    doc = torch.arange(n) // 29
    score_mod = alibi(slopes, _torch_xp())
    mask_mod = documents(doc)
    theirs = flex_attention(
        q,
        k,
        v,
        score_mod=score_mod,
        block_mask=create_block_mask(mask_mod, None, None, n, n, device="cpu"),
        enable_gqa=True,
    )
    mine_bm = pa.create_block_mask(mask_mod, None, None, n, n, block_size=32, xp=torch)
    for impl in ("materialize", "blockwise"):
        mine = pa.attention(q, k, v, score_mod=score_mod, block_mask=mine_bm, impl=impl)
        assert float((mine - theirs).abs().max()) < 2e-6


def _torch_xp() -> Any:
    import array_api_compat.torch as txp

    return txp


# --- block sparsity is real --------------------------------------------------------------


def _counted(doc: Any) -> tuple[Any, Any, dict[str, int]]:
    """An identity score_mod and the packed-documents mask_mod, each counting the pairs it sees."""
    seen = {"score": 0, "mask": 0}
    causal_documents = documents(doc)

    def score_mod(s: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        seen["score"] += q.shape[2] * kv.shape[3]
        return s

    def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        seen["mask"] += q.shape[2] * kv.shape[3]
        return causal_documents(b, h, q, kv)

    return score_mod, mask_mod, seen


def test_work_follows_the_block_mask(rng: np.random.Generator) -> None:
    """8 packed documents: the mods see about 1/8 of the pairs, the mask_mod only partial tiles."""
    n, docs, block = 512, 8, (32, 32)
    doc = np.arange(n) // (n // docs)
    score_mod, mask_mod, seen = _counted(doc)
    bm = pa.create_block_mask(mask_mod, None, None, n, n, block_size=block)
    q, k, v = (rng.standard_normal((1, 2, n, 16)) for _ in "qkv")
    seen.update(score=0, mask=0)
    out = pa.attention(q, k, v, score_mod=score_mod, block_mask=bm, impl="blockwise")
    tiles = np.bincount(np.asarray(bm.table).ravel(), minlength=3)  # empty, partial, full
    area = block[0] * block[1]
    assert seen["score"] == (tiles[1] + tiles[2]) * area  # every visited tile, nothing else
    assert seen["mask"] == tiles[1] * area  # partial tiles only
    assert seen["score"] <= n * n / docs + tiles[1] * area
    want, _, _ = flex_ref(q, k, v, mask_mod=lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv))
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_work_follows_each_batch_entrys_own_mask(
    backend: Backend, rng: np.random.Generator
) -> None:
    """Packed documents that differ per batch entry: each entry skips its own empty tiles.

    With the tile kinds merged over the batch, a tile empty for one entry
    but needed by the other would be visited for both. The call runs as
    one part per entry instead (BlockMask.parts): the mods see each
    entry's visited tiles and nothing else, and the result is the formula's.
    """
    xp = backend.xp
    n, block, nh = 128, (16, 16), 2
    bounds = np.stack(
        [np.arange(n) // 16, (np.arange(n) + 5) // 64]
    )  # 8 documents; 3, edges inside blocks
    doc = backend.asarray(bounds)
    seen = {"score": 0, "mask": 0}

    def score_mod(s: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        seen["score"] += b.shape[0] * h.shape[1] * q.shape[2] * kv.shape[3]
        return s

    def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        seen["mask"] += b.shape[0] * h.shape[1] * q.shape[2] * kv.shape[3]
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    bm = pa.create_block_mask(
        mask_mod, 2, None, n, n, block_size=block, xp=xp, device=backend.device
    )
    assert len(bm.parts) == 2
    arrs = [rng.standard_normal((2, nh, n, 8)) for _ in "qkv"]
    q, k, v = (backend.asarray(a, xp.float32) for a in arrs)
    seen.update(score=0, mask=0)
    out = pa.attention(q, k, v, score_mod=score_mod, block_mask=bm, impl="blockwise")
    area = block[0] * block[1] * nh
    per_entry = [np.bincount(bm.kinds[b, 0].ravel(), minlength=3) for b in range(2)]
    merged = np.bincount(np.asarray(bm.table).ravel(), minlength=3)
    assert sum(t[1] + t[2] for t in per_entry) < 2 * (merged[1] + merged[2])
    if not backend.name.startswith("jax"):  # JAX traces the score_mod once (closure_convert)
        assert seen["score"] == sum(t[1] + t[2] for t in per_entry) * area
        assert seen["mask"] == sum(t[1] for t in per_entry) * area
    want, _, _ = flex_ref(
        *arrs, mask_mod=lambda b, h, q, kv: (bounds[b, q] == bounds[b, kv]) & (q >= kv)
    )
    assert_close_on(backend, out, want, dtype=xp.float32)


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
def test_per_batch_parts_differentiate_like_one_call(rng: np.random.Generator) -> None:
    """torch and JAX gradients through the per-entry parts equal the materialised call's.

    The parts cut q, k, v, the sinks and the bias by batch entry and share
    the captured ALiBi slopes, whose gradient sums over the parts.
    """
    import jax
    import jax.numpy as jnp
    import torch

    n, nh = 64, 2
    bounds = np.stack([np.arange(n) // 8, (np.arange(n) + 3) // 32])  # row 1: edges inside blocks
    arrs = [rng.standard_normal((2, nh, n, 4)) for _ in "qkv"]
    slopes0, sinks0, bias0 = rng.random(nh), rng.standard_normal(nh), rng.standard_normal((n, n))

    def run(lib: Any, impl: str, q: Any, k: Any, v: Any, slopes: Any, sinks: Any, bias: Any) -> Any:
        bm = masks[lib]
        mod = alibi(slopes, _torch_xp() if lib == "torch" else jnp)
        out = pa.attention(q, k, v, score_mod=mod, block_mask=bm, sinks=sinks, bias=bias, impl=impl)
        return (out**2).sum()

    masks = {}  # built outside any trace, as create_block_mask requires
    for lib, xp in (("torch", torch), ("jax", jnp)):
        doc = xp.asarray(bounds)
        masks[lib] = pa.create_block_mask(
            lambda b, h, qi, kv, doc=doc: (doc[b, qi] == doc[b, kv]) & (qi >= kv),
            2,
            None,
            n,
            n,
            block_size=8,
            xp=xp,
        )
        assert len(masks[lib].parts) == 2
    tq = [torch.tensor(a, requires_grad=True) for a in (*arrs, slopes0, sinks0, bias0)]
    want = torch.autograd.grad(run("torch", "materialize", *tq), tq)
    got = torch.autograd.grad(run("torch", "blockwise", *tq), tq)
    again = torch.autograd.grad(run("torch", "blockwise", *tq), tq)
    for w, g, a in zip(want, got, again, strict=True):
        assert float((w - g).abs().max()) < 1e-10 * max(1.0, float(w.abs().max()))
        assert torch.equal(g, a)  # deterministic, parts included

    jax.config.update("jax_enable_x64", True)
    jq = [jnp.asarray(a) for a in (*arrs, slopes0, sinks0, bias0)]
    argnums = tuple(range(6))
    jwant = jax.grad(lambda *a: run("jax", "materialize", *a), argnums)(*jq)
    jgot = jax.jit(jax.grad(lambda *a: run("jax", "blockwise", *a), argnums))(*jq)
    for w, g, tw in zip(jwant, jgot, want, strict=True):
        assert float(jnp.abs(w - g).max()) < 1e-10 * max(1.0, float(jnp.abs(w).max()))
        assert float(np.abs(np.asarray(w) - tw.numpy()).max()) < 1e-10 * max(
            1.0, float(tw.abs().max())
        )


def test_empty_tiles_never_read_keys(backend: Backend, rng: np.random.Generator) -> None:
    """Keys in blocks the mask hides from every query hold NaN: the output never sees them."""
    xp = backend.xp
    n = 64
    hidden = (np.arange(n) >= 16) & (np.arange(n) < 32)  # key block 1 of 16
    (q, _, _), arrs = _inputs(backend, rng)
    kk, vv = np.array(arrs[1][..., :n, :]), np.array(arrs[2][..., :n, :])
    kk[..., hidden, :] = np.nan
    vv[..., hidden, :] = np.nan
    keep = backend.asarray(~hidden)
    bm = pa.create_block_mask(
        lambda b, h, q, kv: keep[kv] & (q >= q),
        None,
        None,
        L,
        n,
        block_size=BLOCK,
        xp=xp,
        device=backend.device,
    )
    out = pa.attention(
        q,
        backend.asarray(kk, xp.float32),
        backend.asarray(vv, xp.float32),
        block_mask=bm,
        impl="blockwise",
    )
    want, _, _ = flex_ref(
        arrs[0],
        np.nan_to_num(kk),
        np.nan_to_num(vv),
        mask_mod=lambda b, h, q, kv: ~hidden[kv] & (q >= q),
    )
    assert_close_on(backend, out, want, dtype=xp.float32)


# --- sinks ---------------------------------------------------------------------------------


def test_sinks_merge_exactly_and_empty_rows_output_zero(rng: np.random.Generator) -> None:
    q, k, v = (rng.standard_normal((B, H, 12, D)) for _ in "qkv")
    sinks = rng.standard_normal(H)
    whole, lse = pa.attention(q, k, v, sinks=sinks, return_lse=True)
    first = pa.attention(q, k[..., :5, :], v[..., :5, :], sinks=sinks, return_lse=True)
    rest = pa.attention(q, k[..., 5:, :], v[..., 5:, :], return_lse=True)
    merged, merged_lse = pa.merge_attention([first[0], rest[0]], [first[1], rest[1]])
    np.testing.assert_allclose(merged, whole, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(merged_lse, lse, rtol=1e-12)
    # A row that sees no key: output 0, lse = sink; weights then sum to 0.
    nothing = np.zeros((12, 12), dtype=bool)
    for impl in ("materialize", "blockwise"):
        out, lse0 = pa.attention(q, k, v, mask=nothing, sinks=sinks, impl=impl, return_lse=True)
        assert not out.any()
        np.testing.assert_array_equal(lse0, np.broadcast_to(sinks[:, None], (B, H, 12)))
    w = pa.attention_weights(q, k, sinks=sinks)
    np.testing.assert_allclose(w.sum(-1), 1 - np.exp(sinks[:, None] - lse), rtol=1e-12)


# --- gradients -----------------------------------------------------------------------------


def _torch_problem(rng: np.random.Generator, n: int = 37, hkv: int = H) -> tuple[Any, ...]:
    import torch

    def t(*shape: int) -> Any:
        return torch.tensor(rng.standard_normal(shape), dtype=torch.float64, requires_grad=True)

    q, k, v = t(B, H, n, D), t(B, hkv, n, D), t(B, hkv, n, D)
    slopes, sinks, bias = t(H), t(H), t(n, n)
    doc = torch.arange(n) // 11
    bm = pa.create_block_mask(documents(doc), None, None, n, n, block_size=8, xp=torch)
    return q, k, v, slopes, sinks, bias, bm


def _loss(inputs: tuple[Any, ...], bm: Any, impl: str, xp: Any) -> Any:
    q, k, v, slopes, sinks, bias = inputs
    out, lse = pa.attention(
        q,
        k,
        v,
        score_mod=alibi(slopes, xp),
        block_mask=bm,
        sinks=sinks,
        bias=bias,
        impl=impl,
        softcap=3.0,
        return_lse=True,
    )
    w = xp.cos(xp.astype(xp.arange(D), out.dtype))
    return xp.sum(out * w) + 0.3 * xp.sum(lse)


@pytest.mark.parametrize("hkv", [H, 2])
def test_torch_gradients_reach_every_input_deterministically(
    rng: np.random.Generator, hkv: int
) -> None:
    import torch

    *inputs, bm = _torch_problem(rng, hkv=hkv)
    txp = _torch_xp()
    want = torch.autograd.grad(_loss(tuple(inputs), bm, "materialize", txp), inputs)
    got = torch.autograd.grad(_loss(tuple(inputs), bm, "blockwise", txp), inputs)
    again = torch.autograd.grad(_loss(tuple(inputs), bm, "blockwise", txp), inputs)
    for name, w, g, a in zip(
        ("q", "k", "v", "slopes", "sinks", "bias"), want, got, again, strict=True
    ):
        assert float((w - g).abs().max()) < 1e-12 * max(1.0, float(w.abs().max())), name
        assert torch.equal(g, a), f"{name}: two backward calls differ"


def test_torch_gradcheck() -> None:
    import torch

    rng = np.random.default_rng(5)
    n = 9

    def t(*shape: int) -> Any:
        return torch.tensor(rng.standard_normal(shape), dtype=torch.float64, requires_grad=True)

    q, k, v, slopes, sinks = t(1, 2, n, 3), t(1, 2, n, 3), t(1, 2, n, 3), t(2), t(2)
    bm = pa.create_block_mask(prefix_lm(3), None, None, n, n, block_size=4, xp=torch)
    txp = _torch_xp()

    def f(q: Any, k: Any, v: Any, slopes: Any, sinks: Any) -> Any:
        return pa.attention(
            q, k, v, score_mod=alibi(slopes, txp), block_mask=bm, sinks=sinks, impl="blockwise"
        )

    assert torch.autograd.gradcheck(f, (q, k, v, slopes, sinks))


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
def test_torch_double_backward_through_mods() -> None:
    """A constant score_mod: second order equals materialize's. Captured tensors: refused."""
    import torch

    rng = np.random.default_rng(6)
    n = 9

    def t(*shape: int) -> Any:
        return torch.tensor(rng.standard_normal(shape), dtype=torch.float64, requires_grad=True)

    q, k, v = t(1, 2, n, 3), t(1, 2, n, 3), t(1, 2, n, 3)
    bm = pa.create_block_mask(prefix_lm(3), None, None, n, n, block_size=4, xp=torch)
    txp = _torch_xp()
    constant = alibi(torch.tensor([0.3, 0.7], dtype=torch.float64), txp)

    def f(q: Any, k: Any, v: Any) -> Any:
        return pa.attention(q, k, v, score_mod=constant, block_mask=bm, impl="blockwise")

    assert torch.autograd.gradgradcheck(f, (q, k, v))
    slopes = torch.tensor([0.3, 0.7], dtype=torch.float64, requires_grad=True)
    out = pa.attention(q, k, v, score_mod=alibi(slopes, txp), block_mask=bm, impl="blockwise")
    with pytest.raises(NotImplementedError, match=r"double backward .* captures tensors"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
    (g,) = torch.autograd.grad(out.sum(), q)  # a first-order gradient still works
    assert g.shape == q.shape


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`:UserWarning")
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.parametrize("backend_name", ["eager", "aot_eager"])
def test_torch_compile_fullgraph(rng: np.random.Generator, backend_name: str) -> None:
    import torch

    *inputs, bm = _torch_problem(rng, n=40)
    txp = _torch_xp()

    def f(*args: Any) -> Any:
        return _loss(args, bm, "blockwise", txp)

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(*inputs).graph_break_count == 0
    compiled = torch.compile(f, backend=backend_name, fullgraph=True)
    got = torch.autograd.grad(compiled(*inputs), inputs)
    want = torch.autograd.grad(f(*inputs), inputs)
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) < 1e-10


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`:UserWarning")
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
def test_torch_compile_fullgraph_runs_per_batch_parts(rng: np.random.Generator) -> None:
    """The parts are cut from static tables: dynamo traces them with no graph break."""
    import torch

    n = 48
    bounds = torch.from_numpy(np.stack([np.arange(n) // 8, (np.arange(n) + 3) // 24]))
    bm = pa.create_block_mask(
        lambda b, h, q, kv: (bounds[b, q] == bounds[b, kv]) & (q >= kv),
        2,
        None,
        n,
        n,
        block_size=8,
        xp=torch,
    )
    assert len(bm.parts) == 2
    slopes = torch.tensor(rng.random(2), requires_grad=True)
    q, k, v = (torch.tensor(rng.standard_normal((2, 2, n, 4)), requires_grad=True) for _ in "qkv")
    mod = alibi(slopes, _torch_xp())

    def f(*a: Any) -> Any:
        return (pa.attention(*a, score_mod=mod, block_mask=bm, impl="blockwise") ** 2).sum()

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(q, k, v).graph_break_count == 0
    got = torch.autograd.grad(
        torch.compile(f, backend="eager", fullgraph=True)(q, k, v), [q, slopes]
    )
    want = torch.autograd.grad(f(q, k, v), [q, slopes])
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) < 1e-10


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
def test_jax_gradients_jit_and_vmap(rng: np.random.Generator) -> None:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)  # float64, as portattn's backend loader sets it

    n = 20
    q, k, v = (jnp.asarray(rng.standard_normal((B, H, n, D))) for _ in "qkv")
    slopes, sinks = jnp.asarray(rng.random(H)), jnp.asarray(rng.standard_normal(H))
    bias = jnp.asarray(rng.standard_normal((n, n)))
    doc = jnp.arange(n) // 7
    bm = pa.create_block_mask(documents(doc), None, None, n, n, block_size=8, xp=jnp)

    def loss(impl: str) -> Any:
        return lambda *a: _loss(a, bm, impl, jnp)

    args = (q, k, v, slopes, sinks, bias)
    want = jax.grad(loss("materialize"), argnums=range(6))(*args)
    got = jax.grad(loss("blockwise"), argnums=range(6))(*args)
    jitted = jax.jit(jax.grad(loss("blockwise"), argnums=range(6)))(*args)
    for w, g, j in zip(want, got, jitted, strict=True):
        assert float(jnp.abs(w - g).max()) < 1e-12 * max(1.0, float(jnp.abs(w).max()))
        assert float(jnp.abs(w - j).max()) < 1e-12 * max(1.0, float(jnp.abs(w).max()))

    def one(qq: Any) -> Any:
        return pa.attention(qq, k, v, score_mod=alibi(slopes, jnp), block_mask=bm, impl="blockwise")

    batched = jax.vmap(one)(jnp.stack([q, 2 * q]))
    assert float(jnp.abs(batched[1] - one(2 * q)).max()) < 1e-12


def test_jax_block_mask_is_built_outside_the_trace_and_serves_inside() -> None:
    """create_block_mask reads values on the host: under jit it is refused, naming the remedy.

    Built outside, its mask_mod (capturing a concrete array) runs inside
    ``jax.jit`` and ``jax.grad``, through the blockwise ``custom_vjp``.
    """
    import jax
    import jax.numpy as jnp

    n = 24
    doc = jnp.arange(n) // 7

    @jax.jit
    def build(d: Any) -> Any:
        pa.create_block_mask(documents(d), None, None, n, n, block_size=8, xp=jnp)
        return d

    with pytest.raises(ValueError, match="build the block mask once, outside the traced"):
        build(doc)
    bm = pa.create_block_mask(documents(doc), None, None, n, n, block_size=8, xp=jnp)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 2, n, 4)), jnp.float32) for _ in "qkv")

    def loss(qq: Any, impl: str) -> Any:
        return jnp.sum(pa.attention(qq, k, v, block_mask=bm, impl=impl) ** 2)

    want = jax.grad(loss)(q, "materialize")
    got = jax.jit(jax.grad(loss), static_argnums=1)(q, "blockwise")
    assert float(jnp.abs(got - want).max()) < 1e-5 * float(jnp.abs(want).max())


# --- dask: the mods run inside each task, on the chunks' own arrays --------------------------


@pytest.mark.parametrize("impl", ["auto", "blockwise", "materialize"])
def test_dask_tasks_run_the_mods_with_absolute_positions(
    rng: np.random.Generator, impl: str
) -> None:
    da = pytest.importorskip("dask.array")
    from portattn._paths._dask import PAIR_PREFIX

    n, docs = 96, 4
    doc = np.arange(n) // (n // docs)
    q = rng.standard_normal((B, H, n, D))
    k, v = (rng.standard_normal((B, 2, n, D)) for _ in "kv")  # GQA: 2 key/value heads
    slopes, sinks = np.linspace(0.1, 0.5, H), rng.standard_normal(H)
    bm = pa.create_block_mask(documents(doc), None, None, n, n, block_size=12)  # NumPy
    chunks = (1, 2, 24, D)  # 4 query and key chunks, one per document; batch and heads split
    dq, dk, dv = (da.from_array(x, chunks=chunks) for x in (q, k, v))
    out, lse = pa.attention(
        dq,
        dk,
        dv,
        score_mod=alibi(slopes),
        block_mask=bm,
        sinks=da.from_array(sinks),
        impl=impl,
        return_lse=True,
    )
    pairs = [
        key
        for key in out.__dask_graph__()
        if isinstance(key, tuple) and key[0].startswith(PAIR_PREFIX)
    ]
    assert not pairs  # each query chunk sees one key chunk (its own document): no pair to merge
    want, _, want_lse = flex_ref(
        q, k, v, score_mod=alibi(slopes), mask_mod=documents(doc), sinks=sinks
    )
    np.testing.assert_allclose(out.compute(), want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse.compute(), want_lse, rtol=1e-12)
    # Smaller query chunks: several key chunks per query chunk, sinks added exactly once.
    out2 = pa.attention(
        da.from_array(q, chunks=(1, 2, 12, D)),
        da.from_array(k, chunks=(1, 2, 12, D)),
        da.from_array(v, chunks=(1, 2, 12, D)),
        score_mod=alibi(slopes),
        block_mask=bm,
        sinks=da.from_array(sinks),
        impl=impl,
    )
    graph = out2.__dask_graph__()
    tiles = [key for key in graph if isinstance(key, tuple) and key[0].startswith(PAIR_PREFIX)]
    # Per document and (batch, head) block: the second query chunk's two pairs
    # get merged; the first sees one key chunk (its pair task is the output),
    # and the pair (first query chunk, second key chunk) is EMPTY: no task.
    assert len(tiles) == B * (H // 2) * docs * 2
    np.testing.assert_allclose(out2.compute(), want, rtol=1e-12, atol=1e-13)


# --- dtypes, GQA, errors ----------------------------------------------------------------------


def test_a_promoting_mod_is_cast_back(rng: np.random.Generator) -> None:
    q, k, v = (rng.standard_normal((1, 2, 10, 4)).astype(np.float32) for _ in "qkv")
    slopes = np.array([0.1, 0.2], dtype=np.float32)

    def promoting(s: Any, b: Any, h: Any, q_: Any, kv: Any) -> Any:
        return s - slopes[h] * abs(q_ - kv)  # float32 * int64: float64

    for impl in ("materialize", "blockwise"):
        out = pa.attention(q, k, v, score_mod=promoting, impl=impl)
        assert out.dtype == np.float32
        want, _, _ = flex_ref(q, k, v, score_mod=promoting)
        np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)


def test_grouped_query_attention_equals_sdpa(rng: np.random.Generator) -> None:
    import torch

    q = torch.tensor(rng.standard_normal((2, 6, 9, 4)))
    k, v = (torch.tensor(rng.standard_normal((2, 2, 9, 4))) for _ in "kv")
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    for impl in ("materialize", "blockwise", "native", "auto"):
        got = pa.attention(q, k, v, causal=True, impl=impl)
        assert float((got - want).abs().max()) < 1e-12, impl


def test_bad_mods_are_named(rng: np.random.Generator) -> None:
    q3 = rng.standard_normal((2, 10, 4))
    q4 = rng.standard_normal((1, 2, 10, 4))
    bm = pa.create_block_mask(prefix_lm(3), None, None, 10, 10, block_size=4)
    with pytest.raises(ValueError, match=r"need 4-D \(B, H, L, d\) inputs"):
        pa.attention(q3, q3, q3, score_mod=lambda s, b, h, q, kv: s)
    with pytest.raises(TypeError, match="expected score_mod to be a function"):
        pa.attention(q4, q4, q4, score_mod=3.0)
    with pytest.raises(TypeError, match=r"expected block_mask to be a portattn\.BlockMask"):
        pa.attention(q4, q4, q4, block_mask=np.ones((10, 10), dtype=bool))
    with pytest.raises(ValueError, match="expected a block_mask built for"):
        pa.attention(q4[..., :9, :], q4, q4, block_mask=bm)
    with pytest.raises(ValueError, match="expected sinks to be broadcastable"):
        pa.attention(q4, q4, q4, sinks=np.zeros(3))
    with pytest.raises(TypeError, match="sinks"):
        pa.attention(q4, q4, q4, sinks=np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="score_mod"):
        pa.attention(q4, q4, q4, score_mod=lambda s, b, h, q, kv: s[..., :2, :])
    # BlockMask is immutable: the bad mod comes in through the constructor.
    bad = pa.BlockMask(
        bm.kinds, mask_mod=lambda b, h, q, kv: q - kv, shape=bm.shape, block_size=bm.block_size
    )  # not a boolean
    with pytest.raises(TypeError, match="boolean"):
        pa.attention(q4, q4, q4, block_mask=bad, impl="blockwise")


def test_a_mod_that_returns_numpy_for_torch_inputs_is_named(rng: np.random.Generator) -> None:
    """Ids captured as NumPy while attention runs on torch: refused at the mod, naming both."""
    import torch

    q = torch.from_numpy(rng.standard_normal((1, 2, 12, 4)))
    ids = np.repeat(np.arange(3), 4)  # NumPy, not torch
    bm = pa.create_block_mask(pa.mods.documents(ids), None, None, 12, 12, block_size=8)
    for impl in ("materialize", "blockwise"):
        with pytest.raises(TypeError, match=r"mask_mod .*torch.*got a numpy\.ndarray"):
            pa.attention(q, q, q, block_mask=bm, impl=impl)
    table = np.linspace(0.0, 1.0, 12)
    with pytest.raises(TypeError, match=r"score_mod .*torch.*got a numpy\.ndarray"):
        pa.attention(q, q, q, score_mod=lambda s, b, h, qi, ki: np.where(table[ki] > 0.5, 1.0, 0.0))
    torch_ids = torch.from_numpy(ids)
    with pytest.raises(TypeError, match=r"mask_mod .*numpy.*got a torch"):  # built by NumPy
        pa.create_block_mask(pa.mods.documents(torch_ids), None, None, 12, 12, block_size=8)
    # The same mask, captured and built in the inputs' library, runs.
    bm = pa.create_block_mask(
        pa.mods.documents(torch_ids), None, None, 12, 12, block_size=8, xp=torch
    )
    assert pa.attention(q, q, q, block_mask=bm, impl="blockwise").shape == (1, 2, 12, 4)


def test_native_refuses_what_sdpa_cannot_do(rng: np.random.Generator) -> None:
    import torch

    q = torch.tensor(rng.standard_normal((1, 2, 10, 4)))
    with pytest.raises(NotImplementedError, match="score_mod"):
        pa.attention(q, q, q, score_mod=lambda s, b, h, qq, kv: s, impl="native")
    with pytest.raises(NotImplementedError, match="sinks"):
        pa.attention(q, q, q, sinks=torch.zeros(2, dtype=torch.float64), impl="native")
    # A block mask alone is a mask: SDPA takes it exactly.
    bm = pa.create_block_mask(prefix_lm(3), None, None, 10, 10, block_size=4, xp=torch)
    got = pa.attention(q, q, q, block_mask=bm, impl="native")
    want = pa.attention(q, q, q, block_mask=bm, impl="materialize")
    assert float((got - want).abs().max()) < 1e-12


def test_backward_skips_empty_tiles_too(rng: np.random.Generator) -> None:
    import torch

    n, block = 256, (32, 32)
    doc = torch.arange(n) // (n // 8)
    score_mod, mask_mod, seen = _counted(doc)
    bm = pa.create_block_mask(mask_mod, None, None, n, n, block_size=block, xp=torch)
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, n, 8)), requires_grad=True) for _ in "qkv")
    seen.update(score=0, mask=0)
    out = pa.attention(q, k, v, score_mod=score_mod, block_mask=bm, impl="blockwise")
    out.sum().backward()
    tiles = np.bincount(np.asarray(bm.table).ravel(), minlength=3)
    area = block[0] * block[1]
    assert seen["score"] == 2 * (tiles[1] + tiles[2]) * area  # once forward, once backward
    assert seen["mask"] == 2 * tiles[1] * area


# --- empty tiles mean "empty" on every path (reliability round 4) -----------------------------


def _empty_block_masks(backend: Backend) -> dict[str, Any]:
    """Block masks whose every tile is EMPTY, for (Lq, Lk) = (20, 37) unless named otherwise."""
    xp, dev = backend.xp, backend.device
    return {
        # One small tile that sees nothing (decode against a future chunk, a tiny call).
        "one-tile": pa.create_block_mask(
            lambda b, h, q, kv: q < 0, None, None, 20, 37, block_size=64, xp=xp, device=dev
        ),
        # A key chunk entirely in the query chunk's future (ring attention, KV streaming).
        "future-chunk": pa.create_block_mask(
            lambda b, h, q, kv: kv + 100 <= q, None, None, 20, 37, block_size=8, xp=xp, device=dev
        ),
        # Per-head kinds, all EMPTY.
        "per-head": pa.create_block_mask(
            lambda b, h, q, kv: q + h < 0, None, H, 20, 37, block_size=(4, 16), xp=xp, device=dev
        ),
    }


@pytest.mark.parametrize("sinks", [False, True])
def test_an_empty_block_mask_hides_everything_on_every_path(
    backend: Backend, rng: np.random.Generator, sinks: bool
) -> None:
    """Output 0 and lse -inf (with sinks: lse = the sink) on every impl, and weights 0."""
    xp = backend.xp
    q, k, v = (
        backend.asarray(rng.standard_normal(s), xp.float32)
        for s in [(B, H, 20, D)] + [(B, H, 37, D)] * 2
    )
    sink = rng.standard_normal(H)
    kw: dict[str, Any] = {"sinks": backend.asarray(sink, xp.float32)} if sinks else {}
    want_lse = np.broadcast_to(sink[:, None] if sinks else -np.inf, (B, H, 20))
    impls = ("auto", *impls_for(backend))
    for name, bm in _empty_block_masks(backend).items():
        for impl in impls:
            if impl == "native" and sinks:
                continue  # refused: the kernel has no sink logit
            lse_too = impl != "native"
            got = pa.attention(q, k, v, block_mask=bm, impl=impl, return_lse=lse_too, **kw)
            out, lse = got if lse_too else (got, None)
            np.testing.assert_array_equal(to_numpy(out), 0.0, err_msg=f"{name} {impl}")
            if lse is not None:
                np.testing.assert_allclose(to_numpy(lse), want_lse, rtol=1e-6, err_msg=name)
            for causal in ("top_left", "bottom_right"):  # native's is_causal path too
                out = pa.attention(q, k, v, block_mask=bm, impl=impl, causal=causal, **kw)
                np.testing.assert_array_equal(to_numpy(out), 0.0, err_msg=f"{name} {impl} {causal}")
        w = pa.attention_weights(q, k, block_mask=bm, **kw)
        np.testing.assert_array_equal(to_numpy(w), 0.0, err_msg=name)


def test_every_path_reads_the_kinds_as_blockwise_does(
    backend: Backend, rng: np.random.Generator
) -> None:
    """A block mask whose kinds disagree with its mod: EMPTY hides, FULL allows, PARTIAL asks.

    Built with the public constructor: kinds from a documents mask, and a
    mod that allows everything. Every path, and the weights, must then
    follow the tiles (what the blockwise path visits), not the mod alone.
    """
    xp = backend.xp
    doc = np.arange(L) // DOC
    real = pa.create_block_mask(documents(doc), None, None, L, L, block_size=BLOCK)
    bm = pa.BlockMask(
        real.kinds, mask_mod=lambda b, h, q, kv: q >= 0, shape=real.shape, block_size=BLOCK
    )
    tiles = np.repeat(np.repeat(real.kinds[0, 0] != EMPTY_KIND, 16, 0), 16, 1)[:L, :L]
    (q, k, v), arrs = _inputs(backend, rng)
    want, weights, _ = flex_ref(*arrs, allowed=np.broadcast_to(tiles, (B, H, L, L)))
    for impl in ("auto", *impls_for(backend)):
        out = pa.attention(q, k, v, block_mask=bm, impl=impl)
        assert_close_on(backend, out, want, dtype=xp.float32)
        out = pa.attention(q, k, v, block_mask=bm, impl=impl, causal=True)
        want_c, _, _ = flex_ref(
            *arrs, allowed=np.broadcast_to(tiles & np.tri(L, dtype=bool), (B, H, L, L))
        )
        assert_close_on(backend, out, want_c, dtype=xp.float32)
    assert_close_on(backend, pa.attention_weights(q, k, block_mask=bm), weights, dtype=xp.float32)


EMPTY_KIND = pa.BlockMask.EMPTY


@pytest.mark.parametrize("causal", [True, "top_left", "bottom_right"])
def test_native_keeps_the_block_mask_under_top_left_causal(
    backend: Backend, rng: np.random.Generator, causal: Any
) -> None:
    """The kernel's own is_causal takes no other mask: the block mask must not be dropped."""
    xp = backend.xp
    doc = np.arange(L) // DOC
    ids = backend.asarray(doc)
    bm = pa.create_block_mask(
        lambda b, h, q, kv: ids[q] == ids[kv],
        None,
        None,
        L,
        L,
        block_size=BLOCK,
        xp=xp,
        device=backend.device,
    )
    (q, k, v), arrs = _inputs(backend, rng)
    if "native" not in impls_for(backend):  # no kernel: refused, naming the library
        with pytest.raises(NotImplementedError, match="impl='native' delegates"):
            pa.attention(q, k, v, block_mask=bm, causal=causal, impl="native")
        return
    allowed = (doc[:, None] == doc[None, :]) & np.tri(L, dtype=bool)
    want, _, _ = flex_ref(*arrs, allowed=np.broadcast_to(allowed, (B, H, L, L)))
    out = pa.attention(q, k, v, block_mask=bm, causal=causal, impl="native")
    assert_close_on(backend, out, want, dtype=xp.float32)


def test_empty_tiles_are_never_read_on_auto_nor_dask_auto(rng: np.random.Generator) -> None:
    """NaN and inf in keys and values of EMPTY tiles reach no row on the default path."""
    da = pytest.importorskip("dask.array")
    n = 48
    doc = np.arange(n) // 16  # three documents, one per block
    bm = pa.create_block_mask(documents(doc), None, None, n, n, block_size=16)
    q, k, v = (rng.standard_normal((1, 2, n, D)) for _ in "qkv")
    kk, vv = k.copy(), v.copy()
    kk[..., 16, 0], vv[..., 17, 1] = np.inf, np.nan  # document 1: hidden from documents 0 and 2
    want, _, _ = flex_ref(q, k, v, mask_mod=documents(doc))
    with np.errstate(invalid="ignore"):  # document 1's own rows are NaN, as they should be
        got = pa.attention(q, kk, vv, block_mask=bm)
    rows = np.isnan(got).any(axis=-1)
    assert not rows[..., :16].any() and not rows[..., 32:].any()
    np.testing.assert_allclose(got[..., 32:, :], want[..., 32:, :], rtol=1e-12)
    np.testing.assert_allclose(got[..., :16, :], want[..., :16, :], rtol=1e-12)
    chunks = (1, 2, 24, D)  # chunk pairs straddle documents: each task holds EMPTY tiles
    dq, dk, dv = (da.from_array(x, chunks=chunks) for x in (q, kk, vv))
    with np.errstate(invalid="ignore"):
        got = pa.attention(dq, dk, dv, block_mask=bm).compute()
    rows = np.isnan(got).any(axis=-1)
    assert not rows[..., :16].any() and not rows[..., 32:].any()
    np.testing.assert_allclose(got[..., 32:, :], want[..., 32:, :], rtol=1e-12)


@pytest.mark.slow  # a torch.compile and two jax.jit traces: about 20 s
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`:UserWarning")
def test_traced_tiles_line_up_with_the_block_mask(rng: np.random.Generator) -> None:
    """Under jax.jit and torch.compile the tiles stay the mask's: inf in one document stays there.

    Beyond 64 visited tiles a trace merges whole mask tiles (the program
    stays bounded); the result is still the formula's on finite inputs.
    """
    import torch

    from portattn._core._flex import flex_mods
    from portattn._paths._blockwise import traced_block_sizes

    n = 128
    doc = np.arange(n) // 32
    bm = pa.create_block_mask(documents(doc), None, None, n, n, block_size=16)
    q, k, v = (rng.standard_normal((1, 2, n, D)) for _ in "qkv")
    kk, vv = k.copy(), v.copy()
    kk[..., 3, 0], vv[..., 5, 1] = np.inf, np.nan  # document 0 only
    with np.errstate(invalid="ignore"):  # document 0's rows are NaN, as they should be
        eager = pa.attention(q, kk, vv, block_mask=bm, impl="blockwise")
    assert np.isnan(eager[..., :32, :]).any() and not np.isnan(eager[..., 32:, :]).any()
    tq, tk, tv = (torch.tensor(x) for x in (q, kk, vv))
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda a, b, c: pa.attention(a, b, c, block_mask=bm, impl="blockwise"),
        backend="eager",
        fullgraph=True,
    )(tq, tk, tv).numpy()
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(eager))
    np.testing.assert_allclose(compiled[..., 32:, :], eager[..., 32:, :], rtol=1e-12)
    jx = load_backend("jax")
    import jax

    def jitted(mask: Any, *arrays: np.ndarray) -> np.ndarray:
        f = jax.jit(lambda a, b, c: pa.attention(a, b, c, block_mask=mask, impl="blockwise"))
        return np.asarray(f(*(jx.from_numpy(x) for x in arrays)))

    on_jax = documents(jx.from_numpy(doc))
    got = jitted(pa.create_block_mask(on_jax, None, None, n, n, block_size=16, xp=jx.xp), q, kk, vv)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(eager))
    np.testing.assert_allclose(got[..., 32:, :], eager[..., 32:, :], rtol=1e-12)
    # Many visited tiles: blocks grow by whole mask blocks, and finite inputs still agree.
    ids = np.arange(512) // 128
    big = pa.create_block_mask(
        documents(jx.from_numpy(ids)), None, None, 512, 512, block_size=16, xp=jx.xp
    )
    mods = flex_mods(None, big, batch=(1, 2), lq=512, lk=512)
    assert traced_block_sizes(
        16, 16, 128, 128, mods=flex_mods(None, bm, batch=(1, 2), lq=n, lk=n)
    ) == (16, 16)
    assert traced_block_sizes(16, 16, 512, 512, mods=mods) == (64, 64)
    assert traced_block_sizes(16, 16, 500, 500, mods=mods) == (64, 64)  # whole mask blocks
    assert traced_block_sizes(16, 16, 500, 500, mods=None) == (63, 63)
    q, k, v = (rng.standard_normal((1, 2, 512, D)) for _ in "qkv")
    want, _, _ = flex_ref(q, k, v, mask_mod=documents(ids))
    np.testing.assert_allclose(jitted(big, q, k, v), want, rtol=1e-10, atol=1e-12)
