"""The one list of backends portattn is tested, documented and demonstrated on.

The test matrix (``PORTATTN_BACKENDS``), the docs' backend table and
``python -m portattn`` all read :data:`BACKENDS` and :func:`load`, so adding a
library here adds it everywhere. Loading imports the library only when asked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._typing import Array, Device, Namespace

__all__ = ["BACKENDS", "BackendSpec", "Loaded", "load", "spec"]


@dataclass(frozen=True)
class BackendSpec:
    """One array library on one kind of device."""

    name: str  # as in PORTATTN_BACKENDS
    label: str  # for people: "PyTorch"
    device_label: str  # "CPU" or "CUDA"
    distribution: str  # whose version reports show
    dtypes: tuple[str, ...]  # the floating dtypes portattn accepts there
    gpu: bool = False
    variant: bool = False  # the same library as another entry, differently held arrays


_HALF = ("float16", "float32", "float64")
_HALF_BF = ("float16", "bfloat16", "float32", "float64")

BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec("numpy", "NumPy", "CPU", "numpy", _HALF),
    BackendSpec("numpy_readonly", "NumPy", "CPU", "numpy", _HALF, variant=True),
    BackendSpec("torch", "PyTorch", "CPU", "torch", _HALF_BF),
    BackendSpec("torch_cuda", "PyTorch", "CUDA", "torch", _HALF_BF, gpu=True),
    BackendSpec("cupy", "CuPy", "CUDA", "cupy-cuda13x", _HALF, gpu=True),
    BackendSpec("array_api_strict", "array-api-strict", "CPU", "array-api-strict", _HALF[1:]),
    BackendSpec("jax", "JAX", "CPU", "jax", _HALF_BF),
    # JAX's own default: without x64, int64 and float64 silently become 32-bit.
    BackendSpec("jax32", "JAX (x64 off)", "CPU", "jax", _HALF_BF[:-1], variant=True),
)


def spec(name: str) -> BackendSpec:
    """The entry called ``name``; ValueError naming the known ones otherwise."""
    for s in BACKENDS:
        if s.name == name:
            return s
    known = ", ".join(s.name for s in BACKENDS)
    msg = f"expected a backend name out of {known}, got {name!r}"
    raise ValueError(msg)


@dataclass(frozen=True)
class Loaded:
    """A backend that can run here: its namespace, device and floating dtypes."""

    spec: BackendSpec
    xp: Namespace  # the array API namespace (array-api-compat wrapper where needed)
    device: Device
    half_dtypes: tuple[Any, ...]  # float16/bfloat16 where the library has them
    from_numpy: Callable[[np.ndarray], Array]  # a fresh array on ``device``


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


def load(name: str) -> Loaded:
    """Import backend ``name``, or raise ImportError/RuntimeError saying why it cannot run.

    Loading ``jax`` turns on ``jax_enable_x64`` so that float64 stays float64;
    ``jax32`` leaves the setting alone (off unless something turned it on):
    the test matrix runs each test inside ``jax.enable_x64(...)`` for it.
    """
    s = spec(name)
    import array_api_compat

    if name in ("numpy", "numpy_readonly"):
        xp = array_api_compat.array_namespace(np.empty(0))
        conv = _readonly if name == "numpy_readonly" else (lambda a: np.array(a, copy=True))
        return Loaded(s, xp, "cpu", (np.float16,), conv)
    if name in ("torch", "torch_cuda"):
        torch = importlib.import_module("torch")
        if name == "torch_cuda" and not torch.cuda.is_available():
            msg = "no CUDA device available"
            raise RuntimeError(msg)
        # An indexed device: arrays made on "cuda" report "cuda:0", and the
        # two compare unequal.
        dev = torch.device("cuda", torch.cuda.current_device()) if s.gpu else torch.device("cpu")
        xp = array_api_compat.array_namespace(torch.empty(0))
        return Loaded(
            s,
            xp,
            dev,
            (torch.float16, torch.bfloat16),
            lambda a: torch.from_numpy(np.array(a, copy=True)).to(dev),
        )
    if name == "cupy":
        cp = importlib.import_module("cupy")
        try:
            count = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # an installed cupy without a driver raises CUDA errors
            msg = f"no CUDA device available ({type(exc).__name__})"
            raise RuntimeError(msg) from None
        if count < 1:
            msg = "no CUDA device available"
            raise RuntimeError(msg)
        xp = array_api_compat.array_namespace(cp.empty(0))
        return Loaded(s, xp, cp.cuda.Device(0), (cp.float16,), cp.asarray)
    if name == "array_api_strict":
        xps = importlib.import_module("array_api_strict")
        xps.set_array_api_strict_flags(boolean_indexing=False, data_dependent_shapes=False)
        return Loaded(s, xps, xps.Device("CPU_DEVICE"), (), lambda a: xps.asarray(a, copy=True))
    # jax
    jax = importlib.import_module("jax")
    if name == "jax":
        jax.config.update("jax_enable_x64", True)
    jnp = importlib.import_module("jax.numpy")
    cpu = jax.devices("cpu")[0]
    # A copy first: on the CPU, device_put may alias the NumPy buffer.
    return Loaded(
        s,
        jnp,
        cpu,
        (jnp.float16, jnp.bfloat16),
        lambda a: jax.device_put(np.array(a, copy=True), cpu),
    )
