"""Ready-made mods: the common variants of attention, each a small value.

A ``mask_mod`` (``causal``, ``sliding_window(...)``, ``documents(...)``,
``prefix_lm(...)``, ``chunked(...)``) goes to :func:`portattn.create_block_mask`
and composes with :func:`portattn.and_masks` / :func:`portattn.or_masks`; a
``score_mod`` (``alibi(...)``, ``softcap(...)``, ``t5_relative_bias(...)``)
goes to attention's ``score_mod=``. Each is written in the array API on the
index arrays it is given, so it runs on every library, and also serves
torch's ``flex_attention``. Import them as ``from portattn import mods``.
"""

from __future__ import annotations

from ._alibi import alibi, alibi_slopes
from ._causal import causal
from ._chunked import chunked
from ._documents import documents
from ._prefix_lm import prefix_lm
from ._sliding_window import sliding_window
from ._softcap import softcap
from ._t5 import t5_buckets, t5_relative_bias

__all__ = [
    "alibi",
    "alibi_slopes",
    "causal",
    "chunked",
    "documents",
    "prefix_lm",
    "sliding_window",
    "softcap",
    "t5_buckets",
    "t5_relative_bias",
]
