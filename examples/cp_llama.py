"""Train a tiny Llama with 2-rank context parallelism through portattn, and check it.

Each rank holds its zigzag shard of every sequence's tokens (chunks ``r`` and
``2P-1-r`` of ``2P``), feeds the model those tokens with their *global*
``position_ids`` (RoPE), and the model's attention is
:func:`portattn.parallel.attention` (registered as a ``transformers`` attention
function): the keys and values of the other ranks travel the ring, forward and
backward. The loss is the mean over every token of every rank; each rank's
weight gradients are its share of it, summed across ranks before the AdamW
step, so every rank keeps the same weights.

The same model, from the same seed, trained on one process with
``transformers``' own SDPA attention on the whole sequence, gives the
reference loss curve; the two agree to 1e-5 in float32 and 1e-10 in float64.

Run on 2 processes by ``torchrun`` (any backend: ``init_process_group`` picks
gloo for CPU tensors, NCCL for CUDA ones; only gloo on CPU is tested here)::

    torchrun --nproc-per-node 2 examples/cp_llama.py --dtype float64

or without ``torchrun``: ``python examples/cp_llama.py`` starts the two ranks
itself, on this machine only (a ``file://`` store in a temporary folder, gloo
on the loopback interface). ``--record FILE`` writes both curves of each dtype as JSON.
No download: the model is built ``from_config``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

from portattn import parallel

STEPS, BATCH, LENGTH, SEED = 30, 2, 64, 0
NAME = "portattn_cp"


def cp_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, n, d): this rank's rows, RoPE'd at global positions
    key: torch.Tensor,  # (B, Hkv, n, d)
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A ``transformers`` attention function: causal attention over the whole, sharded sequence.

    ``attention_mask`` is the model's mask for the local rows, in local
    positions: meaningless here, so it is not used (the batch has no
    padding); causality is applied over global positions instead.
    """
    if dropout:
        msg = f"expected attention dropout 0 (context parallelism has none), got {dropout}"
        raise ValueError(msg)
    out = parallel.attention(query, key, value, causal=True, scale=scaling, layout="zigzag")
    return out.transpose(1, 2).contiguous(), None  # (B, n, H, d), as transformers expects


AttentionInterface.register(NAME, cp_attention)


def model(dtype: torch.dtype, attn: str) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: K/V travel the ring with their own 2 heads
        max_position_embeddings=LENGTH,
        attention_dropout=0.0,
    )
    torch.manual_seed(SEED)
    m = LlamaForCausalLM._from_config(config, attn_implementation=attn)
    return m.to(dtype)


def batches(steps: int) -> list[torch.Tensor]:
    """Token sequences with structure worth learning: a random walk over the vocabulary."""
    g = torch.Generator().manual_seed(SEED + 1)
    steps_ = torch.randint(-2, 3, (steps, BATCH, LENGTH), generator=g)
    start = torch.randint(0, 96, (steps, BATCH, 1), generator=g)
    return [(start[i] + steps_[i].cumsum(-1)) % 96 for i in range(steps)]


def labels_of(tokens: torch.Tensor) -> torch.Tensor:
    """Next-token labels over the whole sequence (-100 for the last), before sharding."""
    return torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -100)], dim=1)


def train(dtype: torch.dtype, steps: int, *, rank: int = 0, world: int = 1) -> list[float]:
    """The loss of every step; ``world > 1``: this rank's shard, in a process group."""
    m = model(dtype, NAME if world > 1 else "sdpa")
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for tokens in batches(steps):
        labels = labels_of(tokens)
        count = int((labels != -100).sum())  # tokens that have a label, on all ranks together
        if world > 1:
            tokens, labels = (
                parallel.shard(t, rank=rank, world=world, axis=-1) for t in (tokens, labels)
            )
        pos = parallel.positions(LENGTH, rank=rank, world=world, xp=torch)
        logits = m(input_ids=tokens, position_ids=pos[None].expand(BATCH, -1)).logits
        total = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
        )
        loss = total / count  # this rank's share of the mean over every token
        opt.zero_grad()
        loss.backward()
        shown = loss.detach().clone()
        if world > 1:
            for p in m.parameters():
                dist.all_reduce(p.grad)  # each rank's share of the weights' gradient
            dist.all_reduce(shown)
        opt.step()
        losses.append(float(shown))
    return losses


def _rank_main(args: argparse.Namespace) -> None:
    """One rank, under torchrun (env://) or started by :func:`_spawn` (a file:// store)."""
    store = os.environ.get("CP_STORE")
    kw = {} if store is None else {"init_method": store}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(rank=rank, world_size=world, **kw)  # gloo for CPU, NCCL for CUDA
    torch.set_num_threads(1)
    try:
        records = []
        for name in args.dtype.split(","):
            cp = train(getattr(torch, name), args.steps, rank=rank, world=world)
            if rank == 0:
                records.append(
                    _report(name, args.steps, train(getattr(torch, name), args.steps), cp, world)
                )
        if rank == 0 and args.record:
            Path(args.record).write_text(json.dumps(records, indent=1) + "\n")
    finally:
        dist.destroy_process_group()


def _report(
    dtype: str, steps: int, one: list[float], cp: list[float], world: int
) -> dict[str, Any]:
    gap = max(abs(a - b) for a, b in zip(one, cp, strict=True))
    print(f"{dtype}: {steps} AdamW steps, P={world} zigzag ring vs one process (SDPA)")
    print(f"loss {one[0]:.6f} -> {one[-1]:.6f}; largest difference between the curves {gap:.3e}")
    return {
        "dtype": dtype,
        "world": world,
        "steps": steps,
        "single": one,
        "cp": cp,
        "max_diff": gap,
    }


def _spawn(args: argparse.Namespace, world: int = 2) -> int:
    """Start ``world`` ranks of this script on this machine: loopback only, always ended."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(
            os.environ,
            WORLD_SIZE=str(world),
            CP_STORE=f"file://{folder}/store",
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
        )
        argv = [sys.executable, __file__, *sys.argv[1:]]
        procs = [subprocess.Popen(argv, env={**env, "RANK": str(r)}) for r in range(world)]
        end, codes = time.monotonic() + args.timeout, []
        try:
            for p in procs:
                codes.append(p.wait(timeout=max(1.0, end - time.monotonic())))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return max(codes) if len(codes) == world else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dtype", default="float32", help="float32, float64, or both: float32,float64"
    )
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--record", help="write both loss curves to this JSON file")
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600,
        help="seconds before the ranks this starts are killed",
    )
    args = parser.parse_args()
    if not set(args.dtype.split(",")) <= {"float32", "float64"}:
        parser.error(f"expected --dtype float32, float64 or both, got {args.dtype!r}")
    if "RANK" in os.environ:
        _rank_main(args)
        return 0
    return _spawn(args)


if __name__ == "__main__":
    sys.exit(main())
