"""Which program transforms each path survives: every cell is a call run while the site builds.

Rows are a capability of one library (torch autograd, ``torch.compile``,
``jax.grad``/``jit``/``vmap``, dask laziness, an ndonnx export); columns are
``impl=``. A cell passes when the call runs under the transform and its result
(and gradients, where there are any) agree with an outside reference: torch
SDPA's float64 gradients, ``jax.nn.dot_product_attention``'s gradients, or
NumPy float64. Shapes are tiny (the whole table takes seconds) but every
blockwise call uses several query and key blocks, so its loop really loops.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

import portattn as pa

from .diskcache import cache_dir, code_key, write_atomic

__all__ = ["CAPABILITIES", "IMPLS", "Cell", "capability_markdown", "run_table"]

IMPLS = ("materialize", "blockwise", "native", "auto")
SHAPE = (2, 2, 8, 4)  # (batch, heads, L, d)
BLOCK = 4  # two query blocks and two key blocks at L=8
LIBRARIES = ("torch", "jax", "jaxlib", "dask", "ndonnx", "onnxruntime", "numpy")


@dataclass(frozen=True)
class Cell:
    """The outcome of one capability on one path."""

    status: str  # "yes", "no", "refused"
    detail: str = ""

    @property
    def markdown(self) -> str:
        mark = {"yes": "✓", "no": "✗", "refused": "—"}[self.status]
        return f"{mark} {self.detail}".strip()


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(12)
    return {n: rng.standard_normal(SHAPE) for n in "qkv"}


def _reference(a: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(pa.attention(a["q"], a["k"], a["v"], causal=True, impl="materialize"))


def _close(got: Any, want: Any, tol: float) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    err = float(np.max(np.abs(got - want)))
    if not err <= tol:
        raise AssertionError(f"differs by {err:.1e}")


# ----------------------------------------------------------------- torch


def _torch_check(impl: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> str:
    import torch

    a = _inputs()
    q, k, v = (torch.tensor(a[n], requires_grad=True) for n in "qkv")
    f = wrap(lambda x, y, z: pa.attention(x, y, z, impl=impl, causal=True, block_size=BLOCK))
    out = f(q, k, v)
    out.pow(2).sum().backward()
    rq, rk, rv = (torch.tensor(a[n], requires_grad=True) for n in "qkv")
    ref = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, is_causal=True)
    ref.pow(2).sum().backward()
    for got, want in ((out, ref), (q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        _close(got.detach(), want.detach(), 1e-10)
    return "grads = SDPA's"


def _torch_autograd(impl: str) -> str:
    return _torch_check(impl, lambda f: f)


def _torch_compile(backend: str) -> Callable[[str], str]:
    def run(impl: str) -> str:
        import torch
        from torch._dynamo.utils import counters

        # The graphs are counted as dynamo hands them to the backend, during
        # the very compile whose values and gradients are checked: a second
        # trace by torch._dynamo.explain cost as much again and showed nothing
        # more. fullgraph=True raises on a break; the counter says so too.
        inner = torch._dynamo.lookup_backend(backend)
        graphs: list[object] = []

        def counting(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
            graphs.append(gm)
            return inner(gm, example_inputs, **kwargs)

        torch._dynamo.reset()
        counters.clear()
        _torch_check(impl, lambda f: torch.compile(f, fullgraph=True, backend=counting))
        if not graphs:  # the call ran, but not through the backend: nothing was compiled
            raise AssertionError("dynamo handed the backend no graph")
        breaks = sum(counters["graph_break"].values())
        return f"{len(graphs)} graph, {breaks} breaks"

    return run


# ------------------------------------------------------------------- JAX


def _jax_arrays(dtype: str = "float32") -> tuple[Any, ...]:
    import jax.numpy as jnp

    a = _inputs()
    return tuple(jnp.asarray(a[n], dtype=dtype) for n in "qkv")


def _jax_grad(impl: str) -> str:
    import jax

    q, k, v = _jax_arrays()

    def loss(f: Callable[..., Any]) -> Callable[..., Any]:
        return lambda x, y, z: (f(x, y, z) ** 2).sum()

    got = jax.grad(
        loss(lambda x, y, z: pa.attention(x, y, z, impl=impl, causal=True, block_size=BLOCK)),
        argnums=(0, 1, 2),
    )(q, k, v)

    def ref(x: Any, y: Any, z: Any) -> Any:  # (B, H, L, d) -> JAX's (B, L, H, d)
        t = (1, 2)
        out = jax.nn.dot_product_attention(
            x.swapaxes(*t), y.swapaxes(*t), z.swapaxes(*t), is_causal=True
        )
        return out.swapaxes(*t)

    want = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        _close(g, w, 1e-4)
    return "grads = jax.nn's"


def _jax_jit(impl: str) -> str:
    import jax

    q, k, v = _jax_arrays()
    f = jax.jit(lambda x, y, z: pa.attention(x, y, z, impl=impl, causal=True, block_size=BLOCK))
    _close(f(q, k, v), _reference(_inputs()), 1e-5)
    return ""


def _jax_vmap(impl: str) -> str:
    import jax

    q, k, v = _jax_arrays()
    f = jax.jit(
        jax.vmap(
            lambda x, y, z: pa.attention(x, y, z, impl=impl, causal=True, block_size=BLOCK),
            in_axes=(0, None, None),
        )
    )
    a = _inputs()
    want = _reference({"q": a["q"], "k": a["k"][:1], "v": a["v"][:1]})
    _close(f(q, k[0], v[0]), want, 1e-5)
    return "in_axes=(0, None, None)"


# ------------------------------------------------------------ dask, ndonnx


def _dask_lazy(impl: str) -> str:
    import dask.array as da
    from dask.callbacks import Callback

    computes = []

    class Count(Callback):  # type: ignore[misc]
        def _start(self, dsk: Any) -> None:
            computes.append(1)

    a = _inputs()
    lazy = {n: da.from_array(x, chunks=(1, 2, 8, 4)) for n, x in a.items()}
    with Count():
        out = pa.attention(
            lazy["q"], lazy["k"], lazy["v"], impl=impl, causal=True, block_size=BLOCK
        )
    if computes:
        raise AssertionError(f"{len(computes)} compute() during the call")
    if out.chunks[0] != lazy["q"].chunks[0]:
        raise AssertionError(f"batch chunks {out.chunks[0]}, input {lazy['q'].chunks[0]}")
    _close(out.compute(), _reference(a), 1e-12)
    return "0 computes"


def _ndonnx_export(impl: str) -> str:
    import ndonnx as ndx
    import onnxruntime as ort

    a = {n: x.astype(np.float32) for n, x in _inputs().items()}
    args = {n: ndx.argument(shape=SHAPE, dtype=ndx.float32) for n in "qkv"}
    out = pa.attention(args["q"], args["k"], args["v"], impl=impl, causal=True, block_size=BLOCK)
    model = ndx.build(args, {"out": out})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, a)
    want = _reference({n: x.astype(np.float64) for n, x in a.items()})
    err = float(np.max(np.abs(got - want)))
    _close(got, want, 1e-6)
    return f"max dev {err:.0e}"


CAPABILITIES: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("torch autograd (float64)", _torch_autograd),
    ('torch.compile, backend "eager", fullgraph', _torch_compile("eager")),
    ('torch.compile, backend "aot_eager", fullgraph', _torch_compile("aot_eager")),
    ("jax.grad (float32)", _jax_grad),
    ("jax.jit", _jax_jit),
    ("jax.vmap", _jax_vmap),
    ("dask: stays lazy", _dask_lazy),
    ("ndonnx: export to ONNX, run in onnxruntime", _ndonnx_export),
)


def _run_cell(fn: Callable[[str], str], impl: str) -> Cell:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Cell("yes", fn(impl))
    except NotImplementedError as exc:
        return Cell("refused", _first_clause(str(exc)))
    except ModuleNotFoundError:
        # A library missing from the docs environment is a broken build, not a
        # finding about portattn: pyproject's docs group installs every one.
        raise
    except Exception as exc:  # a failing cell is the finding; it is shown, not raised
        return Cell("no", f"{type(exc).__name__}: {_first_clause(str(exc))}")


def _first_clause(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.split(";")[0][:90]


Table = tuple[tuple[tuple[str, tuple[Cell, ...]], ...], float]


def _compute() -> Table:
    import jax

    jax.config.update("jax_enable_x64", True)  # as portattn's backend list loads it
    t0 = time.perf_counter()
    rows = tuple((name, tuple(_run_cell(fn, impl) for impl in IMPLS)) for name, fn in CAPABILITIES)
    return rows, time.perf_counter() - t0


@cache
def run_table() -> Table:
    """Every cell, and the seconds the whole table took when it was computed.

    The table costs minutes of CPU under load (torch.compile and XLA compile
    every cell), and depends only on code: it is kept on disk, keyed by this
    file, portattn's source and the versions of the libraries it runs.
    """
    path = cache_dir("capabilities") / f"{code_key(__file__, libraries=LIBRARIES)}.json"
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        rows = tuple((n, tuple(Cell(*c) for c in cells)) for n, cells in stored["rows"])
        return rows, stored["seconds"]
    rows, seconds = _compute()
    plain = [[n, [[c.status, c.detail] for c in cells]] for n, cells in rows]
    write_atomic(path, json.dumps({"rows": plain, "seconds": seconds}).encode())
    return rows, seconds


_WORDS = {
    "en": {
        "capability": "capability",
        "footer": (
            "{cells} cells, each a causal call on (batch {b}, heads {h}, L {n}, d {d}) with "
            "`block_size={block}`, computed in {seconds:.0f} s (kept on disk until portattn, "
            "this table's code or a library's version changes). ✓: ran under the transform "
            "and agreed with the reference; —: refused by design with `NotImplementedError` "
            "(the reason is shown); ✗: failed."
        ),
    },
    "ja": {
        "capability": "機能",
        "footer": (
            "セルは {cells} 個。どれも (バッチ {b}, ヘッド {h}, L {n}, d {d}) の因果マスクつきの"
            "呼び出しで、`block_size={block}`。計算にかかった時間は {seconds:.0f} 秒"
            "(portattn、この表のコード、ライブラリのバージョンのどれかが変わるまでディスクに"
            "保存して使い回す)。✓: 変換の下で動き、基準と一致した。—: 設計上"
            " `NotImplementedError` で断る(理由を示す)。✗: 失敗した。"
        ),
    },
}


# The Japanese table: row names, and each cell's detail by the pattern the
# checks above write it in. A refusal's reason is portattn's own message and
# stays as it is, in code type; a detail no pattern knows fails the build.
_ROWS_JA = {
    "torch autograd (float64)": "torch の自動微分(float64)",
    'torch.compile, backend "eager", fullgraph': 'torch.compile、backend "eager"、fullgraph',
    'torch.compile, backend "aot_eager", fullgraph': (
        'torch.compile、backend "aot_eager"、fullgraph'
    ),
    "jax.grad (float32)": "jax.grad(float32)",
    "jax.jit": "jax.jit",
    "jax.vmap": "jax.vmap",
    "dask: stays lazy": "dask: 遅延のまま",
    "ndonnx: export to ONNX, run in onnxruntime": "ndonnx: ONNX に書き出し、onnxruntime で実行",
}
_DETAILS_JA: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^$"), ""),
    (re.compile(r"^grads = (\S+)'s$"), r"勾配が \1 と一致"),
    (re.compile(r"^(\d+) graph, (\d+) breaks$"), r"グラフ \1 個、分断 \2 回"),
    (re.compile(r"^(\d+) computes$"), r"compute \1 回"),
    (re.compile(r"^max dev (\S+)$"), r"最大のずれ \1"),
    (re.compile(r"^(in_axes=.*)$"), r"`\1`"),
)


def _cell_markdown(cell: Cell, lang: str) -> str:
    if lang == "en":
        return cell.markdown
    mark = {"yes": "✓", "no": "✗", "refused": "—"}[cell.status]
    if cell.status != "yes":  # portattn's or the library's own message, quoted
        return f"{mark} `{cell.detail}`" if cell.detail else mark
    for pattern, words in _DETAILS_JA:
        if pattern.match(cell.detail):
            return f"{mark} {pattern.sub(words, cell.detail)}".strip()
    raise ValueError(f"no Japanese for the capability detail {cell.detail!r}")


def capability_markdown(*, lang: str = "en") -> str:
    """The table as Markdown, with the time it took to compute."""
    rows, seconds = run_table()
    w = _WORDS[lang]
    names = _ROWS_JA if lang == "ja" else {name: name for name, _ in CAPABILITIES}
    lines = [
        f"| {w['capability']} | " + " | ".join(f"`{i}`" for i in IMPLS) + " |",
        "| --- |" + " --- |" * len(IMPLS),
    ]
    lines += [
        f"| {names[name]} | " + " | ".join(_cell_markdown(c, lang) for c in cells) + " |"
        for name, cells in rows
    ]
    b, h, n, d = SHAPE
    footer = w["footer"].format(
        cells=len(rows) * len(IMPLS), b=b, h=h, n=n, d=d, block=BLOCK, seconds=seconds
    )
    lines += ["", footer]
    return "\n".join(lines)
