"""transformers' continuous batching and padding-free training on portattn, against eager.

``serve(model)`` switches a model loaded with ``register()`` to the alias that
continuous batching admits (see the module docstring of
``portattn.integrations.transformers``). ``model.generate_batch`` then hands
portattn packed sequences (``cu_seq_lens_q`` / ``cu_seq_lens_k``), which go
through ``pa.attention_varlen``'s heads-first form; its tokens must equal
``generate`` with ``"eager"`` run on each prompt alone. Padding-free training packs sequences
into one row with restarting ``position_ids``; its logits and gradients must
equal eager's run on each sequence alone.
"""

from __future__ import annotations

import pytest
import torch

from portattn.integrations import transformers as hf

pytestmark = pytest.mark.models

pytest.importorskip("transformers.generation.continuous_batching")
from transformers import GenerationConfig  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

PORTATTN = hf.register()
# 16 prompts of mixed lengths, several longer than the sliding windows (4).
LENGTHS = (3, 17, 5, 9, 30, 2, 12, 7, 21, 4, 11, 6, 25, 8, 14, 1)
NEW_TOKENS = 10
# eos -1: no prompt stops early, and no processor holds eos back (min_new_tokens would).
GREEDY = GenerationConfig(
    max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0
)
# A small cache: by default continuous batching sizes it from the free memory.
SMALL = {"page_size": 16, "num_blocks": 64, "max_batch_tokens": 256, "max_requests_per_batch": 16}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def prompts(seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=g).tolist() for n in LENGTHS]


def eager_tokens(arch: str, batch: list[list[int]]) -> list[list[int]]:
    model = hf.tiny_model(arch, attn_implementation="eager")
    return [
        model.generate(torch.tensor([p]), generation_config=GREEDY)[0, len(p) :].tolist()
        for p in batch
    ]


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fused"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "gpt_oss"])
def test_generate_batch_equals_eager_per_prompt(arch, invariant, monkeypatch):
    calls: list[int] = []
    varlen = hf.varlen_heads_first

    def counted(*args, **kwargs):
        assert kwargs["batch_invariant"] is invariant
        calls.append(len(kwargs["cu_seqlens_q"]) - 1)
        return varlen(*args, **kwargs)

    monkeypatch.setattr(hf, "varlen_heads_first", counted)
    model = hf.serve(hf.tiny_model(arch, attn_implementation=PORTATTN), batch_invariant=invariant)
    assert model.config._attn_implementation == "portattn_flash"
    batch = prompts()
    out = model.generate_batch(
        batch,
        generation_config=GREEDY,
        continuous_batching_config=ContinuousBatchingConfig(**SMALL),
        progress_bar=False,
    )
    got = [out[f"req_{i}"].generated_tokens for i in range(len(batch))]
    assert [len(t) for t in got] == [NEW_TOKENS] * len(batch)
    assert got == eager_tokens(arch, batch)
    # portattn ran, on packed batches holding several sequences at once
    assert calls and max(calls) > 1
    assert model.config._attn_implementation == "portattn_flash"  # left as it was


def test_generate_batch_refuses_plain_portattn_as_transformers_does():
    model = hf.tiny_model("llama", attn_implementation=PORTATTN)
    with pytest.raises(ValueError, match="not supported for continuous batching"):
        model.generate_batch(prompts()[:2], generation_config=GREEDY)


def test_loading_a_flash_name_fails_in_transformers_which_is_why_serve_sets_the_config():
    with pytest.raises(ValueError, match="flash attention implementation"):
        hf.tiny_model("llama", attn_implementation=PORTATTN + "_flash")


def test_serve_refuses_other_implementations_and_is_idempotent():
    with pytest.raises(ValueError, match=r"register\(\.\.\.\).*got attn_implementation='sdpa'"):
        hf.serve(hf.tiny_model("llama", attn_implementation="sdpa"))
    model = hf.serve(hf.serve(hf.tiny_model("llama", attn_implementation=PORTATTN)))
    assert model.config._attn_implementation == "portattn_flash"
    # One call per step by default; batch invariance is asked for, and asked again.
    assert {m.portattn_batch_invariant for m in model.modules()} == {False}
    hf.serve(model, batch_invariant=True)
    assert {m.portattn_batch_invariant for m in model.modules()} == {True}
    assert model.config._attn_implementation == "portattn_flash"
    with pytest.raises(ValueError, match="expected a name without 'flash'"):
        hf.register("my_flash")


# --- padding-free training ---------------------------------------------------

PACKED = (7, 12, 3, 9)  # DataCollatorWithFlattening's layout: one row, positions restart


def _packed_batch() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(3, 128, (n,), generator=g) for n in PACKED]
    ids = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(n) for n in PACKED])[None]
    return ids, positions, seqs


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
def test_padding_free_training_equals_eager_per_sequence(arch, flash_kwargs, monkeypatch):
    from transformers import DataCollatorWithFlattening

    calls: list[list[int]] = []
    varlen = hf.varlen_heads_first

    def counted(*args, **kwargs):
        calls.append(list(kwargs["cu_seqlens_q"]))
        return varlen(*args, **kwargs)

    monkeypatch.setattr(hf, "varlen_heads_first", counted)
    _, _, seqs = _packed_batch()
    collate = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)
    batch = collate([{"input_ids": s.tolist()} for s in seqs])
    weight = torch.randn(1, sum(PACKED), 128, generator=torch.Generator().manual_seed(5))

    ours = hf.tiny_model(arch, attn_implementation=PORTATTN).train()
    logits = ours(**{k: v for k, v in batch.items() if k != "labels"}).logits
    (logits * weight).sum().backward()
    assert calls and calls[0] == [0, *torch.tensor(PACKED).cumsum(0).tolist()]

    eager = hf.tiny_model(arch, attn_implementation="eager").train()
    wants, start = [], 0
    for s in seqs:
        out = eager(input_ids=s[None]).logits
        (out * weight[:, start : start + len(s)]).sum().backward()
        wants.append(out)
        start += len(s)
    torch.testing.assert_close(logits, torch.cat(wants, dim=1), rtol=1e-5, atol=1e-5)
    got, want = _grads(ours), _grads(eager)
    assert got.keys() == want.keys() and len(got) == len(list(ours.parameters()))
    for name in got:  # float32 sums in another order: a few ulps of the largest entry
        worst = (got[name] - want[name]).abs().max().item()
        assert worst <= 2e-6 * want[name].abs().max().item(), (name, worst)


def test_eager_itself_attends_across_packed_sequences():
    """Why the varlen path is needed: the same packed row, eager (no varlen), is far off."""
    ids, positions, seqs = _packed_batch()
    eager = hf.tiny_model("llama", attn_implementation="eager")
    with torch.no_grad():
        packed = eager(input_ids=ids, position_ids=positions).logits
        alone = torch.cat([eager(input_ids=s[None]).logits for s in seqs], dim=1)
        ours = hf.tiny_model("llama", attn_implementation=PORTATTN)
        varlen = ours(input_ids=ids, position_ids=positions).logits
    assert (packed - alone).abs().max() > 0.05
    torch.testing.assert_close(varlen, alone, rtol=1e-5, atol=1e-5)
