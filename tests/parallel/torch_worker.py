"""One rank of the torch context-parallel tests: ``python torch_worker.py RANK WORLD FOLDER``.

Started by ``tests/test_parallel_torch.py``, never collected by pytest. The
ranks meet through a ``file://`` store in ``FOLDER`` (nothing listens on a
port beyond gloo's own loopback sockets, GLOO_SOCKET_IFNAME=lo), run every
case for their world size and write what they measured to ``FOLDER/rank{RANK}.json``.
Each case compares this rank's shard with the same rows of ``pa.attention``
on the whole sequence, forward and backward (float64).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import portattn as pa
from portattn import mods, parallel

torch.set_num_threads(1)  # several ranks share few cores

B, H, L, D = 2, 4, 32, 8


def _inputs(seed: int, hkv: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return {
        "q": draw(B, H, L, D),
        "k": draw(B, hkv, L, D),
        "v": draw(B, hkv, L, D),
        "do": draw(B, H, L, D),
        "dl": draw(B, H, L),
        "sinks": draw(H),
        "slopes": draw(H).abs() * 0.3,
    }


def _case_options(name: str) -> dict[str, Any]:
    """pa.attention's keywords for each case (``slopes``/``sinks`` filled in by ``_run``)."""
    ids = torch.tensor([0] * 5 + [1] * 14 + [2] * 9 + [3] * 4)
    doc_mask = pa.create_block_mask(
        pa.and_masks(mods.causal, mods.documents(ids)), None, None, L, L, block_size=4, xp=torch
    )
    return {
        "plain": {},
        "causal": {"causal": True},
        "window": {"window": (5, 3)},
        "causal_window": {"causal": True, "window": (6, 0)},
        "softcap": {"causal": True, "softcap": 2.0},
        "gqa": {"causal": True},
        "mqa": {"causal": True},
        "sinks": {"causal": True, "sinks": True},
        "alibi": {"causal": True, "alibi": True},
        "documents": {"block_mask": doc_mask},
        "everything": {"causal": True, "softcap": 3.0, "sinks": True, "alibi": True},
        "everything_f32": {"causal": True, "softcap": 3.0, "sinks": True, "alibi": True},
    }[name]


CASES = [
    "plain",
    "causal",
    "window",
    "causal_window",
    "softcap",
    "gqa",
    "mqa",
    "sinks",
    "alibi",
    "documents",
    "everything",
    "everything_f32",  # float32 in, against the whole sequence in float32: rounding only
]
HKV = {"gqa": 2, "mqa": 1}


def _run(name: str, strategy: str, layout: str, rank: int, world: int) -> dict[str, Any]:
    opts = _case_options(name)
    dtype = torch.float32 if name.endswith("_f32") else torch.float64
    x = {n: t.to(dtype) for n, t in _inputs(CASES.index(name), HKV.get(name, H)).items()}
    sinks = x["sinks"].clone().requires_grad_(True) if opts.pop("sinks", False) else None
    slopes = x["slopes"].clone().requires_grad_(True)
    if opts.pop("alibi", False):
        opts["score_mod"] = mods.alibi(slopes)
    # the reference: the whole sequence on one process
    qf, kf, vf = (x[n].clone().requires_grad_(True) for n in "qkv")
    out_f, lse_f = pa.attention(qf, kf, vf, sinks=sinks, return_lse=True, block_size=4, **opts)
    ((out_f * x["do"]).sum() + (lse_f * x["dl"]).sum()).backward()
    ref = {"q": qf.grad, "k": kf.grad, "v": vf.grad}
    ref_sinks = None if sinks is None else sinks.grad.clone()
    ref_slopes = None if slopes.grad is None else slopes.grad.clone()
    if sinks is not None:
        sinks.grad = None
    slopes.grad = None

    def cut(t: torch.Tensor, axis: int = -2) -> torch.Tensor:
        return parallel.shard(t, rank=rank, world=world, layout=layout, axis=axis)

    q, k, v = (cut(x[n]).requires_grad_(True) for n in "qkv")

    def sharded() -> Any:
        return parallel.attention(
            q,
            k,
            v,
            strategy=strategy,
            layout=layout,
            sinks=sinks,
            return_lse=True,
            block_size=(4, 4),
            **opts,
        )

    out, lse = sharded()
    stats = parallel.last_stats()
    loss = (out * cut(x["do"])).sum() + (lse * cut(x["dl"], -1)).sum()
    grads = torch.autograd.grad(
        loss,
        [
            q,
            k,
            v,
            *(
                t
                for t in (sinks, slopes)
                if t is not None and (t is not slopes or ref_slopes is not None)
            ),
        ],
    )
    got = dict(zip("qkv", grads[:3], strict=True))
    errs = {
        "out": (out - cut(out_f)).abs().max().item(),
        "lse": (lse - cut(lse_f, -1)).abs().max().item(),
        **{f"d{n}": (got[n] - cut(ref[n])).abs().max().item() for n in "qkv"},
    }
    rest = list(grads[3:])
    for label, full in (("dsinks", ref_sinks), ("dslopes", ref_slopes)):
        if full is None:
            continue
        partial = rest.pop(0).clone()
        dist.all_reduce(partial)  # partial per rank: their sum is the gradient
        errs[label] = (partial - full).abs().max().item()
    # The same backward twice: the two must agree bit for bit.
    again, once = (
        torch.autograd.grad((sharded()[0] * cut(x["do"])).sum(), [q, k, v]) for _ in range(2)
    )
    errs["repeat_identical"] = all(torch.equal(a, b) for a, b in zip(again, once, strict=True))
    errs["stats"] = {
        "pairs": stats.pairs,
        "hidden": stats.hidden,
        "tiles": stats.tiles,
        "bytes_sent": stats.bytes_sent,
        "backward_bytes_sent": stats.backward_bytes_sent,
        "kv_bytes": (k.numel() + v.numel()) * k.element_size() * world,
    }
    return errs


def _errors(rank: int, world: int) -> dict[str, str]:
    """Bad input: each message, as every rank saw it."""
    out: dict[str, str] = {}
    x = _inputs(0, H)
    q, k, v = (parallel.shard(x[n], rank=rank, world=world) for n in "qkv")

    def seen(label: str, fn: Any) -> None:
        try:
            fn()
            out[label] = "no error"
        except Exception as e:
            out[label] = f"{type(e).__name__}: {e}"

    short = slice(0, 4) if rank == 1 else slice(None)
    seen(
        "lengths", lambda: parallel.attention(q[..., short, :], k[..., short, :], v[..., short, :])
    )
    bm = pa.create_block_mask(mods.causal, None, None, L // 2, L // 2, block_size=4, xp=torch)
    seen("block_mask", lambda: parallel.attention(q, k, v, block_mask=bm))
    seen("axis_name", lambda: parallel.attention(q, k, v, axis_name="i"))
    q3 = torch.randn(B, 3, q.shape[-2], D, dtype=torch.float64)
    seen("ulysses_heads", lambda: parallel.attention(q3, q3, q3, strategy="ulysses"))
    odd = torch.randn(B, H, 3, D, dtype=torch.float64)
    seen("odd_zigzag", lambda: parallel.attention(odd, odd, odd))
    seen("strategy", lambda: parallel.attention(q, k, v, strategy="tree"))
    return out


def _die(rank: int, world: int) -> dict[str, Any]:
    """The last rank dies inside the ring's backward; the others must raise, not hang.

    Backward, every rank waits for its keys' gradients from the previous
    rank, so the dead rank's absence reaches all of them.
    """
    import portattn.parallel._torch as pt

    x = _inputs(0, H)
    q, k, v = (parallel.shard(x[n], rank=rank, world=world).requires_grad_(True) for n in "qkv")
    if rank == world - 1:
        real = pt.backward_source

        def dying(c: Any, src: int, *args: Any, **kw: Any) -> Any:
            if src != rank:
                os._exit(3)
            return real(c, src, *args, **kw)

        pt.backward_source = dying
    start = time.monotonic()
    try:
        parallel.attention(q, k, v, causal=True).sum().backward()
        verdict = "no error"
    except Exception as e:
        verdict = f"{type(e).__name__}: {str(e)[:200]}"
    return {"verdict": verdict, "seconds": time.monotonic() - start}


def main() -> None:
    rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    timeout = timedelta(seconds=float(os.environ.get("PORTATTN_TEST_TIMEOUT", "60")))
    store = f"file://{os.path.join(folder, 'store')}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world, timeout=timeout)
    result: dict[str, Any] = {}
    try:
        for strategy, layout, cases in PLANS[world]:
            for name in cases:
                result[f"{strategy}-{layout}-{name}"] = _run(name, strategy, layout, rank, world)
        if world > 1:
            result["errors"] = _errors(rank, world)
            _write(folder, rank, result)  # before the last case, in which a rank dies
            result["die"] = _die(rank, world)
    except Exception:
        result["crash"] = traceback.format_exc()
    _write(folder, rank, result)
    os._exit(0)  # no teardown: a peer is gone, and destroy_process_group would wait for it


def _write(folder: str, rank: int, result: dict[str, Any]) -> None:
    path = os.path.join(folder, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


PLANS = {
    1: [
        ("ring", "zigzag", ["causal", "documents", "everything"]),
        ("ring", "contiguous", ["causal"]),
    ],
    2: [
        ("ring", "zigzag", CASES),
        ("ring", "contiguous", ["causal", "window", "documents"]),
        ("allgather", "zigzag", ["causal", "gqa", "everything"]),
        ("ulysses", "zigzag", ["causal", "gqa", "everything", "documents"]),
        ("ulysses", "contiguous", ["causal_window"]),
    ],
    4: [
        ("ring", "zigzag", ["causal", "gqa", "everything", "documents", "causal_window"]),
        ("ring", "zigzag", ["everything_f32"]),
        ("ring", "contiguous", ["causal", "everything"]),
        ("allgather", "contiguous", ["causal"]),
        ("ulysses", "zigzag", ["everything"]),
    ],
}

if __name__ == "__main__":
    main()
