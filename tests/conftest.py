"""The backend matrix.

``PORTATTN_BACKENDS=numpy,torch`` chooses backends; a backend that was asked
for and cannot be imported, or has no device, fails the run. With the
variable unset, every known backend is parametrized and those that cannot run
here skip, each with its reason.

Tests ask for the ``backend`` fixture (a :class:`Backend`) and build inputs
with ``backend.asarray(numpy_array)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from portattn.testing import assert_close, backends, load_backend

KNOWN = tuple(b.name for b in backends())  # the one list, shared with the docs and the CLI
ENV = "PORTATTN_BACKENDS"


@dataclass
class Backend:
    """One array library on one device, as the tests see it."""

    name: str
    xp: ModuleType  # the array API namespace (array-api-compat wrapper where needed)
    device: Any
    half_dtypes: tuple[Any, ...] = ()
    _convert: Callable[[np.ndarray], Any] = field(default=lambda a: a, repr=False)

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """Move NumPy data here; ``dtype`` is one of this backend's dtypes."""
        a = np.asarray(a)
        if dtype is None:
            return self._convert(a)
        if a.dtype.kind == "f":
            arr = self._convert(a.astype(np.float64))
            return self.xp.astype(arr, dtype)
        return self.xp.astype(self._convert(a), dtype)

    @property
    def float_dtypes(self) -> tuple[Any, ...]:
        return (self.xp.float32, self.xp.float64, *self.half_dtypes)

    def __str__(self) -> str:
        return self.name


def _load(name: str) -> Backend:
    """Import a backend or raise ImportError/RuntimeError saying why it cannot run."""
    got = load_backend(name)
    return Backend(name, got.xp, got.device, got.half_dtypes, got.from_numpy)


def requested() -> tuple[str, ...] | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        msg = f"{ENV} names unknown backends {unknown}; known: {', '.join(KNOWN)}"
        raise pytest.UsageError(msg)
    return names


def needs(module: str, backend: str) -> None:
    """Import ``module`` for a test; absent, it fails the run that asks for ``backend`` (or
    for every backend, by naming none) and skips the others."""
    asked = os.environ.get(ENV)
    try:
        __import__(module)
    except ImportError:
        if asked is None or backend in asked.split(","):
            raise
        pytest.skip(f"{module} is not installed and {ENV} does not ask for {backend}")


_CACHE: dict[str, Backend | BaseException] = {}


def get_backend(name: str) -> Backend:
    """The backend, or a failure (asked for) / a skip with the reason (not asked for)."""
    if name not in _CACHE:
        try:
            _CACHE[name] = _load(name)
        except (ImportError, RuntimeError, AttributeError) as exc:
            _CACHE[name] = exc
    got = _CACHE[name]
    if isinstance(got, Backend):
        return got
    if requested() is not None:
        pytest.fail(f"backend {name!r} was requested in {ENV} but cannot run: {got}")
    pytest.skip(f"{name}: {got}")


def backend_names() -> tuple[str, ...]:
    return requested() or KNOWN


def pytest_configure(config: pytest.Config) -> None:
    requested()  # refuse unknown names before collecting anything


# The optional libraries that test modules import at module level, and the
# backends whose request makes each one required. A library that no backend
# names (dask, transformers, ...) is required by any run that sets
# PORTATTN_BACKENDS (every nox session installs the whole test group); the
# docs' libraries are required when PORTATTN_SITE_DIR points at a built site.
OPTIONAL: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "jax": ("jax", "jax32"),
    "array_api_strict": ("array_api_strict",),
    **dict.fromkeys(
        ("dask", "distributed", "hypothesis", "ndonnx", "onnxruntime", "transformers"), ()
    ),
}
SITE_ONLY = ("griffe", "mkdocs", "playwright")


def optional_absent(exc: BaseException | None) -> str | None:
    """Why a module that failed to import may skip: an optional library absent and not asked for."""
    if not isinstance(exc, ImportError) or exc.name is None:
        return None
    root = exc.name.split(".")[0]
    asked = requested()
    if root in SITE_ONLY:
        if os.environ.get("PORTATTN_SITE_DIR"):
            return None
        return f"{root} is not installed (the docs group; `nox -s docs` runs these tests)"
    if root not in OPTIONAL:
        return None
    by = OPTIONAL[root]
    if asked is not None and (not by or set(by) & set(asked)):
        return None
    wanted = f" and {ENV} does not ask for {'/'.join(by)}" if by else f" and {ENV} is unset"
    return f"{root} is not installed{wanted}"


class OptionalModule(pytest.Module):
    """A test module that skips, with the reason, when an optional library it imports is absent.

    An absent library that the run asked for stays a collection error.
    """

    def _getobj(self) -> Any:
        try:
            return super()._getobj()
        except pytest.Collector.CollectError as exc:
            reason = optional_absent(exc.__cause__)
            if reason is None:
                raise
            raise pytest.skip.Exception(reason, allow_module_level=True) from None


def pytest_pycollect_makemodule(module_path: Any, parent: Any) -> pytest.Module:
    return OptionalModule.from_parent(parent, path=module_path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test that imports an optional library inside skips by the same rule as a module."""
    try:
        return (yield)
    except ImportError as exc:
        reason = optional_absent(exc)
        if reason is None:
            raise
        pytest.skip(reason)


def pytest_report_header(config: pytest.Config) -> str:
    req = requested()
    return f"portattn backends: {', '.join(backend_names())}" + (
        f" (from {ENV})" if req else f" ({ENV} unset: unavailable ones skip)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        names = backend_names()
        if metafunc.definition.get_closest_marker("jax32") is None:
            # JAX with x64 off runs the tests about integer and float widths
            # only: the whole suite twice on eager JAX is too slow for CI.
            names = tuple(n for n in names if n != "jax32")
        metafunc.parametrize("backend_name", names)


@pytest.fixture
def backend(backend_name: str) -> Iterator[Backend]:
    got = get_backend(backend_name)
    if not backend_name.startswith("jax"):
        yield got
        return
    # Per test, as JAX's config is global: "jax" with x64, "jax32" without.
    with jax_x64(backend_name == "jax"):
        yield got


def jax_x64(on: bool) -> Any:
    """JAX's context manager for 64-bit mode: ``jax.enable_x64`` where it exists (JAX 0.7+),
    ``jax.experimental.enable_x64``/``disable_x64`` before (JAX 0.6.2 is the last on Python 3.10).
    """
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(on)
    from jax import experimental

    return experimental.enable_x64() if on else experimental.disable_x64()


@pytest.fixture
def xp(backend: Backend) -> ModuleType:
    return backend.xp


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261130)


def rtol_for(backend: Backend, dtype: Any) -> float:
    """The agreement bounds the core issue sets, by precision."""
    if dtype == backend.xp.float64:
        return 1e-12
    if dtype == backend.xp.float32:
        return 1e-5
    return 1e-2


def assert_close_on(
    backend: Backend, actual: Any, desired: Any, /, *, dtype: Any, **kwargs: Any
) -> None:
    """``actual`` is in ``backend``'s namespace, on its device, in ``dtype``, and agrees with
    ``desired`` to ``dtype``'s bound (:func:`rtol_for`); ``kwargs`` go to ``assert_close``."""
    assert_close(
        actual,
        desired,
        rtol=rtol_for(backend, dtype),
        xp=backend.xp,
        dtype=dtype,
        device=backend.device,
        **kwargs,
    )


def option_arrays(
    backend: Backend, rng: np.random.Generator, options: dict[str, Any], lq: int, lk: int
) -> dict[str, Any]:
    """``options`` with the placeholders "m", "b", "kl" and "ql" made arrays on ``backend``.

    For a batch of 2 and (Lq, Lk) pairs: "m" a (2, 1, Lq, Lk) boolean mask
    with a fully hidden row, "b" an (Lq, Lk) float32 bias, "kl" and "ql" key
    and query lengths (the first sequence full, the second short). Other
    values pass through, so a table of cases can name arrays it cannot hold.
    """
    mask = rng.random((2, 1, lq, lk)) < 0.6
    mask[0, 0, 1] = False  # a fully hidden row
    table = {
        "m": backend.asarray(mask),
        "b": backend.asarray(rng.standard_normal((lq, lk)), backend.xp.float32),
        "kl": backend.asarray(np.array([[lk], [2]])),
        "ql": backend.asarray(np.array([[lq], [3]])),
    }
    return {k: table.get(v, v) if isinstance(v, str) else v for k, v in options.items()}


def make_qkv(
    rng: np.random.Generator,
    /,
    lq: int,
    lk: int | None = None,
    *,
    d: int,
    dv: int | None = None,
    batch: tuple[int, ...] = (),
    backend: Backend | None = None,
    dtype: Any = None,
    draw_dtype: Any = np.float64,
) -> tuple[Any, Any, Any]:
    """Query (*batch, lq, d), key (*batch, lk, d) and value (*batch, lk, dv), drawn in that order.

    Standard normals from ``rng`` (``draw_dtype`` is NumPy's; ``lk`` defaults
    to ``lq``, ``dv`` to ``d``), as NumPy arrays, or moved to ``backend`` in
    ``dtype`` when one is given. The one q/k/v builder of the suite: drawing
    in one fixed order keeps every test's numbers the same wherever it lives.
    """
    lk = lq if lk is None else lk
    dv = d if dv is None else dv
    shapes = ((*batch, lq, d), (*batch, lk, d), (*batch, lk, dv))
    drawn = tuple(rng.standard_normal(s, dtype=draw_dtype) for s in shapes)
    if backend is None:
        return drawn  # type: ignore[return-value]
    return tuple(backend.asarray(a, dtype) for a in drawn)  # type: ignore[return-value]


def impls_for(backend: Backend) -> tuple[str, ...]:
    """The generic impls, and "native" where the library has a kernel of its own (torch, JAX)."""
    generic = ("materialize", "blockwise")
    kernels = ("torch", "torch_cuda", "jax", "jax32")
    return (*generic, "native") if backend.name in kernels else generic


def jitted(backend: Backend, fn: Callable[..., Any], /, **jit_options: Any) -> Callable[..., Any]:
    """``fn`` under ``jax.jit`` on JAX, ``fn`` itself elsewhere.

    Eager JAX compiles every operation for every new shape: a warm persistent
    cache still lowers and loads each one (tens of ms of CPU), and one
    attention call on the blockwise path is dozens of them. Under ``jax.jit``
    the whole call is one program: one lowering, one load. ``jit_options``
    go to ``jax.jit`` (``static_argnums``, ...).
    """
    if not backend.name.startswith("jax"):
        return fn
    import jax

    return jax.jit(fn, **jit_options)


@pytest.fixture(autouse=True)
def _no_plans_from_other_tests():
    """Every test starts with no memoised plan or decision.

    A repeat call of the same shapes would otherwise take its shortcut from a
    plan an earlier test in the same worker left, and what a test sees (which
    path ran, how many validations, a rule constant it patched) would depend
    on the order the tests ran in.
    """
    from portattn._paths import _auto

    _auto.forget_plans()
