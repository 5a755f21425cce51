"""Measurements that need a fresh process each: run as ``python benchmarks/children.py WHAT ARGS``.

A fresh process per point, so that nothing an earlier call cached or
allocated counts. Each prints its numbers on one line for the parent
(``run.py``) to read.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from core import D, H


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def training(n: int, impl: str, causal: bool, steps: int) -> tuple[float, int, int]:
    """Best of ``steps`` forward + backward steps, the first step's peak RSS growth, and I/O bytes.

    ``impl`` is ``"SDPA"`` (torch's kernel) or a portattn impl (``"blockwise"``, ``"auto"``).
    """
    import torch

    import portattn as pa

    torch.manual_seed(0)

    def inputs(m: int) -> tuple[Any, ...]:
        q, k, v = (torch.randn(1, H, m, D, requires_grad=True) for _ in range(3))
        return q, k, v, torch.randn(1, H, m, D)

    def step(q: Any, k: Any, v: Any, d_out: Any) -> Any:
        if impl == "SDPA":
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            out = pa.attention(q, k, v, causal=causal, impl=impl)
        out.backward(d_out)
        return out

    step(*inputs(256))  # imports, kernels, lazy initialisation
    q, k, v, d_out = inputs(n)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the resident high-water mark restarts from the current RSS
    base = _status("VmRSS:")
    times = []
    peak = 0
    for i in range(steps):
        q.grad = k.grad = v.grad = None
        out = None
        t0 = time.perf_counter()
        out = step(q, k, v, d_out)
        times.append(time.perf_counter() - t0)
        if i == 0:
            peak = _status("VmHWM:") - base
    del out
    return min(times), peak, 8 * q.nbytes


def memory(n: int, impl: str) -> tuple[int, int]:
    """tracemalloc's peak of one NumPy call above its inputs, and inputs + output bytes."""
    import tracemalloc

    import numpy as np

    import portattn as pa

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, H, n, D), dtype=np.float32) for _ in range(3))
    pa.attention(q[..., :64, :], k[..., :64, :], v[..., :64, :], impl=impl)  # imports, caches
    tracemalloc.start()
    out = pa.attention(q, k, v, impl=impl)  # held while the peak is read
    _, peak = tracemalloc.get_traced_memory()
    del out
    return peak, 4 * q.nbytes


def main(argv: list[str]) -> None:
    what, *args = argv
    if what == "training":
        n, impl, causal, steps = args
        print(*training(int(n), impl, causal == "1", int(steps)))
    elif what == "memory":
        n, impl = args
        print(*memory(int(n), impl))
    else:
        raise SystemExit(f"expected 'training' or 'memory', got {what!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
