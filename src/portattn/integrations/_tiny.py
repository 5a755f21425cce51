"""Tiny random ``transformers`` models: the tests, the CLI and the docs page build the same ones.

Re-exported by :mod:`portattn.integrations.transformers`, which imports
``torch`` and ``transformers`` (with a helpful error when they are missing)
before this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ARCHITECTURES", "NON_CAUSAL_ARCHITECTURES", "tiny_batch", "tiny_model"]


# Causal language models: each one generates, and is trained on next tokens.
ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma2", "gpt2", "gpt_oss")
# The others: T5 (encoder-decoder, relative position bias), ModernBERT (a
# bidirectional encoder with local layers, a masked LM).
NON_CAUSAL_ARCHITECTURES = ("t5", "modernbert")
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
    return _config_rest(arch)


def _config_rest(arch: str) -> Any:
    import transformers

    if arch == "gpt_oss":
        # Sinks drawn wide (initializer_range) so that they change the result;
        # 4 experts, 2 per token; plain RoPE (gpt-oss's YaRN needs a long context).
        return transformers.GptOssConfig(
            **_DECODER,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    if arch == "t5":
        # Few buckets and a short max_distance, so that the test sequences
        # reach the logarithmic buckets and the last one.
        return transformers.T5Config(
            vocab_size=_VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=20,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=2,
        )
    if arch == "modernbert":
        # Layer 0 local (a window of 4, i.e. 2 each side), layer 1 global.
        return transformers.ModernBertConfig(
            **_SHARED,
            pad_token_id=0,
            cls_token_id=1,
            sep_token_id=2,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            global_attn_every_n_layers=2,
            local_attention=4,
            max_position_embeddings=128,
            attention_dropout=0.0,
            embedding_dropout=0.0,
            mlp_dropout=0.0,
        )
    known = ARCHITECTURES + NON_CAUSAL_ARCHITECTURES
    msg = f"expected arch to be one of {', '.join(map(repr, known))}, got {arch!r}"
    raise ValueError(msg)


def tiny_model(arch: str, *, attn_implementation: str, seed: int = 0) -> Any:
    """A seeded random model of architecture ``arch``: 2 layers, width 64, vocabulary 128.

    A causal LM for each of :data:`ARCHITECTURES`: four query heads share two
    key/value heads, except GPT-2 (four of each). Mistral slides a window of
    4; Gemma 2 and gpt-oss slide one on their first layer; Gemma 2 soft-caps
    its scores at 2.0; gpt-oss adds a learnt sink logit per head. Of
    :data:`NON_CAUSAL_ARCHITECTURES`, T5 is a sequence-to-sequence LM with 4
    heads on each side and 2 layers each, and ModernBERT a masked LM with a
    local first layer. Dropout is 0 everywhere. Nothing is downloaded. The
    model comes back in eval mode, in float32.

    Parameters
    ----------
    arch : {"llama", "mistral", "qwen2", "gemma2", "gpt2", "gpt_oss", "t5", "modernbert"}
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
    import transformers

    config = _config(arch)
    auto = {
        "t5": transformers.AutoModelForSeq2SeqLM,
        "modernbert": transformers.AutoModelForMaskedLM,
    }.get(arch, transformers.AutoModelForCausalLM)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(
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
