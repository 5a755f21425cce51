"""attention_forward, the function registered with transformers, on random tensors.

The oracle is torch's scaled_dot_product_attention given the same mask in its
own form, with K and V repeated per query head. These tests build no model
(see test_hf_models.py for those, marked ``models``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import (
    AttentionMaskInterface,
    sdpa_mask,
    sliding_window_bidirectional_mask_function,
    sliding_window_causal_mask_function,
)
from transformers.models.llama.modeling_llama import eager_attention_forward

from portattn.integrations import transformers as hf
from portattn.integrations.transformers import attention_forward, register

from reference import attention_ref

F = torch.nn.functional
B, HQ, HKV, D = 2, 4, 2, 8


class Layer(torch.nn.Module):
    """A stand-in for a model's attention layer: only the attributes the contract reads."""

    def __init__(self, *, is_causal: bool = True) -> None:
        super().__init__()
        self.is_causal = is_causal


def _qkv(lq: int, lk: int, *, hq: int = HQ, hkv: int = HKV, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, hq, lq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, hkv, lk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, hkv, lk, D + 2, generator=g, dtype=torch.float64)  # dv != d
    return q, k, v


def _sdpa(q, k, v, **kw):
    """The oracle: K/V repeated per query head, output token-major like the contract."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, **kw).transpose(1, 2)


def _padding_mask(lq: int, lk: int) -> torch.Tensor:
    """Causal (bottom-right) with the second sequence left-padded by 3: (B, 1, Lq, Lk)."""
    pad = torch.ones(B, lk, dtype=torch.bool)
    pad[1, :3] = False
    return sdpa_mask(
        batch_size=B,
        q_length=lq,
        kv_length=lk,
        q_offset=lk - lq,
        attention_mask=pad,
        allow_is_causal_skip=False,
    )


def _close(got, want, tol=1e-12):
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def _live(mask: torch.Tensor) -> torch.Tensor:
    """Query rows (B, Lq) that see at least one key (SDPA returns zeros or NaN for the others)."""
    return mask.any(-1)[:, 0]


@pytest.mark.parametrize(("lq", "lk"), [(7, 7), (1, 9), (3, 9)])
def test_boolean_padding_mask_with_grouped_heads(lq, lk):
    q, k, v = _qkv(lq, lk)
    m = _padding_mask(lq, lk)
    out, weights = attention_forward(Layer(), q, k, v, m)
    assert weights is None
    want = _sdpa(q, k, v, attn_mask=m)
    live = _live(m)
    _close(out[live], want[live])
    assert torch.all(out[~live] == 0)  # a padded query row sees nothing: zeros, never NaN


def test_additive_float_mask_is_a_bias():
    q, k, v = _qkv(6, 6)
    m = _padding_mask(6, 6)
    hidden = torch.full((), torch.finfo(torch.float64).min, dtype=torch.float64)
    additive = torch.where(m, torch.zeros((), dtype=torch.float64), hidden)  # as eager_mask
    additive = additive + torch.randn(B, 1, 6, 6, dtype=torch.float64)  # any bias, not just 0
    out, _ = attention_forward(Layer(), q, k, v, additive)
    want = _sdpa(q, k, v, attn_mask=additive)
    live = _live(m)
    _close(out[live], want[live])


def test_per_head_mask():
    q, k, v = _qkv(5, 5)
    g = torch.Generator().manual_seed(1)
    m = torch.rand(B, HQ, 5, 5, generator=g) < 0.7
    m[..., 0] = True
    out, _ = attention_forward(Layer(), q, k, v, m)
    _close(out, _sdpa(q, k, v, attn_mask=m))


@pytest.mark.parametrize(("lq", "lk"), [(6, 6), (4, 9), (1, 9)])
def test_none_mask_follows_transformers_sdpa_causality(lq, lk):
    q, k, v = _qkv(lq, lk)
    out, _ = attention_forward(Layer(), q, k, v, None)
    # transformers' sdpa path: is_causal (top-left) for a block, nothing for one token
    _close(out, _sdpa(q, k, v, is_causal=lq > 1))


def test_none_mask_bidirectional_layer_and_is_causal_kwarg():
    q, k, v = _qkv(5, 5)
    full = _sdpa(q, k, v)
    _close(attention_forward(Layer(is_causal=False), q, k, v, None)[0], full)
    _close(attention_forward(Layer(), q, k, v, None, is_causal=False)[0], full)
    causal = attention_forward(Layer(is_causal=False), q, k, v, None, is_causal=True)[0]
    _close(causal, _sdpa(q, k, v, is_causal=True))


def test_sliding_window_without_mask_matches_transformers_window():
    lq = lk = 9
    q, k, v = _qkv(lq, lk)
    m = sdpa_mask(
        batch_size=B,
        q_length=lq,
        kv_length=lk,
        mask_function=sliding_window_causal_mask_function(3),
        allow_is_causal_skip=False,
    )
    out, _ = attention_forward(Layer(), q, k, v, None, sliding_window=3)
    _close(out, _sdpa(q, k, v, attn_mask=m))
    # with a mask, the mask (which transformers builds with the window) decides
    masked, _ = attention_forward(Layer(), q, k, v, m, sliding_window=3)
    _close(masked, out)


@pytest.mark.parametrize(("lq", "lk"), [(1, 6), (3, 6), (6, 3)])
def test_bidirectional_sliding_window_without_mask_does_what_eager_does(lq, lk):
    """Lq != Lk leaves a bidirectional window no alignment; transformers' eager path attends to all.

    transformers builds no mask for such a layer only where the window cannot
    bind (kv_length < window), so its own mask, materialized, agrees too.
    """
    q, k, v = _qkv(lq, lk)
    layer = Layer(is_causal=False)
    layer.num_key_value_groups, layer.training = HQ // HKV, False
    out, _ = attention_forward(layer, q, k, v, None, scaling=0.3, sliding_window=7)
    want, _ = eager_attention_forward(layer, q, k, v, None, scaling=0.3)
    _close(out, want, tol=1e-6)  # eager takes its softmax in float32
    skipped = {"batch_size": B, "q_length": lq, "kv_length": lk, "q_offset": max(lk - lq, 0)}
    window = sliding_window_bidirectional_mask_function(7)
    assert (
        sdpa_mask(**skipped, mask_function=window, allow_is_bidirectional_skip=True, local_size=7)
        is None
    )
    m = sdpa_mask(**skipped, mask_function=window)  # the same mask, materialized
    masked, _ = attention_forward(layer, q, k, v, m, scaling=0.3)
    _close(masked, out)


def test_softcap_against_the_float64_formula():
    q, k, v = _qkv(5, 7)
    q = q * 4  # scores of several units, so that a cap of 1.5 bends them hard
    m = _padding_mask(5, 7)
    out, weights = attention_forward(
        Layer(), q, k, v, m, scaling=0.3, softcap=1.5, output_attentions=True
    )
    rep = HQ // HKV
    want, w = (
        torch.from_numpy(a)
        for a in attention_ref(  # Gemma 2: cap the scaled scores, then mask
            q.numpy(),
            k.repeat_interleave(rep, dim=1).numpy(),
            v.repeat_interleave(rep, dim=1).numpy(),
            mask=m.numpy(),
            scale=0.3,
            softcap=1.5,
        )
    )
    want = want.transpose(1, 2)
    live = _live(m)
    _close(out[live], want[live])
    assert weights is not None
    _close(weights.transpose(1, 2)[live], w.transpose(1, 2)[live])
    uncapped, _ = attention_forward(Layer(), q, k, v, m, scaling=0.3)
    assert (uncapped[live] - want[live]).abs().max() > 0.1


def test_scaling_and_multi_head_without_groups():
    q, k, v = _qkv(5, 5, hq=3, hkv=3)
    out, _ = attention_forward(Layer(), q, k, v, None, scaling=0.37)
    _close(out, _sdpa(q, k, v, is_causal=True, scale=0.37))


def test_multi_query():
    q, k, v = _qkv(5, 5, hq=4, hkv=1)
    out, _ = attention_forward(Layer(), q, k, v, _padding_mask(5, 5))
    want = _sdpa(q, k, v, attn_mask=_padding_mask(5, 5))
    live = _live(_padding_mask(5, 5))
    _close(out[live], want[live])


def test_output_attentions_returns_the_weights():
    q, k, v = _qkv(4, 6)
    m = _padding_mask(4, 6)
    out, weights = attention_forward(Layer(), q, k, v, m, scaling=0.5, output_attentions=True)
    rep = HQ // HKV
    scores = q @ k.repeat_interleave(rep, dim=1).transpose(-1, -2) * 0.5
    want = torch.softmax(scores.masked_fill(~m, -torch.inf), dim=-1)
    live = _live(m)
    assert weights is not None
    assert weights.shape == (B, HQ, 4, 6)
    _close(weights.transpose(1, 2)[live], want.transpose(1, 2)[live])
    # the weights are the ones the output was made of
    _close(out, (weights @ v.repeat_interleave(rep, dim=1)).transpose(1, 2))


def test_output_attentions_from_the_module_config():
    q, k, v = _qkv(3, 3)
    layer = Layer()
    layer.config = type("Config", (), {"output_attentions": True})()
    assert attention_forward(layer, q, k, v, None)[1] is not None
    assert attention_forward(layer, q, k, v, None, output_attentions=False)[1] is None


def test_gradients_agree_with_torch_autograd_through_sdpa():
    q, k, v = (x.requires_grad_() for x in _qkv(5, 7))
    m = _padding_mask(5, 7)
    live = _live(m)
    out, _ = attention_forward(Layer(), q, k, v, m)
    g_out = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    g_out[~live] = 0
    got = torch.autograd.grad(out, (q, k, v), g_out)
    want = torch.autograd.grad(_sdpa(q, k, v, attn_mask=m), (q, k, v), g_out)
    for a, b in zip(got, want, strict=True):
        _close(a, b, tol=1e-10)


def test_float32_in_float32_out():
    q, k, v = (x.float() for x in _qkv(4, 4))
    out, _ = attention_forward(Layer(), q, k, v, None)
    assert out.dtype == torch.float32
    _close(out, _sdpa(q, k, v, is_causal=True), tol=1e-5)


def test_inputs_are_not_modified():
    q, k, v = _qkv(4, 4)
    m = _padding_mask(4, 4)
    copies = [x.clone() for x in (q, k, v, m)]
    attention_forward(Layer(), q, k, v, m, output_attentions=True)
    for x, c in zip((q, k, v, m), copies, strict=True):
        assert torch.equal(x, c)


# --- refusals: nothing a model passes is dropped silently -------------------


def test_dropout_while_training_is_refused_and_allowed_in_eval():
    q, k, v = _qkv(3, 3)
    layer = Layer().train()
    with pytest.raises(
        ValueError, match=r"expected dropout=0 while the model trains, got dropout=0\.1"
    ):
        attention_forward(layer, q, k, v, None, dropout=0.1)
    attention_forward(layer, q, k, v, None, dropout=0.0)
    attention_forward(layer.eval(), q, k, v, None, dropout=0.1)


@pytest.mark.parametrize("name", ["head_mask", "alibi"])
def test_unknown_keyword_arguments_are_refused(name):
    q, k, v = _qkv(3, 3)
    with pytest.raises(TypeError, match=f"cannot honour the keyword argument.*{name}"):
        attention_forward(Layer(), q, k, v, None, **{name: torch.zeros(1)})
    # None means absent, and bookkeeping arguments change nothing
    attention_forward(
        Layer(), q, k, v, None, use_cache=True, position_ids=torch.arange(3), **{name: None}
    )


def test_hints_and_extras_reach_attention(monkeypatch):
    """position_bias becomes a bias, s_aux the sinks, and deterministic changes nothing."""
    layer = torch.nn.Module()
    q = torch.randn(1, 4, 3, 8)
    k = v = torch.randn(1, 2, 5, 8)
    seen = []
    real = hf.attention
    monkeypatch.setattr(hf, "attention", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    pb = torch.randn(1, 4, 3, 5)
    attention_forward(layer, q, k, v, None, position_bias=pb, deterministic=False)
    assert torch.equal(seen[-1]["bias"], pb.reshape(1, 2, 2, 3, 5))
    with pytest.raises(
        ValueError,
        match=(
            r"expected position_bias to be a float tensor \(1 or batch, 1 or 4, 3, 5\), "
            r"got torch.float32 tensor of shape \(1, 4, 3, 4\)"
        ),
    ):
        attention_forward(layer, q, k, v, None, position_bias=torch.randn(1, 4, 3, 4))
    with pytest.raises(
        ValueError,
        match=r"expected s_aux \(attention sinks\) to be a tensor of shape \(4,\), got \(2,\)",
    ):
        attention_forward(layer, q, k, v, None, s_aux=torch.zeros(2))


def test_bad_masks_and_shapes_are_refused():
    q, k, v = _qkv(3, 4)
    with pytest.raises(
        ValueError,
        match=r"expected attention_mask of shape \(batch, 1 or 4, 3, 4\), got \(2, 1, 3, 5\)",
    ):
        attention_forward(Layer(), q, k, v, torch.ones(B, 1, 3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="expected attention_mask of shape"):
        attention_forward(Layer(), q, k, v, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(
        TypeError, match=r"expected attention_mask to be boolean or floating, got torch\.int64"
    ):
        attention_forward(Layer(), q, k, v, torch.ones(B, 1, 3, 4, dtype=torch.int64))
    with pytest.raises(
        TypeError, match=r"expected attention_mask to be a torch\.Tensor or None, got object"
    ):
        attention_forward(Layer(), q, k, v, object())
    with pytest.raises(ValueError, match="expected key and value to have the same number of heads"):
        attention_forward(
            Layer(), q, k[:, :1].expand(B, 3, 4, D), v[:, :1].expand(B, 3, 4, D + 2), None
        )
    with pytest.raises(
        ValueError, match=r"expected query of shape \(batch, heads, length, features\)"
    ):
        attention_forward(Layer(), q[0], k, v, None)


# --- registration -----------------------------------------------------------


def test_register_adds_both_interfaces_and_is_idempotent():
    assert register() == "portattn"
    first = AttentionInterface._global_mapping["portattn"]
    assert register() == "portattn"
    assert AttentionInterface._global_mapping["portattn"] is first
    assert AttentionMaskInterface._global_mapping["portattn"] is sdpa_mask
    assert first.func is attention_forward
    assert first.keywords == {"impl": "auto"}
    assert register("portattn-test-blockwise", impl="blockwise") == "portattn-test-blockwise"
    assert AttentionInterface._global_mapping["portattn-test-blockwise"].keywords == {
        "impl": "blockwise"
    }


@pytest.mark.parametrize("name", ["sdpa", "eager", "flex_attention"])
def test_register_refuses_names_of_other_implementations(name):
    before = AttentionInterface._global_mapping.get(name)
    with pytest.raises(
        ValueError, match=f"expected a name that transformers does not already use, got '{name}'"
    ):
        register(name)
    assert AttentionInterface._global_mapping.get(name) is before


def test_register_refuses_unknown_impl_and_empty_name():
    with pytest.raises(ValueError, match=r"expected impl to be one of .*, got 'fast'"):
        register(impl="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected name to be a non-empty string, got ''"):
        register("")


def test_import_without_transformers_names_the_extra():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "try:\n"
        "    import portattn.integrations.transformers\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "import portattn; print('core ok', portattn.attention is not None)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert "pip install 'portattn[transformers]'" in run.stdout
    assert "core ok True" in run.stdout


def test_cli_without_transformers_says_what_to_install():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from portattn.__main__ import main\n"
        "raise SystemExit(main(['hf', '--arch', 'llama']))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "pip install 'portattn[transformers]'" in run.stderr
    assert "Traceback" not in run.stderr
