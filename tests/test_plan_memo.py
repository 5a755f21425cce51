"""The memoised plans of repeat calls: what changes between calls is never taken from the memo.

A plan (``_core._prepare``) is memoised on what its checks read: dtypes,
shapes, devices and options. A call that differs only in its lengths (a decode
step over a growing cache) reuses its family's facts; a call with array
options (the fused varlen mask) reuses its plan but never its arrays; the
transformers adapter reads a step's offsets once per tensor version. Each test
makes the memo's key matter: a call that shares a key with a memoised one but
differs where the key must see it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import portattn as pa
from portattn._core import _prepare
from portattn._paths import _auto

torch = pytest.importorskip("torch")


def _sdpa(q, k, v, *, scale, mask=None, bottom_right=False):
    """The oracle: torch's SDPA in float64, GQA keys repeated, causal aligned bottom-right."""
    q, k, v = (torch.as_tensor(np.asarray(x), dtype=torch.float64) for x in (q, k, v))
    groups = q.shape[-3] // k.shape[-3]
    k, v = (x.repeat_interleave(groups, dim=-3) for x in (k, v))
    lq, lk = q.shape[-2], k.shape[-2]
    if bottom_right:
        rows = torch.arange(lq)[:, None] + (lk - lq)
        mask = torch.arange(lk)[None, :] <= rows
    if mask is not None:
        mask = torch.as_tensor(np.asarray(mask))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@pytest.fixture
def validations(monkeypatch):
    """How many calls ran the whole validation; the plan memo starts empty."""
    calls = []
    validate = _prepare._validate
    monkeypatch.setattr(
        _prepare, "_validate", lambda *a, **kw: calls.append(1) or validate(*a, **kw)
    )
    monkeypatch.setattr(_prepare, "_PLANS", {})
    monkeypatch.setattr(_auto, "_DECIDED", {})  # the shortcut's decisions derive from the plans
    return calls


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_a_new_length_reuses_its_family_and_keeps_its_own_scale_and_options(lib, validations):
    rng = np.random.default_rng(0)
    as_array = np.asarray if lib == "numpy" else torch.from_numpy

    def draw(lq, lk):
        q = rng.standard_normal((2, 4, lq, 8))
        k, v = (rng.standard_normal((2, 2, lk, 8)) for _ in range(2))
        return [as_array(x) for x in (q, k, v)]

    q, k, v = draw(1, 30)
    pa.attention(q, k, v, causal="bottom_right", scale=0.3)
    assert len(validations) == 1
    for lq, lk, scale in ((1, 31, 0.3), (3, 32, 0.3), (1, 33, 0.7)):
        q, k, v = draw(lq, lk)
        out = pa.attention(q, k, v, causal="bottom_right", scale=scale)
        want = _sdpa(q, k, v, scale=scale, bottom_right=True)
        np.testing.assert_allclose(np.asarray(out), want.numpy(), rtol=1e-12, atol=1e-12)
    # Lengths alone changed (one family); the other scale is a family of its own.
    assert len(validations) == 2
    softcapped = pa.attention(q, k, v, causal="bottom_right", scale=0.7, softcap=0.5)
    assert len(validations) == 3
    assert not np.allclose(np.asarray(softcapped), np.asarray(out))


def test_a_family_hit_still_refuses_what_the_new_lengths_make_wrong(validations):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, n, 4)) for n in (5, 5, 5))
    pa.attention(q, k, v, causal=True)  # Lq == Lk: causal=True is fine
    k6, v6 = (rng.standard_normal((1, 2, 6, 4)) for _ in range(2))
    with pytest.raises(ValueError, match="causal=True is ambiguous when Lq != Lk"):
        pa.attention(q, k6, v6, causal=True)
    with pytest.raises(ValueError, match="expected value to have Lk=6 rows"):
        pa.attention(q, k6, v, causal=True)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        pa.attention(q, k6[0, 0, 0], v6, causal=True)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_a_repeat_call_with_a_mask_reuses_the_plan_and_reads_its_own_mask(lib, validations):
    rng = np.random.default_rng(2)
    as_array = np.asarray if lib == "numpy" else torch.from_numpy
    q, k, v = (as_array(rng.standard_normal((1, 4, 6, 8))) for _ in range(3))
    masks = [rng.random((6, 6)) < p for p in (0.3, 0.6, 0.9)]
    for m in masks:
        m[:, 0] = True  # every row sees a key
    for m in masks:
        out = pa.attention(q, k, v, mask=as_array(m), scale=0.5)
        want = _sdpa(q, k, v, scale=0.5, mask=m)
        np.testing.assert_allclose(np.asarray(out), want.numpy(), rtol=1e-12, atol=1e-12)
    assert len(validations) == 1  # one plan for the three masks
    wide = as_array(np.broadcast_to(masks[0], (1, 4, 6, 6)).copy())  # another shape: checked
    pa.attention(q, k, v, mask=wide, scale=0.5)
    assert len(validations) == 2
    with pytest.raises(TypeError, match="expected mask to be a boolean array"):
        pa.attention(q, k, v, mask=as_array(masks[0].astype(np.float64)), scale=0.5)
    for plan in _prepare._PLANS.values():  # the memo holds no array, not even in its variant
        assert not any(isinstance(x, np.ndarray | torch.Tensor) for x in plan)
        assert not plan[6].arrays()


def test_the_fused_varlen_call_follows_each_steps_offsets(validations):
    """Decode steps whose offsets change: each step's fused mask and plan are its own."""
    rng = np.random.default_rng(3)
    for lengths in ([5, 9, 3], [6, 10, 4], [2, 12, 6]):
        cu_k = [0, *np.cumsum(lengths).tolist()]
        q = torch.from_numpy(rng.standard_normal((3, 4, 8)))
        k, v = (torch.from_numpy(rng.standard_normal((cu_k[-1], 2, 8))) for _ in range(2))
        fused = pa.attention_varlen(
            q, k, v, cu_seqlens_q=[0, 1, 2, 3], cu_seqlens_k=cu_k, causal="bottom_right",
            batch_invariant=False,
        )  # fmt: skip
        for i, (a, b) in enumerate(itertools.pairwise(cu_k)):
            one = (x.permute(1, 0, 2)[None] for x in (q[i : i + 1], k[a:b], v[a:b]))
            want = _sdpa(*one, scale=8**-0.5)[0, :, 0, :]
            torch.testing.assert_close(fused[i], want, rtol=1e-12, atol=1e-12)


def test_the_adapter_rereads_offsets_written_in_place():
    """Continuous batching refills one offsets buffer in place: the adapter must see each step's."""
    from portattn.integrations import transformers as hf

    layer = torch.nn.Module()
    layer.is_causal = False
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 4, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 4, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    buffer = torch.tensor([0, 2, 4, 0], dtype=torch.int32)
    cu = buffer[:3]  # a view of the buffer, as continuous batching passes it
    kw = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu}
    two, _ = hf.attention_forward(layer, q, k, v, None, **kw)
    again, _ = hf.attention_forward(layer, q, k, v, None, **kw)
    assert torch.equal(two, again)
    buffer[1] = 1  # the next step's offsets, written through the buffer: [0, 1, 4]
    moved, _ = hf.attention_forward(layer, q, k, v, None, **kw)
    fresh, _ = hf.attention_forward(layer, q, k, v, None, cu_seq_lens_q=cu.clone(),
                                    cu_seq_lens_k=cu.clone())  # fmt: skip
    assert torch.equal(moved, fresh) and not torch.equal(moved, two)


def test_a_decode_step_with_a_new_length_takes_the_kernel_shortcut(validations, monkeypatch):
    """Once a family is checked plain, a new Lk goes from attend to SDPA with the same bits."""
    from portattn import _attention as entry

    taken = []
    real = entry.plain_native
    monkeypatch.setattr(entry, "plain_native", lambda *a, **kw: taken.append(1) or real(*a, **kw))
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 1, 8, generator=gen)
    for lk in (20, 21, 22):
        k, v = (torch.randn(1, 2, lk, 8, generator=gen) for _ in range(2))
        out = pa.attention(q, k, v, causal="bottom_right")
        assert torch.equal(out, pa.attention(q, k, v, causal="bottom_right", impl="native"))
    assert len(validations) == 1 and len(taken) == 2  # the first call went the whole way
    with pytest.raises(ValueError, match="causal=True is ambiguous"):
        pa.attention(q, k, v, causal=True)  # another family: checked, and refused
