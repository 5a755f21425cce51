"""Programmable attention against FlexAttention and against portattn's own dense calls.

Run by ``python benchmarks/run.py --only programmable`` (``nox -s bench --
--only programmable``), which merges the result into ``cpu.json`` under
``"programmable"``; ``python benchmarks/programmable.py memory N`` is the
fresh-process child of the memory point.

Every ratio is paired: per round each subject of a case runs once, in turn,
and the ratio is the median over rounds of (subject time / peer time in the
same round), so that the load of a shared machine hits both alike. torch runs
on one thread for every subject (see :func:`run`).

Cases (B=1, H=8, d=64, float32; 8 packed documents of N/8 tokens, causal inside each):

- ``documents``: the block mask on torch against ``torch.compile(flex_attention)``
  with its own block mask (target <= 2x), and on NumPy against portattn's own
  dense causal call (target <= 0.2x);
- ``documents, forward + backward`` (torch): against the dense causal call of
  the same path, blockwise (target <= 0.25x);
- ``alibi``: ALiBi as a ``score_mod`` against the plain blockwise call (target <= 1.5x);
- ``create_block_mask`` at N=8192: portattn's (NumPy, the default) against
  FlexAttention's (target <= 1x);
- ``memory`` at N=16384 on NumPy: tracemalloc's peak above the inputs, against
  the bytes of inputs and output (target <= 2x).

Record (``cpu.json["programmable"]``): ``config``; ``rows``: ``{case, library,
n, subject, peer, median_s, peer_median_s, ratio, target, met, rounds}``;
``memory``: ``{n, peak_bytes, inputs_plus_output_bytes, ratio, target, met}``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from core import B, D, H, time_interleaved

DOCS = 8
SIZES = (2048, 8192)
MASK_N = 8192
MEMORY_N = 16384
TARGETS = {
    ("documents", "torch"): 2.0,
    ("documents", "numpy"): 0.2,
    ("documents, forward + backward", "torch"): 0.25,
    ("alibi", "torch"): 1.5,
    ("alibi", "numpy"): 1.5,
    ("create_block_mask", "numpy"): 1.0,
    ("memory", "numpy"): 2.0,
}


def doc_ids(n: int) -> np.ndarray:
    return np.repeat(np.arange(DOCS), n // DOCS)


def _paired(
    funcs: dict[str, Callable[[], Any]], peer: str, rounds: int
) -> dict[str, tuple[float, float]]:
    """Per subject: (median seconds, median over rounds of its time over the peer's)."""
    for f in funcs.values():
        f()  # warm: compiled kernels, caches, thread pools
    times = time_interleaved(funcs, rounds)
    return {
        name: (
            statistics.median(ts),
            statistics.median(t / p for t, p in zip(ts, times[peer], strict=True)),
        )
        for name, ts in times.items()
    }


def _rows(
    case: str, library: str, n: int, funcs: dict[str, Callable[[], Any]], peer: str, rounds: int
) -> list[dict[str, Any]]:
    got = _paired(funcs, peer, rounds)
    target = TARGETS.get((case, library))
    rows = []
    for name, (median_s, ratio) in got.items():
        if name == peer:
            continue
        rows.append(
            {
                "case": case,
                "library": library,
                "n": n,
                "subject": name,
                "peer": peer,
                "median_s": median_s,
                "peer_median_s": got[peer][0],
                "ratio": ratio,
                "target": target,
                "met": None if target is None else ratio <= target,
                "rounds": rounds,
            }
        )
        print(
            f"  {case:30s} {library:6s} N={n:5d} {name:42s} "
            f"{median_s * 1e3:9.1f} ms {ratio:6.3f}x {peer}"
        )
    return rows


def _flex() -> tuple[Any, Any]:
    import torch
    from torch.nn.attention import flex_attention as fa

    # dynamic=False: with a second N, dynamo's default recompiles with symbolic
    # sizes, and inductor's C++ for that graph does not compile (torch 2.13 CPU).
    return torch.compile(fa.flex_attention, dynamic=False), fa.create_block_mask


def documents_torch(n: int, rounds: int) -> list[dict[str, Any]]:
    import torch

    import portattn as pa
    from portattn import mods

    flex, flex_mask = _flex()
    rng = np.random.default_rng(n)
    tq, tk, tv = (
        torch.from_numpy(rng.standard_normal((B, H, n, D), dtype=np.float32)) for _ in range(3)
    )
    ids = torch.from_numpy(doc_ids(n))
    mod = pa.and_masks(mods.causal, mods.documents(ids))
    ours = pa.create_block_mask(mod, None, None, n, n, xp=torch)
    theirs = flex_mask(mod, None, None, n, n, device="cpu")
    funcs = {
        "portattn torch auto, block mask": lambda: pa.attention(tq, tk, tv, block_mask=ours),
        "torch.compile(flex_attention)": lambda: flex(tq, tk, tv, block_mask=theirs),
    }
    return _rows("documents", "torch", n, funcs, "torch.compile(flex_attention)", rounds)


def documents_numpy(n: int, rounds: int) -> list[dict[str, Any]]:
    import portattn as pa
    from portattn import mods

    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(3))
    ours = pa.create_block_mask(
        pa.and_masks(mods.causal, mods.documents(doc_ids(n))), None, None, n, n
    )
    funcs = {
        "portattn numpy auto, block mask": lambda: pa.attention(q, k, v, block_mask=ours),
        "portattn numpy auto, dense causal": lambda: pa.attention(q, k, v, causal=True),
    }
    return _rows("documents", "numpy", n, funcs, "portattn numpy auto, dense causal", rounds)


def documents_training(n: int, rounds: int) -> list[dict[str, Any]]:
    import torch

    import portattn as pa
    from portattn import mods

    torch.manual_seed(n)
    q, k, v = (torch.randn(B, H, n, D, requires_grad=True) for _ in range(3))
    d_out = torch.randn(B, H, n, D)
    mask = pa.create_block_mask(
        pa.and_masks(mods.causal, mods.documents(torch.from_numpy(doc_ids(n)))),
        None,
        None,
        n,
        n,
        xp=torch,
    )

    def step(**options: Any) -> Callable[[], None]:
        def run() -> None:
            q.grad = k.grad = v.grad = None
            pa.attention(q, k, v, impl="blockwise", **options).backward(d_out)

        return run

    funcs = {
        "portattn torch blockwise, block mask": step(block_mask=mask),
        "portattn torch blockwise, dense causal": step(causal=True),
    }
    return _rows(
        "documents, forward + backward",
        "torch",
        n,
        funcs,
        "portattn torch blockwise, dense causal",
        rounds,
    )


def alibi(library: str, n: int, rounds: int) -> list[dict[str, Any]]:
    import portattn as pa
    from portattn import mods

    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(3))
    xp = None
    if library == "torch":
        import torch

        q, k, v = (torch.from_numpy(a) for a in (q, k, v))
        xp = torch
    mod = mods.alibi(mods.alibi_slopes(H, xp=xp))
    plain = f"portattn {library} blockwise"
    funcs = {
        f"portattn {library} blockwise, ALiBi score_mod": lambda: pa.attention(
            q, k, v, score_mod=mod, impl="blockwise"
        ),
        plain: lambda: pa.attention(q, k, v, impl="blockwise"),
    }
    return _rows("alibi", library, n, funcs, plain, rounds)


def block_masks(rounds: int) -> list[dict[str, Any]]:
    import torch

    import portattn as pa
    from portattn import mods

    _, flex_mask = _flex()
    n = MASK_N
    ids_np, ids_t = doc_ids(n), torch.from_numpy(doc_ids(n))
    mod_np = pa.and_masks(mods.causal, mods.documents(ids_np))
    mod_t = pa.and_masks(mods.causal, mods.documents(ids_t))
    funcs = {
        "portattn create_block_mask (NumPy)": lambda: pa.create_block_mask(
            mod_np, None, None, n, n
        ),
        "portattn create_block_mask (xp=torch)": lambda: pa.create_block_mask(
            mod_t, None, None, n, n, xp=torch
        ),
        "flex_attention create_block_mask": lambda: flex_mask(
            mod_t, None, None, n, n, device="cpu"
        ),
    }
    rows = _rows("create_block_mask", "numpy", n, funcs, "flex_attention create_block_mask", rounds)
    for row in rows:
        if "xp=torch" in row["subject"]:
            row["library"], row["target"], row["met"] = "torch", None, None
    return rows


def memory_child(n: int) -> None:
    """In a fresh process: tracemalloc's peak of one document-mask call above its inputs."""
    import tracemalloc

    import portattn as pa
    from portattn import mods

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(3))
    mask = pa.create_block_mask(
        pa.and_masks(mods.causal, mods.documents(doc_ids(n))), None, None, n, n
    )
    small = pa.create_block_mask(mods.causal, None, None, 256, 256)
    pa.attention(
        q[..., :256, :], k[..., :256, :], v[..., :256, :], block_mask=small
    )  # imports, caches
    tracemalloc.start()
    out = pa.attention(q, k, v, block_mask=mask)  # held while the peak is read
    _, peak = tracemalloc.get_traced_memory()
    del out
    print(peak, 4 * q.nbytes)


def memory(n: int = MEMORY_N) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "memory", str(n)],
        capture_output=True,
        text=True,
        check=True,
    )
    peak, io = (int(x) for x in done.stdout.split())
    ratio = peak / io
    target = TARGETS[("memory", "numpy")]
    print(
        f"  memory N={n}: peak {peak / 2**20:.1f} MiB, inputs + output "
        f"{io / 2**20:.1f} MiB: {ratio:.2f}x"
    )
    return {
        "n": n,
        "peak_bytes": peak,
        "inputs_plus_output_bytes": io,
        "ratio": ratio,
        "target": target,
        "met": ratio <= target,
    }


def run(*, rounds: int = 5, quick: bool = False) -> dict[str, Any]:
    """Every case, in one process (the memory point in a child); the record's ``programmable``."""
    import torch

    sizes = SIZES[:1] if quick else SIZES
    rows: list[dict[str, Any]] = []
    # One torch thread for every subject, FlexAttention's included: on a shared
    # 2-core machine two threads made the same call vary 7x between rounds
    # (0.7 s to 5.1 s), one thread by a few percent.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch.compile's CPU notices
        for n in sizes:
            rows += documents_torch(n, rounds)
            rows += documents_numpy(n, rounds)
            rows += documents_training(n, rounds)
            rows += alibi("torch", n, rounds)
            rows += alibi("numpy", n, rounds)
        rows += block_masks(rounds)
    torch.set_num_threads(threads)
    config = {"B": B, "H": H, "d": D, "dtype": "float32", "documents": DOCS, "rounds": rounds}
    return {
        "config": {**config, "torch_threads": 1},
        "rows": rows,
        "memory": memory(2048 if quick else MEMORY_N),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["memory"]:
        memory_child(int(sys.argv[2]))
    else:
        raise SystemExit("run through benchmarks/run.py --only programmable")
