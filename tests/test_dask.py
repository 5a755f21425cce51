"""Attention on dask arrays: the graph's structure, laziness, chunks, and semantics vs NumPy.

Small shapes and dask's synchronous scheduler; the real cluster lives in
``test_dask_cluster.py`` (marked ``cluster``).
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from dask.callbacks import Callback

import portattn as pa
from portattn._paths._dask import FAN_IN_CONFIG, _merge, _pair
from portattn.testing import dask_schedule

from conftest import make_qkv
from reference import allowed_pairs, attention_ref


class CountComputes(Callback):  # type: ignore[misc]
    """Counts every graph that a dask scheduler starts while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.starts = 0

    def _start(self, dsk: Any) -> None:
        self.starts += 1


def tasks(x: Any, fn: Any) -> list[tuple[Any, ...]]:
    """The tasks of ``x``'s graph that call ``fn``."""
    return [t for t in dict(x.__dask_graph__()).values() if isinstance(t, tuple) and t[0] is fn]


def grid(x: Any) -> frozenset[tuple[int, int]]:
    """(query chunk, key chunk) of every pair task, read from the graph."""
    return dask_schedule(x).pairs


def compute(*xs: Any) -> Any:
    out = dask.compute(*xs, scheduler="sync")
    return out if len(xs) > 1 else out[0]


@pytest.fixture
def qkv(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return make_qkv(rng, 40, d=8, batch=(2, 3))  # type: ignore[no-any-return]


def test_batch_and_head_chunks_give_one_task_per_chunk(qkv: Any) -> None:
    q, k, v = (da.from_array(x, chunks=(1, 1, 40, 8)) for x in qkv)
    with CountComputes() as counter:
        out = pa.attention(q, k, v, causal=True)
    assert counter.starts == 0
    assert isinstance(out, da.Array)
    assert out.chunks == q.chunks
    assert len(tasks(out, _pair)) == 2 * 3  # one per chunk, no merge
    assert not tasks(out, _merge)
    ref, _ = attention_ref(*qkv, causal=True)
    np.testing.assert_allclose(compute(out), ref, rtol=1e-12, atol=1e-12)


def test_output_chunks_follow_the_query(qkv: Any) -> None:
    q = da.from_array(qkv[0], chunks=(2, 1, 15, 4))
    k = da.from_array(qkv[1], chunks=(1, 3, 7, 8))
    v = da.from_array(qkv[2], chunks=(2, 2, 40, 3))
    out, lse = pa.attention(q, k, v, return_lse=True)
    assert out.chunks == (*q.chunks[:3], (8,))
    assert lse.chunks == q.chunks[:3]
    ref_out, ref_lse = pa.attention(*qkv, return_lse=True)
    got_out, got_lse = compute(out, lse)
    np.testing.assert_allclose(got_out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_lse, ref_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, 16),
        ({"causal": True}, 10),  # the upper triangle of chunks gets no task
        ({"window": (10, 0)}, 7),  # a band of width 2 chunks
        ({"causal": "bottom_right"}, 10),
    ],
)
def test_hidden_pairs_get_no_task(qkv: Any, options: dict[str, Any], expected: int) -> None:
    q, k, v = (da.from_array(x, chunks=(2, 3, 10, 8)) for x in qkv)
    out = pa.attention(q, k, v, **options)
    got = grid(out)
    # The oracle: a pair of chunks needs a task iff some (query, key) in it is allowed.
    causal = options.get("causal", False)
    align = "bottom_right" if causal == "bottom_right" else "top_left"
    ok = allowed_pairs(40, 40, causal=causal, window=options.get("window"), align=align)
    want = {
        (i, j)
        for i in range(4)
        for j in range(4)
        if ok[10 * i : 10 * i + 10, 10 * j : 10 * j + 10].any()
    }
    assert got == want
    assert len(got) == expected
    ref, _ = attention_ref(*qkv, **options)
    np.testing.assert_allclose(compute(out), ref, rtol=1e-12, atol=1e-12)


def _as_dask(x: Any, chunks: Any) -> Any:
    return None if x is None else da.from_array(x, chunks=chunks)


CASES = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window": (6, 3)},
    "causal window": {"causal": True, "window": 5},
    "mask": {"mask": "mask"},
    "bias": {"bias": "bias"},
    "lengths": {"key_lengths": "kl", "query_lengths": "ql"},
    "softcap": {"softcap": 2.0, "causal": True},
    "everything": {
        "mask": "mask",
        "bias": "bias",
        "key_lengths": "kl",
        "causal": True,
        "window": (9, 2),
        "scale": 0.3,
    },
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("q_chunk", [40, 11])
@pytest.mark.parametrize("k_chunk", [40, 13])
def test_sequence_chunks_agree_with_numpy(
    rng: np.random.Generator, qkv: Any, case: str, q_chunk: int, k_chunk: int
) -> None:
    arrays = {
        # batch axes broadcast: the mask per batch entry, the bias per head
        "mask": rng.random((2, 1, 40, 40)) > 0.4,
        "bias": rng.standard_normal((3, 40, 40)),
        "kl": np.array([[31], [40]]),
        "ql": np.array([[40, 0, 17]]),
    }
    chunks = {"mask": (1, 1, 20, 20), "bias": (1, 40, 7), "kl": 1, "ql": 2}
    opts = {o: arrays.get(a, a) if isinstance(a, str) else a for o, a in CASES[case].items()}
    lazy = {
        o: _as_dask(arrays[a], chunks[a]) if isinstance(a, str) else a
        for o, a in CASES[case].items()
    }
    q = da.from_array(qkv[0], chunks=(1, 3, q_chunk, 8))
    k, v = (da.from_array(x, chunks=(2, 1, k_chunk, 8)) for x in qkv[1:])
    with CountComputes() as counter:
        out, lse = pa.attention(q, k, v, return_lse=True, **lazy)
        plain = pa.attention(q, k, v, **lazy)
    assert counter.starts == 0
    assert out.chunks[:3] == q.chunks[:3]
    ref_out, ref_lse = pa.attention(*qkv, return_lse=True, **opts)
    got_out, got_lse, got_plain = compute(out, lse, plain)
    np.testing.assert_allclose(got_out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_lse, ref_lse, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_plain, ref_out, rtol=1e-12, atol=1e-12)
    oracle, _ = attention_ref(*qkv, **opts)
    np.testing.assert_allclose(got_plain, oracle, rtol=1e-10, atol=1e-12)


def test_grouped_query_attention_by_broadcast_batch_axes(rng: np.random.Generator) -> None:
    # (B, H_kv, group, L, d) queries against (B, H_kv, 1, L, d) keys: K/V never repeated.
    qn = rng.standard_normal((2, 2, 3, 24, 8))
    kn, vn = (rng.standard_normal((2, 2, 1, 24, 8)) for _ in range(2))
    q = da.from_array(qn, chunks=(1, 1, 1, 8, 8))
    k, v = (da.from_array(x, chunks=(1, 2, 1, 12, 8)) for x in (kn, vn))
    out = pa.attention(q, k, v, causal=True)
    assert out.chunks == q.chunks
    ref, _ = attention_ref(qn, kn, vn, causal=True)
    np.testing.assert_allclose(compute(out), ref, rtol=1e-12, atol=1e-12)
    # every group reads the one key block of its kv head: none is copied per group
    pairs = tasks(out, _pair)
    key_blocks = {t[2] for t in pairs}
    assert {b[3] for b in key_blocks} == {0}  # the group axis, where keys broadcast
    assert len(key_blocks) == 2 * 2 * 2  # batch x kv heads x key chunks
    assert len(pairs) == 2 * 2 * 3 * 5  # x groups x visible (query, key) chunk pairs


def test_multi_head_attention_on_dask_arrays_takes_the_same_path(rng: np.random.Generator) -> None:
    eager = pa.MultiHeadAttention.random(32, 4, num_kv_heads=2, seed=3)
    lazy = pa.MultiHeadAttention.random(32, 4, num_kv_heads=2, seed=3, xp=da)
    x = rng.standard_normal((2, 24, 32))
    dx = da.from_array(x, chunks=(1, 8, 32))
    with CountComputes() as counter:
        out = lazy(dx, causal=True)
    assert counter.starts == 0
    assert out.chunks == dx.chunks
    assert tasks(out, _pair)  # sequence-parallel: q and k/v chunked along L
    np.testing.assert_allclose(compute(out), eager(x, causal=True), rtol=1e-12, atol=1e-12)


def test_queries_that_see_nothing_and_empty_sequences(rng: np.random.Generator) -> None:
    qn, kn, vn = (rng.standard_normal((20, 4)) for _ in range(3))
    q, k, v = (da.from_array(x, chunks=5) for x in (qn, kn, vn))
    # a window that lies entirely past the keys for the late query chunks
    out, lse = pa.attention(q, k[:8], v[:8], causal="top_left", window=(2, 0), return_lse=True)
    ref_out, ref_lse = pa.attention(
        qn, kn[:8], vn[:8], causal="top_left", window=(2, 0), return_lse=True
    )
    got_out, got_lse = compute(out, lse)
    np.testing.assert_array_equal(got_out[12:], 0.0)
    assert np.all(np.isneginf(got_lse[12:]))
    np.testing.assert_allclose(got_out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_lse, ref_lse, rtol=1e-12, atol=1e-12)
    out, lse = pa.attention(q, k[:0], v[:0], return_lse=True)
    assert out.shape == (20, 4)
    got_out, got_lse = compute(out, lse)
    np.testing.assert_array_equal(got_out, 0.0)
    assert np.all(np.isneginf(got_lse))
    assert compute(pa.attention(q[:0], k, v)).shape == (0, 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dtypes_come_back(rng: np.random.Generator, dtype: Any) -> None:
    qn, kn, vn = (rng.standard_normal((2, 32, 8)).astype(dtype) for _ in range(3))
    q, k, v = (da.from_array(x, chunks=(1, 8, 8)) for x in (qn, kn, vn))
    out, lse = pa.attention(q, k, v, causal=True, return_lse=True)
    assert out.dtype == dtype
    assert lse.dtype == np.float32  # the compute dtype, as on one machine
    ref_out, ref_lse = pa.attention(qn, kn, vn, causal=True, return_lse=True)
    got_out, got_lse = compute(out, lse)
    assert got_out.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-2
    np.testing.assert_allclose(got_out, ref_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_lse, ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["auto", "blockwise", "materialize"])
def test_every_generic_kernel_runs_inside_the_tasks(qkv: Any, impl: str) -> None:
    q, k, v = (da.from_array(x, chunks=(2, 3, 20, 8)) for x in qkv)
    out = pa.attention(q, k, v, causal=True, impl=impl, block_size=(8, 8))
    ref, _ = attention_ref(*qkv, causal=True)
    np.testing.assert_allclose(compute(out), ref, rtol=1e-12, atol=1e-12)


def test_native_is_refused_at_call_time(qkv: Any) -> None:
    q, k, v = (da.from_array(x) for x in qkv)
    with pytest.raises(NotImplementedError, match="impl='native'"):
        pa.attention(q, k, v, impl="native")


@pytest.mark.parametrize("fan_in", [2, 3, 16])
def test_merge_fan_in_is_a_dask_config_key(qkv: Any, fan_in: int) -> None:
    q, k, v = (da.from_array(x, chunks=(2, 3, 40, 8)) for x in qkv)
    k, v = (x.rechunk((2, 3, 5, 8)) for x in (k, v))  # 8 key chunks
    with dask.config.set({FAN_IN_CONFIG: fan_in}):
        out = pa.attention(q, k, v)
    merges = tasks(out, _merge)
    assert all(len(t[1]) <= fan_in for t in merges)
    # a tree over 8 partials: 7 merges with fan-in 2, 4 with 3 (3+3+2, then 3), 1 with 16
    assert len(merges) == {2: 7, 3: 4, 16: 1}[fan_in]
    ref, _ = attention_ref(*qkv)
    np.testing.assert_allclose(compute(out), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [1, 0, "4", True])
def test_bad_fan_in_is_named(qkv: Any, bad: object) -> None:
    q, k, v = (da.from_array(x, chunks=(2, 3, 10, 8)) for x in qkv)
    with dask.config.set({FAN_IN_CONFIG: bad}), pytest.raises(ValueError, match=FAN_IN_CONFIG):
        pa.attention(q, k, v)


def test_the_threaded_scheduler_gives_the_same_bits(qkv: Any) -> None:
    q, k, v = (da.from_array(x, chunks=(1, 1, 10, 8)) for x in qkv)
    out = pa.attention(q, k, v, causal=True)
    np.testing.assert_array_equal(out.compute(scheduler="threads"), compute(out))


def test_inputs_are_neither_computed_nor_changed(qkv: Any) -> None:
    copies = [x.copy() for x in qkv]
    q, k, v = (da.from_array(x, chunks=(1, 3, 10, 8)) for x in qkv)
    names = [x.name for x in (q, k, v)]
    with CountComputes() as counter:
        out = pa.attention(q, k, v, window=3, return_lse=True)
    assert counter.starts == 0
    compute(*out)
    assert [x.name for x in (q, k, v)] == names
    for x, c in zip(qkv, copies, strict=True):
        np.testing.assert_array_equal(x, c)


@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_unknown_chunk_sizes_are_named(qkv: Any, where: str) -> None:
    arrays = dict(
        zip(
            ("query", "key", "value"),
            (da.from_array(x, chunks=(1, 3, 10, 8)) for x in qkv),
            strict=True,
        )
    )
    x = arrays[where]
    arrays[where] = x[da.from_array(np.array([True, True]), chunks=1)]  # batch sizes unknown
    assert np.isnan(arrays[where].shape[0])
    with pytest.raises(ValueError, match=r"compute_chunk_sizes\(\)"):
        pa.attention(arrays["query"], arrays["key"], arrays["value"])


def test_unknown_sequence_length_is_named(qkv: Any) -> None:
    q = da.from_array(qkv[0][0, 0], chunks=10)
    keep = da.from_array(np.ones(40, dtype=bool), chunks=10)
    with pytest.raises(ValueError, match=r"compute_chunk_sizes\(\)"):
        pa.attention(q[keep], q, q)
