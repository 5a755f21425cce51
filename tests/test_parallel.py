"""portattn.parallel without other processes: layouts, positions, one rank, refusals.

The multi-process tests are tests/test_parallel_torch.py and
tests/test_parallel_jax.py (marker ``parallel``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import portattn as pa
from portattn import parallel


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_unshard_positions_round_trip(layout: str, world: int) -> None:
    length = 24
    x = np.arange(length * 3).reshape(length, 3)
    parts = [parallel.shard(x, rank=r, world=world, layout=layout) for r in range(world)]
    np.testing.assert_array_equal(parallel.unshard(parts, layout=layout), x)
    for r, part in enumerate(parts):
        pos = parallel.positions(length, rank=r, world=world, layout=layout)
        np.testing.assert_array_equal(part[:, 0] // 3, pos)  # each row knows its global position
    every = np.concatenate(
        [parallel.positions(length, rank=r, world=world, layout=layout) for r in range(world)]
    )
    np.testing.assert_array_equal(np.sort(every), np.arange(length))


def test_zigzag_is_chunks_r_and_2p_minus_1_minus_r() -> None:
    x = np.arange(16)[:, None]
    assert parallel.shard(x, rank=1, world=4)[:, 0].tolist() == [2, 3, 12, 13]
    assert parallel.shard(x, rank=1, world=4, layout="contiguous")[:, 0].tolist() == [4, 5, 6, 7]
    assert parallel.shard(np.arange(8), rank=0, world=2, axis=0).tolist() == [0, 1, 6, 7]


def test_layout_refusals_name_the_numbers() -> None:
    x = np.zeros((10, 2))
    with pytest.raises(ValueError, match=r"divisible by 2P = 4, got 10"):
        parallel.shard(x, rank=0, world=2)
    with pytest.raises(ValueError, match=r"rank in \[0, world=2\), got rank=2"):
        parallel.shard(x, rank=2, world=2, layout="contiguous")
    with pytest.raises(ValueError, match="layout to be one of"):
        parallel.positions(8, rank=0, world=2, layout="striped")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same length"):
        parallel.unshard([np.zeros((4, 1)), np.zeros((2, 1))])


def test_numpy_arrays_are_refused_with_the_remedy() -> None:
    q = np.zeros((1, 1, 4, 2))
    with pytest.raises(TypeError, match="needs torch tensors"):
        parallel.attention(q, q, q)
    with pytest.raises(ValueError, match="strategy to be one of"):
        parallel.attention(q, q, q, strategy="tree")


def test_importing_portattn_imports_neither_torch_nor_jax() -> None:
    code = (
        "import sys, portattn, portattn.parallel; "
        "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_rank_equals_attention(tmp_path: object) -> None:
    """P = 1 (a one-process gloo group on a file:// store): the call is pa.attention's."""
    asked = os.environ.get("PORTATTN_BACKENDS")
    if asked is not None and "torch" not in asked.split(","):
        pytest.skip("PORTATTN_BACKENDS does not ask for torch")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 16, 4, generator=g, dtype=torch.float64) for _ in range(3))
        for strategy in parallel.STRATEGIES:
            for layout in ("zigzag", "contiguous"):
                got, lse = parallel.attention(
                    q,
                    k,
                    v,
                    causal=True,
                    window=(5, 0),
                    strategy=strategy,
                    layout=layout,
                    return_lse=True,
                )
                want, want_lse = pa.attention(q, k, v, causal=True, window=(5, 0), return_lse=True)
                assert float((got - want).abs().max()) < 1e-14
                assert float((lse - want_lse).abs().max()) < 1e-14
        with pytest.raises(ValueError, match="axis_name=None for torch"):
            parallel.attention(q, k, v, axis_name="x")
        stats = parallel.last_stats()
        assert stats is not None and stats.bytes_sent == 0
    finally:
        dist.destroy_process_group()
