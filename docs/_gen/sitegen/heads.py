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

from . import attnmap, i18n, learned
from .figures import viridis
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
        "per_head": "head {name}: {parts}",
        "heads_label": "Heads drawn together",
        "none": "Tick a head to draw its lines.",
        "grid": "Every layer and head on this sequence. Choose one to draw its lines alone.",
        "thumb": "layer {layer}, head {head}",
        "axes": "query ↓ key →",
        "masked": "masked",
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
        "per_head": "ヘッド {name}: {parts}",
        "heads_label": "重ねて描くヘッド",
        "none": "ヘッドにチェックを入れると、その線が描かれる。",
        "grid": "この系列での全層・全ヘッド。1つ選ぶと、その線だけが描かれる。",
        "thumb": "層 {layer}、ヘッド {head}",
        "axes": "見る側(クエリ)↓ 見られる側(キー)→",
        "masked": "マスク",
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


def _thumbnail(task: str, layer: int, head: int, *, lang: str) -> str:
    """One head's weights on the view's sequence as a small heatmap: a button, drawn here.

    The site's one way to draw attention (:mod:`.attnmap`): rows are queries,
    columns keys, viridis from 0 to 1, and the cells a causal mask hides
    hatched (the hatch group's id carries :data:`.attnmap.MASKED_GID`, which
    the browser tests look for). One path per colour keeps the SVG small.
    """
    data = view_data(task)
    w = data["weights"][layer][head]
    n = len(w)
    stops = viridis(64)
    cells: dict[str, list[str]] = {}
    masked = []
    for q in range(n):
        for k in range(n):
            if data["causal"] and k > q:
                masked.append(f"M{k} {q}h1v1h-1z")
                continue
            fill = stops[round(w[q][k] * (len(stops) - 1))]
            cells.setdefault(fill, []).append(f"M{k} {q}h1v1h-1z")
    tag = f"{task}-{layer + 1}-{head + 1}"
    paths = "".join(f'<path fill="{c}" d="{"".join(d)}"/>' for c, d in sorted(cells.items()))
    hatch = ""
    if masked:
        hatch = (
            f'<defs><pattern id="pa-hv-hatch-{tag}" patternUnits="userSpaceOnUse" width="0.5" '
            'height="0.5" patternTransform="rotate(45)">'
            '<rect class="pa-mask-bg" width="0.5" height="0.5"/>'
            '<rect class="pa-mask-line" width="0.18" height="0.5"/></pattern></defs>'
            f'<g id="{attnmap.MASKED_GID}-hv-{tag}">'
            f'<path fill="url(#pa-hv-hatch-{tag})" d="{"".join(masked)}"/></g>'
        )
    words = _TEXT[lang]
    label = words["thumb"].format(layer=layer + 1, head=head + 1)
    return (
        f'<button type="button" class="pa-hv-thumb" data-layer="{layer}" data-head="{head}" '
        f'aria-label="{html.escape(label)}">'
        f'<svg viewBox="0 0 {n} {n}" aria-hidden="true" shape-rendering="crispEdges">'
        f"{hatch}<g>{paths}</g></svg>"
        f'<span class="pa-hv-thumb-name">{head_name(layer, head)}</span></button>'
    )


def thumbnail_grid(task: str, *, lang: str = "en") -> str:
    """Every layer and head as a thumbnail, BertViz's model view; a click selects the head.

    Rows are layers and columns heads, each column headed by its head's line
    colour; under the grid, the axes and the colour scale of every heatmap on
    the site. Drawn at build time, so it shows without JavaScript too.
    """
    words = _TEXT[lang]
    data = view_data(task)
    layers, heads_ = len(data["weights"]), len(data["weights"][0])
    cells = ['<span class="pa-hv-grid-corner"></span>']
    for h in range(heads_):
        swatch = f'<span class="pa-hv-swatch" style="background:{SERIES[h]}"></span>'
        cells.append(f'<span class="pa-hv-grid-head">{swatch}{words["head_word"]} {h + 1}</span>')
    for li in range(layers):
        cells.append(f'<span class="pa-hv-grid-layer">{words["layer"]} {li + 1}</span>')
        cells.extend(_thumbnail(task, li, h, lang=lang) for h in range(heads_))
    stops = viridis(9)
    mask = ""
    if data["causal"]:
        mask = f'<span class="pa-hm-scale-mask"></span><span>{words["masked"]}</span>'
    scale = (
        f'<p class="pa-hv-axes">{words["axes"]}</p><div class="pa-hm-scale">'
        f'<span class="pa-hv-scale-title">{i18n.t("scale_title", lang)}</span><span>0%</span>'
        '<span class="pa-hm-scale-bar" style="background-image:linear-gradient(to right, '
        f'{", ".join(stops)})"></span><span>100%</span>{mask}</div>'
    )
    return (
        f'<div class="pa-hv-model" role="group" aria-label="{html.escape(words["grid"])}">'
        f'<p class="pa-hv-grid-title">{words["grid"]}</p>'
        f'<div class="pa-hv-grid" style="grid-template-columns:auto repeat({heads_}, '
        f'minmax(0, 7.5rem))">{"".join(cells)}</div>{scale}</div>'
    )


def head_view(task: str, *, lang: str = "en", caption: str) -> str:
    """The interactive head view (docs/assets/headview.js draws it), data as JSON beside it.

    The thumbnail grid of every layer and head is drawn here; the script moves
    it beside the lines and makes each thumbnail select its head.
    """
    w = _TEXT[lang]
    data = dict(view_data(task))
    keys = ("layer", "head_word", "queries", "keys", "hint", "attends", "per_head")
    data["text"] = {k: w[k] for k in (*keys, "heads_label", "none")}
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    return (
        f'<figure class="pa-headview" data-pa-headview="{task}">'
        f'<script type="application/json" class="pa-headview-data">{payload}</script>'
        '<div class="pa-hv-live"></div>'
        f"{thumbnail_grid(task, lang=lang)}"
        f"<noscript><p>{w['noscript']}</p></noscript>"
        f"<figcaption>{caption}</figcaption></figure>"
    )
