"""The Hugging Face page: each architecture run with portattn while the site builds.

Every figure on the page comes from here: the support table measures what the
model tests (tests/test_hf_models.py) assert, on the same tiny random models.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch

from portattn.integrations import transformers as hf

from .diskcache import cache_dir, code_key, write_atomic
from .i18n import translate

LENGTHS = (12, 9, 5)  # three sequences, left-padded to 12: longer than the windows (4)
NEW_TOKENS = 16
NAMES = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "gemma2": "Gemma 2",
    "gpt2": "GPT-2",
    "gpt_oss": "gpt-oss",
}


@dataclass(frozen=True)
class Support:
    """What one architecture did with portattn as its attention."""

    arch: str
    model: str  # the transformers class
    heads: str  # "4 on 2 KV heads"
    features: str  # what of portattn the architecture exercises
    logits: dict[str, float]  # max |portattn - reference| over real tokens, per reference
    generate: tuple[str, bool]  # (reference, same 16 greedy tokens)
    grads: float  # max |portattn - eager| over every parameter's gradient
    refused: str | None = None  # the error portattn raised instead, if it did


def _references(arch: str) -> tuple[str, ...]:
    # transformers' sdpa refuses Gemma 2's soft-capping and gpt-oss's sinks
    return ("eager",) if arch in ("gemma2", "gpt_oss") else ("eager", "sdpa")


def _features(arch: str, config: object) -> str:
    parts = ["left padding (boolean mask)", "KV cache"]
    if getattr(config, "sliding_window", None) and arch in ("mistral", "gemma2", "gpt_oss"):
        parts.append(f"sliding window {config.sliding_window}")  # type: ignore[attr-defined]
    if getattr(config, "attn_logit_softcapping", None):
        parts.append(f"soft cap {config.attn_logit_softcapping:g}")  # type: ignore[attr-defined]
    if arch == "gpt_oss":
        parts.append("attention sinks (s_aux)")
    if arch == "gpt2":
        parts.append("no KV groups (grouping read from the shapes)")
    return ", ".join(parts)


@contextmanager
def _one_thread() -> Iterator[None]:
    """Models this small spend their time in thread hand-offs: one thread is ~10x faster here."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@cache
def support(arch: str) -> Support:
    """Run ``arch`` with portattn and its references: logits, greedy generation, gradients.

    Kept on disk between builds (``sitegen.diskcache``), keyed by this file,
    portattn's source and the torch and transformers versions: the six
    architectures cost tens of seconds of CPU and change only with the code.
    """
    key = code_key(__file__, libraries=("torch", "transformers"), extra=arch)
    path = cache_dir("huggingface") / f"{arch}-{key}.json"
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        return Support(**{**stored, "generate": tuple(stored["generate"])})
    with _one_thread():
        got = _support(arch)
    write_atomic(path, json.dumps(dataclasses.asdict(got)).encode())
    return got


def _support(arch: str) -> Support:
    name = hf.register()
    model = hf.tiny_model(arch, attn_implementation=name)
    ids, mask = hf.tiny_batch(LENGTHS)  # the model tests' batch
    real = mask.bool()

    def logits(impl: str) -> torch.Tensor:
        model.set_attn_implementation(impl)
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).logits[real]

    def generate(impl: str) -> torch.Tensor:
        model.set_attn_implementation(impl)
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )

    def grads(impl: str) -> dict[str, torch.Tensor]:
        labels = ids.masked_fill(mask == 0, -100)
        # the first real token is predicted from a padded position, which sees no key
        labels[torch.arange(len(LENGTHS)), max(LENGTHS) - torch.tensor(LENGTHS)] = -100
        model.set_attn_implementation(impl)
        model.train()
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        model.eval()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    try:
        ours = logits(name)
    except (TypeError, ValueError) as exc:  # refused, never silently different
        return Support(
            arch,
            type(model).__name__,
            "",
            _features(arch, model.config),
            {},
            ("", False),
            0.0,
            refused=f"{type(exc).__name__}: {exc}",
        )
    devs = {ref: float((ours - logits(ref)).abs().max()) for ref in _references(arch)}
    ref = _references(arch)[-1]
    same = bool(torch.equal(generate(name), generate(ref)))
    g_ours, g_eager = grads(name), grads("eager")
    worst = max(float((g_ours[n] - g_eager[n]).abs().max()) for n in g_eager)
    cfg = model.config
    hq = cfg.num_attention_heads
    hkv = getattr(cfg, "num_key_value_heads", None) or hq
    return Support(
        arch=arch,
        model=type(model).__name__,
        heads=f"{hq} on {hkv} KV heads" if hkv != hq else f"{hq} heads",
        features=_features(arch, cfg),
        logits=devs,
        generate=(ref, same),
        grads=worst,
    )


def _e(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


_SUPPORT = {
    "en": {
        "head": "| architecture | heads | exercises | logits vs eager | logits vs sdpa "
        "| 16 greedy tokens | gradients vs eager |",
        "refused": "refused",
        "no_sdpa": "n/a (sdpa refuses this model)",
        "same": "same as {ref}",
        "differ": "**differ from** {ref}",
    },
    "ja": {
        "head": "| アーキテクチャ | ヘッド | 使う機能 | ロジット(eager との差) "
        "| ロジット(sdpa との差) | 貪欲生成 16 トークン | 勾配(eager との差) |",
        "refused": "断った",
        "no_sdpa": "なし(sdpa がこのモデルを受け付けない)",
        "same": "{ref} と同じ",
        "differ": "{ref} と**異なる**",
    },
}
# What _features and Support.heads say, on the Japanese page.
_SUPPORT_JA = (
    ("left padding (boolean mask)", "左パディング(真偽値マスク)"),
    ("KV cache", "KV キャッシュ"),
    ("sliding window", "スライディングウィンドウ"),
    ("soft cap", "ソフトキャップ"),
    ("attention sinks (s_aux)", "attention sink(s_aux)"),
    ("no KV groups (grouping read from the shapes)", "KV グループなし(グループ分けは形から読む)"),
    (" on ", " 個(KV ヘッド "),
    (" KV heads", " 個)"),
    (" heads", " 個"),
    (", ", "、"),
)


def _ja(text: str, lang: str) -> str:
    return translate(text, _SUPPORT_JA, lang)


def support_markdown(*, lang: str = "en") -> str:
    """The per-architecture table, every number measured while the page builds."""
    w = _SUPPORT[lang]
    lines = [w["head"], "|---|---|---|---:|---:|---|---:|"]
    for arch in hf.ARCHITECTURES:
        s = support(arch)
        if s.refused is not None:
            lines.append(
                f"| {NAMES[arch]} (`{s.model}`) | | {_ja(s.features, lang)} "
                f"| {w['refused']}: {html.escape(s.refused)} | | | |"
            )
            continue
        sdpa = _e(s.logits["sdpa"]) if "sdpa" in s.logits else w["no_sdpa"]
        ref, same = s.generate
        lines.append(
            f"| {NAMES[arch]} (`{s.model}`) | {_ja(s.heads, lang)} | {_ja(s.features, lang)} "
            f"| {_e(s.logits['eager'])} | {sdpa} "
            f"| {(w['same'] if same else w['differ']).format(ref=ref)} | {_e(s.grads)} |"
        )
    return "\n".join(lines) + "\n"


def worst() -> dict[str, str]:
    """The largest deviations over all architectures, for the prose."""
    rows = [s for s in map(support, hf.ARCHITECTURES) if s.refused is None]
    return {
        "logits": _e(max(v for s in rows for v in s.logits.values())),
        "grads": _e(max(s.grads for s in rows)),
        "generate": str(sum(s.generate[1] for s in rows)),
        "n": str(len(rows)),
    }


@cache
def last_layer(arch: str, length: int = 10) -> tuple[tuple[str, ...], torch.Tensor, object]:
    """Tokens, the last layer's weights (Hq, L, L) of a random prompt through portattn, config."""
    model = hf.tiny_model(arch, attn_implementation=hf.register())
    ids = torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True).attentions[-1][0]
    return tuple(f"t{int(i)}" for i in ids[0]), weights, model.config


_FIG = {
    "en": {
        "head": "head {h}",
        "label": "{name} attention weights per head",
        "caption": "The {n} heads of the last layer of a random {name} ({layers} layers, "
        "{kv} KV heads{window}), computed by portattn while this page was built, "
        "on {tokens} random tokens. Hatched cells are hidden by the causal mask{window_too}.",
        "window": ", sliding window {w}",
        "window_too": " and the window",
    },
    "ja": {
        "head": "ヘッド {h}",
        "label": "{name} のヘッドごとの注目の重み",
        "caption": "乱数の重みの {name}({layers} 層、KV ヘッド {kv} 個{window})の最終層に"
        "ある {n} 個のヘッド。このページのビルド時に、乱数の {tokens} トークンに対して"
        "portattn が計算した。斜線のセルは因果マスク{window_too}で隠れている。",
        "window": "、スライディングウィンドウ {w}",
        "window_too": "とウィンドウ",
    },
}


def hidden(length: int, window: int | None) -> np.ndarray:
    """(L, L) True where a causal decoder with ``window`` (HF: keys ``i - j < window``) hides."""
    i, j = np.indices((length, length))
    allowed = j <= i
    if window:
        allowed &= i - j < window
    return ~allowed


def heads_figure(arch: str = "mistral", *, lang: str = "en") -> str:
    """The last layer's heads side by side, drawn by :mod:`sitegen.attnmap`, in ``lang``."""
    from sitegen import attnmap

    tokens, weights, cfg = last_layer(arch)
    n = weights.shape[0]
    words = _FIG[lang]
    window = getattr(cfg, "sliding_window", None)
    masked = hidden(len(tokens), window)
    w = weights.double().numpy()
    if np.any(w[:, masked] != 0):  # the hatch must be the mask the model applied
        msg = f"{arch}: weights outside causal + window={window} are not 0"
        raise AssertionError(msg)
    panels = [
        attnmap.Panel(
            w[h], masked=masked, title=words["head"].format(h=h), queries=tokens, keys=tokens
        )
        for h in range(n)
    ]
    caption = words["caption"].format(
        n=n,
        name=NAMES[arch],
        layers=cfg.num_hidden_layers,  # type: ignore[attr-defined]
        kv=cfg.num_key_value_heads,  # type: ignore[attr-defined]
        window=words["window"].format(w=window) if window else "",
        tokens=len(tokens),
        window_too=words["window_too"] if window and window < len(tokens) else "",
    )
    return attnmap.figure(
        panels,
        lang=lang,
        name=f"hf-{arch}-{lang}",
        label=words["label"].format(name=NAMES[arch]),
        caption=html.escape(caption),
    )


def _refusal(**kwargs: Any) -> str:
    """The error ``attention_forward`` raises for ``kwargs`` on a tiny call ("" if none)."""
    layer = torch.nn.Module()
    layer.train(bool(kwargs.pop("training", False)))
    q = torch.randn(1, 2, 3, 4)
    try:
        hf.attention_forward(layer, q, q, q, None, **kwargs)
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _names(names: Iterator[str] | frozenset[str] | tuple[str, ...]) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names))


_LIMITS = {
    "en": (
        "- **Dropout.** A model in training mode with attention dropout above 0 is "
        "refused, asked on a tiny call while this page was built:\n  `{dropout}`\n"
        "- **Keyword arguments.** `attention_forward` honours {honoured} (T5's "
        "`position_bias` becomes `bias=`, gpt-oss's `s_aux` becomes `sinks=`: the "
        "gpt-oss row of the table above runs it), passes {passed} through, and refuses "
        "any other one, such as a head mask:\n  `{head_mask}`\n"
        "- **Gradients** flow through torch autograd. The short sequences above take "
        'the materialising path: `impl="auto"` materialises below {pairs} (query, key) '
        "pairs per head.\n"
    ),
    "ja": (
        "- **ドロップアウト。** attention のドロップアウトが 0 より大きいモデルを学習"
        "モードで使うと断られる。このページのビルド時に小さな呼び出しで確かめた:\n"
        "  `{dropout}`\n"
        "- **キーワード引数。** `attention_forward` は {honoured} を扱い(T5 の "
        "`position_bias` は `bias=` に、gpt-oss の `s_aux` は `sinks=` になる。後者は上の表の"
        "gpt-oss の行で動いている)、{passed} はそのまま通し、それ以外は断る。ヘッドマスクの例:\n"
        "  `{head_mask}`\n"
        "- **勾配**は torch の autograd を通って流れる。上の短い系列は実体化の経路を"
        '通る。`impl="auto"` は、ヘッドあたりの (クエリ, キー) の組が {pairs} 未満なら'
        "実体化する。\n"
    ),
}


def limits_markdown(*, lang: str = "en") -> str:
    """What the integration refuses and honours: read from its code, asked of it while building."""
    from portattn._paths._auto import MATERIALIZE_MAX_PAIRS

    side = int(MATERIALIZE_MAX_PAIRS**0.5)
    square = side * side == MATERIALIZE_MAX_PAIRS
    pairs = f"{side} × {side}" if square else str(MATERIALIZE_MAX_PAIRS)  # noqa: RUF001
    return _LIMITS[lang].format(
        dropout=_refusal(dropout=0.1, training=True),
        head_mask=_refusal(head_mask=torch.ones(1, 2, 3, 3)),
        honoured=_names(hf._HONOURED),
        passed=_names(hf._NO_EFFECT),
        pairs=pairs,
    )
