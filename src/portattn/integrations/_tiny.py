"""Tiny random ``transformers`` models: the tests, the CLI and the docs page build the same ones.

Re-exported by :mod:`portattn.integrations.transformers`, which imports
``torch`` and ``transformers`` (with a helpful error when they are missing)
before this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ARCHITECTURES", "tiny_batch", "tiny_model"]


ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma2", "gpt2")
_VOCAB = 128

# Weights drawn five times wider than transformers' default (0.02), so that the
# random heads attend unevenly and a wrong scale, mask or cap shows in the
# logits; wider still, float32 rounding alone approaches 1e-5 in the logits.
_SHARED = {"vocab_size": _VOCAB, "initializer_range": 0.1, "bos_token_id": 1, "eos_token_id": 2}
_DECODER = {
    **_SHARED,
    "max_position_embeddings": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attention_dropout": 0.0,
}


def _config(arch: str) -> Any:
    import transformers

    if arch == "llama":
        return transformers.LlamaConfig(**_DECODER)
    if arch == "mistral":
        return transformers.MistralConfig(**_DECODER, sliding_window=4)
    if arch == "qwen2":
        return transformers.Qwen2Config(**_DECODER)
    if arch == "gemma2":
        # A soft cap below the scores' size, so that capping changes the result,
        # and a window smaller than the test sequences on the sliding layers.
        return transformers.Gemma2Config(
            **_DECODER,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=4,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "full_attention"],
        )
    if arch == "gpt2":
        return transformers.GPT2Config(
            **_SHARED,
            n_positions=128,
            n_embd=64,
            n_layer=2,
            n_head=4,
            attn_pdrop=0.0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
        )
    msg = f"expected arch to be one of {', '.join(map(repr, ARCHITECTURES))}, got {arch!r}"
    raise ValueError(msg)


def tiny_model(arch: str, *, attn_implementation: str, seed: int = 0) -> Any:
    """A seeded random causal LM of architecture ``arch``: 2 layers, width 64, vocabulary 128.

    Four query heads share two key/value heads, except GPT-2 (four of each).
    Mistral slides a window of 4; Gemma 2 slides one on its first layer and
    soft-caps its scores at 2.0. Dropout is 0 everywhere. Nothing is
    downloaded. The model comes back in eval mode, in float32.

    Parameters
    ----------
    arch : {"llama", "mistral", "qwen2", "gemma2", "gpt2"}
        The architecture whose configuration class builds the model.
    attn_implementation : str
        ``"eager"``, ``"sdpa"``, or a name from :func:`register`.
    seed : int, optional
        Seeds torch's generator before the weights are drawn.

    Returns
    -------
    transformers.PreTrainedModel

    Examples
    --------
    >>> from portattn.integrations.transformers import register, tiny_model
    >>> model = tiny_model("llama", attn_implementation=register())
    >>> model.config.num_hidden_layers, model.config._attn_implementation
    (2, 'portattn')
    """
    from transformers import AutoModelForCausalLM

    config = _config(arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation, dtype=torch.float32
        )
    return model.eval()


def tiny_batch(lengths: Sequence[int], /, *, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random prompts for the tiny models, left-padded with token 0 to the longest.

    Row ``i`` holds ``lengths[i]`` real tokens drawn from 3 to 127 (past the
    pad, bos and eos ids 0, 1 and 2, inside :func:`tiny_model`'s vocabulary),
    after as many 0s as it is shorter than the longest row.

    Parameters
    ----------
    lengths : sequence of int
        Real tokens per row, each at least 1.
    seed : int, optional
        Seeds the generator the tokens are drawn from; the default, 7, gives
        the batch that the model tests and the docs' Hugging Face page run.

    Returns
    -------
    input_ids, attention_mask : torch.Tensor
        Both int64, of shape ``(len(lengths), max(lengths))``; the mask is 1
        on real tokens and 0 on padding.

    Examples
    --------
    >>> from portattn.integrations.transformers import tiny_batch
    >>> ids, mask = tiny_batch((3, 1))
    >>> mask.tolist()
    [[1, 1, 1], [0, 0, 1]]
    >>> bool((ids[mask == 0] == 0).all()), bool((ids[mask == 1] >= 3).all())
    (True, True)
    """
    sizes = tuple(lengths)
    if not sizes or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes
    ):
        msg = f"expected lengths to be a non-empty sequence of positive ints, got {lengths!r}"
        raise ValueError(msg)
    g = torch.Generator().manual_seed(seed)
    width = max(sizes)
    ids = torch.zeros(len(sizes), width, dtype=torch.long)
    mask = torch.zeros(len(sizes), width, dtype=torch.long)
    for row, n in enumerate(sizes):
        ids[row, width - n :] = torch.randint(3, _VOCAB, (n,), generator=g)
        mask[row, width - n :] = 1
    return ids, mask
