"""Assertions for checking attention results across array libraries, and what to check on.

:func:`assert_close` first checks that the result is in the namespace, dtype,
shape and device the caller expects, and only then compares values, so a test
cannot pass because both sides were silently NumPy. :func:`backends` and
:func:`load_backend` are the libraries portattn is tested on, and
:func:`dask_schedule` says which tasks a lazy dask result will run.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._lib._backends import BACKENDS, BackendSpec, Loaded, load
from ._lib._checks import check_real, dtype_name, shown
from ._lib._compat import array_namespace, device_of, is_array_api_obj, resolve_namespace
from ._lib._convert import to_numpy
from ._lib._typing import Array, Device, DType, Namespace

__all__ = [
    "BackendSpec",
    "DaskSchedule",
    "Loaded",
    "assert_close",
    "backends",
    "dask_schedule",
    "load_backend",
    "max_relative_error",
    "to_numpy",
]


def _reference(name: str, x: object) -> np.ndarray:
    """An array from any library, or nested lists / numbers, as a NumPy array."""
    if is_array_api_obj(x):
        return to_numpy(x)
    if isinstance(x, (numbers.Real, Sequence)) and not isinstance(x, (str, bytes, bool)):
        try:
            ref = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            pass
        else:
            if not isinstance(x, np.ma.MaskedArray):
                return ref
    msg = (
        f"expected {name} to be an array, a (nested) list of real numbers or a real number, "
        f"got {shown(x)}"
    )
    raise TypeError(msg)


def max_relative_error(actual: Array, desired: Array) -> float:
    """``max |a - d| / max(max |d|, tiny)``, computed in float64 NumPy.

    Normalising by the largest reference magnitude (not elementwise) keeps
    entries that are near zero by cancellation from dominating. Either
    argument may be an array from any library or a (nested) list of numbers.
    """
    a = _reference("actual", actual).astype(np.float64)
    d = _reference("desired", desired).astype(np.float64)
    if a.shape != d.shape:
        msg = f"shapes differ: {a.shape} vs {d.shape}"
        raise AssertionError(msg)
    if a.size == 0:
        return 0.0
    denom = max(float(np.max(np.abs(d))), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(a - d))) / float(denom)


def assert_close(
    actual: Array,
    desired: Array,
    /,
    *,
    rtol: float,
    xp: Namespace | None = None,
    dtype: DType | None = None,
    device: Device | None = None,
    shape: tuple[int, ...] | None = None,
) -> None:
    """Assert that ``actual`` lives where expected and matches ``desired`` to ``rtol``.

    Parameters
    ----------
    actual : array
        The result under test.
    desired : array or nested list of numbers
        Reference values, from any library (often float64 NumPy), or a
        plain list such as ``[1.0, 2.0]``.
    rtol : float
        Bound on :func:`max_relative_error`, a real number >= 0.

    Raises
    ------
    AssertionError
        ``actual`` is not where it should be, or not close enough.
    TypeError
        ``actual`` is not an array (it is the result under test, so a list
        there means the code under test returned the wrong kind of object),
        or ``desired`` is neither an array nor numbers.
    ValueError
        ``rtol`` is not a finite real number >= 0.
    xp, dtype, device, shape : optional
        When given, ``actual`` must have exactly this namespace, dtype,
        device and shape; ``shape`` defaults to ``desired``'s shape.

    Examples
    --------
    >>> import numpy as np
    >>> from portattn.testing import assert_close
    >>> assert_close(np.asarray([1.0, 2.0]), [1.0, 2.0], rtol=0, xp=np, dtype=np.float64)
    >>> assert_close(np.asarray([1.0, 2.0], dtype=np.float32), [1.0, 2.0], rtol=0, dtype=np.float64)
    Traceback (most recent call last):
    AssertionError: expected dtype float64, got float32
    """
    if not is_array_api_obj(actual):
        msg = f"expected actual to be an array from an array API library, got {shown(actual)}"
        raise TypeError(msg)
    tol = check_real("rtol", rtol, minimum=0.0)
    ref = _reference("desired", desired)
    got_xp = array_namespace(actual)
    if xp is not None and got_xp is not resolve_namespace(xp):
        msg = f"expected an array from {xp.__name__}, got one from {got_xp.__name__}"
        raise AssertionError(msg)
    if dtype is not None and not _same_dtype(actual.dtype, dtype):
        msg = f"expected dtype {dtype_name(dtype)}, got {dtype_name(actual.dtype)}"
        raise AssertionError(msg)
    if device is not None:
        got = device_of(actual)
        if got != device:
            msg = f"expected device {device}, got {got}"
            raise AssertionError(msg)
    want_shape = tuple(ref.shape) if shape is None else tuple(shape)
    if tuple(actual.shape) != want_shape:
        msg = f"expected shape {want_shape}, got {tuple(actual.shape)}"
        raise AssertionError(msg)
    a = to_numpy(actual)
    if a.dtype.kind == "f" and np.isnan(a).any():
        msg = "result contains NaN"
        raise AssertionError(msg)
    err = max_relative_error(a, ref)
    if not err <= tol:
        msg = f"max relative error {err:.3e} exceeds rtol {tol:.1e}"
        raise AssertionError(msg)


def _same_dtype(a: DType, b: DType) -> bool:
    # np.dtype("float64") == None is True, so never compare against None.
    if a is None or b is None:
        return a is b
    return bool(a == b)


def backends() -> tuple[BackendSpec, ...]:
    """Every array library portattn is tested and documented on, installed here or not.

    The one list that the test matrix (``PORTATTN_BACKENDS``), the docs'
    backend table and ``python -m portattn`` read. Nothing is imported: see
    :func:`load_backend`.

    Returns
    -------
    tuple of BackendSpec
        In a fixed order. Each names the library (``name`` as in
        ``PORTATTN_BACKENDS``, ``label`` for people), its kind of device, the
        distribution whose version reports show and the floating dtypes
        portattn accepts there; ``variant`` marks another way of holding one
        library's arrays (read-only NumPy).

    Examples
    --------
    >>> from portattn.testing import backends
    >>> [b.name for b in backends()][:3]
    ['numpy', 'numpy_readonly', 'torch']
    """
    return BACKENDS


def load_backend(name: str) -> Loaded:
    """Import the backend called ``name`` and say how to put arrays on it.

    Parameters
    ----------
    name : str
        A ``name`` from :func:`backends`, such as ``"torch"``.

    Returns
    -------
    Loaded
        ``xp`` (the array API namespace), ``device``, ``half_dtypes`` (its
        float16/bfloat16, where it has them) and ``from_numpy`` (a NumPy
        array's values as an array of this library on ``device``).

    Raises
    ------
    ValueError
        ``name`` is not a known backend.
    ImportError
        The library is not installed.
    RuntimeError
        It cannot run here, such as a CUDA backend without a CUDA device.

    Examples
    --------
    >>> import numpy as np
    >>> from portattn.testing import load_backend
    >>> readonly = load_backend("numpy_readonly")
    >>> readonly.from_numpy(np.ones((2, 3))).flags.writeable
    False
    """
    return load(name)


@dataclass(frozen=True)
class DaskSchedule:
    """The tasks a lazy attention result on dask arrays will run (see :func:`dask_schedule`).

    Attributes
    ----------
    pairs : frozenset of (int, int)
        The (query chunk, key chunk) pairs that get a task; pairs that
        ``causal``, ``window`` or lengths hide entirely get none.
    pair_tasks : int
        Pair tasks over every batch block.
    merge_tasks : int
        Tasks that merge partial results through their log-sum-exp.
    tasks : int
        The result's own tasks in all: pairs, merges and output chunks
        (the inputs' tasks are not counted).
    """

    pairs: frozenset[tuple[int, int]]
    pair_tasks: int
    merge_tasks: int
    tasks: int


def dask_schedule(result: Any, /) -> DaskSchedule:
    """Read the schedule of ``pa.attention`` on dask arrays from its graph, without computing it.

    Parameters
    ----------
    result : dask array
        What :func:`portattn.attention` returned for dask inputs (the output,
        not yet computed).

    Returns
    -------
    DaskSchedule
        Which (query chunk, key chunk) pairs run, and how many tasks.

    Examples
    --------
    Needs dask (tests/test_dask.py runs the same), so the example is
    skipped where doctests run on NumPy alone:

    >>> import dask.array as da  # doctest: +SKIP
    >>> import portattn as pa
    >>> from portattn.testing import dask_schedule
    >>> x = da.ones((1, 8, 4), chunks=(1, 4, 4))  # doctest: +SKIP
    >>> sorted(dask_schedule(pa.attention(x, x, x, causal=True)).pairs)  # doctest: +SKIP
    [(0, 0), (1, 0), (1, 1)]
    """
    from ._paths._dask import _merge, _pair, _Tile

    graph = dict(result.__dask_graph__())
    found = [t for t in graph.values() if isinstance(t, tuple) and t]
    pair_tasks = [t for t in found if t[0] is _pair]
    # the tile is found by its type, not its place, so _pair's signature may change
    tiles = [next(a for a in t[1:] if isinstance(a, _Tile)) for t in pair_tasks]
    return DaskSchedule(
        pairs=frozenset(tile.index for tile in tiles),
        pair_tasks=len(pair_tasks),
        merge_tasks=sum(1 for t in found if t[0] is _merge),
        tasks=sum(1 for key in graph if str(key[0]).startswith("attention-")),
    )
