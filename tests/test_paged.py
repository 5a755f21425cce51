"""A paged KV cache and attention over its pages, on every backend.

Oracles: :func:`pa.attention` on each sequence's contiguous keys and values
(bit for bit off JAX's jit), and torch's own paged attention
(``torch.nn.attention.experimental._paged_attention``) with eager
``flex_attention``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import portattn as pa
from portattn.testing import to_numpy

from conftest import Backend, assert_close_on

H, HKV, D, PAGE = 4, 2, 8, 4


def _cu(lengths: list[int]) -> list[int]:
    return [0, *np.cumsum(lengths).tolist()]


def _cache(backend: Backend, num_pages: int = 24) -> pa.PagedKVCache:
    return pa.PagedKVCache(
        num_pages, PAGE, HKV, D, xp=backend.xp, dtype=backend.xp.float64, device=backend.device
    )


def _append(backend: Backend, cache, ids, full: dict, new: dict) -> None:
    """Append ``new[s]`` tokens of each sequence's keys (kept in ``full``) to the cache."""
    ks, vs = [], []
    for s in ids:
        start = cache_len(full, s)
        ks.append(full[s][0][start : start + new[s]])
        vs.append(full[s][1][start : start + new[s]])
        full[s][2] += new[s]
    k, v = np.concatenate(ks), np.concatenate(vs)
    cache.append(ids, backend.asarray(k), backend.asarray(v), cu_seqlens=_cu([new[s] for s in ids]))


def cache_len(full: dict, s: str) -> int:
    return int(full[s][2])


def close(actual: np.ndarray, desired: np.ndarray) -> None:
    np.testing.assert_allclose(actual, desired, rtol=1e-12, atol=1e-13)


def _check_attention(backend: Backend, rng, cache, ids, full: dict, nq: dict, **options: Any):
    """paged_attention of each sequence's last ``nq`` tokens equals attention on its own K/V.

    Bit for bit by default; within rounding with ``batch_invariant=False`` (one fused call).
    """
    fused = options.pop("batch_invariant", True) is False
    q = rng.standard_normal((sum(nq[s] for s in ids), H, D))
    out, lse = pa.paged_attention(
        backend.asarray(q),
        cache.k_pages,
        cache.v_pages,
        block_table=cache.block_table(ids),
        seq_lens=cache.seq_lens(ids),
        cu_seqlens_q=_cu([nq[s] for s in ids]),
        return_lse=True,
        batch_invariant=not fused,
        **options,
    )
    cq = _cu([nq[s] for s in ids])
    for i, s in enumerate(ids):
        n = cache_len(full, s)
        k, v = full[s][0][:n], full[s][1][:n]

        def heads_first(x):
            return backend.asarray(np.transpose(x, (1, 0, 2))[None])

        want, want_lse = pa.attention(
            heads_first(q[cq[i] : cq[i + 1]]),
            heads_first(k),
            heads_first(v),
            causal="bottom_right",
            return_lse=True,
            **options,
        )
        got = to_numpy(out)[cq[i] : cq[i + 1]]
        same = close if fused else np.testing.assert_array_equal
        same(got, np.transpose(to_numpy(want)[0], (1, 0, 2)))
        same(to_numpy(lse)[:, cq[i] : cq[i + 1]], to_numpy(want_lse)[0])


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"window": 5, "softcap": 3.0},
        {"window": 5, "batch_invariant": False},
        {"softcap": 3.0, "batch_invariant": False},  # decode steps: one padded batch
    ],
    ids=["plain", "window", "fused-window", "fused"],
)
def test_prefill_chunks_decode_and_fork_equal_attention_per_sequence(
    backend: Backend, rng, options
):
    cache = _cache(backend)
    lengths = {"a": 13, "b": 6, "c": 21}
    full = {
        s: [rng.standard_normal((n + 8, HKV, D)), rng.standard_normal((n + 8, HKV, D)), 0]
        for s, n in lengths.items()
    }
    for s in full:
        cache.add(s)
    ids = ["a", "b", "c"]
    # Chunked prefill: two chunks of each prompt, each chunk attended as it arrives.
    first = {"a": 5, "b": 6, "c": 9}
    _append(backend, cache, ids, full, first)
    _check_attention(backend, rng, cache, ids, full, first, **options)
    rest = {s: lengths[s] - first[s] for s in ids}
    _append(backend, cache, ["a", "c"], full, rest)
    _check_attention(backend, rng, cache, ["a", "c"], full, rest, **options)
    # Fork "a" (13 tokens: 3 full pages shared, a partial fourth copied on write).
    free = cache.free_pages
    cache.fork("a", "a2")
    assert cache.free_pages == free  # nothing copied yet
    table = to_numpy(cache.block_table(["a", "a2"]))
    np.testing.assert_array_equal(table[0], table[1])
    full["a2"] = [full["a"][0].copy(), rng.standard_normal(full["a"][1].shape), 13]
    full["a2"][1][:13] = full["a"][1][:13]
    # Decode: one token for each of four sequences, the fork included.
    one = dict.fromkeys(["a", "a2", "b", "c"], 1)
    full["a2"][0][13] += 1.0  # the fork's new token differs from its parent's
    _append(backend, cache, ["a", "a2", "b", "c"], full, one)
    table = to_numpy(cache.block_table(["a", "a2"]))
    np.testing.assert_array_equal(table[0, :3], table[1, :3])  # full pages still shared
    assert table[0, 3] != table[1, 3]  # the partial one was copied before the write
    _check_attention(backend, rng, cache, ["a", "a2", "b", "c"], full, one, **options)
    cache.free("a")
    _check_attention(backend, rng, cache, ["a2"], full, {"a2": 1}, **options)


def test_a_fork_and_its_parent_writing_together_copy_their_shared_page_once(backend: Backend, rng):
    """One append to both: the first copies the shared partial page, the second keeps it."""
    cache = _cache(backend, num_pages=6)
    cache.add("a")
    n = PAGE + 1  # one full page and a partial one
    kv = backend.asarray(rng.standard_normal((n, HKV, D)))
    cache.append(["a"], kv, kv, cu_seqlens=[0, n])
    cache.fork("a", "a2")
    one = backend.asarray(rng.standard_normal((2, HKV, D)))
    cache.append(["a", "a2"], one, one, cu_seqlens=[0, 1, 2])
    table = to_numpy(cache.block_table(["a", "a2"]))
    assert table[0, 0] == table[1, 0] and table[0, 1] != table[1, 1]
    # Three pages hold data and three are free: none is lost to the pool.
    assert cache.free_pages == 6 - len(set(table.ravel().tolist()))
    assert sorted(cache._refs) == [0, 0, 0, 1, 1, 2]
    # The parent's copy and the fork's own page each read back their own new token.
    for row in range(2):  # a, then a2
        page = int(table[row, 1])
        got = to_numpy(cache.k_pages)[page, 1]
        np.testing.assert_array_equal(got, to_numpy(one)[row])
        np.testing.assert_array_equal(to_numpy(cache.k_pages)[page, 0], to_numpy(kv)[PAGE])


def _state(cache) -> tuple:
    return (
        {s: list(t) for s, t in cache._tables.items()},
        dict(cache._lengths),
        list(cache._free),
        list(cache._refs),
        to_numpy(cache.k_pages),
        to_numpy(cache.v_pages),
    )


def test_a_full_cache_raises_and_changes_nothing(backend: Backend, rng):
    cache = _cache(backend, num_pages=5)
    for s in "ab":
        cache.add(s)
    kv = backend.asarray(rng.standard_normal((9, HKV, D)))
    cache.append(["a", "b"], kv, kv, cu_seqlens=[0, 6, 9])  # 2 + 1 pages, both last ones partial
    cache.fork("b", "b2")
    before = _state(cache)
    big = backend.asarray(rng.standard_normal((9, HKV, D)))
    # "a" needs 1 more page; the fork, a copy of its shared partial page and 1 more: 3 > 2 free.
    with pytest.raises(ValueError, match=r"3 free pages for this append, got 2 .* nothing was"):
        cache.append(["a", "b2"], big, big, cu_seqlens=[0, 5, 9])
    after = _state(cache)
    for x, y in zip(before, after, strict=True):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y
    with pytest.raises(ValueError, match="one distinct seq_id per sequence"):
        cache.append(["a", "a"], big, big, cu_seqlens=[0, 5, 9])
    with pytest.raises(ValueError, match="a seq_id the cache holds, got 'z'"):
        cache.append(["z"], big, big, cu_seqlens=[0, 9])
    assert all(
        (np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y)
        for x, y in zip(before, _state(cache), strict=True)
    )


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fused"])
def test_pages_a_sequence_does_not_own_are_never_read(rng, invariant):
    """Pages no sequence owns, and the block table padding, hold NaN: the result is finite.

    Fused (``batch_invariant=False``): chunked prefill (one masked call) and
    decode (one padded batch, each row padded with its own last page) alike.
    """
    cache = pa.PagedKVCache(12, PAGE, HKV, D, dtype=np.float64)
    for s in "ab":
        cache.add(s)
    kv = rng.standard_normal((11, HKV, D))
    cache.append(["a", "b"], kv, kv, cu_seqlens=[0, 9, 11])
    owned = set(to_numpy(cache.block_table(["a"]))[0]) | {
        int(to_numpy(cache.block_table(["b"]))[0, 0])
    }
    for page in set(range(12)) - owned:
        cache.k_pages[page] = np.nan
        cache.v_pages[page] = np.nan
    table = to_numpy(cache.block_table(["a", "b"]))
    table[1, 1:] = next(iter(set(range(12)) - owned))  # padding that points at a NaN page
    out = pa.paged_attention(
        rng.standard_normal((3, H, D)),
        cache.k_pages,
        cache.v_pages,
        block_table=table,
        seq_lens=[9, 2],
        cu_seqlens_q=[0, 2, 3],
        batch_invariant=invariant,
    )
    assert np.isfinite(out).all()
    decoded = pa.paged_attention(
        out[1:], cache.k_pages, cache.v_pages, block_table=table, seq_lens=[9, 2],
        cu_seqlens_q=[0, 1, 2], batch_invariant=invariant,
    )  # fmt: skip
    assert np.isfinite(decoded).all()
    with pytest.raises(ValueError, match="sequence 1's seq_lens \\(9\\) to fit its block_table"):
        pa.paged_attention(
            out, cache.k_pages, cache.v_pages, block_table=table[:, :2], seq_lens=[2, 9],
            cu_seqlens_q=[0, 2, 3],
        )  # fmt: skip


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_torch_matches_its_own_paged_flex_attention(rng):
    torch = pytest.importorskip("torch")  # in the test dependency group: present
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from conftest import get_backend

    get_backend("torch")
    lens, n_pages, hkv = [9, 3, 14], 16, H  # torch's flex kernel here needs H == Hkv
    ours = pa.PagedKVCache(n_pages, PAGE, hkv, D, xp=torch, dtype=torch.float64)
    theirs = PagedAttention(n_pages, PAGE, len(lens), device="cpu")
    k_cache = torch.zeros(1, hkv, n_pages * PAGE, D, dtype=torch.float64)
    v_cache = torch.zeros_like(k_cache)
    ks = [torch.tensor(rng.standard_normal((n, hkv, D))) for n in lens]
    vs = [torch.tensor(rng.standard_normal((n, hkv, D))) for n in lens]
    for i, (n, k, v) in enumerate(zip(lens, ks, vs, strict=True)):
        ours.add(i)
        b = torch.tensor([i])
        theirs.reserve(b, torch.tensor(n))
        pos = torch.arange(n)[None]
        theirs.assign(b, pos, k.permute(1, 0, 2)[None], v.permute(1, 0, 2)[None], k_cache, v_cache)
    ours.append([0, 1, 2], torch.cat(ks), torch.cat(vs), cu_seqlens=_cu(lens))
    q = torch.tensor(rng.standard_normal((len(lens), H, D)))  # one decode query each
    got = pa.paged_attention(
        q, ours.k_pages, ours.v_pages, block_table=ours.block_table([0, 1, 2]),
        seq_lens=ours.seq_lens([0, 1, 2]), cu_seqlens_q=[0, 1, 2, 3],
    )  # fmt: skip
    kv_len = torch.tensor(lens)
    logical = create_block_mask(
        lambda b, h, qi, kv: kv < kv_len[b], len(lens), None, 1, n_pages * PAGE,
        device="cpu", BLOCK_SIZE=(1, PAGE),
    )  # fmt: skip
    physical = theirs.convert_logical_block_mask(logical, kv_len=kv_len)
    want = flex_attention(
        q[:, :, None, :], k_cache, v_cache, block_mask=physical,
        score_mod=theirs.get_score_mod(None, kv_len),
    )  # fmt: skip
    assert_close_on(get_backend("torch"), got, want[:, :, 0, :], dtype=torch.float64)
