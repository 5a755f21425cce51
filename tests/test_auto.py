"""impl="auto": which path it takes (seen through a spy), and that it agrees with materialize there.

The rule (attention's docstring): the fused kernel wherever it is exact and
needs no more memory than the generic path, which today means torch SDPA
without softcap or return_lse and without a position mask larger than the
generic path's working memory; otherwise materialize below 256 x 256 pairs,
blockwise above, except for one query (a decode step), which materializes
against a cache of any length.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

import portattn as pa
import portattn._attention as entry
from portattn._paths import _auto
from portattn.testing import assert_close, to_numpy

from conftest import Backend, assert_close_on, jitted, needs, option_arrays, rtol_for

BIG = 300  # 300 x 300 pairs > 256 x 256: above the materialising size
CACHE = 256 * 256 + 7  # one query against this many keys: above it too, in pairs

# name: (options, Lq, Lk, path on torch)
CASES = {
    "plain": ({}, 6, 6, "native"),
    "plain_big": ({}, BIG, BIG, "native"),
    "causal": ({"causal": True}, 6, 6, "native"),
    "causal_big": ({"causal": True}, BIG, BIG, "native"),
    "top_left_long_k": ({"causal": "top_left"}, 4, 7, "native"),
    "bottom_right": ({"causal": "bottom_right"}, 4, 7, "native"),
    "bottom_right_long_q": ({"causal": "bottom_right"}, 7, 5, "native"),
    # an (Lq, Lk) mask is more than blockwise needs: blockwise
    "bottom_right_big": ({"causal": "bottom_right"}, BIG - 20, BIG, "blockwise"),
    "window": ({"window": (2, 1)}, 7, 7, "native"),
    "window_big": ({"window": (2, 1)}, BIG, BIG, "blockwise"),
    "mask": ({"mask": "m"}, 6, 8, "native"),
    "bias_mask_causal": ({"mask": "m", "bias": "b", "causal": "bottom_right"}, 6, 8, "native"),
    "lengths": ({"key_lengths": "kl", "query_lengths": "ql"}, 6, 8, "native"),
    # one row of key lengths per batch entry: always cheap
    "key_lengths_big": ({"key_lengths": "kl"}, BIG, BIG, "native"),
    "scale": ({"scale": 0.3}, 5, 5, "native"),
    "softcap": ({"softcap": 2.0}, 6, 6, "materialize"),
    "softcap_big": ({"softcap": 2.0, "causal": True}, BIG, BIG, "blockwise"),
    "lse": ({"return_lse": True}, 6, 6, "materialize"),
    # one query against a long cache: its scores are a d-th of the keys
    "decode_long_cache": ({}, 1, CACHE, "native"),
    "decode_long_cache_softcap": ({"softcap": 2.0}, 1, CACHE, "materialize"),
    "two_queries_long_cache": ({"softcap": 2.0}, 2, CACHE, "blockwise"),
}


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the name of every path the entry point runs."""
    ran: list[str] = []
    paths = {
        "native_attention": "native",
        "blockwise_attention": "blockwise",
        "differentiable_blockwise": "blockwise",  # blockwise with its own backward
        "materialize_attention": "materialize",
        "plain_native": "native",  # a repeat plain torch call's shortcut to the same kernel
        "plain_materialize": "materialize",  # a repeat plain NumPy call's shortcut to its core
    }
    for name, path in paths.items():
        real = getattr(entry, name, None)
        if real is None:
            continue

        def wrapper(*args, _real=real, _path=path, **kwargs):
            ran.append(_path)
            return _real(*args, **kwargs)

        monkeypatch.setattr(entry, name, wrapper)
    return ran


def _expected(backend: Backend, torch_path: str, lq: int, lk: int) -> str:
    if backend.name.startswith("torch"):
        return torch_path
    if torch_path != "native":
        return torch_path
    return "blockwise" if lq * lk > 256 * 256 and lq > 1 else "materialize"


def _case(backend: Backend, rng: np.random.Generator, name: str) -> tuple[Any, ...]:
    """CASES[name] ready to call: its options (placeholders made arrays on ``backend``), whether
    it asks for the lse, q, k and v as float64 NumPy, and (Lq, Lk, the path torch takes)."""
    kw, lq, lk, torch_path = CASES[name]
    kw = dict(kw)
    want_lse = kw.pop("return_lse", False)
    needs_arrays = any(v in ("m", "b", "kl", "ql") for v in kw.values())
    kwargs = option_arrays(backend, rng, kw, lq, lk) if needs_arrays else kw
    qkv = [rng.standard_normal((2, 3, n, 8)) for n in (lq, lk, lk)]
    return kwargs, want_lse, qkv, (lq, lk, torch_path)


# portattn._core._masks builds position indices as int64, which JAX without x64
# truncates to int32 with a warning; harmless at these sizes.
@pytest.mark.filterwarnings("ignore:Explicitly requested dtype int64:UserWarning")
@pytest.mark.parametrize("name", sorted(CASES))
def test_auto_takes_the_rule_path_and_agrees_with_materialize(backend, rng, spy, name):
    kwargs, want_lse, (q, k, v), (lq, lk, torch_path) = _case(backend, rng, name)
    xp = backend.xp
    for dtype in backend.float_dtypes:
        args = [backend.asarray(a, dtype) for a in (q, k, v)]
        spy.clear()
        run = functools.partial(pa.attention, return_lse=want_lse, **kwargs)
        got = jitted(backend, run)(*args)
        assert spy == [_expected(backend, torch_path, lq, lk)], (name, dtype)
        want = jitted(backend, functools.partial(run, impl="materialize"))(*args)
        if want_lse:
            assert_close(got[1], want[1], rtol=rtol_for(backend, dtype), xp=xp)
            got, want = got[0], want[0]
        assert_close_on(backend, got, want, dtype=dtype)
        assert not np.isnan(to_numpy(got)).any()


def test_auto_with_fully_hidden_rows_trains_like_materialize(rng, spy):
    """The default path on torch is SDPA now: a row that sees nothing must give 0 and 0 grads."""
    torch = pytest.importorskip("torch")  # torch is in every CI run; elsewhere, nothing to test
    q, k, v = (torch.tensor(rng.standard_normal((2, 3, 6, 8)), requires_grad=True) for _ in "qkv")
    mask = torch.tensor(rng.random((6, 6)) < 0.5)
    mask[2] = False
    kl = torch.tensor([[6], [0]])  # the second batch entry sees no key at all
    grads = {}
    for impl in ("auto", "materialize"):
        out = pa.attention(q, k, v, mask=mask, key_lengths=kl, impl=impl)
        (out * torch.linspace(-1, 1, 8, dtype=out.dtype)).sum().backward()
        grads[impl] = [to_numpy(x.grad) for x in (q, k, v)]
        assert not torch.isnan(out).any()
        assert (out[:, :, 2] == 0).all() and (out[1] == 0).all()
        for x in (q, k, v):
            x.grad = None
    assert spy == ["native", "materialize"]
    for a, b in zip(grads["auto"], grads["materialize"], strict=True):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "batch",
    [(), (3,), (2, 3, 2)],
    ids=["2-D", "3-D", "5-D"],
)
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"mask": "per-entry", "bias": "b"}])
def test_native_hands_torch_four_d_tensors(rng, monkeypatch, batch, kw):
    """torch's fused CPU kernel takes 4-D only; any other rank runs its O(N²) math kernel."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    seen: list[tuple[int, ...]] = []
    real = F.scaled_dot_product_attention

    def spy_sdpa(q, k, v, attn_mask=None, **kw):
        seen.extend(x.ndim for x in (q, k, v) if x is not None)
        if attn_mask is not None:
            seen.append(attn_mask.ndim)
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy_sdpa)
    q, k, v = (torch.tensor(rng.standard_normal((*batch, 5, 4))) for _ in "qkv")
    kwargs = {}
    if "mask" in kw:
        m = rng.random((*batch, 5, 5)) < 0.6
        if m.ndim > 2:
            m[(0,) * (m.ndim - 2) + (1,)] = False  # a fully hidden row
        kwargs = {"mask": torch.tensor(m), "bias": torch.tensor(rng.standard_normal((5, 5)))}
    else:
        kwargs = dict(kw)
    got = pa.attention(q, k, v, impl="native", **kwargs)
    want = pa.attention(q, k, v, impl="materialize", **kwargs)
    assert seen and set(seen) == {4}
    assert got.shape == (*batch, 5, 4)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "opts",
    [{"window": (1, 0)}, {"causal": True, "bias": "zeros"}, {"mask": "tril"}, {"causal": True}],
    ids=["window", "causal_bias", "mask", "causal"],
)
def test_auto_agrees_with_generic_paths_on_an_inf_key_hidden_by_position(rng, opts):
    """The generic paths never see a hidden key's scores; torch's kernel with a mask does
    (NaN rows, documented): auto checks the keys and stays on the generic path then."""
    import torch

    q, k, v = (torch.from_numpy(rng.standard_normal((2, 6, 4))) for _ in range(3))
    k[:, -1] = float("inf")
    kw = dict(opts)
    if kw.get("bias") == "zeros":
        kw["bias"] = torch.zeros(6, 6, dtype=torch.float64)
    if kw.get("mask") == "tril":
        kw["mask"] = torch.ones(6, 6, dtype=torch.bool).tril()
    want = pa.attention(q, k, v, impl="materialize", **kw)
    assert torch.isfinite(want[:, :-1]).all()
    for impl in ("blockwise", "auto"):
        got = pa.attention(q, k, v, impl=impl, **kw)
        torch.testing.assert_close(got[:, :-1], want[:, :-1], rtol=1e-12, atol=1e-12)
    native = pa.attention(q, k, v, impl="native", **kw)
    if "causal" in opts and len(opts) == 1:  # the kernel's own is_causal skips hidden keys
        torch.testing.assert_close(native[:, :-1], want[:, :-1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(1, 2, 8, 4, 6), (2, 8, 300, 4), (1, 8, 4, 4)])
def test_auto_stays_off_the_kernel_for_an_inf_key_hidden_only_by_causality(rng, spy, shape):
    """Plain causal, no mask: torch's math kernel (here d != dv, or d > 256) masks the scores it
    formed, so one +inf key in the future makes every row NaN; auto checks the keys first."""
    import torch

    *batch, n, d, dv = shape
    q, k = (torch.from_numpy(rng.standard_normal((*batch, n, d))) for _ in "qk")
    v = torch.from_numpy(rng.standard_normal((*batch, n, dv)))
    k[..., 5, 0] = float("inf")  # hidden from rows 0..4 by causality alone
    want = pa.attention(q, k, v, impl="materialize", causal=True)
    assert torch.isfinite(want[..., :5, :]).all()
    spy.clear()
    got = pa.attention(q, k, v, causal=True)
    assert spy == ["materialize"]
    torch.testing.assert_close(got[..., :5, :], want[..., :5, :], rtol=1e-12, atol=1e-12)
    assert torch.equal(got.isnan(), want.isnan())
    spy.clear()
    pa.attention(q, k.nan_to_num(posinf=1.0), v, causal=True)  # finite keys: the kernel again
    assert spy == ["native"]


# (B, H, Hkv, Lq, Lk, d) -> the path torch's auto takes with the threshold at 2 * 8 * 64 * 16
GROUPED_DECODE = {
    (2, 8, 2, 1, 64, 16): "materialize",  # B * H * Lk * d at the threshold: materialise
    (2, 8, 2, 1, 63, 16): "native",  # just below it: SDPA's fixed cost is the smaller one
    (2, 8, 8, 1, 64, 16): "native",  # no groups: SDPA reads each head once anyway
    (2, 8, 2, 2, 64, 16): "native",  # two queries: not a decode step
}


@pytest.mark.parametrize("shape", sorted(GROUPED_DECODE))
def test_auto_materialises_a_large_grouped_decode_step_on_torch(rng, spy, monkeypatch, shape):
    """torch's CPU SDPA with enable_gqa is slower than materialising one query against grouped
    keys past a size (benchmarks/decode.py, "lq1"); auto takes materialize there, and agrees
    with SDPA, gradients included."""
    torch = pytest.importorskip("torch")

    monkeypatch.setattr(_auto, "TORCH_MATERIALIZE_GQA_DECODE", 2 * 8 * 64 * 16)
    b, h, hkv, lq, lk, d = shape
    q, k, v = (
        torch.tensor(rng.standard_normal((b, n, length, d)), requires_grad=True)
        for n, length in ((h, lq), (hkv, lk), (hkv, lk))
    )
    got = pa.attention(q, k, v)
    assert spy == [GROUPED_DECODE[shape]]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=h != hkv)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    d_out = torch.from_numpy(rng.standard_normal(want.shape))
    grads = torch.autograd.grad(got, (q, k, v), d_out)
    wants = torch.autograd.grad(want, (q, k, v), d_out)
    for a, w in zip(grads, wants, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["cpu", "mps"])
def test_autocast_on_sees_autocast_on_every_device_type(kind):
    """The shortcut's autocast question: torch's cheap any-autocast query skips MPS, so it is
    only trusted for CPU and CUDA; every other device type is asked by name."""
    needs("torch", "torch")
    import torch

    from portattn._lib._precision import autocast_on

    if not torch.amp.is_autocast_available(kind):
        pytest.skip(f"this torch has no autocast for {kind}")
    assert not autocast_on(kind)
    before = torch.is_autocast_enabled(kind)
    torch.set_autocast_enabled(kind, True)
    try:
        assert autocast_on(kind)
    finally:
        torch.set_autocast_enabled(kind, before)
    assert not autocast_on(kind) and not autocast_on("")


@pytest.mark.parametrize("d", [16, 48])
@pytest.mark.parametrize("scale", [0.3, None])
@pytest.mark.parametrize("hkv", [2, 8])
def test_repeat_plain_torch_call_gives_the_kernel_path_bits(monkeypatch, hkv, scale, d):
    """A repeat plain call takes the memoised shortcut to SDPA: the bits of impl='native'
    (which passes the scale; the shortcut leaves the default 1/sqrt(d) to SDPA)."""
    torch = pytest.importorskip("torch")

    taken = _record(monkeypatch, "plain_native", "native_attention")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 1, d, generator=gen)
    k, v = (torch.randn(2, hkv, 33, d, generator=gen) for _ in range(2))
    _auto.forget_plans()
    first = pa.attention(q, k, v, scale=scale)  # validates, and memoises the plan
    assert taken == ["native_attention"]
    assert _memoised(q, k, v, scale=scale)
    again = pa.attention(q, k, v, scale=scale)
    assert taken == ["native_attention", "plain_native"]
    native = pa.attention(q, k, v, scale=scale, impl="native")
    assert torch.equal(first, again) and torch.equal(again, native)
    taken.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = pa.attention(q, k, v, scale=scale)
    assert taken == ["native_attention"]  # autocast: the whole way, which turns it off
    assert cast.dtype == torch.float32 and torch.equal(cast, first)


@pytest.mark.parametrize("hkv", [2, 8])
def test_repeat_plain_torch_call_gives_the_kernel_path_gradients(monkeypatch, hkv):
    """The shortcut keeps autograd's graph: a repeat call's q, k and v gradients are the first's."""
    torch = pytest.importorskip("torch")

    taken = _record(monkeypatch, "plain_native", "native_attention")
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 8, 3, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(2, hkv, 33, 16, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    d_out = torch.randn(2, 8, 3, 16, generator=gen, dtype=torch.float64)
    _auto.forget_plans()
    outs, grads = [], []
    for _ in range(2):
        out = pa.attention(q, k, v, scale=0.3)
        outs.append(out)
        grads.append(torch.autograd.grad(out, (q, k, v), d_out))
    assert taken == ["native_attention", "plain_native"]
    assert torch.equal(outs[0], outs[1])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def _record(monkeypatch: pytest.MonkeyPatch, *names: str) -> list[str]:
    """Records which of the entry's functions ``names`` run, in order."""
    taken: list[str] = []
    for name in names:
        real = getattr(entry, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            taken.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(entry, name, wrapper)
    return taken


_SHORTCUTS = {"plain_native": "native", "plain_materialize": "materialize"}
_FULL = {
    "native_attention": "native",
    "blockwise_attention": "blockwise",
    "materialize_attention": "materialize",
}


def _memoised(q, k, v, *, scale: float | None) -> bool:
    """Whether a plain call on q, k, v with ``scale`` has a memoised plan (a repeat: shortcut)."""
    from portattn._core import _prepare
    from portattn._core._variant import build_variant

    key = _prepare.plan_key(q, k, v, variant=build_variant(), scale=scale)
    return _prepare.plain_plan(memo=key) is not None


def _twice(monkeypatch, run, args) -> tuple[list[str], list[str]]:
    """The entry functions a first call (plans forgotten) and a repeat call of ``run`` ran."""

    taken = _record(monkeypatch, *_SHORTCUTS, *_FULL)
    _auto.forget_plans()
    run(*args)
    first = list(taken)
    taken.clear()
    run(*args)
    return first, list(taken)


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype int64:UserWarning")
@pytest.mark.parametrize("name", sorted(CASES))
def test_auto_takes_the_same_path_on_a_repeat_call(backend, rng, monkeypatch, name):
    """A repeat call takes the first call's path: the memoised shortcut (a plain call on NumPy
    or torch) applies auto's rule as the whole way does, so its copy of the rule cannot drift."""
    from portattn._lib._compat import namespace_library

    # Other libraries have no shortcut: their repeat call goes the whole way.
    has_shortcut = namespace_library(backend.xp) in ("numpy", "torch")
    kwargs, want_lse, (q, k, v), (lq, lk, torch_path) = _case(backend, rng, name)
    path = _expected(backend, torch_path, lq, lk)
    # Only a plain call (no option but the scale) has a shortcut, on the path auto takes for it.
    shortcut = has_shortcut and not want_lse and set(kwargs) <= {"scale"} and path != "blockwise"
    run = functools.partial(pa.attention, return_lse=want_lse, **kwargs)
    for dtype in backend.float_dtypes:
        args = [backend.asarray(a, dtype) for a in (q, k, v)]
        first, again = _twice(monkeypatch, run, args)
        assert [_FULL[n] for n in first] == [path], (name, dtype)
        paths = [_SHORTCUTS.get(n) or _FULL[n] for n in again]
        assert paths == [path], (name, dtype, again)
        # A half dtype computes in float32: the whole way, which casts.
        plain = shortcut and dtype in (backend.xp.float32, backend.xp.float64)
        assert (again[0] in _SHORTCUTS) == plain, (name, dtype, again)
        monkeypatch.undo()


@pytest.mark.parametrize("shape", sorted(GROUPED_DECODE))
def test_auto_takes_the_same_grouped_decode_path_on_a_repeat_call(rng, monkeypatch, shape):
    """torch's grouped-decode threshold holds for a repeat call too: the shortcut takes SDPA
    exactly where the whole way does, and a materialising step stays materialising."""
    import torch

    b, h, hkv, lq, lk, d = shape
    q, k, v = (
        torch.tensor(rng.standard_normal((b, n, length, d)))
        for n, length in ((h, lq), (hkv, lk), (hkv, lk))
    )
    monkeypatch.setattr(_auto, "TORCH_MATERIALIZE_GQA_DECODE", 2 * 8 * 64 * 16)
    first, again = _twice(monkeypatch, pa.attention, (q, k, v))
    path = GROUPED_DECODE[shape]
    assert [_FULL[n] for n in first] == [path]
    assert again == (["plain_native"] if path == "native" else first)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("hkv", "lq"), [(2, 1), (8, 1), (2, 16), (8, 16)])
def test_repeat_plain_numpy_call_gives_the_materialising_bits(monkeypatch, hkv, lq, dtype):
    """A repeat plain NumPy call takes the memoised shortcut: the bits of impl='materialize'."""

    taken = _record(monkeypatch, "plain_materialize", "materialize_attention")
    gen = np.random.default_rng(0)
    q = gen.standard_normal((2, 8, lq, 16)).astype(dtype)
    k, v = (gen.standard_normal((2, hkv, 33, 16)).astype(dtype) for _ in range(2))
    kept = [x.copy() for x in (q, k, v)]
    _auto.forget_plans()
    first = pa.attention(q, k, v, scale=0.3)  # validates, and memoises the plan
    assert taken == ["materialize_attention"]
    assert _memoised(q, k, v, scale=0.3)
    again = pa.attention(q, k, v, scale=0.3)
    chosen = pa.attention(q, k, v, scale=0.3, impl="materialize")
    assert taken == ["materialize_attention", "plain_materialize", "plain_materialize"]
    assert again.dtype == dtype and again.shape == (2, 8, lq, 16)
    assert np.array_equal(first, again) and np.array_equal(again, chosen)
    blockwise = pa.attention(q, k, v, scale=0.3, impl="blockwise")  # no shortcut: prepare, solve
    assert len(taken) == 3
    for got, was in zip((q, k, v), kept, strict=True):
        assert np.array_equal(got, was)  # inputs never written
    # The formula, on K and V repeated per query head (an outside oracle).
    kr, vr = (np.repeat(x, 8 // hkv, axis=1).astype(np.float64) for x in (k, v))
    s = 0.3 * q.astype(np.float64) @ np.swapaxes(kr, -1, -2)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    want = (w / w.sum(axis=-1, keepdims=True)) @ vr
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(again, want, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(blockwise, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("scale", [None, 0.3, 2])
def test_a_bare_call_keys_its_plan_as_a_call_with_no_option(scale):
    """The public entry's bare-call key (asked before any lookup) is the plan key that
    ``prepare`` memoises under for the variant with no option: so a bare repeat call finds
    the plan its first call checked, and only for the inputs a plan may be memoised for."""
    torch = pytest.importorskip("torch")
    from portattn._core import _prepare
    from portattn._core._variant import build_variant

    gen = np.random.default_rng(0)
    arrays = [gen.standard_normal(s).astype(np.float32) for s in ((1, 8, 1, 16), (1, 2, 9, 16))]
    q, k = arrays
    tq, tk = (torch.from_numpy(x) for x in arrays)
    for args in ((q, k, k), (tq, tk, tk)):
        want = _prepare.plan_key(*args, variant=build_variant(), scale=scale)
        assert want is not None and _prepare.bare_key(*args, scale=scale) == want
    assert _prepare.bare_key(q, k, k, scale=True) is None  # a bool is refused, never memoised
    assert _prepare.bare_key(q, tk, tk, scale=scale) is None  # mixed libraries: the whole way
    param = torch.nn.Parameter(tk)
    assert _prepare.bare_key(tq, param, param, scale=scale) is None  # a subclass
    assert _prepare.bare_key(q, k, None, scale=scale) is None  # weights-only: not bare


def test_a_layer_repeat_call_takes_the_shortcut_through_attend(monkeypatch):
    """``attend`` (the layers' entry, with a built variant) has the repeat shortcut too."""
    torch = pytest.importorskip("torch")
    from portattn._core._variant import build_variant
    from portattn._lib._compat import array_namespace

    taken = _record(monkeypatch, *_SHORTCUTS, *_FULL)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 1, 8, generator=gen)
    k, v = (torch.randn(1, 2, 20, 8, generator=gen) for _ in range(2))
    xp = array_namespace(q, k, v)
    _auto.forget_plans()
    outs = [entry.attend(q, k, v, variant=build_variant(), xp=xp) for _ in range(2)]
    assert taken == ["native_attention", "plain_native"]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[1], pa.attention(q, k, v))
