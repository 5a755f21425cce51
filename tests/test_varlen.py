"""Packed variable-length attention (flash-attn's layout) on every backend.

Oracles: :func:`pa.attention` on each sequence alone (bit-for-bit), a float64
NumPy formula with the dense block-diagonal mask, torch SDPA with that mask
(forward and gradients) and ``jax.grad`` of a dense JAX formula.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import portattn as pa
from portattn._lib._compat import is_concrete
from portattn.testing import to_numpy

from conftest import Backend, assert_close_on, jax_x64, jitted, needs

H, HKV, D = 4, 2, 8
LQ = [5, 0, 23, 1, 12]  # an empty sequence and a decode-sized one among them
LK = [9, 3, 23, 17, 12]


def _cu(lengths: list[int]) -> list[int]:
    return [0, *np.cumsum(lengths).tolist()]


def _packed(rng: np.random.Generator, lq: list[int], lk: list[int], hkv: int = HKV) -> tuple:
    q = rng.standard_normal((sum(lq), H, D))
    k = rng.standard_normal((sum(lk), hkv, D))
    v = rng.standard_normal((sum(lk), hkv, D + 2))
    return q, k, v


def _counted(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Patch ``owner.name`` to count its calls; the list fills as the patched function runs."""
    calls: list[int] = []
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def _varlen(backend: Backend, q, k, v, /, **options: Any) -> Any:
    """pa.attention_varlen on ``backend``; under jax.jit on JAX (eager JAX is slow)."""
    arrays = [backend.asarray(x) for x in (q, k, v)]
    if backend.name != "jax":
        return pa.attention_varlen(*arrays, **options)
    import jax

    return jax.jit(lambda q, k, v: pa.attention_varlen(q, k, v, **options))(*arrays)


def _same(backend: Backend, got: Any, want: np.ndarray) -> None:
    """Bit for bit, except under jax.jit, whose XLA program fuses the packed call as a whole."""
    if backend.name == "jax":
        assert_close_on(backend, got, want, dtype=backend.xp.float64)
    else:
        np.testing.assert_array_equal(to_numpy(got), want)


def _alone(backend: Backend, q, k, v, lq, lk, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence through pa.attention alone, in the packed layout: the oracle."""
    outs, lses = [], []
    cq, ck = _cu(lq), _cu(lk)
    mod = options.pop("score_mod", None)
    for i in range(len(lq)):

        def heads_first(x, a, b):
            return backend.asarray(np.transpose(x[a:b], (1, 0, 2))[None])

        seq_mod = None if mod is None else (lambda s, b, h, qi, kv, i=i: mod(s, b + i, h, qi, kv))
        out, lse = jitted(  # on JAX, as _varlen: _same compares them within rounding there
            backend,
            lambda q, k, v, seq_mod=seq_mod: pa.attention(
                q, k, v, return_lse=True, score_mod=seq_mod, **options
            ),
        )(
            heads_first(q, cq[i], cq[i + 1]),
            heads_first(k, ck[i], ck[i + 1]),
            heads_first(v, ck[i], ck[i + 1]),
        )
        outs.append(np.transpose(to_numpy(out)[0], (1, 0, 2)))
        lses.append(to_numpy(lse)[0])
    return np.concatenate(outs, axis=0), np.concatenate(lses, axis=-1)


def _dense_reference(q, k, v, lq, lk, *, causal=False, window=None, sinks=None, softcap=None):
    """float64, the whole packed batch at once with its block-diagonal mask."""
    cq, ck = _cu(lq), _cu(lk)
    allowed = np.zeros((sum(lq), sum(lk)), dtype=bool)
    for i in range(len(lq)):
        qi = np.arange(lq[i])[:, None]
        kj = np.arange(lk[i])[None, :]
        ok = np.ones((lq[i], lk[i]), dtype=bool)
        shift = lk[i] - lq[i]  # bottom-right alignment
        if causal:
            ok &= kj <= qi + shift
        if window is not None:
            ok &= (kj >= qi + shift - window) & (kj <= qi + shift + window)
        allowed[cq[i] : cq[i + 1], ck[i] : ck[i + 1]] = ok
    kk = np.repeat(k, H // k.shape[1], axis=1)
    vv = np.repeat(v, H // v.shape[1], axis=1)
    s = np.einsum("qhd,khd->hqk", q, kk) / np.sqrt(D)
    if softcap is not None:
        s = np.tanh(s / softcap) * softcap
    s = np.where(allowed, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks[:, None, None])
    top = np.where(np.isinf(top), 0.0, top)
    e = np.exp(s - top)
    total = e.sum(-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks[:, None, None] - top)
    out = np.einsum("hqk,khd->qhd", e / np.where(total == 0, 1, total), vv)
    return out, (np.log(total) + top)[..., 0]


CASES = {
    "plain": {},
    "bottom_right": {"causal": "bottom_right"},
    "window": {"causal": "bottom_right", "window": 4},
    "softcap": {"softcap": 2.0},
    "sinks": {"causal": "bottom_right", "sinks": "sinks"},
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_sequence_equals_attention_alone_and_the_dense_mask(backend: Backend, rng, case):
    q, k, v = _packed(rng, LQ, LK)
    sinks = rng.standard_normal(H)
    opts = {n: (backend.asarray(sinks) if x == "sinks" else x) for n, x in CASES[case].items()}
    out, lse = _varlen(
        backend,
        q,
        k,
        v,
        cu_seqlens_q=np.array(_cu(LQ), dtype=np.int32),
        cu_seqlens_k=_cu(LK),
        return_lse=True,
        **opts,
    )
    assert tuple(out.shape) == (sum(LQ), H, D + 2) and tuple(lse.shape) == (H, sum(LQ))
    alone, alone_lse = _alone(backend, q, k, v, LQ, LK, **opts)
    _same(backend, out, alone)
    _same(backend, lse, alone_lse)
    ref_opts = {n: x for n, x in CASES[case].items() if n != "sinks"}
    if "causal" in ref_opts:
        ref_opts["causal"] = True
    want, want_lse = _dense_reference(
        q, k, v, LQ, LK, sinks=sinks if "sinks" in CASES[case] else None, **ref_opts
    )
    assert_close_on(backend, out, want, dtype=backend.xp.float64)
    assert_close_on(backend, lse, want_lse, dtype=backend.xp.float64)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_batch_invariant_false_is_one_call_equal_within_rounding(
    backend: Backend, rng, case, monkeypatch
):
    """The fused path: one attend call with the block-diagonal mask, the same values."""
    import portattn._varlen as varlen

    calls = _counted(monkeypatch, varlen, "attend")
    q, k, v = _packed(rng, LQ, LK)
    sinks = rng.standard_normal(H)
    opts = {n: (backend.asarray(sinks) if x == "sinks" else x) for n, x in CASES[case].items()}
    cu_q, cu_k = _cu(LQ), _cu(LK)
    out, lse = _varlen(
        backend, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True,
        batch_invariant=False, **opts,
    )  # fmt: skip
    assert len(calls) == 1
    alone, alone_lse = _alone(backend, q, k, v, LQ, LK, **opts)
    assert_close_on(backend, out, alone, dtype=backend.xp.float64)
    assert_close_on(backend, lse, alone_lse, dtype=backend.xp.float64)
    calls.clear()
    _varlen(
        backend, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, batch_invariant=False,
        score_mod=lambda s, b, h, qi, kv: s,
    )  # fmt: skip
    assert len(calls) == len(LQ)  # a score_mod sees positions within a sequence: per sequence


# NumPy warns of the fused attempt's 0 * inf, which the call then runs again per sequence.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_batch_invariant_false_keeps_a_sequences_inf_and_nan_keys_to_itself(
    backend: Backend, rng, causal
):
    """Sequence 2 holds a NaN key and an inf value: the fused call's other rows stay finite.

    torch's kernel reads every key of the packed row (NaN rows elsewhere), the
    materialising path weighs the inf value by 0 (NaN): the fused call sees
    it in its output and runs the step per sequence. (Eager on JAX: under
    jax.jit the output cannot be read.)
    """
    q, k, v = _packed(rng, LQ, LK)
    a = _cu(LK)[2]
    k[a + 3, 0, 1] = np.nan
    v[a + 5, 1, 0] = np.inf
    options: dict[str, Any] = {"cu_seqlens_q": _cu(LQ), "cu_seqlens_k": _cu(LK), "causal": causal}
    q, k, v = (backend.asarray(x) for x in (q, k, v))
    fused = to_numpy(pa.attention_varlen(q, k, v, batch_invariant=False, **options))
    alone = to_numpy(pa.attention_varlen(q, k, v, **options))
    rows = np.ones(sum(LQ), dtype=bool)
    rows[_cu(LQ)[2] : _cu(LQ)[3]] = False
    assert np.isfinite(fused[rows]).all()
    np.testing.assert_allclose(fused, alone, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_batch_invariant_false_keeps_the_checks_and_refuses_a_non_flag(rng):
    q, k, v = _packed(rng, LQ, LK)
    with pytest.raises(ValueError, match=r"sequence 0 \(Lq=5, Lk=9\).*causal=True is ambiguous"):
        pa.attention_varlen(
            q, k, v, cu_seqlens_q=_cu(LQ), cu_seqlens_k=_cu(LK), causal=True,
            batch_invariant=False,
        )  # fmt: skip
    with pytest.raises(ValueError, match="expected batch_invariant to be True or False, got 'no'"):
        pa.attention_varlen(
            q, k, v, cu_seqlens_q=_cu(LQ), cu_seqlens_k=_cu(LK), batch_invariant="no"
        )


def test_score_mod_sees_the_sequence_index_and_positions_within_it(backend: Backend, rng):
    q, k, v = _packed(rng, LQ, LK)
    xp = backend.xp
    seen: list[tuple[int, int, int]] = []

    def mod(s, b, h, qi, kv):
        # Recorded where the indices hold values (JAX traces the mod first); an
        # empty sequence's empty tile has none to read.
        if is_concrete(b) and qi.shape[2] and kv.shape[3]:
            seen.append((int(to_numpy(b).max()), int(to_numpy(qi).min()), int(to_numpy(kv).min())))
        return s + xp.astype(b, s.dtype) * 0.25 - xp.astype(abs(qi - kv), s.dtype) * 0.1

    out = _varlen(
        backend,
        q,
        k,
        v,
        cu_seqlens_q=_cu(LQ),
        cu_seqlens_k=_cu(LK),
        causal="top_left",
        score_mod=mod,
        impl="blockwise",
    )
    if backend.name != "jax":
        assert {b for b, _, _ in seen} == {0, 2, 3, 4}  # sequence 1 has no query
        assert all(q0 == 0 and k0 == 0 for _, q0, k0 in seen)  # positions start at each sequence
    alone, _ = _alone(backend, q, k, v, LQ, LK, causal="top_left", score_mod=mod, impl="blockwise")
    _same(backend, out, alone)


def test_rows_do_not_depend_on_the_other_sequences(backend: Backend, rng):
    """Batch invariance: sequence 2's rows, bit for bit, in three different crowds."""
    q, k, v = _packed(rng, [23], [23])
    got = []
    for before, after in (([], []), ([7, 40], [1]), ([33], [3, 50, 2])):
        lengths = [*before, 23, *after]
        pq, pk, pv = _packed(rng, lengths, lengths)
        at = sum(before)
        pq[at : at + 23], pk[at : at + 23], pv[at : at + 23] = q, k, v
        out = _varlen(
            backend,
            pq,
            pk,
            pv,
            cu_seqlens_q=_cu(lengths),
            cu_seqlens_k=_cu(lengths),
            causal=True,
        )
        got.append(to_numpy(out)[at : at + 23])
    for other in got[1:]:
        np.testing.assert_array_equal(other, got[0])


def test_work_follows_the_sequences_own_tiles(rng, monkeypatch):
    """Scores are formed only on each sequence's own block: sum(Lq_i * Lk_i), never T^2."""
    from portattn._core._problem import Problem

    areas: list[int] = []
    scores = Problem.scores

    def counted(self, qb, k_t, q0, q1, k0, k1, *, xp):
        areas.append(int(np.prod(qb.shape[:-1])) * (k1 - k0))
        return scores(self, qb, k_t, q0, q1, k0, k1, xp=xp)

    monkeypatch.setattr(Problem, "scores", counted)
    lengths = [40, 3, 70, 11, 2]
    q, k, v = _packed(rng, lengths, lengths, hkv=H)
    pa.attention_varlen(
        q, k, v, cu_seqlens_q=_cu(lengths), cu_seqlens_k=_cu(lengths), impl="blockwise",
        block_size=16,
    )  # fmt: skip
    assert sum(areas) == H * sum(n * n for n in lengths)  # 6994 * H, against T^2 = 15876 * H
    areas.clear()
    pa.attention_varlen(
        q, k, v, cu_seqlens_q=_cu(lengths), cu_seqlens_k=_cu(lengths), impl="blockwise",
        block_size=16, causal=True,
    )  # fmt: skip
    # Causal: per query block, only the key blocks up to its diagonal.
    want = sum((min(q0 + 16, n) - q0) * min(q0 + 16, n) for n in lengths for q0 in range(0, n, 16))
    assert sum(areas) == H * want


@pytest.mark.parametrize(
    ("cu_q", "cu_k", "error", "match"),
    [
        ([0, 5, 3, 47], None, ValueError, "cu_seqlens_q to be non-decreasing, got 5 then 3"),
        ([1, 5, 47], None, ValueError, "cu_seqlens_q to start at 0, got 1"),
        ([0, 5, 40], None, ValueError, "cu_seqlens_q to end at the packed length 41, got 40"),
        (np.array([0.0, 41.0]), None, TypeError, "cu_seqlens_q to be a 1-D integer array"),
        (None, [0, 9, 64], ValueError, "count the same sequences, got 5 and 2"),
        (None, [0, 9, 12, 35, 52, 63], ValueError, "cu_seqlens_k to end at the packed length 64"),
    ],
)
def test_bad_offsets_are_refused_by_name(rng, cu_q, cu_k, error, match):
    q, k, v = _packed(rng, LQ, LK)
    with pytest.raises(error, match=match):
        pa.attention_varlen(
            q,
            k,
            v,
            cu_seqlens_q=_cu(LQ) if cu_q is None else cu_q,
            cu_seqlens_k=_cu(LK) if cu_k is None else cu_k,
        )


@pytest.mark.parametrize("heads_first", [False, True])
def test_bad_layouts_are_refused_with_the_expected_shape(rng, heads_first):
    """Both layouts: the packed (T, H, d) and the adapter's heads-first (1, H, T, d)."""
    from portattn._varlen import varlen_heads_first

    q, k, v = _packed(rng, LQ, LK)
    call = pa.attention_varlen
    if heads_first:
        q, k, v = (np.transpose(x, (1, 0, 2))[None] for x in (q, k, v))
        call = varlen_heads_first
    want = "4-D \\(1, H, Tq, d\\)" if heads_first else "3-D \\(Tq, H, d\\)"
    bad_q = [q[0], np.concatenate([q, q])] if heads_first else [q[0], q[None]]
    for wrong in bad_q:
        with pytest.raises(ValueError, match=f"expected q to be {want}, got shape"):
            call(wrong, k, v, cu_seqlens_q=_cu(LQ), cu_seqlens_k=_cu(LK))
    short_v = v[..., :-1, :] if heads_first else v[:-1]
    with pytest.raises(ValueError, match="expected k and v to share"):
        call(q, k, short_v, cu_seqlens_q=_cu(LQ), cu_seqlens_k=_cu(LK))


def test_causal_true_needs_equal_lengths_and_names_the_sequence(rng):
    q, k, v = _packed(rng, LQ, LK)
    with pytest.raises(ValueError, match=r"sequence 0 \(Lq=5, Lk=9\).*bottom_right"):
        pa.attention_varlen(q, k, v, cu_seqlens_q=_cu(LQ), cu_seqlens_k=_cu(LK), causal=True)
    with pytest.raises(ValueError, match="max_seqlen_q to bound every sequence's length"):
        pa.attention_varlen(q, k, v, cu_seqlens_q=_cu(LQ), cu_seqlens_k=_cu(LK), max_seqlen_q=12)


def test_torch_matches_sdpa_with_the_block_diagonal_mask_forward_and_backward(rng):
    needs("torch", "torch")
    import torch

    from conftest import get_backend

    get_backend("torch")
    lq = lk = [6, 19, 1, 30]
    q, k, v = (torch.tensor(x, requires_grad=True) for x in _packed(rng, lq, lk))
    sinks = torch.tensor(rng.standard_normal(H), requires_grad=True)
    slope = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)

    def alibi(s, b, h, qi, kv):  # captures a tensor that needs its gradient
        return s - slope * (qi - kv).to(s.dtype)

    out = pa.attention_varlen(
        q, k, v, cu_seqlens_q=torch.tensor(_cu(lq)), cu_seqlens_k=_cu(lk), causal=True,
        score_mod=alibi, sinks=sinks, impl="blockwise", block_size=8,
    )  # fmt: skip
    g = torch.tensor(rng.standard_normal(out.shape))
    grads = torch.autograd.grad(out, (q, k, v, sinks, slope), g)

    doc = torch.repeat_interleave(torch.arange(len(lq)), torch.tensor(lq))
    pos = torch.arange(sum(lq)) - torch.tensor(_cu(lq))[doc]
    allowed = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    bias = -slope * (pos[:, None] - pos[None, :]).to(torch.float64)
    bias = bias.masked_fill(~allowed, -torch.inf)
    # Sinks as one extra key whose value is 0 (gpt-oss's formulation).
    qh, kh, vh = (x.permute(1, 0, 2)[None] for x in (q, k, v))
    kh = torch.cat([kh.repeat_interleave(2, 1), torch.zeros(1, H, 1, D, dtype=q.dtype)], 2)
    vh = torch.cat([vh.repeat_interleave(2, 1), torch.zeros(1, H, 1, D + 2, dtype=q.dtype)], 2)
    n = sum(lq)
    full_bias = torch.cat([bias.expand(H, n, n), sinks[:, None, None].expand(H, n, 1)], -1)
    want = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=full_bias[None])
    want = want[0].permute(1, 0, 2)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    for got, ref in zip(grads, torch.autograd.grad(want, (q, k, v, sinks, slope), g), strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-11)


def test_jax_grads_match_the_dense_formula_under_jit(rng):
    needs("jax", "jax")
    import jax

    from conftest import get_backend

    get_backend("jax")
    jnp = jax.numpy
    lq, lk = [4, 11, 1], [9, 11, 6]
    q, k, v = _packed(rng, lq, lk)
    sinks = rng.standard_normal(H)
    allowed = np.zeros((sum(lq), sum(lk)), dtype=bool)
    for i in range(3):
        qi, kj = np.arange(lq[i])[:, None], np.arange(lk[i])[None, :]
        block = kj <= qi + lk[i] - lq[i]
        allowed[_cu(lq)[i] : _cu(lq)[i + 1], _cu(lk)[i] : _cu(lk)[i + 1]] = block

    def ours(q, k, v, sinks):
        out = pa.attention_varlen(
            q, k, v, cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk), causal="bottom_right",
            sinks=sinks, impl="blockwise", block_size=8,
        )  # fmt: skip
        return jnp.sum(out * jnp.sin(out))

    def dense(q, k, v, sinks):
        kk, vv = jnp.repeat(k, 2, axis=1), jnp.repeat(v, 2, axis=1)
        s = jnp.einsum("qhd,khd->hqk", q, kk) / np.sqrt(D)
        s = jnp.where(allowed, s, -jnp.inf)
        s = jnp.concatenate([s, jnp.broadcast_to(sinks[:, None, None], (H, sum(lq), 1))], -1)
        w = jax.nn.softmax(s, axis=-1)[..., :-1]
        out = jnp.einsum("hqk,khd->qhd", w, vv)
        return jnp.sum(out * jnp.sin(out))

    with jax_x64(True):
        args = tuple(jnp.asarray(x) for x in (q, k, v, sinks))
        got = jax.jit(jax.grad(ours, argnums=(0, 1, 2, 3)))(*args)
        want = jax.grad(dense, argnums=(0, 1, 2, 3))(*args)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)


def _block_mask(lq: list[int], lk: list[int], *, window: int | None = None) -> np.ndarray:
    """The (Tq, Tk) block-diagonal mask, each block bottom-right causal (and windowed)."""
    allowed = np.zeros((sum(lq), sum(lk)), dtype=bool)
    cq, ck = _cu(lq), _cu(lk)
    for i in range(len(lq)):
        qi, kj = np.arange(lq[i])[:, None], np.arange(lk[i])[None, :]
        ok = kj <= qi + lk[i] - lq[i]
        if window is not None:
            ok &= kj >= qi + lk[i] - lq[i] - window
        allowed[cq[i] : cq[i + 1], ck[i] : ck[i + 1]] = ok
    return allowed


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_torch_call_is_sdpa_with_the_boolean_mask_bit_for_bit(rng, window, dtype):
    """The fused call hands torch's kernel the 0 / -inf bias that SDPA makes of a boolean mask.

    Built once per step instead of by the kernel on every layer: the same
    scores, so the same bits as SDPA handed the boolean block-diagonal mask.
    """
    needs("torch", "torch")
    import torch

    from conftest import get_backend

    get_backend("torch")
    q, k, v = (torch.tensor(x, dtype=getattr(torch, dtype)) for x in _packed(rng, LQ, LK))
    opts: dict[str, Any] = {"causal": "bottom_right", "window": window}
    out = pa.attention_varlen(
        q, k, v, cu_seqlens_q=_cu(LQ), cu_seqlens_k=_cu(LK), batch_invariant=False, **opts
    )
    allowed = torch.tensor(_block_mask(LQ, LK, window=window))
    qh, kh, vh = (x.permute(1, 0, 2)[None] for x in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=allowed, enable_gqa=True
    )
    assert torch.equal(out, want[0].permute(1, 0, 2))


def test_fused_variant_proves_that_every_row_sees_a_key_from_the_offsets():
    """``rows_see_keys`` (the native path then skips its search for empty rows) only when true."""
    from portattn._core._variant import build_variant
    from portattn._lib._compat import array_namespace
    from portattn._varlen import _fused_variant

    like = np.zeros(1)
    xp = array_namespace(like)

    def proved(lq: list[int], lk: list[int], **options: Any) -> bool:
        spans = [(a, n) for a, n in zip(_cu(lk), lk, strict=False)]
        variant = build_variant(**options)
        fused = _fused_variant(_cu(lq), spans, sum(lk), variant, additive=None, like=like, xp=xp)
        assert fused.mask is not None and bool(np.any(to_numpy(fused.mask)))
        return fused.rows_see_keys

    assert proved(LQ, LK, causal="bottom_right")
    assert proved(LQ, LK, causal="bottom_right", window=0)  # each row sees its own key
    assert proved(LQ, LK)
    assert not proved([3, 2, 4], [5, 0, 4])  # sequence 1: queries and no key
    assert not proved([3, 6], [5, 4], causal="bottom_right")  # its first 2 rows precede its keys
    assert not proved([3, 6], [5, 4], causal="top_left", window=(0, 0))  # rows 4, 5: no key 4, 5


@pytest.mark.parametrize(
    ("lib", "impl"), [("torch", "auto"), ("torch", "native"), ("jax", "native")]
)
def test_fused_rows_that_see_no_key_are_zero_in_one_call(rng, monkeypatch, lib, impl):
    """A sequence with queries and no key: its rows are 0, the others its own call's, in one call.

    Not proved from the offsets (``rows_see_keys`` unset), so the native
    path looks for the empty rows and zeroes them: JAX's kernel spreads
    their weight uniformly (torch 2.13's gives 0 itself, older math kernels NaN).
    """
    needs(lib, lib)
    import portattn._varlen as varlen

    from conftest import get_backend

    backend = get_backend(lib)
    calls = _counted(monkeypatch, varlen, "attend")
    lq, lk = [3, 2, 4], [5, 0, 4]
    q, k, v = _packed(rng, lq, lk)
    # JAX's kernel: float32 only, and values as wide as the queries.
    q, k, v = (backend.asarray(x, dtype=backend.xp.float32) for x in (q, k, v[..., :D]))
    options: dict[str, Any] = {"cu_seqlens_q": _cu(lq), "cu_seqlens_k": _cu(lk), "impl": impl}
    out = to_numpy(pa.attention_varlen(q, k, v, batch_invariant=False, **options))
    assert len(calls) == 1
    np.testing.assert_array_equal(out[3:5], 0.0)
    alone = to_numpy(pa.attention_varlen(q, k, v, **options))
    np.testing.assert_allclose(out, alone, rtol=1e-5, atol=1e-6)


def test_finite_is_one_sum_that_never_passes_a_non_finite_output(backend: Backend):
    """``all_finite`` (``run_fused``'s output, auto's hidden keys): a finite sum proves every
    element finite; an overflow only alarms."""
    from portattn._lib._compat import all_finite as _finite

    xp = backend.xp
    if not is_concrete(backend.asarray(np.zeros(1))):
        pytest.skip(f"{backend.name}'s arrays are not read by the check (lazy)")
    rows = np.ones((4, 3, 2))
    assert _finite(backend.asarray(rows), xp=xp)
    for bad in ([np.nan], [np.inf], [-np.inf], [np.inf, -np.inf]):
        x = rows.copy()
        x.flat[: len(bad)] = bad
        assert not _finite(backend.asarray(x), xp=xp)
    assert not _finite(backend.asarray(np.full((4,), 1e308)), xp=xp)  # overflows: a false alarm
    if hasattr(xp, "float16"):  # not in the standard (array-api-strict has none)
        half = backend.asarray(np.full((4, 3), 6e4), dtype=xp.float16)  # sum: past float16's max
        assert _finite(half, xp=xp)


@pytest.mark.parametrize(
    "lengths", [(LQ, LK), ([1, 1, 1, 1], [7, 3, 12, 1])], ids=["mixed", "decode"]
)
def test_fused_repeat_call_goes_straight_to_the_kernel_with_the_same_bits(
    rng, monkeypatch, lengths
):
    """A layer's repeat fused call skips ``prepare`` (its plan was checked): the same bits.

    Not under autocast, which the whole way turns off (the shortcut would
    run the kernel in bfloat16).
    """
    needs("torch", "torch")
    import torch

    import portattn._attention as attention
    from portattn._paths._auto import forget_plans

    from conftest import get_backend

    get_backend("torch")
    lq, lk = lengths
    prepared = _counted(monkeypatch, attention, "prepare")
    q, k, v = (torch.tensor(x, dtype=torch.float32) for x in _packed(rng, lq, lk))
    options: dict[str, Any] = {
        "cu_seqlens_q": _cu(lq), "cu_seqlens_k": _cu(lk), "causal": "bottom_right",
        "batch_invariant": False,
    }  # fmt: skip
    first = pa.attention_varlen(q, k, v, **options)
    assert prepared == [1]
    again = pa.attention_varlen(q, k, v, **options)
    assert prepared == [1]  # straight to the kernel
    assert torch.equal(again, first)
    forget_plans()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pa.attention_varlen(q, k, v, **options)  # checked again: the plans were forgotten
        autocast = pa.attention_varlen(q, k, v, **options)
    assert len(prepared) == 3
    assert autocast.dtype == torch.float32
    assert torch.equal(autocast, first)


def test_fused_batch_of_long_sequences_runs_per_sequence(rng, monkeypatch):
    """Blocks that leave most pairs out: one call would compute them all, so each runs alone.

    The same bits as the default then; the test's short batch above still
    runs as one call (``test_batch_invariant_false_is_one_call_equal_within_rounding``).
    """
    import portattn._varlen as varlen

    calls = _counted(monkeypatch, varlen, "attend")
    lq, lk = [1, 1, 1, 1], [6000, 5000, 6000, 5500]  # decode over long caches
    q, k, v = _packed(rng, lq, lk)
    options: dict[str, Any] = {"cu_seqlens_q": _cu(lq), "cu_seqlens_k": _cu(lk)}
    fused = pa.attention_varlen(q, k, v, batch_invariant=False, **options)
    assert len(calls) == len(lq)
    np.testing.assert_array_equal(fused, pa.attention_varlen(q, k, v, **options))
    calls.clear()
    pa.attention_varlen(q[:2], k[:20], v[:20], cu_seqlens_q=[0, 1, 2], cu_seqlens_k=[0, 9, 20])
    pa.attention_varlen(
        q[:2], k[:20], v[:20], cu_seqlens_q=[0, 1, 2], cu_seqlens_k=[0, 9, 20],
        batch_invariant=False,
    )  # fmt: skip
    assert len(calls) == 2 + 1  # short ones: one call


def test_fused_shortcut_memo_answers_only_the_same_call(rng):
    """The kernel plan memoised for a step's variant holds for its very facts, never a bool scale.

    ``scale=True`` equals ``1`` as a dict key: the memo keys on the scale's
    type too, so the checks still refuse it.
    """
    needs("torch", "torch")
    import torch

    from portattn._attention import attend
    from portattn._core._prepare import kernel_mask_plan
    from portattn._core._variant import build_variant
    from portattn._lib._compat import array_namespace
    from portattn._varlen import _fused_variant

    from conftest import get_backend

    get_backend("torch")
    lq, lk = [1, 1, 1], [5, 9, 2]
    q, k, v = (torch.tensor(x, dtype=torch.float32) for x in _packed(rng, lq, lk))
    qh, kh, vh = (x.permute(1, 0, 2)[None] for x in (q, k, v))
    xp = array_namespace(qh)
    spans = [(a, n) for a, n in zip(_cu(lk), lk, strict=False)]
    fused = _fused_variant(
        _cu(lq), spans, sum(lk), build_variant(causal="bottom_right"), additive=torch.float32,
        like=qh, xp=xp,
    )  # fmt: skip
    assert kernel_mask_plan(qh, kh, vh, variant=fused, scale=1) is None  # not checked yet
    want = attend(qh, kh, vh, variant=fused, scale=1, impl="native", xp=xp)
    assert kernel_mask_plan(qh, kh, vh, variant=fused, scale=1) is not None
    assert torch.equal(attend(qh, kh, vh, variant=fused, scale=1, impl="native", xp=xp), want)
    assert kernel_mask_plan(qh, kh, vh, variant=fused, scale=True) is None
    with pytest.raises(ValueError, match="expected scale to be a finite real number"):
        attend(qh, kh, vh, variant=fused, scale=True, impl="native", xp=xp)
    assert kernel_mask_plan(qh.double(), kh.double(), vh.double(), variant=fused, scale=1) is None


def test_the_kernel_memo_holds_no_mask_the_fused_memo_let_go(rng):
    """Emptying the fused masks' memo empties kernel_mask_plan's: no bias outlives both."""
    needs("torch", "torch")
    import torch

    import portattn._core._prepare as prepare
    import portattn._varlen as varlen

    from conftest import get_backend

    get_backend("torch")
    for step in range(2 * varlen._MASKS_MAX + 1):  # past the memo's size: emptied at least once
        lq, lk = [1, 1, 1], [5 + step, 9, 2]
        q, k, v = (torch.tensor(x, dtype=torch.float32) for x in _packed(rng, lq, lk))
        for _ in range(2):  # a step's two layers: the second one memoises the kernel's plan
            pa.attention_varlen(
                q, k, v, cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk), causal="bottom_right",
                batch_invariant=False,
            )  # fmt: skip
        held = {id(fused) for fused in varlen._MASKS.values()}
        assert prepare._KERNEL_MASK, "the repeat call memoised no kernel plan"
        assert {id(entry[0]) for entry in prepare._KERNEL_MASK.values()} <= held
