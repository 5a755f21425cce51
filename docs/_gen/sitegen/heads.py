"""The page "What attention learns": tables, loss curves and the head view, from :mod:`.learned`.

Every number here is read from :func:`.learned.trained` (trained once, then
cached) and :func:`.learned.head_scores`; nothing is typed in by hand. The
English and Japanese pages call the same functions with ``lang``.
"""

from __future__ import annotations

import html
import json
from functools import cache
from typing import Any

import torch

from . import learned
from .plotting import FG, MUTED, SERIES, figure, width

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_TEXT: dict[str, dict[str, str]] = {
    "en": {
        "reverse": "reverse",
        "induction": "induction",
        "task": "Task",
        "params": "Parameters",
        "steps": "Steps",
        "acc_pa": "Accuracy, portattn",
        "acc_sdpa": "Accuracy, SDPA",
        "gap": "Largest gap between the curves",
        "time": "Training time, wall / CPU (s)",
        "head": "Head",
        "previous": "On the previous token",
        "anti_diagonal": "On the reversed position",
        "induction_score": "After the earlier copy",
        "step": "training step",
        "loss": "cross-entropy loss (log scale)",
        "pa_curve": "portattn (blockwise, its own backward)",
        "sdpa_curve": "torch SDPA",
        "curves_label": "Loss curves of both tasks, portattn and torch SDPA",
        "layer": "Layer",
        "head_word": "Head",
        "queries": "query",
        "keys": "key",
        "hint": "Hover over a query token on the left (or tap it) to see where it looks.",
        "attends": "{q} (position {i}) attends to {parts}",
        "noscript": "JavaScript is off: the measurements in the table above describe each head.",
    },
    "ja": {
        "reverse": "反転",
        "induction": "帰納(induction)",
        "task": "課題",
        "params": "パラメータ数",
        "steps": "ステップ数",
        "acc_pa": "正解率(portattn)",
        "acc_sdpa": "正解率(SDPA)",
        "gap": "2本の曲線の最大の差",
        "time": "学習時間 実時間 / CPU(秒)",
        "head": "ヘッド",
        "previous": "直前のトークンへ",
        "anti_diagonal": "反転した位置へ",
        "induction_score": "前の出現の次へ",
        "step": "学習ステップ",
        "loss": "交差エントロピー損失(対数目盛)",
        "pa_curve": "portattn(blockwise、自前の逆伝播)",
        "sdpa_curve": "torch SDPA",
        "curves_label": "2つの課題の損失曲線(portattn と torch SDPA)",
        "layer": "層",
        "head_word": "ヘッド",
        "queries": "クエリ",
        "keys": "キー",
        "hint": "左の見る側(クエリ)のトークンにカーソルを置くか、タップすると、注目先が見える。",
        "attends": "{q}(位置 {i})の注目先: {parts}",
        "noscript": "JavaScript が無効なので、各ヘッドの働きは上の表の数値で読める。",
    },
}

# SDPA wide and pale underneath, portattn thin on top: where the curves agree
# both stay visible.
CURVES = (("sdpa", 4.0, 0.45, SERIES[1]), ("portattn", 1.3, 1.0, SERIES[0]))

SCORES = {"reverse": ("anti_diagonal", "previous"), "induction": ("previous", "induction")}


def head_name(layer: int, head: int) -> str:
    """``"1.2"``: layer 1, head 2, both counted from 1 as the page's text counts them."""
    return f"{layer + 1}.{head + 1}"


@cache
def scores(task: str) -> dict[str, list[list[float]]]:
    r = learned.trained(task)
    return learned.head_scores(r.model, r.settings)


def strongest(task: str, score: str, *, layer: int | None = None) -> tuple[str, float]:
    """The head with the highest ``score`` (in ``layer`` if given), and the score."""
    table = scores(task)[score]
    best = max(
        ((li, h) for li, row in enumerate(table) for h in range(len(row)) if layer in (None, li)),
        key=lambda lh: table[lh[0]][lh[1]],
    )
    return head_name(*best), table[best[0]][best[1]]


def fmt(x: float) -> str:
    return f"{x:.2f}"


def gap(x: float) -> str:
    return f"{x:.1e}"


def summary_table(*, lang: str = "en") -> str:
    """One row per task: size, steps, both accuracies, the curves' largest gap, the time."""
    w = _TEXT[lang]
    head = ["task", "params", "steps", "acc_pa", "acc_sdpa", "gap", "time"]
    rows = []
    for task in learned.TASKS:
        r = learned.trained(task)
        cells = [
            w[task],
            str(r.parameters),
            str(r.settings.steps),
            f"{100 * r.accuracy['portattn']:.1f}%",
            f"{100 * r.accuracy['sdpa']:.1f}%",
            gap(r.largest_gap),
            f"{sum(r.wall_s.values()):.1f} / {sum(r.cpu_s.values()):.1f}",
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    ths = "".join(f"<th>{html.escape(w[h])}</th>" for h in head)
    return (
        f'<table data-pa-table="learned-summary"><thead><tr>{ths}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>\n"
    )


def heads_table(task: str, *, lang: str = "en") -> str:
    """Each head's share of weight on the positions the task's solution needs."""
    w = _TEXT[lang]
    names = SCORES[task]
    table = scores(task)
    key = {"induction": "induction_score"}
    ths = "".join(
        f"<th>{html.escape(w[h])}</th>" for h in ["head", *(key.get(n, n) for n in names)]
    )
    rows = []
    for li, row in enumerate(table[names[0]]):
        for h in range(len(row)):
            cells = [head_name(li, h), *(fmt(table[n][li][h]) for n in names)]
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (
        f'<table data-pa-table="heads-{task}"><thead><tr>{ths}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>\n"
    )


def loss_figure(*, lang: str = "en", caption: str) -> str:
    """Both tasks' loss per step, portattn drawn over torch SDPA, wide and phone layouts."""
    w = _TEXT[lang]
    tasks = list(learned.TASKS)

    def draw(narrow: bool) -> Any:
        import matplotlib.pyplot as plt

        rows, cols = (2, 1) if narrow else (1, 2)
        fig, axes = plt.subplots(rows, cols, figsize=(width(narrow), 5.6 if narrow else 3.2))
        for ax, task in zip(axes, tasks, strict=True):
            r = learned.trained(task)
            # Every k-th step (at most 400 points): the page stays small, and the
            # largest gap in the caption is taken over every step.
            k = max(1, len(r.losses["sdpa"]) // 400)
            steps = range(0, len(r.losses["sdpa"]), k)
            for impl, lw, alpha, colour in CURVES:
                ax.plot(
                    steps,
                    r.losses[impl][::k],
                    lw=lw,
                    alpha=alpha,
                    color=colour,
                    label=w[f"{'pa' if impl == 'portattn' else impl}_curve"],
                    gid=f"pa-loss-{impl}-{task}",
                )
            ax.set_yscale("log")
            ax.set_title(w[task], color=FG)
            ax.set_xlabel(w["step"])
            ax.grid(True, which="major", lw=0.5)
        axes[0].set_ylabel(w["loss"])
        axes[0].legend(loc="upper right", labelcolor=MUTED)
        fig.tight_layout()
        return fig

    return figure(draw, label=w["curves_label"], caption=caption, name=f"loss-{lang}")


def example(task: str) -> torch.Tensor:
    """One sequence to show: for induction, the first with a repeat of at least 5 tokens."""
    s = learned.TASKS[task]
    g = torch.Generator().manual_seed(3)
    tokens, target = learned.BATCHES[task](s, g)
    pick = int(((target >= 0).sum(-1) >= 4).int().argmax()) if task == "induction" else 0
    return tokens[pick]


@cache
def view_data(task: str) -> dict[str, Any]:
    """The head view's data: tokens, and weights[layer][head][query][key] from portattn."""
    r = learned.trained(task)
    tokens = example(task)
    weights = r.model.weights(tokens[None])  # layers x (1, h, n, n)
    return {
        "tokens": [LETTERS[t] for t in tokens.tolist()],
        "weights": [
            [[[round(x, 4) for x in q] for q in h] for h in w[0].tolist()] for w in weights
        ],
        "causal": r.settings.causal,
        "colours": list(SERIES),
    }


def head_view(task: str, *, lang: str = "en", caption: str) -> str:
    """The interactive head view (docs/assets/headview.js draws it), data as JSON beside it."""
    w = _TEXT[lang]
    data = dict(view_data(task))
    data["text"] = {k: w[k] for k in ("layer", "head_word", "queries", "keys", "hint", "attends")}
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    return (
        f'<figure class="pa-headview" data-pa-headview="{task}">'
        f'<script type="application/json" class="pa-headview-data">{payload}</script>'
        '<div class="pa-hv-live"></div>'
        f"<noscript><p>{w['noscript']}</p></noscript>"
        f"<figcaption>{caption}</figcaption></figure>"
    )
