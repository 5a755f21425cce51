"""portattn inside the libraries' own programs: jit, vmap, torch.compile and lazy arrays.

Every path must run where the arrays hold no values yet: JAX tracers,
torch.compile's fake tensors, torch meta tensors, dask graphs and ndonnx
exports. None of them may read an array on the host (the blockwise path's
Cauchy-Schwarz shortcut is the one place that does, on concrete arrays only),
and no call may leave a traced array behind in a cache.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import dask
import dask.array as da
import jax
import jax.numpy as jnp
import ndonnx as ndx
import numpy as np
import onnxruntime as ort
import pytest
import torch
from dask.callbacks import Callback

import portattn as pa
from portattn._paths import _blockwise

# As the backend matrix loads JAX: float64 stays float64 (and int64 int64),
# whichever test module runs first.
jax.config.update("jax_enable_x64", True)

IMPLS = ("materialize", "blockwise", "native", "auto")
GENERIC = ("materialize", "blockwise", "auto")
BS = 10  # two query and two key blocks at L=20, so the blockwise loop really loops
SHAPE = (2, 3, 20, 8)  # (batch, heads, L, d)

# array-api-compat memoises its type and namespace predicates with
# functools.lru_cache (they hold types and flags, never arrays); dynamo warns
# once per such function it traces through, and the suite turns warnings into
# errors. Graph breaks are counted separately (test_dynamo_explain...).
DYNAMO_LRU = "ignore:Dynamo detected a call to a `functools.lru_cache`:UserWarning"
# torch 2.13's dynamo instantiates an autograd.Function while it traces
# Function.apply (blockwise's backward), and torch warns about its own call.
DYNAMO_FUNCTION = "ignore:.*should not be instantiated:DeprecationWarning"


@pytest.fixture
def no_host_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if the blockwise path tries its host-side bound (a sync) on these arrays."""

    def refuse(p: Any, *, xp: Any) -> float:
        raise AssertionError(f"host read of {type(p.q).__name__} arrays under a trace")

    monkeypatch.setattr(_blockwise, "_score_spread", refuse)


def _numpy_case(rng: np.random.Generator) -> dict[str, np.ndarray]:
    b, _, n, _ = SHAPE
    mask = rng.random((b, 1, n, n)) < 0.8
    mask[0, 0, 3] = False  # a row that sees nothing: output 0
    return {
        "q": rng.standard_normal(SHAPE).astype(np.float32),
        "k": rng.standard_normal(SHAPE).astype(np.float32),
        "v": rng.standard_normal(SHAPE).astype(np.float32),
        "mask": mask,
        "bias": rng.standard_normal((n, n)).astype(np.float32),
        "key_lengths": np.array([[n], [13]], dtype=np.int32),
        "query_lengths": np.array([[n], [17]], dtype=np.int32),
    }


def _call(arrays: dict[str, Any], **kw: Any) -> Any:
    opts = {name: arrays[name] for name in arrays if name not in ("q", "k", "v")}
    return pa.attention(arrays["q"], arrays["k"], arrays["v"], **opts, **kw)


def _reference(arrays: dict[str, np.ndarray], **kw: Any) -> np.ndarray:
    """The same call in NumPy float64, materialised: the oracle for every transform."""
    wide = {n: a.astype(np.float64) if a.dtype == np.float32 else a for n, a in arrays.items()}
    kw.pop("block_size", None)
    return np.asarray(_call(wide, impl="materialize", **kw))


# ---------------------------------------------------------------- JAX: jit


SUBSETS = (
    ("q",),
    ("k", "v"),
    ("q", "k", "v"),
    ("mask", "bias"),
    ("key_lengths", "query_lengths"),
    ("q", "k", "v", "mask", "bias", "key_lengths", "query_lengths"),
)


@pytest.mark.usefixtures("no_host_reads")
@pytest.mark.parametrize("impl", IMPLS)
def test_jax_jit_with_any_subset_traced(impl: str, rng: np.random.Generator) -> None:
    case = _numpy_case(rng)
    want = _reference(case, causal=True)
    concrete = {n: jnp.asarray(a) for n, a in case.items()}
    for traced in SUBSETS:

        def f(t: dict[str, Any], traced: tuple[str, ...] = traced) -> Any:
            return _call({**concrete, **t}, impl=impl, causal=True, block_size=BS)

        got = jax.jit(f)({n: concrete[n] for n in traced})
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5, err_msg=f"{traced}")


@pytest.mark.usefixtures("no_host_reads")
@pytest.mark.parametrize("impl", IMPLS)
def test_jax_jit_twice_leaks_no_tracer(impl: str, rng: np.random.Generator) -> None:
    """A second jit of a causal call after a first: no cache holds the first trace's tracer."""
    case = _numpy_case(rng)
    q, k, v = (jnp.asarray(case[n]) for n in "qkv")
    want = _reference({n: case[n] for n in "qkv"}, causal=True)
    with jax.checking_leaks():
        for scale in (None, 0.5):  # two distinct functions, two traces
            f = jax.jit(
                lambda a, b, c, s=scale: pa.attention(
                    a, b, c, impl=impl, causal=True, block_size=BS, scale=s
                )
            )
            got = f(q, k, v)
            if scale is None:
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
        again = jax.jit(
            lambda a, b, c: pa.attention(a, b, c, impl=impl, causal=True, block_size=BS)
        )
        np.testing.assert_allclose(np.asarray(again(q, k, v)), want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------- JAX: vmap


@pytest.mark.parametrize("impl", IMPLS)
def test_jax_vmap_with_none_in_axes(impl: str, rng: np.random.Generator) -> None:
    """Batch over queries with shared keys, and over masks with shared inputs."""
    case = _numpy_case(rng)
    q, k, v = (jnp.asarray(case[n][0]) for n in "qkv")  # (H, L, d)
    per_head = jax.jit(
        jax.vmap(
            lambda a, b, c: pa.attention(a, b, c, impl=impl, causal=True, block_size=BS),
            in_axes=(0, None, None),
        )
    )(q, k[0], v[0])
    for h in range(q.shape[0]):
        want = _reference(
            {"q": case["q"][0, h], "k": case["k"][0, 0], "v": case["v"][0, 0]}, causal=True
        )
        np.testing.assert_allclose(np.asarray(per_head[h]), want, rtol=1e-5, atol=1e-5)

    masks = jnp.asarray(case["mask"][:, 0])  # (B, L, L)
    per_mask = jax.jit(
        jax.vmap(
            lambda m, a, b, c: pa.attention(a, b, c, mask=m, impl=impl, block_size=BS),
            in_axes=(0, None, None, None),
        )
    )(masks, q, k, v)
    for i in range(masks.shape[0]):
        want = _reference(
            {"q": case["q"][0], "k": case["k"][0], "v": case["v"][0], "mask": case["mask"][i, 0]}
        )
        np.testing.assert_allclose(np.asarray(per_mask[i]), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [None, 64], ids=["default-tiles", "small-tiles"])
def test_jax_jit_blockwise_long_sequence(block_size: int | None, rng: np.random.Generator) -> None:
    """jit of blockwise at N=16384: the unrolled loop stays small enough to compile quickly.

    Under a trace the blocks grow to at least N/8 per axis (at most 8 x 8
    tiles), whatever ``block_size`` asks for; the time is printed for the
    record, never asserted.
    """
    n, d = 16384, 64
    q, k, v = (jnp.asarray(rng.standard_normal((n, d), dtype=np.float32)) for _ in range(3))
    f = jax.jit(
        lambda a, b, c: pa.attention(a, b, c, impl="blockwise", causal=True, block_size=block_size)
    )
    t0 = time.perf_counter()
    compiled = f.lower(q, k, v).compile()
    t1 = time.perf_counter()
    out = np.asarray(compiled(q, k, v).block_until_ready())
    t2 = time.perf_counter()
    print(
        f"jit blockwise N={n} block_size={block_size}: compile {t1 - t0:.1f} s, run {t2 - t1:.1f} s"
    )
    rows = np.sort(rng.choice(n, size=32, replace=False))
    qn, kn, vn = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = qn[rows] @ kn.T / np.sqrt(d)
    s[np.arange(n)[None, :] > rows[:, None]] = -np.inf
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    want = (w / w.sum(axis=-1, keepdims=True)) @ vn
    np.testing.assert_allclose(out[rows], want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------ torch.compile


def _torch_inputs(rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
    case = _numpy_case(rng)
    return tuple(torch.tensor(case[n], dtype=torch.float64, requires_grad=True) for n in "qkv")


def _sdpa_grads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True
) -> tuple[torch.Tensor, ...]:
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.pow(2).sum().backward()
    return (out.detach(), *(x.grad for x in (q, k, v)))


@pytest.mark.filterwarnings(DYNAMO_LRU, DYNAMO_FUNCTION)
@pytest.mark.usefixtures("no_host_reads")
@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
@pytest.mark.parametrize("impl", ["materialize", "blockwise", "native"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "plain"])
def test_torch_compile_fullgraph_forward_and_backward(
    impl: str, causal: bool, compiler: str, rng: np.random.Generator
) -> None:
    torch._dynamo.reset()
    q, k, v = _torch_inputs(rng)

    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return pa.attention(a, b, c, impl=impl, causal=causal, block_size=BS)

    out = torch.compile(f, fullgraph=True, backend=compiler)(q, k, v)
    out.pow(2).sum().backward()
    want = _sdpa_grads(q, k, v, causal=causal)
    for got, ref in zip((out, q.grad, k.grad, v.grad), want, strict=True):
        torch.testing.assert_close(got.detach(), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.filterwarnings(DYNAMO_LRU, DYNAMO_FUNCTION)
def test_torch_compile_self_attention_blockwise_backward(rng: np.random.Generator) -> None:
    """One tensor as query, key and value: blockwise's autograd.Function gets it only once."""
    torch._dynamo.reset()
    x = _torch_inputs(rng)[0]
    f = torch.compile(
        lambda a: pa.attention(a, a, a, impl="blockwise", causal=True, block_size=BS),
        fullgraph=True,
        backend="aot_eager",
    )
    f(x).pow(2).sum().backward()
    ref = x.detach().requires_grad_()
    sdpa = torch.nn.functional.scaled_dot_product_attention(ref, ref, ref, is_causal=True)
    sdpa.pow(2).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.filterwarnings(DYNAMO_LRU, DYNAMO_FUNCTION)
@pytest.mark.parametrize("impl", ["materialize", "blockwise", "native", "auto"])
def test_dynamo_explain_one_graph_no_breaks(impl: str, rng: np.random.Generator) -> None:
    torch._dynamo.reset()
    q, k, v = (x.detach() for x in _torch_inputs(rng))
    mask = torch.from_numpy(_numpy_case(rng)["mask"])

    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return pa.attention(a, b, c, mask=m, window=(5, 0), impl=impl, block_size=BS)

    report = torch._dynamo.explain(f)(q, k, v, mask)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons


@pytest.mark.inductor
# inductor itself imports torch.jit pieces that torch 2.13 deprecates
@pytest.mark.filterwarnings(DYNAMO_LRU, DYNAMO_FUNCTION, "ignore::DeprecationWarning")
@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
def test_torch_compile_inductor(impl: str, rng: np.random.Generator) -> None:
    torch._dynamo.reset()
    q, k, v = (x.detach().float().requires_grad_() for x in _torch_inputs(rng))
    f = torch.compile(
        lambda a, b, c: pa.attention(a, b, c, impl=impl, causal=True, block_size=BS), fullgraph=True
    )
    out = f(q, k, v)
    out.pow(2).sum().backward()
    want = _sdpa_grads(*(x.double() for x in (q, k, v)))
    for got, ref in zip((out, q.grad, k.grad, v.grad), want, strict=True):
        torch.testing.assert_close(got.detach().double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_torch_meta_and_fake_tensors_give_shapes(impl: str) -> None:
    """Value-less tensors (shape inference, FSDP init) run every path without a host read."""
    q = torch.empty(2, 300, 8, device="meta")  # above auto's switch to blockwise
    v = torch.empty(2, 300, 4, device="meta")
    out = pa.attention(
        q,
        q,
        v,
        impl=impl,
        causal=True,
        key_lengths=torch.empty(2, dtype=torch.int64, device="meta"),
    )
    assert out.shape == (2, 300, 4)
    assert out.device.type == "meta"
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fq = torch.empty(2, 300, 8)
        assert pa.attention(fq, fq, fq, impl=impl).shape == (2, 300, 8)


# ---------------------------------------------------------------------- dask


class _ComputeCounter(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.computes = 0

    def _start(self, dsk: Any) -> None:
        self.computes += 1


@pytest.mark.parametrize("impl", GENERIC)
@pytest.mark.parametrize("opts", ["plain", "causal_mask_lengths"])
def test_dask_stays_lazy(impl: str, opts: str, rng: np.random.Generator) -> None:
    case = {
        n: a.astype(np.float64) if a.dtype == np.float32 else a for n, a in _numpy_case(rng).items()
    }
    if opts == "plain":
        case = {n: case[n] for n in "qkv"}
    kw: dict[str, Any] = {"causal": True} if opts != "plain" else {}
    chunks = {"q": (1, 3, 20, 8), "k": (1, 3, 20, 8), "v": (1, 3, 20, 8), "mask": (1, 1, 20, 20)}
    lazy = {n: da.from_array(a, chunks=chunks.get(n, a.shape)) for n, a in case.items()}
    with dask.config.set(scheduler="sync"), _ComputeCounter() as counter:
        out = _call(lazy, impl=impl, block_size=BS, **kw)
        assert counter.computes == 0, f"{counter.computes} compute() during the call"
    assert isinstance(out, da.Array)
    assert out.chunks[:2] == lazy["q"].chunks[:2]  # batch axes keep the input chunks
    np.testing.assert_allclose(out.compute(), _reference(case, **kw), rtol=1e-12, atol=1e-12)


def test_dask_unknown_chunk_sizes_are_refused_clearly() -> None:
    x = da.ones((4, 6, 8), chunks=2)
    unknown = x[x[:, 0, 0] > 0]  # shape (nan, 6, 8)
    with pytest.raises(ValueError, match=r"compute_chunk_sizes\(\)"):
        pa.attention(unknown, unknown, unknown)


# -------------------------------------------------------------------- ndonnx


def _export(case: dict[str, np.ndarray], **kw: Any) -> np.ndarray:
    args = {
        n: ndx.argument(shape=a.shape, dtype=ndx.from_numpy_dtype(a.dtype)) for n, a in case.items()
    }
    model = ndx.build(args, {"out": _call(args, **kw)})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, case)
    return np.asarray(out)


# ndonnx builds its graph with value propagation (spox runs onnxruntime on
# every constant subgraph), so each tile costs seconds: two query and two key
# blocks (block_size=BS=10 at L=20) keep the blockwise loop a loop and the test
# short. auto goes blockwise above 256 x 256 pairs only, so here it materialises.
NDONNX_CASES = [
    ("materialize", "plain"),
    ("materialize", "everything"),
    ("blockwise", "plain"),
    ("blockwise", "everything"),
    ("auto", "causal"),
]


@pytest.mark.usefixtures("no_host_reads")
@pytest.mark.parametrize(("impl", "opts"), NDONNX_CASES)
def test_ndonnx_export_runs_in_onnxruntime(impl: str, opts: str, rng: np.random.Generator) -> None:
    """A static-shape export agrees with NumPy float64 to 1e-6 (inputs float32)."""
    case = _numpy_case(rng)
    if opts != "everything":
        case = {n: case[n] for n in "qkv"}
    kw: dict[str, Any] = {} if opts == "plain" else {"causal": True}
    got = _export(case, impl=impl, block_size=BS, **kw)
    np.testing.assert_allclose(got, _reference(case, **kw), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dim", [None, "N"])
def test_ndonnx_dynamic_dimensions_are_refused_clearly(dim: str | None) -> None:
    q = ndx.argument(shape=(dim, 20, 8), dtype=ndx.float32)
    with pytest.raises(ValueError, match="static shape"):
        pa.attention(q, q, q)


def test_subsets_cover_every_array() -> None:
    """The jit subsets trace each array at least once, and all of them together."""
    assert set(itertools.chain(*SUBSETS)) == set(_numpy_case(np.random.default_rng(0)))
