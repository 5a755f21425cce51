"""Bring any array back to NumPy, for reports and comparisons (never on a hot path)."""

from __future__ import annotations

import numpy as np

from ._compat import array_namespace, library_name
from ._typing import Array

__all__ = ["to_numpy"]


def to_numpy(x: Array) -> np.ndarray:
    """A NumPy copy of ``x`` from any library or device.

    Floating dtypes NumPy lacks (bfloat16) are widened to float32, exactly.
    """
    if isinstance(x, np.ndarray):
        return np.array(x, copy=True)
    xp = array_namespace(x)
    lib = library_name(x)
    if xp.isdtype(x.dtype, "real floating") and x.dtype not in (xp.float32, xp.float64):
        x = xp.astype(x, xp.float32)  # float16 and bfloat16 widen exactly
    if lib == "torch":
        return np.array(x.detach().cpu().numpy(), copy=True)
    if lib == "cupy":
        return np.asarray(x.get())
    return np.array(np.from_dlpack(x), copy=True)
