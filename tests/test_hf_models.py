"""portattn inside real transformers architectures, against their own eager and sdpa attention.

Each architecture is a tiny random model (2 layers, width 64, 4 query heads on
2 key/value heads, vocabulary 128; see ``tiny_model``) built once; the
implementations are swapped on the same weights with ``set_attn_implementation``.
Gemma 2 soft-caps its scores, which transformers' sdpa refuses, so eager is
its only reference. All are float32, and the sequences are short, so
``impl="auto"`` takes the materialising path, whose torch autograd the
gradient check relies on.
"""

from __future__ import annotations

import pytest
import torch

from portattn.integrations import transformers as hf

pytestmark = pytest.mark.models

PORTATTN = hf.register()
TOL = 1e-5
LENGTHS = (12, 9, 5)  # longer than the sliding windows (4), left-padded to 12
NEW_TOKENS = 16


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Models this small spend their time in thread hand-offs: one thread runs them ~10x faster
    on a busy machine, and leaves the other cores to whatever else runs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def references(arch: str) -> tuple[str, ...]:
    # transformers' sdpa refuses Gemma 2's soft-capping and gpt-oss's sinks
    return ("eager",) if arch in ("gemma2", "gpt_oss") else ("eager", "sdpa")


@pytest.fixture(scope="module", params=hf.ARCHITECTURES)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


_MODELS: dict[str, torch.nn.Module] = {}


@pytest.fixture
def model(arch: str):
    if arch not in _MODELS:
        _MODELS[arch] = hf.tiny_model(arch, attn_implementation=PORTATTN)
    m = _MODELS[arch]
    yield m
    m.set_attn_implementation(PORTATTN)
    m.eval()
    m.zero_grad(set_to_none=True)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three sequences of different lengths, left-padded with token 0."""
    return hf.tiny_batch(LENGTHS)


def logits_with(model, implementation: str) -> torch.Tensor:
    ids, mask = batch()
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def test_portattn_is_the_attention_that_runs(model, monkeypatch):
    calls = []
    real = hf.attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(hf, "attention", spy)
    logits_with(model, PORTATTN)
    assert len(calls) == model.config.num_hidden_layers
    # the padding reached the attention as a mask: registering the mask function matters
    assert all(c["mask"] is not None for c in calls)


def test_logits_of_a_left_padded_batch(model, arch):
    _, mask = batch()
    got = logits_with(model, PORTATTN)
    real = mask.bool()  # padded positions' logits are not defined by any implementation
    for ref in references(arch):
        want = logits_with(model, ref)
        assert (got[real] - want[real]).abs().max() <= TOL, ref


def test_logits_of_a_right_padded_batch(model, arch):
    ids, mask = batch()
    ids, mask = ids.flip(-1), mask.flip(-1)  # the same sequences (reversed), padded on the right
    real = mask.bool()
    out = {}
    for name in (PORTATTN, "eager"):
        model.set_attn_implementation(name)
        with torch.no_grad():
            out[name] = model(input_ids=ids, attention_mask=mask).logits
    assert (out[PORTATTN][real] - out["eager"][real]).abs().max() <= TOL


def test_a_4d_additive_mask_from_the_caller(model, arch, monkeypatch):
    """A float mask the caller builds reaches the attention as is: portattn adds it as a bias."""
    seen = []
    real_attention = hf.attention
    monkeypatch.setattr(
        hf, "attention", lambda *a, **kw: seen.append(kw) or real_attention(*a, **kw)
    )
    ids, mask = batch()
    n = ids.shape[1]
    allowed = torch.ones(n, n, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    out = {}
    for name in (PORTATTN, "eager"):
        model.set_attn_implementation(name)
        with torch.no_grad():
            out[name] = model(input_ids=ids, attention_mask=additive).logits
    assert seen
    assert all(kw["bias"] is not None and kw["mask"] is None for kw in seen)
    real = mask.bool()
    assert (out[PORTATTN][real] - out["eager"][real]).abs().max() <= TOL


def test_without_the_mask_function_padding_is_lost(model):
    """Why register() also fills AttentionMaskInterface: a name known only to AttentionInterface
    gets attention_mask=None, and the padded batch silently computes something else."""
    from transformers import AttentionInterface

    AttentionInterface.register("portattn-test-no-mask-function", hf.attention_forward)
    _, mask = batch()
    real = mask.bool()
    try:
        lost = logits_with(model, "portattn-test-no-mask-function")
    finally:
        del AttentionInterface._global_mapping["portattn-test-no-mask-function"]
    kept = logits_with(model, PORTATTN)
    assert (lost[real] - kept[real]).abs().max() > 1000 * TOL


def test_logits_discriminate(model, arch):
    """The tolerance is meaningful: losing the padding mask moves the logits far beyond it."""
    ids, mask = batch()
    model.set_attn_implementation(PORTATTN)
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits
        unpadded = model(input_ids=ids).logits
    real = mask.bool()
    assert (padded[real] - unpadded[real]).abs().max() > 1000 * TOL


def generated(model, implementations: tuple[str, ...], **options) -> list[torch.Tensor]:
    """``model``'s greedy tokens on ``batch()``, with the cache, under each implementation."""
    ids, mask = batch()
    tokens = []
    for name in implementations:
        model.set_attn_implementation(name)
        tokens.append(
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                use_cache=True,
                **options,
            )
        )
    return tokens


def test_greedy_generation_with_the_cache(model, arch):
    got, want = generated(model, (PORTATTN, references(arch)[-1]), pad_token_id=0)
    assert got.shape == (len(LENGTHS), max(LENGTHS) + NEW_TOKENS)
    assert torch.equal(got, want)


def gradients_with(model, implementation: str) -> dict[str, torch.Tensor]:
    ids, mask = batch()
    labels = ids.masked_fill(mask == 0, -100)
    # The first real token would be predicted from the last padding position, a
    # query row that sees no key: eager makes it uniform, sdpa and portattn zero.
    # Nothing defines it, so it is not part of the loss.
    labels[torch.arange(len(LENGTHS)), max(LENGTHS) - torch.tensor(LENGTHS)] = -100
    model.set_attn_implementation(implementation)
    model.train()
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_training_step_gradients(model):
    got = gradients_with(model, PORTATTN)
    want = gradients_with(model, "eager")
    assert got.keys() == want.keys()
    assert len(got) == len(list(model.parameters()))
    worst = max((got[n] - want[n]).abs().max().item() for n in got)
    assert worst <= TOL


def test_training_step_under_autocast(model):
    """A bfloat16 mixed-precision step: portattn's gradients are as close to float32 as eager's.

    Each parameter's error is measured against eager's float32 gradients,
    relative to their largest entry; portattn may not be worse than eager
    under the same autocast, beyond bfloat16's own rounding (2**-8).
    """
    want = gradients_with(model, "eager")
    errors = {}
    for implementation in (PORTATTN, "eager"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = gradients_with(model, implementation)
        assert got.keys() == want.keys()
        errors[implementation] = max(
            ((got[n].float() - want[n]).abs().max() / want[n].abs().max()).item() for n in want
        )
    assert errors[PORTATTN] <= max(2 * errors["eager"], 2**-8), errors
    assert errors[PORTATTN] < 0.1, errors


def test_output_attentions(model, arch):
    ids, mask = batch()
    out = {}
    for name in (PORTATTN, "eager"):
        model.set_attn_implementation(name)
        with torch.no_grad():
            out[name] = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    real = mask.bool()
    for got, want in zip(out[PORTATTN], out["eager"], strict=True):
        assert got.shape == want.shape
        # rows of padded queries differ by convention (zeros here, uniform in eager)
        diff = (got - want).abs().amax(dim=(1, 3))  # (B, Lq)
        assert diff[real].max() <= TOL


def test_dropout_in_training_is_refused():
    model = hf.tiny_model("gpt2", attn_implementation=PORTATTN)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    ids, _ = batch()
    model.eval()(input_ids=ids)  # eval: dropout is off, nothing to refuse
    with pytest.raises(ValueError, match="expected dropout=0 while the model trains"):
        model.train()(input_ids=ids)


def test_cli_prints_the_last_layer_heatmaps(capsys):
    from portattn.__main__ import main

    assert main(["hf", "--arch", "qwen2", "--length", "5", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "Qwen2ForCausalLM" in out
    assert out.count("head ") == 4
    lines = out.splitlines()
    first_row = lines[lines.index("head 0:") + 2]
    assert first_row.split()[1] == "100%"  # causal: the first token sees only itself
    assert "\x1b[" not in out


def test_gemma2_soft_capping_matters():
    """Gemma 2's agreement with eager says something: without the cap its logits move far."""
    model = hf.tiny_model("gemma2", attn_implementation=PORTATTN)
    capped = logits_with(model, PORTATTN)
    model.config.attn_logit_softcapping = None
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    uncapped = logits_with(model, PORTATTN)
    real = batch()[1].bool()
    assert (capped[real] - uncapped[real]).abs().max() > 1000 * TOL


@pytest.mark.parametrize("impl", ["materialize", "blockwise", "native"])
def test_every_impl_can_be_registered(impl):
    name = hf.register(f"portattn-{impl}", impl=impl)
    model = _MODELS.get("llama") or hf.tiny_model("llama", attn_implementation=PORTATTN)
    _, mask = batch()
    real = mask.bool()
    try:
        got = logits_with(model, name)
        want = logits_with(model, "eager")
    finally:
        model.set_attn_implementation(PORTATTN)
    assert (got[real] - want[real]).abs().max() <= TOL


def test_native_impl_refuses_gemma2_soft_capping_by_name():
    name = hf.register("portattn-native", impl="native")
    model = hf.tiny_model("gemma2", attn_implementation=name)
    ids, mask = batch()
    with pytest.raises(NotImplementedError, match="cannot soft-cap"):
        model(input_ids=ids, attention_mask=mask)


def test_gpt_oss_sinks_matter():
    """gpt-oss's agreement with eager says something: with its sinks silenced the logits move."""
    model = hf.tiny_model("gpt_oss", attn_implementation=PORTATTN)
    with_sinks = logits_with(model, PORTATTN)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)  # exp(-1e4) = 0: no sink
    without = logits_with(model, PORTATTN)
    real = batch()[1].bool()
    assert (with_sinks[real] - without[real]).abs().max() > 1000 * TOL


# T5 (encoder-decoder: relative position bias, cross-attention, a padded source)
# and ModernBERT (a masked LM: bidirectional, a local layer, the deterministic hint).

_OTHERS: dict[str, torch.nn.Module] = {}


@pytest.fixture(params=hf.NON_CAUSAL_ARCHITECTURES)
def other(request: pytest.FixtureRequest):
    arch = request.param
    if arch not in _OTHERS:
        _OTHERS[arch] = hf.tiny_model(arch, attn_implementation=PORTATTN)
    m = _OTHERS[arch]
    yield arch, m
    m.set_attn_implementation(PORTATTN)
    m.eval()
    m.zero_grad(set_to_none=True)


def other_inputs(arch: str) -> dict[str, torch.Tensor]:
    ids, mask = batch()
    if arch == "t5":  # a padded source, and a target of 7 tokens (causal, with a cache in generate)
        return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, -7:]}
    return {"input_ids": ids, "attention_mask": mask}


def other_real(arch: str) -> torch.Tensor:
    """The positions whose logits are defined: every target token for T5, real tokens otherwise."""
    if arch == "t5":
        return torch.ones(len(LENGTHS), 7, dtype=torch.bool)
    return batch()[1].bool()


def other_logits(model, arch: str, implementation: str) -> torch.Tensor:
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(**other_inputs(arch)).logits


def test_non_causal_logits(other):
    arch, model = other
    got = other_logits(model, arch, PORTATTN)
    real = other_real(arch)
    for ref in ("eager", "sdpa"):
        want = other_logits(model, arch, ref)
        assert (got[real] - want[real]).abs().max() <= TOL, ref


def test_non_causal_gradients(other):
    arch, model = other
    inputs = other_inputs(arch)
    if arch == "t5":
        labels = inputs["decoder_input_ids"].contiguous()
    else:
        labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    grads = {}
    for name in (PORTATTN, "eager"):
        model.set_attn_implementation(name)
        model.train()
        model.zero_grad(set_to_none=True)
        model(**inputs, labels=labels).loss.backward()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    got, want = grads.values()
    assert got.keys() == want.keys()
    if arch == "t5":  # the relative bias tables learn through position_bias
        assert any("relative_attention_bias" in n for n in got)
    worst = max((got[n] - want[n]).abs().max().item() for n in got)
    assert worst <= TOL


def test_t5_greedy_generation_with_the_cache():
    model = _OTHERS.get("t5") or hf.tiny_model("t5", attn_implementation=PORTATTN)
    got, want = generated(model, (PORTATTN, "sdpa"))
    assert got.shape == (len(LENGTHS), NEW_TOKENS + 1)  # the decoder start token, then 16
    assert torch.equal(got, want)


def test_t5_position_bias_matters():
    """T5's agreement says something: without its relative bias the logits move far."""
    model = _OTHERS.get("t5") or hf.tiny_model("t5", attn_implementation=PORTATTN)
    biased = other_logits(model, "t5", PORTATTN)
    tables = [
        m.relative_attention_bias
        for m in model.modules()
        if hasattr(m, "compute_bias") and m.has_relative_attention_bias
    ]
    saved = [t.weight.detach().clone() for t in tables]
    try:
        with torch.no_grad():
            for t in tables:
                t.weight.zero_()
        flat = other_logits(model, "t5", PORTATTN)
    finally:
        with torch.no_grad():
            for t, w in zip(tables, saved, strict=True):
                t.weight.copy_(w)
    assert (biased - flat).abs().max() > 1000 * TOL
