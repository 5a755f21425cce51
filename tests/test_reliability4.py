"""Issue 27, programmable attention under attack: the classes not pinned in test_flex/test_mods.

Each test reproduces the issue's example and its variants on every library
the suite runs (the ``backend`` fixture) and every impl that takes the
option, against a float64 formula (``reference.flex_ref``) where one applies.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest

import portattn as pa
from portattn.testing import to_numpy

from conftest import Backend, assert_close_on, impls_for
from reference import flex_ref

B, H, L, D = 2, 3, 20, 4


def _qkv(backend: Backend, rng: np.random.Generator, lq: int = L) -> tuple[tuple[Any, ...], Any]:
    arrs = tuple(rng.standard_normal((B, H, n, D)) for n in (lq, L, L))
    return tuple(backend.asarray(a, backend.xp.float32) for a in arrs), arrs


# --- 9: BlockMask immutable, its constructor checked, block masks pickle ------------------


def _mask_mods(backend: Backend) -> dict[str, Any]:
    """Every ready-made mask_mod and the combinators, capturing arrays of ``backend``."""
    ids = np.arange(L) // 7
    rows = np.stack([ids, np.arange(L) // 5])
    m = pa.mods
    return {
        "causal": m.causal,
        "documents": m.documents(backend.asarray(ids)),
        "documents-rows": m.documents(backend.asarray(rows)),
        "documents-kv": m.documents(backend.asarray(ids), backend.asarray(ids[::-1].copy())),
        "prefix_lm": m.prefix_lm(5),
        "prefix_lm-rows": m.prefix_lm(backend.asarray(np.array([3, 9]))),
        "sliding_window": m.sliding_window(4, 1),
        "chunked": m.chunked(6),
        "and_masks": pa.and_masks(m.causal, m.documents(backend.asarray(ids))),
        "or_masks": pa.or_masks(m.sliding_window(2), m.chunked(8)),
        "nested": pa.and_masks(pa.or_masks(m.causal, m.prefix_lm(4)), m.chunked(10)),
        "and_masks()": pa.and_masks(),
    }


def _round_trip_error(x: object) -> type[BaseException] | None:
    """The exception's type if ``x`` does not survive a stdlib pickle round trip, else None."""
    try:
        pickle.loads(pickle.dumps(x))
    except Exception as e:  # whatever the library raises is the answer
        return type(e)
    return None


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
@pytest.mark.jax32  # int32 ids and indices without x64
def test_block_masks_of_every_ready_made_mod_pickle(
    backend: Backend, rng: np.random.Generator
) -> None:
    """Stdlib pickle (multiprocessing, torch.save) round-trips them; attention is unchanged."""
    xp = backend.xp
    (q, k, v), _ = _qkv(backend, rng)
    # array-api-strict before 2.5 cannot round-trip its own arrays: a mod that captures
    # one then fails exactly as a bare array does, and only there.
    refused = _round_trip_error(backend.asarray(np.zeros(2, dtype=np.int32)))
    for name, mod in _mask_mods(backend).items():
        bm = pa.create_block_mask(
            mod, B, None, L, L, block_size=(4, 8), xp=xp, device=backend.device
        )
        failed = _round_trip_error(bm)
        if failed is not None:
            assert refused is not None and issubclass(failed, refused), (name, failed)
            continue
        back = pickle.loads(pickle.dumps(bm))
        assert isinstance(back, pa.BlockMask), name
        np.testing.assert_array_equal(back.kinds, bm.kinds, err_msg=name)
        assert (back.shape, back.block_size) == (bm.shape, bm.block_size), name
        assert not back.kinds.flags.writeable, name
        for impl in impls_for(backend):
            want = pa.attention(q, k, v, block_mask=bm, impl=impl)
            got = pa.attention(q, k, v, block_mask=back, impl=impl)
            np.testing.assert_array_equal(to_numpy(got), to_numpy(want), err_msg=f"{name} {impl}")
    # The size checks travel with the mod: too few ids is still refused after a round trip.
    if refused is not None:
        return
    short = pickle.loads(pickle.dumps(pa.mods.documents(backend.asarray(np.zeros(L - 1, int)))))
    with pytest.raises(ValueError, match=r"ids captured by mods.documents .* Lq=20, got 19"):
        pa.create_block_mask(short, None, None, L, L, xp=xp, device=backend.device)


def test_block_mask_is_immutable() -> None:
    """Every attribute refuses assignment: a new mask_mod was half-applied, block_size crashed."""
    bm = pa.create_block_mask(pa.mods.causal, None, None, 16, 16, block_size=8)
    for name, value in [
        ("mask_mod", lambda b, h, q, kv: q < 0),
        ("block_size", (4, 4)),
        ("shape", (1, 1, 8, 8)),
        ("kinds", np.zeros((1, 1, 2, 2), np.int8)),
        ("_table", ()),
        ("other", 1),
    ]:
        with pytest.raises(
            AttributeError,
            match=f"BlockMask is immutable: cannot set .{name}. \\(expected it to stay as built",
        ):
            setattr(bm, name, value)
    with pytest.raises(AttributeError, match="BlockMask is immutable"):
        del bm.mask_mod
    x = np.random.default_rng(0).standard_normal((1, 1, 16, 4))
    want, _, _ = flex_ref(x, x, x, allowed=np.tri(16, dtype=bool)[None, None])
    np.testing.assert_allclose(pa.attention(x, x, x, block_mask=bm), want, rtol=1e-12)


def test_block_mask_constructor_checks_kinds_and_block_size() -> None:
    causal = pa.mods.causal
    ok = np.ones((1, 1, 2, 2), np.int8)
    with pytest.raises(ValueError, match=r"PARTIAL \(1\) or FULL \(2\) only, got \[-1, 7\]"):
        pa.BlockMask(
            np.array([[[[7, 1], [-1, 2]]]], np.int8),
            mask_mod=causal,
            shape=(1, 1, 16, 16),
            block_size=(8, 8),
        )
    with pytest.raises(ValueError, match=r"expected block_size\[0\] to be a positive int, got 0"):
        pa.BlockMask(ok, mask_mod=causal, shape=(1, 1, 16, 16), block_size=(0, 4))
    with pytest.raises(ValueError, match="expected block_size to be a positive int or a pair"):
        pa.BlockMask(ok, mask_mod=causal, shape=(1, 1, 16, 16), block_size=[8, 8])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"expected shape\[1\] \(H\) to be a positive int, got 0"):
        pa.BlockMask(ok, mask_mod=causal, shape=(1, 0, 16, 16), block_size=(8, 8))
    with pytest.raises(ValueError, match=r"expected shape to be a tuple \(B, H, q_len, kv_len\)"):
        pa.BlockMask(ok, mask_mod=causal, shape=(16, 16), block_size=(8, 8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected mask_mod to be a callable"):
        pa.BlockMask(ok, mask_mod=None, shape=(1, 1, 16, 16), block_size=(8, 8))  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"expected kinds to be an int8 array of shape \(1, 1, 2, 2\)"
    ):
        pa.BlockMask(ok.astype(np.int64), mask_mod=causal, shape=(1, 1, 16, 16), block_size=8)
    bm = pa.BlockMask(ok, mask_mod=causal, shape=(1, 1, 16, 16), block_size=8)  # an int: square
    assert bm.block_size == (8, 8)


# --- 12: NaN and +inf sinks ---------------------------------------------------------------


@pytest.mark.parametrize("impl", ["auto", "materialize", "blockwise"])
def test_nan_and_inf_sinks_are_what_the_docstring_says(
    backend: Backend, rng: np.random.Generator, impl: str
) -> None:
    """NaN: output and lse NaN (never -inf, "saw no key"); +inf: output 0, lse +inf; -inf: none."""
    xp = backend.xp
    (q, k, v), arrs = _qkv(backend, rng)
    sinks = backend.asarray(np.array([np.nan, np.inf, -np.inf]), xp.float32)
    with np.errstate(invalid="ignore"):
        out, lse = (
            to_numpy(a) for a in pa.attention(q, k, v, sinks=sinks, impl=impl, return_lse=True)
        )
        w = to_numpy(pa.attention_weights(q, k, sinks=sinks))
    assert np.isnan(out[:, 0]).all() and np.isnan(lse[:, 0]).all() and np.isnan(w[:, 0]).all()
    np.testing.assert_array_equal(out[:, 1], 0.0)
    np.testing.assert_array_equal(lse[:, 1], np.inf)
    np.testing.assert_array_equal(w[:, 1], 0.0)
    want, weights, want_lse = flex_ref(*arrs)
    assert_close_on(backend, xp.asarray(out[:, 2]), want[:, 2], dtype=xp.float32)
    np.testing.assert_allclose(lse[:, 2], want_lse[:, 2], rtol=1e-5)
    np.testing.assert_allclose(w[:, 2], weights[:, 2], rtol=1e-5, atol=1e-7)


def test_a_nan_row_has_a_nan_lse_not_minus_inf(rng: np.random.Generator) -> None:
    """The same rule without sinks: a NaN query row's lse is NaN, a row that sees nothing -inf."""
    q, k, v = (rng.standard_normal((1, 1, 4, 3)) for _ in "qkv")
    q[0, 0, 1, 0] = np.nan
    bm = pa.create_block_mask(lambda b, h, qi, kv: qi != 2, None, None, 4, 4, block_size=1)
    for impl in ("materialize", "blockwise"):
        with np.errstate(invalid="ignore"):
            _, lse = pa.attention(q, k, v, block_mask=bm, impl=impl, return_lse=True)
        assert np.isnan(lse[0, 0, 1]) and lse[0, 0, 2] == -np.inf, impl
        assert np.isfinite(lse[0, 0, [0, 3]]).all(), impl


# --- 13: score_mod results: integer and tile-dependent shapes refused ---------------------


def test_score_mod_results_must_be_floating_and_the_tiles_shape(
    backend: Backend, rng: np.random.Generator
) -> None:
    xp = backend.xp
    (q, k, v), arrs = _qkv(backend, rng)

    def integer(s: Any, b: Any, h: Any, qi: Any, kv: Any) -> Any:
        return qi - kv

    def first_row(s: Any, b: Any, h: Any, qi: Any, kv: Any) -> Any:
        return s[..., :1, :]

    def key_only(s: Any, b: Any, h: Any, qi: Any, kv: Any) -> Any:
        return s[..., :, :1]

    def head_free(s: Any, b: Any, h: Any, qi: Any, kv: Any) -> Any:  # broadcast over b, h: kept
        return xp.astype(-abs(qi - kv), xp.float32)

    for impl in ("auto", "materialize", "blockwise"):
        kw: dict[str, Any] = {"impl": impl}
        if impl == "blockwise":
            kw["block_size"] = (8, 8)  # tiles smaller than the call
        with pytest.raises(TypeError, match=r"score_mod integer to return a real array .*got int"):
            pa.attention(q, k, v, score_mod=integer, **kw)
        for mod in (first_row, key_only):
            with pytest.raises(
                ValueError,
                match=rf"score_mod {mod.__name__} to return the score's shape \(2, 3, \d+, \d+\), "
                r"got shape \(2, 3, \d+, \d+\): a result smaller than the tile",
            ):
                pa.attention(q, k, v, score_mod=mod, **kw)
        got = pa.attention(q, k, v, score_mod=head_free, **kw)
        dist = -np.abs(np.arange(L)[:, None] - np.arange(L)[None, :]).astype(float)
        want, _, _ = flex_ref(*arrs, bias=np.broadcast_to(dist, (B, H, L, L)), scale=0.0)
        assert_close_on(backend, got, want, dtype=xp.float32)


def test_a_score_mod_returning_a_captured_array_leaves_it_alone(rng: np.random.Generator) -> None:
    """The blockwise path subtracts the row max in place only on a tile it made itself."""
    q, k, v = (rng.standard_normal((B, H, L, D)) for _ in "qkv")
    table = rng.standard_normal((B, H, L, L))
    kept = table.copy()
    for impl in ("materialize", "blockwise"):
        got = pa.attention(q, k, v, score_mod=lambda s, b, h, qi, kv: table, impl=impl)
        np.testing.assert_array_equal(table, kept, err_msg=impl)
        want, _, _ = flex_ref(q, k, v, bias=table, scale=0.0)
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=impl)


# --- 14: apply_rope under JAX without x64 -------------------------------------------------


@pytest.mark.jax32  # JAX with x64 off warned; filterwarnings=error fails on it
def test_apply_rope_default_positions_take_the_default_integer(
    backend: Backend, rng: np.random.Generator
) -> None:
    xp = backend.xp
    x = backend.asarray(rng.standard_normal((2, 5, 8)), xp.float32)
    got = pa.apply_rope(x)
    positions = xp.arange(5, dtype=xp.float32, device=backend.device)
    assert_close_on(backend, got, to_numpy(pa.apply_rope(x, positions)), dtype=xp.float32)
    w = [backend.asarray(rng.standard_normal((8, 8)), xp.float32) for _ in range(4)]
    mha = pa.MultiHeadAttention(*w, num_heads=2, rope="half")
    mha(x, causal=True)  # the layer's own RoPE (rope_heads) takes the same default positions


# --- 5: torch.func.vmap over k, v, bias, sinks and captured tensors on every path ---------


@pytest.mark.parametrize("impl", ["blockwise", "materialize", "auto"])
def test_torch_vmap_over_any_operand_equals_a_loop(impl: str) -> None:
    """The blockwise output buffer took unbatched q's shape: vmap over k alone failed."""
    torch = pytest.importorskip("torch")
    from torch.func import vmap

    g = torch.Generator().manual_seed(0)

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    n, lq = 3, 40
    q = draw(B, H, lq, D)
    stacked = {
        "k": draw(n, B, H, L * 2, D),
        "v": draw(n, B, H, L * 2, D),
        "bias": draw(n, lq, L * 2),
        "sinks": draw(n, H),
        "slopes": draw(n, H).abs(),
    }
    fixed = {name: x[0] for name, x in stacked.items()}
    bm = pa.create_block_mask(pa.mods.sliding_window(9, 3), None, None, lq, L * 2, block_size=16)
    kw: dict[str, Any] = {"impl": impl, "block_mask": bm}
    if impl == "blockwise":
        kw["block_size"] = 16  # several query blocks: the buffer is written block by block

    def call(a: dict[str, Any]) -> Any:
        mod = pa.mods.alibi(a["slopes"])
        return pa.attention(
            q, a["k"], a["v"], bias=a["bias"], sinks=a["sinks"], score_mod=mod, **kw
        )

    for batched in [*stacked, tuple(stacked)]:
        names = batched if isinstance(batched, tuple) else (batched,)

        def one(*xs: Any, names: tuple[str, ...] = names) -> Any:
            return call({**fixed, **dict(zip(names, xs, strict=True))})

        got = vmap(one)(*(stacked[m] for m in names))
        want = torch.stack([one(*(stacked[m][i] for m in names)) for i in range(n)])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=str(names))


# --- 8: inside torch.compile(fullgraph=True) ----------------------------------------------


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
def test_torch_compile_fullgraph_builds_mods_and_names_block_mask_remedy(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """t5_relative_bias built inside compiles; create_block_mask says to build it outside;
    blockwise compiles without dynamo's functools.lru_cache warnings (filterwarnings=error)."""
    torch = pytest.importorskip("torch")
    # Dynamo warns once per message and process: forget earlier tests' warnings.
    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set())
    x = torch.tensor(rng.standard_normal((1, H, 12, D)))
    table = torch.tensor(rng.standard_normal((32, H)))

    def t5(a: Any, t: Any) -> Any:
        return pa.attention(a, a, a, score_mod=pa.mods.t5_relative_bias(t), impl="blockwise")

    def blockwise(a: Any) -> Any:
        return pa.attention(a, a, a, causal=True, impl="blockwise", block_size=4)

    def with_mask(a: Any) -> Any:
        bm = pa.create_block_mask(pa.mods.causal, None, None, 12, 12, block_size=4)
        return pa.attention(a, a, a, block_mask=bm)

    torch._dynamo.reset()
    got = torch.compile(blockwise, backend="eager", fullgraph=True)(x)  # no warning: an error
    torch.testing.assert_close(got, blockwise(x), rtol=1e-12, atol=1e-12)
    with warnings.catch_warnings():  # array-api-compat's own caches, met while mods are built
        warnings.filterwarnings("ignore", "Dynamo detected a call to a `functools.lru_cache`")
        torch._dynamo.reset()
        got = torch.compile(t5, backend="eager", fullgraph=True)(x, table)
        torch.testing.assert_close(got, t5(x, table), rtol=1e-12, atol=1e-12)
        torch._dynamo.reset()
        with pytest.raises(Exception, match=r"expected create_block_mask to run outside torch\.c"):
            torch.compile(with_mask, backend="eager", fullgraph=True)(x)
        torch._dynamo.reset()  # without fullgraph dynamo falls back to eager there: it works
        torch.testing.assert_close(torch.compile(with_mask, backend="eager")(x), with_mask(x))


# --- 6: a mod's captured arrays in another library than the inputs -----------------------

LIBRARIES = ("numpy", "torch", "jax", "array_api_strict")
CAPTURING = ("alibi", "t5", "documents", "per_head")


def _in_library(name: str, a: np.ndarray) -> Any:
    """``a`` as an array of library ``name`` (skipped where it is not installed)."""
    if name == "numpy":
        return a
    if name == "jax":
        return pytest.importorskip("jax.numpy").asarray(a)
    return pytest.importorskip(name).asarray(a)


def _capturing_mod(kind: str, make: Any) -> tuple[str, str, Any]:
    """(``score_mod`` or ``mask_mod``, the name it is refused under, the mod) for ``kind``.

    ``make`` turns a NumPy array into the library the mod is to capture.
    """
    if kind == "alibi":
        return "score_mod", "alibi_bias", pa.mods.alibi(make(np.array([0.5, 0.25, 0.125])))
    if kind == "t5":
        table = make(np.linspace(-1.0, 1.0, 8 * H).reshape(8, H))
        return "score_mod", "t5_bias", pa.mods.t5_relative_bias(table, max_distance=12)
    if kind == "documents":
        return "mask_mod", "document_mask", pa.mods.documents(make(np.arange(L) // 6))
    per_head = make(np.linspace(-2.0, 2.0, B * H).reshape(B, H))

    def per_head_bias(s: Any, b: Any, h: Any, qi: Any, kv: Any) -> Any:
        return s + per_head[b, h]

    return "score_mod", "per_head_bias", per_head_bias


def _library(backend: Backend) -> str:
    """The library behind a backend: numpy_readonly, jax32 and torch_cuda by their root."""
    for root in ("jax", "numpy", "torch"):
        if backend.name.startswith(root):
            return root
    return backend.name


def _flex(kind: str, mod: Any, backend: Backend, **kw: Any) -> dict[str, Any]:
    """The keywords that hand ``mod`` to attention, its block mask built with ``backend``'s xp."""
    if kind == "score_mod":
        return {"score_mod": mod, **kw}
    bm = pa.create_block_mask(mod, None, None, L, L, block_size=L, xp=backend.xp)
    return {"block_mask": bm, **kw}


@pytest.mark.parametrize("captured", LIBRARIES)
@pytest.mark.parametrize("kind", CAPTURING)
def test_captured_arrays_of_another_library_are_refused_on_every_impl(
    backend: Backend, rng: np.random.Generator, kind: str, captured: str
) -> None:
    """Every (captured library, inputs' library) pair either works the same on every impl
    (the same library) or is refused up front with one message: the mod, both libraries, the fix.

    Before, 16 of the 48 mixed pairs reached portattn's message; the others failed inside the
    mod, differently per impl (NumPy slopes on JAX ran on materialize and broke blockwise).
    """
    xp, library = backend.xp, _library(backend)
    (q, k, v), arrs = _qkv(backend, rng)
    what, name, mod = _capturing_mod(kind, lambda a: _in_library(captured, a))
    impls = (*impls_for(backend), "auto")
    if captured == library:  # the control: every impl agrees with the float64 formula
        _, _, host = _capturing_mod(kind, lambda a: a)
        want, _, _ = flex_ref(*arrs, **{what: host})
        for impl in impls:
            if impl == "native" and what == "score_mod":
                continue  # the fused kernels take no score_mod (refused, tested elsewhere)
            got = pa.attention(q, k, v, impl=impl, **_flex(what, mod, backend))
            assert_close_on(backend, got, want, dtype=xp.float32)
        return
    make = "jax.numpy" if library == "jax" else library
    refused = (
        rf"expected the arrays that {what} {name} captures to be {library} arrays, the library "
        rf"(of the inputs|the block mask is built with \(xp={library}\)).*\({captured}\): "
        rf"convert it \({make}\.asarray\) and build the mod, and any block mask"
    )
    for impl in impls:
        with pytest.raises(TypeError, match=refused):
            pa.attention(q, k, v, impl=impl, **_flex(what, mod, backend))
    if what == "mask_mod":  # a block mask built in the ids' library, used on these inputs
        own = pa.create_block_mask(
            mod, None, None, L, L, block_size=L, xp=pa.testing.load_backend(captured).xp
        )
        for impl in impls:
            with pytest.raises(TypeError, match=refused):
                pa.attention(q, k, v, impl=impl, block_mask=own)
    if library == "jax" and what == "score_mod":  # NumPy slopes ran eagerly on materialize only
        import jax

        for impl in impls:

            def call(a: Any, b: Any, c: Any, impl: str = impl) -> Any:
                return pa.attention(a, b, c, impl=impl, score_mod=mod)

            with pytest.raises(TypeError, match=refused):
                jax.jit(call)(q, k, v)


@pytest.mark.parametrize("captured", ["torch", "jax", "array_api_strict", "dask"])
def test_dask_inputs_take_mods_capturing_their_chunks_library(
    rng: np.random.Generator, captured: str
) -> None:
    """Dask runs the mods on its chunks: NumPy arrays are right, any other library is refused."""
    da = pytest.importorskip("dask.array")
    q, k, v = (da.from_array(rng.standard_normal((B, H, L, D)), chunks=(1, H, 8, D)) for _ in "qkv")
    arrs = tuple(np.asarray(a) for a in (q, k, v))

    def make(a: np.ndarray) -> Any:
        return da.from_array(a) if captured == "dask" else _in_library(captured, a)

    for kind in CAPTURING:
        what, name, mod = _capturing_mod(kind, make)
        _, _, host = _capturing_mod(kind, lambda a: a)
        want, _, _ = flex_ref(*arrs, **{what: host})
        for impl in ("auto", "materialize", "blockwise"):
            kw: dict[str, Any] = {"impl": impl}
            np_kw = {**kw, **_flex(what, host, pa.testing.load_backend("numpy"))}
            np.testing.assert_allclose(
                np.asarray(pa.attention(q, k, v, **np_kw)), want, rtol=1e-12, err_msg=impl
            )
            if what == "mask_mod" and captured == "dask":
                continue  # create_block_mask refuses xp=dask: a block mask is read on the host
            built_with = pa.testing.load_backend("numpy" if captured == "dask" else captured)
            with pytest.raises(
                TypeError,
                match=rf"{what} {name} captures to be numpy arrays, the library of the inputs "
                rf"\(of their chunks, for dask\), got .*: convert it \(numpy\.asarray\)",
            ):
                pa.attention(q, k, v, **kw, **_flex(what, mod, built_with))


# --- 7: a T5 table with more heads than the call is refused, as one with fewer ------------


@pytest.mark.parametrize("heads", [H + 1, H + 5, H - 1])
def test_t5_table_with_another_number_of_heads_is_refused(
    backend: Backend, rng: np.random.Generator, heads: int
) -> None:
    """More columns than H were accepted silently (the extra heads' biases never read)."""
    (q, k, v), _ = _qkv(backend, rng)
    table = backend.asarray(rng.standard_normal((16, heads)), backend.xp.float32)
    mod = pa.mods.t5_relative_bias(table, max_distance=12)
    for impl in (*impls_for(backend), "auto"):
        with pytest.raises(
            ValueError,
            match=rf"table captured by mods\.t5_relative_bias to have one column per query "
            rf"head, H={H}, got {heads}$",
        ):
            pa.attention(q, k, v, score_mod=mod, impl=impl)
