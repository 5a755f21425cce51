"""Serving: packed varlen attention, paged decode and continuous batching, against SDPA.

Run ``python benchmarks/serving.py [--rounds N]`` from the root, or
``nox -s bench -- --only serving`` (a full ``nox -s bench`` runs it too); it
writes ``benchmarks/results/serving.json`` (the Serving page reads it). torch
on 2 threads, float32, CPU.

Cases (each ratio paired: per round every subject runs once in turn, each
round starting with the next subject (the cyclic order kept), and the ratio is the median over
rounds of subject time / peer time in that round, so that a shared
machine's load hits both alike; ``spread`` is the max/min of the per-round
ratios, the noise):

- ``varlen``: 16 sequences of mixed lengths, T = 8192 in all, H = 8, d = 64,
  causal. ``pa.attention_varlen`` against SDPA on the packed row with the
  dense (T, T) block-diagonal causal mask, and against a Python loop of
  ``pa.attention`` on each sequence;
- ``paged``: decode of 16 sequences of 2048 keys each (pages of 16, shuffled),
  H = 8, Hkv = 2, d = 64: ``pa.paged_attention`` (per sequence, the
  batch-invariant default, and ``batch_invariant=False``: one masked call;
  ``impl="blockwise"`` and ``impl="invariant"``, whose ratio is what
  invariance to decode and padding costs) against SDPA on contiguous
  (16, H, 2048, d) K/V (``enable_gqa``);
- ``continuous``: tokens/s of ``model.generate_batch`` on the tiny Llama
  (16 prompts of 1 to 30 tokens, 32 new tokens each, greedy), portattn
  (``serve(model)``, the default; ``portattn_invariant``: ``serve(...,
  batch_invariant=True)``) against ``"sdpa"`` (target >= 1.0x for the
  default). The gap between the two portattn rows is what batch invariance
  costs. Its
  attention calls are tiny, so it measures per-call overhead: each layer's
  Python bookkeeping against one SDPA call;
- ``continuous_long``: the same, on 16 prompts of 64 to 512 tokens (4794 in
  all, drawn once from seed 1, not tuned), 32 new tokens each, the cache
  sized for all of them and the short case's 256 tokens per step, so that
  prompts are prefilled in chunks. Closer to serving: here ``"sdpa"`` pays
  for its dense (tokens, keys) masks, which the packed path never builds.

The varlen case's packed batch (8192² pairs) is above the fused call's bound
(2**22 pairs), so it always runs per sequence.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).parent / "results" / "serving.json"
LENGTHS = [1024, 64, 700, 300, 1500, 96, 512, 200, 900, 40, 650, 128, 800, 260, 600, 418]


def _paired(subjects: dict[str, Callable[[], object]], peer: str, rounds: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {n: [] for n in subjects}
    names = list(subjects)
    for r in range(rounds):
        # Each round starts with the next subject, so that none always runs
        # first (a run leaves garbage, caches and clock state to the next).
        # The cyclic order stays: each subject follows the same one, or none.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            subjects[name]()
            times[name].append(time.perf_counter() - t)
    rows = {}
    for name in subjects:
        ratios = [a / b for a, b in zip(times[name], times[peer], strict=True)]
        rows[name] = {
            "median_s": statistics.median(times[name]),
            "ratio_to_" + peer: statistics.median(ratios),
            "spread": max(ratios) / min(ratios),
        }
    return rows


def varlen(rounds: int) -> dict[str, Any]:
    import torch

    import portattn as pa

    assert sum(LENGTHS) == 8192
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8192, 8, 64, generator=g) for _ in range(3))
    cu = [0, *np.cumsum(LENGTHS).tolist()]
    doc = torch.repeat_interleave(torch.arange(16), torch.tensor(LENGTHS))
    pos = torch.arange(8192) - torch.tensor(cu[:-1])[doc]
    mask = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])  # (T, T)
    qh, kh, vh = (x.permute(1, 0, 2)[None] for x in (q, k, v))

    def loop() -> None:
        for a, b in itertools.pairwise(cu):
            pa.attention(qh[..., a:b, :], kh[..., a:b, :], vh[..., a:b, :], causal=True)

    subjects = {
        "sdpa_dense_mask": lambda: torch.nn.functional.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask
        ),
        "portattn_varlen": lambda: pa.attention_varlen(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True
        ),
        "portattn_loop": loop,
    }
    with torch.no_grad():
        return _paired(subjects, "sdpa_dense_mask", rounds)


def paged(rounds: int) -> dict[str, Any]:
    import torch

    import portattn as pa

    s, n, page, h, hkv, d = 16, 2048, 16, 8, 2, 64
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(s, hkv, n, d, generator=g) for _ in range(2))
    q = torch.randn(s, h, 1, d, generator=g)
    per = n // page
    order = torch.randperm(s * per, generator=g)
    table = order.reshape(s, per).to(torch.int32)
    k_pages = torch.empty(s * per, page, hkv, d)
    v_pages = torch.empty(s * per, page, hkv, d)
    k_pages[order] = k.permute(0, 2, 1, 3).reshape(s * per, page, hkv, d)
    v_pages[order] = v.permute(0, 2, 1, 3).reshape(s * per, page, hkv, d)
    seq_lens = torch.full((s,), n, dtype=torch.int32)
    qp = q[:, :, 0, :]  # (S, H, d): one query per sequence
    cu_q = list(range(s + 1))

    paged = functools.partial(
        pa.paged_attention,
        qp,
        k_pages,
        v_pages,
        block_table=table,
        seq_lens=seq_lens,
        cu_seqlens_q=cu_q,
    )
    subjects = {
        "sdpa_contiguous": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, enable_gqa=True
        ),
        "portattn_paged": paged,
        "portattn_paged_fused": functools.partial(paged, batch_invariant=False),
        # What impl="invariant" costs: the same step on the blockwise path and on it.
        **{
            f"portattn_paged_{impl}": functools.partial(paged, impl=impl)
            for impl in ("blockwise", "invariant")
        },
    }
    with torch.no_grad():
        return _paired(subjects, "sdpa_contiguous", rounds)


def continuous(rounds: int) -> dict[str, Any]:
    """The short workload: 16 prompts of 1 to 30 tokens, 32 new tokens each."""
    import torch

    g = torch.Generator().manual_seed(0)
    lens = [3, 17, 5, 9, 30, 2, 12, 7, 21, 4, 11, 6, 25, 8, 14, 1]
    small = {"page_size": 16, "num_blocks": 128, "max_batch_tokens": 256}
    return _generate_batch(lens, g, small, rounds)


def continuous_long(rounds: int) -> dict[str, Any]:
    """The long workload: 16 prompts of 64 to 512 tokens (drawn from seed 1), 32 new tokens each."""
    import torch

    g = torch.Generator().manual_seed(1)
    lens = torch.randint(64, 513, (16,), generator=g).tolist()
    # Room for every sequence at once (16 * (512 + 32) tokens, pages of 16);
    # the short workload's token budget per step, so long prompts are
    # prefilled in chunks, as a server does.
    cache = {"page_size": 16, "num_blocks": 640, "max_batch_tokens": 256}
    return _generate_batch(lens, g, cache, rounds)


def _generate_batch(lens: list[int], g: Any, cache: dict[str, int], rounds: int) -> dict[str, Any]:
    """Tokens/s of ``generate_batch`` on prompts of ``lens`` tokens (drawn from ``g``), paired."""
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from portattn.integrations.transformers import register, serve, tiny_model

    new = 32
    prompts = [torch.randint(3, 128, (m,), generator=g).tolist() for m in lens]
    greedy = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    models = {
        "sdpa": tiny_model("llama", attn_implementation="sdpa"),
        "portattn": serve(tiny_model("llama", attn_implementation=register())),
        "portattn_invariant": serve(
            tiny_model("llama", attn_implementation=register()), batch_invariant=True
        ),
    }

    def run(model: Any) -> Callable[[], object]:
        return lambda: model.generate_batch(
            prompts,
            generation_config=greedy,
            continuous_batching_config=ContinuousBatchingConfig(**cache, max_requests_per_batch=16),
            progress_bar=False,
        )

    rows = _paired({n: run(m) for n, m in models.items()}, "sdpa", rounds)
    for row in rows.values():
        row["tokens_per_s"] = len(prompts) * new / row["median_s"]
    for name in ("portattn", "portattn_invariant"):
        rows[name]["speed_vs_sdpa"] = 1 / rows[name]["ratio_to_sdpa"]
    # The default is held to the target; batch invariance is an option, and its row its price.
    rows["portattn"]["target"] = ">= 1.0x"
    rows["portattn"]["met"] = rows["portattn"]["speed_vs_sdpa"] >= 1.0
    return rows


def run(out: Path = OUT.parent, *, rounds: int = 5) -> dict[str, Any]:
    """Every case, written to ``out / "serving.json"`` (``benchmarks/run.py --only serving``)."""
    import datetime as dt

    import torch
    from core import load, machine

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        record = {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "load_before": load(),
            "config": {"rounds": rounds, "torch": torch.__version__, "threads": 2},
            "varlen": varlen(rounds),
            "paged": paged(rounds),
            "continuous": continuous(rounds),
            "continuous_long": continuous_long(rounds),
            "load_after": load(),
        }
    finally:
        torch.set_num_threads(before)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT.name).write_text(json.dumps(record, indent=2) + "\n")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT.parent)
    args = parser.parse_args()
    print(json.dumps(run(args.out, rounds=args.rounds), indent=2))


if __name__ == "__main__":
    main()
