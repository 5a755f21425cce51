"""The JAX context-parallel checks, on 4 simulated CPU devices: ``python jax_worker.py OUT``.

Run in a subprocess by ``tests/test_parallel_jax.py``: XLA's device count
must be set before JAX is imported. Every case runs
``portattn.parallel.attention`` inside ``jax.shard_map`` under ``jax.jit``,
takes ``jax.grad`` through it, and compares with ``pa.attention`` on the
whole sequence (float64); the errors go to ``OUT`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as Spec

import portattn as pa
from portattn import mods, parallel

jax.config.update("jax_enable_x64", True)
B, H, L, D, WORLD = 1, 4, 32, 8, 4
SEQ = Spec(None, None, "x", None)


def _order(layout: str) -> np.ndarray:
    """Global row of each position of the layout-ordered (concatenated shards) sequence."""
    return np.concatenate(
        [
            np.asarray(parallel.positions(L, rank=r, world=WORLD, layout=layout))
            for r in range(WORLD)
        ]
    )


def _case(name: str) -> tuple[str, str, dict[str, Any], int]:
    """(strategy, layout, options, Hkv); ``sinks``/``alibi`` are flags filled in below."""
    return {
        "ring-zigzag-causal": ("ring", "zigzag", {"causal": True}, H),
        "ring-contiguous-causal": ("ring", "contiguous", {"causal": True}, H),
        "ring-zigzag-window": ("ring", "zigzag", {"causal": True, "window": (6, 0)}, H),
        "ring-zigzag-gqa": ("ring", "zigzag", {"causal": True}, 2),
        "ring-zigzag-everything": (
            "ring",
            "zigzag",
            {"causal": True, "softcap": 3.0, "sinks": True, "alibi": True},
            H,
        ),
        "ring-zigzag-documents": ("ring", "zigzag", {"documents": True}, H),
        "allgather-zigzag-everything": (
            "allgather",
            "zigzag",
            {"causal": True, "sinks": True, "alibi": True},
            H,
        ),
        "ulysses-zigzag-everything": (
            "ulysses",
            "zigzag",
            {"causal": True, "sinks": True, "alibi": True},
            H,
        ),
    }[name]


def _run(name: str, mesh: Any) -> dict[str, float]:
    strategy, layout, opts, hkv = _case(name)
    opts = dict(opts)
    rng = np.random.default_rng(len(name))
    q, do = (jnp.asarray(rng.standard_normal((B, H, L, D))) for _ in range(2))
    k, v = (jnp.asarray(rng.standard_normal((B, hkv, L, D))) for _ in range(2))
    dl = jnp.asarray(rng.standard_normal((B, H, L)))
    sinks = jnp.asarray(rng.standard_normal(H))
    slopes = jnp.asarray(np.abs(rng.standard_normal(H)) * 0.3)
    use_sinks, use_alibi = opts.pop("sinks", False), opts.pop("alibi", False)
    if opts.pop("documents", False):
        ids = jnp.asarray([0] * 5 + [1] * 14 + [2] * 9 + [3] * 4)
        opts["block_mask"] = pa.create_block_mask(
            pa.and_masks(mods.causal, mods.documents(ids)), None, None, L, L, block_size=4, xp=jnp
        )

    def extra(s: Any, a: Any) -> dict[str, Any]:
        return {
            "sinks": s if use_sinks else None,
            "score_mod": mods.alibi(a) if use_alibi else None,
        }

    def whole(q: Any, k: Any, v: Any, s: Any, a: Any) -> Any:
        out, lse = pa.attention(q, k, v, return_lse=True, **opts, **extra(s, a))
        return (out * do).sum() + (lse * dl).sum(), (out, lse)

    order = _order(layout)

    def body(q: Any, k: Any, v: Any, s: Any, a: Any) -> Any:
        return parallel.attention(
            q,
            k,
            v,
            axis_name="x",
            strategy=strategy,
            layout=layout,
            return_lse=True,
            **opts,
            **extra(s, a),
        )

    sharded = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(SEQ, SEQ, SEQ, Spec(), Spec()),
        out_specs=(SEQ, Spec(None, None, "x")),
        check_vma=not use_alibi,
    )  # see portattn.parallel._jax

    def split(q: Any, k: Any, v: Any, s: Any, a: Any) -> Any:
        out, lse = sharded(q, k, v, s, a)
        return (out * do[..., order, :]).sum() + (lse * dl[..., order]).sum(), (out, lse)

    put = lambda x: jax.device_put(x[..., order, :], NamedSharding(mesh, SEQ))  # noqa: E731
    args = (put(q), put(k), put(v), sinks, slopes)
    (_, (out, lse)), g = jax.jit(jax.value_and_grad(split, argnums=(0, 1, 2, 3, 4), has_aux=True))(
        *args
    )
    (_, (ro, rl)), rg = jax.jit(jax.value_and_grad(whole, argnums=(0, 1, 2, 3, 4), has_aux=True))(
        q, k, v, sinks, slopes
    )
    errs = {
        "out": float(jnp.abs(out - ro[..., order, :]).max()),
        "lse": float(jnp.abs(lse - rl[..., order]).max()),
    }
    for label, a, b in zip("qkv", g[:3], rg[:3], strict=True):
        errs[f"d{label}"] = float(jnp.abs(a - b[..., order, :]).max())
    if use_sinks:
        errs["dsinks"] = float(jnp.abs(g[3] - rg[3]).max())
    if use_alibi:
        errs["dslopes"] = float(jnp.abs(g[4] - rg[4]).max())
    return errs


CASES = [
    "ring-zigzag-causal",
    "ring-contiguous-causal",
    "ring-zigzag-window",
    "ring-zigzag-gqa",
    "ring-zigzag-everything",
    "ring-zigzag-documents",
    "allgather-zigzag-everything",
    "ulysses-zigzag-everything",
]


def _errors(mesh: Any) -> dict[str, str]:
    q = jnp.zeros((B, H, L, D))
    out: dict[str, str] = {}

    def seen(label: str, heads: int = H, **kw: Any) -> None:
        f = jax.shard_map(
            lambda x: parallel.attention(x, x, x, **kw), mesh=mesh, in_specs=SEQ, out_specs=SEQ
        )
        try:
            jax.jit(f)(jax.device_put(q[:, :heads], NamedSharding(mesh, SEQ)))
            out[label] = "no error"
        except Exception as e:
            out[label] = f"{type(e).__name__}: {e}"

    seen("no_axis")
    seen("wrong_axis", axis_name="y")
    seen("group", axis_name="x", group=object())
    seen("ulysses", heads=3, axis_name="x", strategy="ulysses")
    return out


def main() -> None:
    mesh = jax.make_mesh((WORLD,), ("x",))
    result: dict[str, Any] = {"devices": len(jax.devices())}
    try:
        for name in os.environ.get("CP_CASES", ",".join(CASES)).split(","):
            result[name] = _run(name, mesh)
        result["errors"] = _errors(mesh)
    except Exception:
        result["crash"] = traceback.format_exc()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
