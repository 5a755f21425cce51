"""portattn: scaled dot-product attention written once against the Python array API standard.

The same code runs on NumPy, PyTorch (CPU and CUDA), CuPy, ``array_api_strict``
and any other library that follows the standard; results come back in the
caller's library, dtype and device.
"""

from __future__ import annotations

from . import mods as mods  # ready-made mods: pa.mods.causal, pa.mods.alibi(...)
from ._attention import attention, attention_weights
from ._core._block_mask import BlockMask, create_block_mask
from ._core._masks import causal_mask, window_mask
from ._core._merge import merge_attention
from ._core._modspec import and_masks, or_masks
from ._core._softmax import softmax
from ._layers._head import Head
from ._layers._kvcache import KVCache
from ._layers._linear import (
    LinearAttentionState,
    elu_feature_map,
    linear_attention,
    linear_attention_step,
)
from ._layers._multihead import MultiHeadAttention
from ._layers._paged import PagedKVCache
from ._layers._positions import apply_rope, rope_positions, sinusoidal_encoding
from ._varlen import attention_varlen, paged_attention

__all__ = [
    "BlockMask",
    "Head",
    "KVCache",
    "LinearAttentionState",
    "MultiHeadAttention",
    "PagedKVCache",
    "and_masks",
    "apply_rope",
    "attention",
    "attention_varlen",
    "attention_weights",
    "causal_mask",
    "create_block_mask",
    "elu_feature_map",
    "linear_attention",
    "linear_attention_step",
    "merge_attention",
    "or_masks",
    "paged_attention",
    "rope_positions",
    "sinusoidal_encoding",
    "softmax",
    "window_mask",
]

__version__ = "0.1.0"
