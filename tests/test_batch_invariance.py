"""Batch invariance: a sequence's output rows, bit for bit, whatever else is batched with it.

What every path guarantees, asserted exactly here on every backend: a
sequence's rows from ``pa.attention_varlen`` (a packed batch) and from
``pa.paged_attention`` (a paged cache shared with other sequences, pages in
any order) equal ``pa.attention`` on that sequence alone. Both run each
sequence as its own problem, of the same shape whatever its neighbours, so
the same arithmetic runs in the same order.

What only ``impl="invariant"`` guarantees: a sequence in a padded batch
(``key_lengths``) equals it alone, and a token computed by decode or by a
chunked prefill equals the same token in a full prefill. On the other paths
the matmuls see other shapes and BLAS sums in another order (measured
2026-12-04, float64, H=4, d=16, L=37: up to 2.2e-16 in a padded batch on
NumPy, array-api-strict and torch, up to 1e-15 by decode on every library).
The invariant path forms no matmul: fixed key tiles aligned to absolute
key positions, sums over one contiguous axis of fixed length, and an online
softmax merged tile by tile in one order (``_paths/_invariant.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn.testing import to_numpy

from conftest import Backend, assert_close_on, jax_x64, option_arrays

# Three crowds per case on four libraries: minutes on eager JAX, so kept out of bare nox.
pytestmark = pytest.mark.slow

H, HKV, D = 4, 2, 8
L = 23  # the sequence watched


def _seq(rng: np.random.Generator, lq: int, lk: int) -> tuple[np.ndarray, ...]:
    return (
        rng.standard_normal((lq, H, D)),
        rng.standard_normal((lk, HKV, D)),
        rng.standard_normal((lk, HKV, D)),
    )


def _crowds() -> list[tuple[list[int], list[int]]]:
    """Neighbours before and after the watched sequence: none, few, many and long."""
    return [([], []), ([7, 40], [1]), ([33, 2, 64, 5], [3, 50, 2])]


@pytest.mark.parametrize("impl", ["materialize", "blockwise", "invariant"])
@pytest.mark.parametrize("causal", [True, "bottom_right"])
def test_packed_rows_equal_the_sequence_alone(backend: Backend, rng, impl, causal):
    lq = L if causal is True else 5  # bottom_right: the last 5 tokens of 23 (chunked prefill)
    q, k, v = _seq(rng, lq, L)
    alone = None
    for before, after in _crowds():
        parts = [_seq(rng, n if causal is True else 1, n) for n in before]
        parts += [(q, k, v)] + [_seq(rng, n if causal is True else 1, n) for n in after]
        cu_q = [0, *np.cumsum([p[0].shape[0] for p in parts]).tolist()]
        cu_k = [0, *np.cumsum([p[1].shape[0] for p in parts]).tolist()]
        packed = [backend.asarray(np.concatenate([p[i] for p in parts])) for i in range(3)]
        out = to_numpy(
            pa.attention_varlen(
                *packed, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal, impl=impl
            )
        )
        at = cu_q[len(before)]
        rows = out[at : at + lq]
        if alone is None:
            alone = to_numpy(
                pa.attention(
                    *(backend.asarray(np.transpose(x, (1, 0, 2))[None]) for x in (q, k, v)),
                    causal=causal,
                    impl=impl,
                )
            )[0].transpose(1, 0, 2)
        np.testing.assert_array_equal(rows, alone)


@pytest.mark.parametrize("impl", ["materialize", "blockwise", "invariant"])
def test_paged_decode_rows_equal_the_sequence_alone(backend: Backend, rng, impl):
    """One decode query over the watched sequence's pages, in a crowded, shuffled cache."""
    page = 4
    q, k, v = _seq(rng, 1, L)
    results = []
    for before, after in _crowds():
        lens = [*before, L, *after]
        need = [-(-n // page) for n in lens]
        order = rng.permutation(sum(need)).tolist()  # pages handed out in any order
        k_pages = rng.standard_normal((sum(need), page, HKV, D))
        v_pages = rng.standard_normal((sum(need), page, HKV, D))
        table = np.zeros((len(lens), max(need)), dtype=np.int32)
        for i, n in enumerate(need):
            table[i, :n] = order[sum(need[:i]) : sum(need[:i]) + n]
        w = len(before)
        for j in range(need[w]):  # the watched sequence's keys, in its own pages
            rows = slice(j * page, min((j + 1) * page, L))
            filled = rows.stop - rows.start
            k_pages[table[w, j], :filled], v_pages[table[w, j], :filled] = k[rows], v[rows]
        queries = np.concatenate([rng.standard_normal((1, H, D)) for _ in lens])
        queries[w] = q[0]
        out = pa.paged_attention(
            backend.asarray(queries),
            backend.asarray(k_pages),
            backend.asarray(v_pages),
            block_table=backend.asarray(table),
            seq_lens=backend.asarray(np.array(lens, dtype=np.int32)),
            cu_seqlens_q=list(range(len(lens) + 1)),
            impl=impl,
        )
        results.append(to_numpy(out)[w])
    alone = pa.attention(
        *(backend.asarray(np.transpose(x, (1, 0, 2))[None]) for x in (q, k, v)),
        causal="bottom_right",
        impl=impl,
    )
    for got in results:
        np.testing.assert_array_equal(got, to_numpy(alone)[0, :, 0])


def _heads_first(backend: Backend, dtype, *arrays: np.ndarray) -> list:
    """(L, H, d) NumPy arrays as (1, H, L, d) arrays on ``backend`` in ``dtype``."""
    return [backend.asarray(np.transpose(x, (1, 0, 2))[None], dtype) for x in arrays]


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
@pytest.mark.parametrize("causal", [False, True])
def test_invariant_padded_batch_equals_the_sequence_alone(
    backend: Backend, rng, causal, dtype_name
):
    """(a): the watched sequence, padded among longer and shorter ones, with key_lengths."""
    dtype = getattr(backend.xp, dtype_name)
    q, k, v = _seq(rng, L, L)
    alone = to_numpy(
        pa.attention(*_heads_first(backend, dtype, q, k, v), causal=causal, impl="invariant")
    )[0]
    for others in ([], [5], [150, 2], [40, 70, 9]):
        lens = [L, *others]
        longest = max(lens)
        batch = [np.zeros((len(lens), H if i == 0 else HKV, longest, D)) for i in range(3)]
        for b, n in enumerate(lens):
            for i, x in enumerate((q, k, v) if b == 0 else _seq(rng, n, n)):
                batch[i][b, :, :n] = np.transpose(x, (1, 0, 2))
                batch[i][b, :, n:] = rng.standard_normal(batch[i][b, :, n:].shape)  # padding
        out = pa.attention(
            *(backend.asarray(x, dtype) for x in batch),
            key_lengths=backend.asarray(np.array(lens)[:, None]),
            causal=causal,
            impl="invariant",
        )
        np.testing.assert_array_equal(to_numpy(out)[0, :, :L], alone)


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_invariant_decode_and_chunked_prefill_equal_the_full_prefill(
    backend: Backend, rng, dtype_name
):
    """(b): every token, computed by decode (chunks of 1) or chunks of 3 and 7, bit for bit."""
    dtype = getattr(backend.xp, dtype_name)
    n = 70  # two key tiles, the last one partial
    q, k, v = _heads_first(backend, dtype, *_seq(rng, n, n))
    full = to_numpy(pa.attention(q, k, v, causal=True, impl="invariant"))
    for chunk in (1, 3, 7):
        starts = range(0, n, chunk)
        if backend.name.startswith("jax"):
            # Eager JAX compiles every new shape: the first chunks, the ones on
            # each side of the tile edge at key 64, and the last (13 calls, not 104).
            edge = 64 // chunk * chunk
            starts = sorted({0, chunk, edge - chunk, edge, starts[-1]})
        for start in starts:
            stop = min(start + chunk, n)
            got = pa.attention(
                q[..., start:stop, :],
                k[..., :stop, :],
                v[..., :stop, :],
                causal="bottom_right",
                impl="invariant",
            )
            np.testing.assert_array_equal(
                to_numpy(got),
                full[..., start:stop, :],
                err_msg=f"chunk {chunk}, rows {start}:{stop}",
            )


def _mask_mod(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx) % 5 != 1


_OPTIONS = {
    "plain": {},
    "causal": {"causal": True},
    "bottom_right": {"causal": "bottom_right"},
    "window": {"window": (40, 3)},
    "mask": {"mask": "m"},
    "bias": {"bias": "b"},
    "lengths": {"key_lengths": "kl", "query_lengths": "ql"},
    "softcap": {"softcap": 1.5},
    "score_mod": {"score_mod": "alibi", "causal": True},
    "block_mask": {"block_mask": "bm"},
    "sinks": {"sinks": "s"},
}


def _option_case(backend: Backend, rng, name: str, lq: int, lk: int) -> dict:
    options = option_arrays(backend, rng, _OPTIONS[name], lq, lk)
    if name == "block_mask":
        options["block_mask"] = pa.create_block_mask(
            _mask_mod, 2, 4, lq, lk, block_size=32, xp=backend.xp, device=backend.device
        )
    if name == "sinks":
        options["sinks"] = backend.asarray(rng.standard_normal(4))
    if name == "score_mod":
        slopes = pa.mods.alibi_slopes(4, xp=backend.xp, device=backend.device)
        options["score_mod"] = pa.mods.alibi(slopes)
    return options


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
@pytest.mark.parametrize("hkv", [4, 2])
@pytest.mark.parametrize("name", list(_OPTIONS))
def test_invariant_equals_materialize_for_every_option(
    backend: Backend, rng, name, hkv, dtype_name
):
    dtype = getattr(backend.xp, dtype_name)
    lq, lk = (70, 150) if name == "bottom_right" else (150, 150)
    q = backend.asarray(rng.standard_normal((2, 4, lq, D)), dtype)
    k, v = (backend.asarray(rng.standard_normal((2, hkv, lk, D)), dtype) for _ in range(2))
    options = _option_case(backend, rng, name, lq, lk)
    got, got_lse = pa.attention(q, k, v, impl="invariant", return_lse=True, **options)
    want, want_lse = pa.attention(q, k, v, impl="materialize", return_lse=True, **options)
    assert_close_on(backend, got, want, dtype=dtype)
    seen = to_numpy(want_lse) > -np.inf  # rows that see no key have lse -inf on both
    np.testing.assert_array_equal(to_numpy(got_lse) > -np.inf, seen)
    xp = backend.xp
    assert_close_on(
        backend,
        xp.where(got_lse > -xp.inf, got_lse, 0.0),
        xp.where(want_lse > -xp.inf, want_lse, 0.0),
        dtype=dtype,
    )


_GRAD_OPTIONS = {"causal": "bottom_right", "softcap": 2.0, "window": (70, 0)}


def _grad_case(rng) -> list[np.ndarray]:
    """q, k, v (GQA, Lq < Lk), sinks, and the output's cotangent."""
    shapes = ((1, 4, 20, D), (1, 2, 80, D), (1, 2, 80, D), (4,), (1, 4, 20, D))
    return [rng.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("return_lse", [False, True])
def test_invariant_torch_grads_match_blockwise(rng, return_lse):
    torch = pytest.importorskip("torch")
    *inputs, d_out = _grad_case(rng)
    options = _GRAD_OPTIONS
    grads = []
    for impl in ("invariant", "blockwise"):
        q, k, v, sinks = (torch.tensor(x, requires_grad=True) for x in inputs)
        out = pa.attention(q, k, v, sinks=sinks, impl=impl, return_lse=return_lse, **options)
        loss = (
            (out[0] * torch.tensor(d_out)).sum() + out[1].sum()
            if return_lse
            else (out * torch.tensor(d_out)).sum()
        )
        grads.append(torch.autograd.grad(loss, (q, k, v, sinks)))
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_invariant_jax_grads_match_blockwise(rng):
    jax = pytest.importorskip("jax")
    *inputs, d_out = _grad_case(rng)
    options = _GRAD_OPTIONS
    with jax_x64(True):
        arrays = [jax.numpy.asarray(x) for x in inputs]

        def loss(impl, q, k, v, sinks):
            out, lse = pa.attention(q, k, v, sinks=sinks, impl=impl, return_lse=True, **options)
            return (out * d_out).sum() + lse.sum()

        got = jax.grad(lambda *a: loss("invariant", *a), argnums=(0, 1, 2, 3))(*arrays)
        want = jax.grad(lambda *a: loss("blockwise", *a), argnums=(0, 1, 2, 3))(*arrays)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-12)
