"""Batch invariance: a sequence's output rows, bit for bit, whatever else is batched with it.

What is guaranteed, and asserted exactly here, on every backend and on the
materialize and blockwise paths: a sequence's rows from
``pa.attention_varlen`` (a packed batch) and from ``pa.paged_attention`` (a
paged cache shared with other sequences, pages in any order) equal
``pa.attention`` on that sequence alone. Both run each sequence as its own
problem, of the same shape whatever its neighbours, so the same arithmetic
runs in the same order.

What is not guaranteed (measured 2026-12-04, float64, H=4, d=16, L=37; see
the Serving notes in the final report): a padded batch with ``key_lengths``
(rows differ by up to 2.2e-16 on NumPy, array-api-strict and torch, equal
on eager JAX), and a token computed by decode or chunked prefill against the
same token in a full prefill (up to 1e-15 on every library): the matmuls
see other shapes, and BLAS sums in another order. Pack instead of padding
to get invariance.
"""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn.testing import to_numpy

from conftest import Backend

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


@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
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


@pytest.mark.parametrize("impl", ["materialize", "blockwise"])
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
