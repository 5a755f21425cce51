"""The Programmable attention page: the mask gallery, the FlexAttention table, the ALiBi example.

Everything is computed while the site builds, through portattn's public API
only (``pa.create_block_mask``, ``pa.mods``, ``pa.attention``); the bench
figures are read from the committed record, ``benchmarks/results/cpu.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

import portattn as pa
from portattn import mods

from . import plotting
from .i18n import translate

N = 256  # gallery tokens
BLOCK = 32  # gallery tiles: 8 x 8
RECORD = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "cpu.json"


@dataclass(frozen=True)
class Panel:
    """One ready-made mod as the gallery draws it."""

    title: str  # the code that builds it
    allowed: np.ndarray | None  # (N, N) bool for a mask_mod
    bias: np.ndarray | None  # (N, N) float for a score_mod: score_mod(0, ...) of head 0
    block_mask: pa.BlockMask | None


def _grid() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The index arrays a mod sees for the whole (1, 1, N, N) tile."""
    r = np.arange(N)
    return (
        r[:1].reshape(1, 1, 1, 1),
        r[:1].reshape(1, 1, 1, 1),
        r.reshape(1, 1, N, 1),
        r.reshape(1, 1, 1, N),
    )


def _mask_panel(title: str, mod: Any) -> Panel:
    allowed = np.broadcast_to(mod(*_grid()), (1, 1, N, N))[0, 0]
    return Panel(
        title, allowed, None, pa.create_block_mask(mod, None, None, N, N, block_size=BLOCK)
    )


def _score_panel(title: str, mod: Any) -> Panel:
    b, h, q, kv = _grid()
    bias = np.broadcast_to(mod(np.zeros((1, 1, N, N)), b, h, q, kv), (1, 1, N, N))[0, 0]
    return Panel(title, None, np.asarray(bias, dtype=np.float64), None)


DOCS = np.repeat(np.arange(4), [40, 100, 60, 56])  # four packed documents


@cache
def panels() -> tuple[Panel, ...]:
    """Every ready-made mod, evaluated over N x N with its block mask."""
    window_global = pa.or_masks(
        pa.and_masks(mods.causal, mods.sliding_window(24)),
        lambda b, h, q, kv: kv < 8,  # eight global tokens every query sees
    )
    # A T5 table of 32 buckets whose bias falls with the distance, either way.
    table = -np.log1p(np.r_[np.arange(16), np.arange(16)])[:, None]
    return (
        _mask_panel("mods.causal", mods.causal),
        _mask_panel("mods.sliding_window(24)", mods.sliding_window(24)),
        _mask_panel(
            "pa.and_masks(mods.causal, mods.documents(ids))",
            pa.and_masks(mods.causal, mods.documents(DOCS)),
        ),
        _mask_panel("mods.prefix_lm(96)", mods.prefix_lm(96)),
        _mask_panel(
            "pa.and_masks(mods.causal, mods.chunked(64))",
            pa.and_masks(mods.causal, mods.chunked(64)),
        ),
        _mask_panel("sliding window + 8 global keys", window_global),
        _score_panel(
            "mods.alibi(mods.alibi_slopes(8)), head 0",
            mods.alibi(mods.alibi_slopes(8, dtype=np.float64)),
        ),
        _score_panel(
            "mods.t5_relative_bias(table, bidirectional=True, max_distance=64)",
            mods.t5_relative_bias(table, max_distance=64),
        ),
        _score_panel("mods.softcap(2.0) of scores i/32 - j/32", _scaled(mods.softcap(2.0))),
    )


def _scaled(mod: Any) -> Any:
    """A score mod shown on a ramp of scores (it leaves a zero score at zero)."""

    def shown(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        return mod(score + (q - kv) / 32.0, b, h, q, kv)

    return shown


# The gallery's words that are not code, on the Japanese page.
_GALLERY_JA = (
    ("sliding window + 8 global keys", "スライディングウィンドウ + 全員が見るキー8個"),
    (", head 0", "、ヘッド 0"),
    (" of scores i/32 - j/32", "(スコア i/32 − j/32 に適用)"),  # noqa: RUF001
)


def _title(panel: Panel, lang: str) -> str:
    return translate(panel.title, _GALLERY_JA, lang)


def _draw_panel(ax: Any, panel: Panel, lang: str = "en", k: int = 0) -> None:
    from matplotlib.patches import Rectangle

    if panel.allowed is not None:
        rgba = np.zeros((N, N, 4))
        rgba[panel.allowed] = (*_rgb(plotting.SERIES[0]), 1.0)
        # The gid lets docs/assets/gallery.js find the picture and read a cell under the pointer.
        ax.imshow(rgba, interpolation="nearest", gid=f"pa-gallery-{k}")
        bm = panel.block_mask
        assert bm is not None
        for i in range(bm.num_blocks[0]):
            for j in range(bm.num_blocks[1]):
                kind = bm.tile_kind(i, j)
                if kind == pa.BlockMask.EMPTY:
                    continue
                full = kind == pa.BlockMask.FULL
                ax.add_patch(
                    Rectangle(
                        (j * BLOCK - 0.5, i * BLOCK - 0.5),
                        BLOCK,
                        BLOCK,
                        fill=False,
                        linewidth=1.0 if full else 0.8,
                        linestyle="-" if full else ":",
                        edgecolor=plotting.FG,
                    )
                )
        ax.set_xlabel(f"density {bm.density:.2f}" if lang == "en" else f"密度 {bm.density:.2f}")
    else:
        assert panel.bias is not None
        ax.imshow(panel.bias, cmap="viridis", interpolation="nearest")
        lo, hi = panel.bias.min(), panel.bias.max()
        ax.set_xlabel(f"from {lo:.2f} to {hi:.2f}" if lang == "en" else f"{lo:.2f} から {hi:.2f}")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(
        _wrap(_title(panel, lang), 30 if lang == "en" else 18), fontsize=plotting.MIN_FONT_PT
    )


def _wrap(text: str, width: int = 30) -> str:
    words, lines, line = text.split(" "), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join([*lines, line])


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    h = hex_colour.lstrip("#")
    return int(h[0:2], 16) / 255, int(h[2:4], 16) / 255, int(h[4:6], 16) / 255


def gallery_figure(*, caption: str, label: str, lang: str = "en") -> str:
    """Every ready-made mod as a picture: a mask with its tiles, or a score mod's bias."""
    import matplotlib.pyplot as plt

    shown = panels()

    def draw(narrow: bool) -> Any:
        cols = 2 if narrow else 3
        rows = -(-len(shown) // cols)
        w = plotting.width(narrow)
        fig, axes = plt.subplots(rows, cols, figsize=(w, w / cols * rows * 1.25))
        for k, (ax, panel) in enumerate(zip(axes.ravel(), shown, strict=False)):
            _draw_panel(ax, panel, lang, k)
        for ax in axes.ravel()[len(shown) :]:
            ax.axis("off")
        fig.tight_layout()
        return fig

    both = plotting.figures_only(draw, label=label, name=f"mod-gallery-{lang}")
    data = json.dumps({"n": N, "block": BLOCK, "panels": _explorable(shown, lang)})
    readout = {
        "en": "Point at (or tap) a cell of a mask to read its query, key and tile.",
        "ja": "マスクのマスにカーソルを置く(またはタップする)と、クエリ・キー・タイルが読める。",
    }[lang]
    return (
        f'<figure class="pa-plot pa-gallery" data-lang="{lang}">{both}'
        f'<p class="pa-gallery-readout" aria-live="polite">{readout}</p>'
        f'<script type="application/json" class="pa-gallery-data">{data}</script>'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _explorable(shown: tuple[Panel, ...], lang: str) -> list[dict[str, Any] | None]:
    """Per panel (None for a score mod): its title, each tile's kind, each row's runs of seen keys.

    Runs, not bits: a row of a mask is a few intervals, so the page carries
    a few kB for what would be 64 kB of booleans per panel.
    """
    out: list[dict[str, Any] | None] = []
    for p in shown:
        if p.allowed is None or p.block_mask is None:
            out.append(None)
            continue
        kinds = np.asarray(p.block_mask.kinds).reshape(p.block_mask.num_blocks)
        runs = []
        for row in p.allowed:
            edges = np.flatnonzero(np.diff(np.r_[0, row.astype(np.int8), 0]))
            runs.append(edges.reshape(-1, 2).tolist())  # [start, stop) of each run
        out.append({"title": _title(p, lang), "kinds": kinds.tolist(), "runs": runs})
    return out


def gallery_table(*, lang: str = "en") -> str:
    """Density and tile counts of each mask in the gallery, read off its block mask."""
    head = {
        "en": "| mask | full tiles | partial tiles | empty tiles | density |",
        "ja": "| マスク | 満杯のタイル | 一部のタイル | 空のタイル | 密度 |",
    }[lang]
    lines = [head, "|---|---:|---:|---:|---:|"]
    for p in panels():
        if p.block_mask is None:
            continue
        kinds = p.block_mask.kinds
        count = [
            int((kinds == k).sum())
            for k in (pa.BlockMask.FULL, pa.BlockMask.PARTIAL, pa.BlockMask.EMPTY)
        ]
        name = f"`{p.title}`" if p.title.startswith(("mods.", "pa.")) else _title(p, lang)
        lines.append(
            f"| {name} | {count[0]} | {count[1]} | {count[2]} | {p.block_mask.density:.3f} |"
        )
    return "\n".join(lines) + "\n"


def bench_record() -> dict[str, Any]:
    """The committed bench record."""
    return json.loads(RECORD.read_text(encoding="utf-8"))


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


_BENCH_WORDS = {
    "en": {
        "head": "| case | N | time | peer's time | ratio | target | portattn against its peer |",
        "met": "met",
        "missed": "missed",
        "vs": "against",
        "memory": "memory (numpy)",
        "peak": "peak above the inputs",
        "io": "inputs + output",
    },
    "ja": {
        "head": "| 場合 | N | 時間 | 相手の時間 | 比 | 目標 | portattn と比較相手 |",
        "met": "達成",
        "missed": "未達",
        "vs": "対",
        "memory": "メモリ(numpy)",
        "peak": "入力を除いた最大値",
        "io": "入力 + 出力",
    },
}
# The record's own words (benchmarks/run.py writes them), as the Japanese page says them.
_RECORD_JA = (
    ("documents, forward + backward", "文書の詰め込み、順伝播 + 逆伝播"),
    ("documents", "文書の詰め込み"),
    ("block mask", "ブロックマスク"),
    ("dense causal", "密な因果マスク"),
)


def _said(text: str, lang: str) -> str:
    return translate(text, _RECORD_JA, lang)


def _side(name: str, library: str) -> str:
    """A subject or peer without the words every row repeats ("portattn torch ...")."""
    return name.removeprefix(f"portattn {library} ").removeprefix("portattn ")


def bench_table(*, lang: str = "en") -> str:
    """The programmable cases of the committed record: each ratio against its target.

    The measurements come first and the description last, so that a phone
    shows a row's numbers next to its name before the long words.
    """
    got = bench_record().get("programmable")
    if got is None:
        return "*(no programmable cases in the record yet)*\n"
    w = _BENCH_WORDS[lang]
    lines = [w["head"], "|---|---:|---:|---:|---:|---|---|"]
    for r in got["rows"]:
        verdict = w["met"] if r["met"] else w["missed"]
        target = "" if r["target"] is None else f"≤ {r['target']:g}x ({verdict})"
        subject, peer = _side(r["subject"], r["library"]), _side(r["peer"], r["library"])
        lines.append(
            f"| {_said(r['case'], lang)} ({r['library']}) | {r['n']} "
            f"| {_ms(r['median_s'])} | {_ms(r['peer_median_s'])} | {r['ratio']:.2f}x | {target} "
            f"| {_said(subject, lang)} {w['vs']} {_said(peer, lang)} |"
        )
    m = got["memory"]
    mib = 2**20
    verdict = w["met"] if m["met"] else w["missed"]
    lines.append(
        f"| {w['memory']} | {m['n']} | {m['peak_bytes'] / mib:.0f} MiB "
        f"| {m['inputs_plus_output_bytes'] / mib:.0f} MiB | {m['ratio']:.2f}x "
        f"| ≤ {m['target']:g}x ({verdict}) | {w['peak']} {w['vs']} {w['io']} |"
    )
    return "\n".join(lines) + "\n"


def bench_summary() -> dict[str, str]:
    """When and where the programmable cases ran, for the prose."""
    rec = bench_record()
    got = rec.get("programmable", {})
    cpu = rec.get("machine", {}).get("cpu", "?")
    return {
        "date": str(got.get("date", "?"))[:10],
        "cpu": str(cpu),
        "rounds": str(got.get("config", {}).get("rounds", "?")),
    }


def loss_figure(
    losses: list[float],
    slopes: np.ndarray,
    truth: np.ndarray,
    *,
    label: str,
    caption: str,
    lang: str = "en",
) -> str:
    """The ALiBi example: the loss per step, and each head's slope approaching its target."""
    import matplotlib.pyplot as plt

    steps = np.arange(len(losses))
    text = {
        "en": ("step", "loss (mean squared error)", "slope", "head"),
        "ja": ("ステップ", "損失(平均二乗誤差)", "傾き", "ヘッド"),
    }[lang]

    def draw(narrow: bool) -> Any:
        w = plotting.width(narrow)
        rows, cols = (2, 1) if narrow else (1, 2)
        fig, (a, b) = plt.subplots(rows, cols, figsize=(w, 3.2 * rows if narrow else 3.2))
        a.semilogy(steps, losses, color=plotting.SERIES[0], linewidth=2)
        a.set_xlabel(text[0])
        a.set_ylabel(text[1])
        for h in range(slopes.shape[1]):
            colour = plotting.SERIES[h % len(plotting.SERIES)]
            b.plot(steps, slopes[:, h], color=colour, linewidth=2, label=f"{text[3]} {h}")
            b.axhline(truth[h], color=colour, linestyle=":", linewidth=1)
        b.set_xlabel(text[0])
        b.set_ylabel(text[2])
        b.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        return fig

    return plotting.figure(draw, label=label, caption=caption, name=f"alibi-learned-{lang}")
