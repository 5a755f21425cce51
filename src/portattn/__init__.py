"""portattn: scaled dot-product attention written once against the Python array API standard.

The same code runs on NumPy, PyTorch (CPU and CUDA), CuPy, ``array_api_strict``
and any other library that follows the standard; results come back in the
caller's library, dtype and device.
"""

from __future__ import annotations

from ._attention import attention, attention_weights
from ._head import Head
from ._masks import causal_mask, window_mask
from ._softmax import softmax

__all__ = [
    "Head",
    "attention",
    "attention_weights",
    "causal_mask",
    "softmax",
    "window_mask",
]

__version__ = "0.1.0"
