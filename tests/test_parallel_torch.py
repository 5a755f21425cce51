"""Context parallelism on torch.distributed: 2 and 4 gloo processes against one process.

Each world size is one run of ``tests/parallel/torch_worker.py`` per rank,
meeting through a ``file://`` store in a temporary folder (never tcp://),
with gloo bound to loopback and a bounded timeout; the processes always exit
(killed at the deadline). Every case compares a rank's shard of the output,
the lse and the gradients with the same rows of ``pa.attention`` on the whole
sequence, in float64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import needs

pytestmark = pytest.mark.parallel

WORKER = Path(__file__).parent / "parallel" / "torch_worker.py"
DEADLINE = 900  # seconds for one world's whole run (a shared machine at load 27 needed > 400)


def _torch_or_skip() -> None:
    needs("torch.distributed", "torch")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.fail("torch.distributed with gloo is needed for these tests")


def _spawn(world: int, folder: Path) -> tuple[list[dict[str, Any]], float]:
    env = dict(
        os.environ,
        GLOO_SOCKET_IFNAME="lo",
        PORTATTN_TEST_TIMEOUT="30",
        OMP_NUM_THREADS="1",
        MASTER_ADDR="127.0.0.1",
    )
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(world), str(folder)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            left = max(1.0, DEADLINE - (time.monotonic() - start))
            logs.append(p.communicate(timeout=left)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for r in range(world):
        path = folder / f"rank{r}.json"
        assert path.exists(), (
            f"rank {r} wrote nothing; its log:\n{logs[r] if r < len(logs) else ''}"
        )
        results.append(json.loads(path.read_text()))
        assert "crash" not in results[-1], results[-1]["crash"]
    return results, time.monotonic() - start


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"P{w}")
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    _torch_or_skip()
    results, seconds = _spawn(request.param, tmp_path_factory.mktemp(f"cp{request.param}"))
    return request.param, results, seconds


def _cases(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    names = [n for n in results[0] if n not in ("errors", "die")]
    return {n: [r[n] for r in results] for n in names}


def test_exact_against_one_process(world: Any) -> None:
    """Output, lse and every gradient match the whole-sequence call: 1e-12 in float64.

    In float32 (``*_f32``), both sides round: 1e-5 for values of order 1, and
    1e-4 for the slopes' gradient, a sum over every (query, key) score.
    """
    p, results, _ = world
    cases = _cases(results)
    assert len(cases) >= 9
    assert any(n.endswith("_f32") for n in cases)
    for name, ranks in cases.items():
        f32 = name.endswith("_f32")
        for r, errs in enumerate(ranks):
            for what, err in errs.items():
                if what in ("stats", "repeat_identical"):
                    continue
                tol = (1e-4 if what == "dslopes" else 1e-5) if f32 else 1e-12
                assert err < tol, f"P={p} {name} rank {r}: {what} off by {err}"
        assert all(e["repeat_identical"] for e in ranks), f"{name}: two backwards differ"
        if "sinks" in name or "everything" in name:
            assert all("dsinks" in e for e in ranks)
        if "everything" in name:
            assert all("dslopes" in e for e in ranks)


def test_ring_sends_its_kv_share(world: Any) -> None:
    """Ring: each rank sends (P-1)/P of the K/V bytes forward; backward K/V again, dK/dV P times."""
    p, results, _ = world
    for name, ranks in _cases(results).items():
        if not name.startswith("ring-"):
            continue
        for s in (e["stats"] for e in ranks):
            assert s["bytes_sent"] * p == s["kv_bytes"] * (p - 1), name
            assert s["backward_bytes_sent"] * p == s["kv_bytes"] * (2 * p - 1), name


def test_zigzag_balances_causal_tiles(world: Any) -> None:
    """Causal zigzag: every rank visits the same tiles within one; contiguous: they grow by rank."""
    p, results, _ = world
    cases = _cases(results)
    zig = [e["stats"]["tiles"] for e in cases["ring-zigzag-causal"]]
    flat = [e["stats"]["tiles"] for e in cases["ring-contiguous-causal"]]
    assert max(zig) - min(zig) <= 1, zig
    assert flat == sorted(flat) and flat[-1] - flat[0] > p, flat
    assert sum(zig) == sum(flat)  # the same visible tiles, dealt differently


def test_hidden_pairs_cost_nothing(world: Any) -> None:
    """Causal hides pairs; the documents' block mask hides more than causal alone."""
    p, results, _ = world
    cases = _cases(results)
    for name in ("ring-zigzag-causal", "ring-zigzag-documents"):
        for e in cases[name]:
            s = e["stats"]
            assert s["pairs"] + s["hidden"] == (4 if "zigzag" in name else 1) * p
    causal = sum(e["stats"]["tiles"] for e in cases["ring-zigzag-causal"])
    docs = sum(e["stats"]["tiles"] for e in cases["ring-zigzag-documents"])
    hidden = sum(e["stats"]["hidden"] for e in cases["ring-zigzag-documents"])
    assert docs < causal and hidden > sum(e["stats"]["hidden"] for e in cases["ring-zigzag-causal"])


def test_bad_input_is_named(world: Any) -> None:
    p, results, _ = world
    for res in results:
        e = res["errors"]
        rows = [32 // p] * p
        rows[1] = 4  # rank 1 passed a short shard
        assert "ValueError" in e["lengths"] and f"query shard lengths {rows}" in e["lengths"], e
        assert "block_mask built for" in e["block_mask"], e["block_mask"]
        assert "axis_name=None" in e["axis_name"], e["axis_name"]
        assert f"P={p}" in e["ulysses_heads"] and "H=3" in e["ulysses_heads"], e["ulysses_heads"]
        assert "even shard length" in e["odd_zigzag"], e["odd_zigzag"]
        assert "strategy" in e["strategy"], e["strategy"]


def test_a_dying_rank_makes_the_others_raise(world: Any) -> None:
    """The last rank exits inside the ring; every other rank raises within the group's timeout."""
    p, results, seconds = world
    for r in range(p - 1):
        got = results[r]["die"]
        assert got["verdict"] != "no error", got
        assert got["seconds"] < 30 + 5, got
    assert seconds < DEADLINE
