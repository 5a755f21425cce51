"""The "Beyond one device" page: context parallelism, drawn and read from records.

Everything here is computed while the site builds: which tiles each rank
computes comes from :func:`portattn.parallel.positions` (the public layout
helper) and causality; the training curves are the records the examples
write (``benchmarks/results/parallel-llama.json``, ``parallel-jax.json``);
the strategies come from the bench record (``benchmarks/results/parallel.json``).
Records are read defensively: a missing one shows as "not recorded".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from portattn import parallel

from . import attnmap, plotting

RESULTS = Path("benchmarks/results")
LAYOUTS = ("contiguous", "zigzag")


def _read(name: str) -> Any:
    p = RESULTS / name
    return json.loads(p.read_text()) if p.is_file() else None


def owners(tiles: int, world: int, layout: str) -> np.ndarray:
    """The rank that holds each of ``tiles`` query tiles (one tile = one row here)."""
    who = np.empty(tiles, dtype=int)
    for r in range(world):
        who[np.asarray(parallel.positions(tiles, rank=r, world=world, layout=layout))] = r
    return who


def visible_tiles(tiles: int, world: int, layout: str) -> list[int]:
    """Each rank's causal tiles: a query tile sees the key tiles at or before it."""
    who = owners(tiles, world, layout)
    return [int(sum(i + 1 for i in range(tiles) if who[i] == r)) for r in range(world)]


_TEXT = {
    "en": {
        "layout": {"contiguous": "contiguous", "zigzag": "zigzag"},
        "scale": "rank that computes the tile",
        "label": "which rank computes each causal tile, contiguous and zigzag, {p} ranks",
        "caption": (
            "{n} x {n} tiles of causal attention over {p} ranks. A tile's colour is the rank "
            "that holds its query rows and computes it; hatched tiles are hidden by causality "
            "and cost nothing. Contiguous gives the last rank the most tiles; zigzag gives "
            "every rank chunks r and 2P-1-r, one early and one late."
        ),
        "rank": "rank",
        "tiles": "tiles",
        "layout_head": "layout",
        "spread": "largest / smallest",
        "curve_label": "loss of every training step, context parallel and one process",
        "curve_caption": (
            "Loss at each AdamW step, float32. Lines: one process on the whole sequence; "
            "markers: context parallel (the examples' records). The curves lie on each other."
        ),
        "step": "step",
        "loss": "loss",
        "single": "one process",
        "cp": "context parallel",
        "none": "not recorded",
    },
    "ja": {
        "layout": {"contiguous": "contiguous(連続)", "zigzag": "zigzag(ジグザグ)"},
        "scale": "そのタイルを計算するランク",
        "label": "因果的なタイルをどのランクが計算するか、contiguous と zigzag、{p} ランク",
        "caption": (
            "{p} ランクで因果的 attention を {n} x {n} タイルに分けた図である。色はそのタイルの"
            "クエリ行を持ち、計算するランクを表す。斜線のタイルは因果性で隠れ、計算しない。"
            "contiguous では最後のランクが最も多くのタイルを受け持つ。zigzag では各ランクが"
            "チャンク r と 2P-1-r、つまり前の方と後ろの方を一つずつ持つ。"
        ),
        "rank": "ランク",
        "tiles": "タイル",
        "layout_head": "レイアウト",
        "spread": "最大 / 最小",
        "curve_label": "学習の各ステップの損失、コンテキスト並列と1プロセス",
        "curve_caption": (
            "AdamW の各ステップの損失(float32)。線は系列全体を1プロセスで計算したもの、"
            "印はコンテキスト並列(例のスクリプトが書いた記録)。二つの曲線は重なる。"
        ),
        "step": "ステップ",
        "loss": "損失",
        "single": "1プロセス",
        "cp": "コンテキスト並列",
        "none": "記録なし",
    },
}


def tile_figure(lang: str, *, tiles: int = 16, world: int = 4) -> str:
    """Both layouts as attention maps: colour = the computing rank, hatched = hidden."""
    w = _TEXT[lang]
    hidden = np.triu(np.ones((tiles, tiles), dtype=bool), k=1)
    panels = [
        attnmap.Panel(
            np.repeat(owners(tiles, world, lay)[:, None], tiles, axis=1).astype(float),
            masked=hidden,
            title=w["layout"][lay],
        )
        for lay in LAYOUTS
    ]
    return attnmap.figure(
        panels,
        lang=lang,
        name=f"cp-tiles-{lang}",
        label=w["label"].format(p=world),
        caption=w["caption"].format(n=tiles, p=world),
        vmin=0.0,
        vmax=float(world - 1),
        scale_label=w["scale"],
        cols_narrow=2,
        panel_in=3.0,
    )


def balance_table(lang: str, *, world: int = 4, sizes: tuple[int, ...] = (16, 64, 256)) -> str:
    """Visible causal tiles per rank, per layout and grid size, with the spread."""
    w = _TEXT[lang]
    ranks = " | ".join(f"{w['rank']} {r}" for r in range(world))
    head = f"| {w['tiles']} | {w['layout_head']} | {ranks} | {w['spread']} |"
    rows = [head, "|" + " --- |" * (world + 3)]
    for n in sizes:
        for lay in LAYOUTS:
            c = visible_tiles(n, world, lay)
            rows.append(
                f"| {n} x {n} | {w['layout'][lay]} | "
                + " | ".join(str(x) for x in c)
                + f" | {max(c) / min(c):.2f} |"
            )
    return "\n".join(rows)


def training() -> dict[str, Any]:
    """The examples' records: ``{"llama": [...], "jax": [...]}`` (an absent one is ``[]``)."""
    return {
        "llama": _read("parallel-llama.json") or [],
        "jax": _read("parallel-jax.json") or [],
    }


def training_table(lang: str) -> str:
    w = _TEXT[lang]
    what = {
        "en": {"llama": "transformers Llama, 2 gloo ranks", "jax": "pure JAX, 4 devices"},
        "ja": {"llama": "transformers の Llama、gloo の2ランク", "jax": "純粋な JAX、4デバイス"},
    }[lang]
    head = {
        "en": "| model | dtype | steps | loss, first → last | largest difference |",
        "ja": "| モデル | dtype | ステップ | 損失、最初 → 最後 | 最大の差 |",
    }[lang]
    rows = [head, "| --- | --- | --- | --- | --- |"]
    for name, records in training().items():
        if not records:
            rows.append(f"| {what[name]} | {w['none']} | | | |")
        for r in records:
            rows.append(
                f"| {what[name]} | {r['dtype']} | {r['steps']} | "
                f"{r['single'][0]:.4f} → {r['single'][-1]:.4f} | {r['max_diff']:.1e} |"
            )
    return "\n".join(rows)


def training_figure(lang: str) -> str:
    import matplotlib.pyplot as plt

    w = _TEXT[lang]
    found = {
        k: next((r for r in v if r["dtype"] == "float32"), None) for k, v in training().items()
    }
    shown = {k: r for k, r in found.items() if r is not None}
    if not shown:
        return f"<p>{w['none']}</p>"

    def draw(narrow: bool) -> Any:
        fig, axes = plt.subplots(
            1,
            len(shown),
            figsize=(plotting.width(narrow), 2.8),
            squeeze=False,
            layout="constrained",
        )
        for ax, (name, r) in zip(axes.flat, shown.items(), strict=True):
            steps = range(1, len(r["single"]) + 1)
            ax.plot(steps, r["single"], label=w["single"])
            ax.plot(steps, r["cp"], "o", markersize=3, label=w["cp"])
            ax.set_title("Llama (torch, P=2)" if name == "llama" else "JAX (P=4)")
            ax.set_xlabel(w["step"])
            ax.set_ylabel(w["loss"])
            ax.legend(frameon=False)
        return fig

    return plotting.figure(
        draw, label=w["curve_label"], caption=w["curve_caption"], name=f"cp-curves-{lang}"
    )


def bench() -> dict[str, Any]:
    return _read("parallel.json") or {}


def strategies_table(lang: str) -> str:
    """The bench record's P=2 timings: each strategy against one process on 2 threads."""
    s = bench().get("speed")
    if not s:
        return _TEXT[lang]["none"]
    head = {
        "en": "| subject | median (s) | / one process | tiles per rank | MB sent per rank |",
        "ja": "| 対象 | 中央値 (s) | 1プロセス比 | ランクごとのタイル | ランクごとの送信 (MB) |",
    }[lang]
    rows = [head, "| --- | --- | --- | --- | --- |"]
    for name, c in s["cases"].items():
        tiles = ", ".join(str(x) for x in c.get("tiles", [])) or "-"
        sent = ", ".join(f"{x / 1e6:.1f}" for x in c.get("bytes_sent", [])) or "-"
        rows.append(
            f"| {name} | {c['median_s']:.3f} | {c['ratio_vs_one_process']:.2f} | {tiles} | {sent} |"
        )
    return "\n".join(rows)


def memory_table(lang: str) -> str:
    m = bench().get("memory")
    if not m:
        return _TEXT[lang]["none"]
    head = {
        "en": "| strategy | peak per rank (MB) | own q, k, v shards (MB) |",
        "ja": "| 方式 | ランクごとのピーク (MB) | 自分の q, k, v シャード (MB) |",
    }[lang]
    rows = [head, "| --- | --- | --- |"]
    for r in m["rows"]:
        peaks = ", ".join(f"{x / 1e6:.0f}" for x in r["peak_bytes"])
        rows.append(f"| {r['strategy']} | {peaks} | {r['shard_bytes'] / 1e6:.0f} |")
    return "\n".join(rows)
