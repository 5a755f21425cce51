"""A tiny transformer trained by portattn's own backward, for the page "What attention learns".

Two toy tasks whose solutions are known, so that what each head learned can be
measured instead of described:

- **reverse**: read ``n`` tokens and write them backwards. Every position sees
  every other (no mask); a head that solves it attends along the anti-diagonal.
- **induction**: random tokens in which one random pattern occurs twice in a
  row (causal). Predicting the second copy needs a previous-token head in layer 1
  and, in layer 2, an induction head: from the current token, attend to the
  token that followed its earlier occurrence.

The model is attention-only (nanoGPT's block without the MLP), small enough to
train on two CPU cores in seconds. Its attention is a parameter: ``"portattn"``
calls ``pa.attention(..., impl="blockwise")``, whose backward is portattn's
own; ``"sdpa"`` calls torch's fused kernel. The same seed gives both the same
weights and batches, so their loss curves can be laid on top of each other.
"""

from __future__ import annotations

import dataclasses
import io
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import portattn as pa

from .diskcache import cache_dir, code_key, write_atomic


@dataclass(frozen=True)
class Settings:
    """Everything that decides a training run; the cache key is built from it."""

    task: str  # "reverse" or "induction"
    vocab: int = 16
    length: int = 16  # longest sequence (the position table's size)
    width: int = 24
    heads: int = 2
    layers: int = 2
    steps: int = 600
    batch: int = 64
    lr: float = 1e-2
    seed: int = 0
    # float64, so that the portattn and SDPA curves differ by what the two
    # backwards compute, not by float32 rounding that training amplifies.
    dtype: str = "float64"

    @property
    def causal(self) -> bool:
        return self.task == "induction"


# ---------------------------------------------------------------- the tasks


def reverse_batch(s: Settings, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random tokens in, the same tokens reversed out: every position is scored."""
    n = s.length // 2
    tokens = torch.randint(0, s.vocab, (s.batch, n), generator=g)
    return tokens, tokens.flip(-1)


def induction_batch(s: Settings, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens with one pattern repeated at once; ``-1`` marks the targets not scored.

    The pattern's length ``m`` and start ``p`` vary, so neither a fixed offset
    nor a position can find the earlier copy. Every other token is distinct
    (one permutation feeds them all), so each token of the repeat has exactly
    one earlier occurrence. Scored: the repeat after its first token, which is
    what an induction head can predict.
    """
    n = s.length
    m = torch.randint(3, n // 2 + 1, (s.batch, 1), generator=g)
    p = (torch.rand(s.batch, 1, generator=g) * (n - 2 * m + 1)).long()  # 0 <= p <= n - 2m
    perm = torch.argsort(torch.rand(s.batch, s.vocab, generator=g), dim=-1)
    i = torch.arange(n)[None, :]
    repeat = (i >= p + m) & (i < p + 2 * m)  # (B, n) the second copy
    tokens = torch.gather(perm, 1, torch.where(i < p + m, i, i - m))
    # Position i predicts token i + 1.
    target = torch.full_like(tokens, -1)
    scored = repeat[:, 1:] & (i[:, 1:] > p + m)
    target[:, :-1] = torch.where(scored, tokens[:, 1:], -1)
    return tokens, target


BATCHES = {"reverse": reverse_batch, "induction": induction_batch}


# ---------------------------------------------------------------- the model


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, impl: str) -> Any:
    """One attention call for all heads, (B, h, n, hd), through portattn or torch SDPA."""
    if impl == "portattn":
        return pa.attention(q, k, v, causal=causal, impl="blockwise")
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    msg = f"expected impl 'portattn' or 'sdpa', got {impl!r}"
    raise ValueError(msg)


class Block(nn.Module):
    """Pre-norm multi-head self-attention with a residual connection, and nothing else."""

    def __init__(self, s: Settings) -> None:
        super().__init__()
        self.heads = s.heads
        self.norm = nn.LayerNorm(s.width)
        self.qkv = nn.Linear(s.width, 3 * s.width, bias=False)
        self.out = nn.Linear(s.width, s.width, bias=False)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, n, c = x.shape
        qkv = self.qkv(self.norm(x)).view(b, n, 3, self.heads, c // self.heads)
        return tuple(qkv.permute(2, 0, 3, 1, 4))  # 3 x (B, h, n, hd)

    def forward(self, x: torch.Tensor, *, causal: bool, impl: str) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.split(x)
        y = attend(q, k, v, causal=causal, impl=impl)  # (B, h, n, hd)
        return x + self.out(y.transpose(1, 2).reshape(b, n, c))


class TinyTransformer(nn.Module):
    """Token and position embeddings, ``layers`` attention blocks, a final norm, logits."""

    def __init__(self, s: Settings) -> None:
        super().__init__()
        self.causal = s.causal
        self.tok = nn.Embedding(s.vocab, s.width)
        self.pos = nn.Embedding(s.length, s.width)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = nn.LayerNorm(s.width)
        self.head = nn.Linear(s.width, s.vocab)

    def forward(self, tokens: torch.Tensor, *, impl: str = "portattn") -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[-1]))
        for block in self.blocks:
            x = block(x, causal=self.causal, impl=impl)
        return self.head(self.norm(x))  # (B, n, vocab)

    @torch.no_grad()
    def weights(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Every head's attention weights, one (B, h, n, n) tensor per layer, by portattn."""
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[-1]))
        out = []
        for block in self.blocks:
            q, k, _ = block.split(x)
            out.append(pa.attention_weights(q, k, causal=self.causal))
            x = block(x, causal=self.causal, impl="portattn")
        return out


def n_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- training


@dataclass
class Run:
    """One finished training run: the model, its loss per step, and its time."""

    model: TinyTransformer
    losses: list[float]
    wall_s: float
    cpu_s: float


def train(s: Settings, *, impl: str) -> Run:
    """Train from ``s.seed``: the same initial weights and batches whatever ``impl`` is."""
    import time

    torch.manual_seed(s.seed)
    model = TinyTransformer(s).to(getattr(torch, s.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(s.seed + 1)
    # Cosine decay to zero: late in training Adam's normalised steps would
    # otherwise keep kicking a converged model, and the two runs drift apart.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1 + math.cos(math.pi * i / s.steps))
    )
    losses = []
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(s.steps):
        tokens, target = BATCHES[s.task](s, g)
        logits = model(tokens, impl=impl)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return Run(model, losses, time.perf_counter() - wall, time.process_time() - cpu)


def accuracy(model: TinyTransformer, s: Settings, *, batches: int = 8, seed: int = 10_000) -> float:
    """The share of scored tokens predicted exactly, on fresh batches."""
    g = torch.Generator().manual_seed(seed)
    right = total = 0
    with torch.no_grad():
        for _ in range(batches):
            tokens, target = BATCHES[s.task](s, g)
            guess = model(tokens).argmax(-1)
            scored = target >= 0
            right += int((guess[scored] == target[scored]).sum())
            total += int(scored.sum())
    return right / total


# ---------------------------------------------------------------- what the heads do


def previous_token(w: torch.Tensor) -> torch.Tensor:
    """Per head, the mean weight a query puts on the token just before it: (layers, h)."""
    n = w.shape[-1]
    i = torch.arange(1, n)
    return w[..., i, i - 1].mean(dim=(1, -1))


def anti_diagonal(w: torch.Tensor) -> torch.Tensor:
    """Per head, the mean weight query ``i`` puts on key ``n - 1 - i`` (the reversed position)."""
    n = w.shape[-1]
    i = torch.arange(n)
    return w[..., i, n - 1 - i].mean(dim=(1, -1))


def induction(w: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per head, the mean weight on the token after the current token's earlier occurrence.

    Scored at queries whose token occurred before (the repeat); a query with
    none is left out.
    """
    n = tokens.shape[-1]
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, q, k)
    earlier = same & (torch.arange(n)[None, :] < torch.arange(n)[:, None])
    has = earlier.any(-1)  # (B, q)
    target = (earlier.int().argmax(-1) + 1).clamp(max=n - 1)  # (B, q) the key after it
    picked = torch.gather(w, -1, target[None, :, None, :, None].expand(*w.shape[:-1], 1))[..., 0]
    mask = has[None, :, None, :].to(w.dtype)
    return (picked * mask).sum(dim=(1, -1)) / mask.sum(dim=(1, -1))


def head_scores(model: TinyTransformer, s: Settings, *, seed: int = 20_000) -> dict[str, Any]:
    """Each head's score on the patterns the task calls for, on 256 fresh sequences."""
    g = torch.Generator().manual_seed(seed)
    tokens, _ = BATCHES[s.task](dataclasses.replace(s, batch=256), g)
    w = torch.stack(model.weights(tokens))  # (layers, B, h, n, n)
    scores = {"previous": previous_token(w)}
    if s.task == "reverse":
        scores["anti_diagonal"] = anti_diagonal(w)
    else:
        scores["induction"] = induction(w, tokens)
    return {k: v.tolist() for k, v in scores.items()}


# ---------------------------------------------------------------- the results, cached

TASKS = {
    "reverse": Settings(task="reverse", steps=300),
    # A gentler rate for induction: at 1e-2 the loss spikes, and a spike turns
    # a 1e-16 difference between the runs into a visible one.
    "induction": Settings(task="induction", steps=1200, lr=3e-3),
}
IMPLS = ("portattn", "sdpa")


@dataclass
class Trained:
    """What the page shows for one task: both runs' curves and accuracies, the portattn model."""

    settings: Settings
    model: TinyTransformer
    losses: dict[str, list[float]]
    accuracy: dict[str, float]
    wall_s: dict[str, float]
    cpu_s: dict[str, float]

    @property
    def largest_gap(self) -> float:
        """The largest difference between the two loss curves at any step."""
        a, b = (self.losses[i] for i in IMPLS)
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    @property
    def parameters(self) -> int:
        return n_parameters(self.model)


def cache_path(s: Settings) -> Any:
    """Where the runs of ``s`` are kept; the name changes with any change to the code.

    The key covers the settings, this file, portattn's whole source and
    torch's version: a change to portattn (its backward included) trains
    again, and a rebuild without changes reuses the weights.
    """
    key = code_key(__file__, libraries=("torch",), extra=repr(s))
    return cache_dir("learned") / f"{s.task}-{key}.pt"


def _train_both(s: Settings) -> dict[str, Any]:
    """Both runs, single-threaded and with deterministic kernels, as a dict to store."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        runs = {impl: train(s, impl=impl) for impl in IMPLS}
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
    return {
        "state": runs["portattn"].model.state_dict(),
        "losses": {i: r.losses for i, r in runs.items()},
        "accuracy": {i: accuracy(r.model, s) for i, r in runs.items()},
        "wall_s": {i: r.wall_s for i, r in runs.items()},
        "cpu_s": {i: r.cpu_s for i, r in runs.items()},
    }


def trained(task: str) -> Trained:
    """The task's trained model and curves, from the cache when the code is unchanged."""
    if task in _MEMO:
        return _MEMO[task]
    s = TASKS[task]
    path = cache_path(s)
    if path.is_file():
        stored = torch.load(path, weights_only=True)
    else:
        stored = _train_both(s)
        buf = io.BytesIO()
        torch.save(stored, buf)
        write_atomic(path, buf.getvalue())
    model = TinyTransformer(s).to(getattr(torch, s.dtype))
    model.load_state_dict(stored["state"])
    model.eval()
    keys = ("losses", "accuracy", "wall_s", "cpu_s")
    _MEMO[task] = Trained(s, model, **{k: stored[k] for k in keys})
    return _MEMO[task]


_MEMO: dict[str, Trained] = {}
