"""portattn: scaled dot-product attention written once against the Python array API standard.

The same code runs on NumPy, PyTorch (CPU and CUDA), CuPy, ``array_api_strict``
and any other library that follows the standard; results come back in the
caller's library, dtype and device.
"""

from __future__ import annotations

from ._attention import attention, attention_weights
from ._head import Head
from ._kvcache import KVCache
from ._linear import LinearAttentionState, elu_feature_map, linear_attention, linear_attention_step
from ._masks import causal_mask, window_mask
from ._merge import merge_attention
from ._multihead import MultiHeadAttention
from ._positions import apply_rope, rope_positions, sinusoidal_encoding
from ._softmax import softmax

__all__ = [
    "Head",
    "KVCache",
    "LinearAttentionState",
    "MultiHeadAttention",
    "apply_rope",
    "attention",
    "attention_weights",
    "causal_mask",
    "elu_feature_map",
    "linear_attention",
    "linear_attention_step",
    "merge_attention",
    "rope_positions",
    "sinusoidal_encoding",
    "softmax",
    "window_mask",
]

__version__ = "0.1.0"
