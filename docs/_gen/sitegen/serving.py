"""The Serving page: packed batches, a paged cache and batch invariance, computed at build time.

Every figure is drawn from real portattn objects: the packed layout from the
output of :func:`portattn.attention_varlen` (values that are the identity,
so the output *is* the weights), its tiles from the offsets, the page table
from a :class:`portattn.PagedKVCache` filled here. The speed tables read
``benchmarks/results/serving.json`` (``benchmarks/serving.py``); the
batch-invariance table runs the comparisons on each library installed.

The page's own words live here (not in :mod:`sitegen.i18n`), one dict per
figure or table, English and Japanese side by side.
"""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

import portattn as pa
from portattn.testing import to_numpy

from . import attnmap, plotting
from .diskcache import cache_dir, code_key, write_atomic

RECORD = Path("benchmarks/results/serving.json")
LENGTHS = (5, 3, 7)  # the packed example: three sequences
BLOCK = 4  # the tile size drawn (small, so that a 15-token batch shows tiles)

_W: dict[str, dict[str, str]] = {
    "seq": {"en": "sequence {i}", "ja": "系列 {i}"},
    "packed_label": {
        "en": "Attention weights of a packed batch of three sequences",
        "ja": "3系列を詰めたバッチの注目の重み",
    },
    "packed_caption": {
        "en": "The output of <code>pa.attention_varlen</code> on a packed batch with "
        "<code>cu_seqlens = {cu}</code>, causal, with the identity as values, so that each "
        "output row is that query's weights. Outlined: the {tiles} tiles of {b}\u00d7{b} that run, "
        "each starting at its sequence's first query and first key; the {grid} tiles of a "
        "grid over the whole packed axis would include every hatched pair.",
        "ja": "<code>cu_seqlens = {cu}</code> で詰めたバッチに因果マスクで "
        "<code>pa.attention_varlen</code> をかけた出力である。値を単位行列にしたので、"
        "出力の各行がそのクエリの重みになる。"
        "枠は実際に計算する {b}\u00d7{b} のタイル {tiles} 個で、"
        "どれも自分の系列の最初のクエリと最初のキーから数える。詰めた軸全体に格子を切ると"
        "タイルは {grid} 個になり、斜線の組もすべて含んでしまう。",
    },
    "pages_label": {
        "en": "The page table of a paged cache",
        "ja": "ページ化したキャッシュのページ表",
    },
    "pages_caption": {
        "en": "A <code>pa.PagedKVCache</code> of {n} pages of {p} tokens, after the calls "
        "above. Each row is a sequence's block table: the pages it reads, in order; a filled "
        "slot holds a token's key and value. Pages shared by a fork are outlined twice as "
        "thick; {free} pages are free.",
        "ja": "上の呼び出しのあとの <code>pa.PagedKVCache</code>(1ページ {p} トークン、"
        "{n} ページ)である。各行が1系列のブロック表で、読むページを順に並べる。"
        "塗った枠にはトークン1つ分のキーと値が入っている。fork で共有したページは太い枠で"
        "示す。空きページは {free} 個である。",
    },
    "page": {"en": "page {p}", "ja": "ページ {p}"},
    "filled": {"en": "filled slot", "ja": "使用中の枠"},
    "empty": {"en": "empty slot", "ja": "空きの枠"},
}


def _t(key: str, lang: str, **kw: object) -> str:
    return _W[key][lang].format(**kw)


# ---------------------------------------------------------------- the packed layout


def packed_example() -> dict[str, Any]:
    """The packed weights from ``attention_varlen``, its offsets, and the tiles it runs."""
    rng = np.random.default_rng(0)
    total, h, d = sum(LENGTHS), 1, 8
    q = rng.standard_normal((total, h, d))
    k = rng.standard_normal((total, h, d))
    v = np.eye(total)[:, None, :]  # (T, 1, T): the output rows are the weights
    cu = [0, *itertools.accumulate(LENGTHS)]
    out = pa.attention_varlen(
        q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, block_size=BLOCK
    )
    weights = np.asarray(out)[:, 0, :]
    seq = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    pos = np.arange(total) - np.asarray(cu[:-1])[seq]
    visible = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])
    return {"weights": weights, "masked": ~visible, "cu": cu, "tiles": tiles(cu)}


def tiles(cu: list[int]) -> list[tuple[int, int, int, int]]:
    """(row, col, height, width) of each tile the varlen path runs, causal, from ``cu`` alone."""
    out = []
    for a, b in itertools.pairwise(cu):
        for r in range(a, b, BLOCK):
            for c in range(a, b, BLOCK):
                if c - a <= min(r + BLOCK, b) - 1 - a:  # not wholly above the diagonal
                    out.append((r, c, min(BLOCK, b - r), min(BLOCK, b - c)))
    return out


def packed_figure(*, lang: str = "en") -> str:
    """The packed batch's weights, the hidden pairs hatched, its tiles outlined."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    ex = packed_example()
    total = len(ex["weights"])
    labels = [f"{i}:{p}" for i, n in enumerate(LENGTHS) for p in range(n)]

    def draw(narrow: bool) -> Any:
        side = plotting.width(narrow) * (0.8 if narrow else 0.55)
        fig, ax = plt.subplots(figsize=(side, side + 0.9), layout="constrained")
        image = attnmap.draw(
            ax, ex["weights"], masked=ex["masked"], lang=lang, queries=labels, keys=labels
        )
        for r, c, hh, ww in ex["tiles"]:
            ax.add_patch(
                Rectangle(
                    (c - 0.5, r - 0.5), ww, hh, fill=False, edgecolor=plotting.FG, linewidth=1.5
                )
            )
        ax.set_xlim(-0.5, total - 0.5)
        ax.set_ylim(total - 0.5, -0.5)
        attnmap.colour_bar(fig, [ax], image, lang=lang, masked=True)
        return fig

    grid = (-(-total // BLOCK)) ** 2
    caption = _t("packed_caption", lang, cu=ex["cu"], tiles=len(ex["tiles"]), b=BLOCK, grid=grid)
    return plotting.figure(
        draw,
        label=_t("packed_label", lang),
        caption=caption,
        name=f"serving-packed-{lang}",
        css="pa-plot pa-attn",
    )


# ---------------------------------------------------------------- the page table


def page_table_figure(cache: pa.PagedKVCache, seq_ids: list[str], *, lang: str = "en") -> str:
    """Each sequence's block table as a row of pages, its filled slots shaded."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    table = to_numpy(cache.block_table(seq_ids)).tolist()
    lens = to_numpy(cache.seq_lens(seq_ids)).tolist()
    p = cache.page_size
    owners: dict[int, int] = {}
    for row, n in zip(table, lens, strict=True):
        for page in row[: -(-n // p)]:
            owners[page] = owners.get(page, 0) + 1

    def draw(narrow: bool) -> Any:
        width = plotting.width(narrow)
        cols = max(len(r) for r in table)
        fig, ax = plt.subplots(figsize=(width, 0.55 * len(seq_ids) + 0.9), layout="constrained")
        for y, (row, n) in enumerate(zip(table, lens, strict=True)):
            for j, page in enumerate(row[: -(-n // p)]):
                x0 = j * (p + 1)
                for s in range(p):
                    full = j * p + s < n
                    ax.add_patch(
                        Rectangle(
                            (x0 + s, y),
                            1,
                            0.8,
                            facecolor=plotting.SERIES[y % len(plotting.SERIES)] if full else "none",
                            edgecolor=plotting.MUTED,
                            linewidth=0.5,
                        )
                    )
                shared = owners[page] > 1
                ax.add_patch(
                    Rectangle(
                        (x0, y),
                        p,
                        0.8,
                        fill=False,
                        edgecolor=plotting.FG,
                        linewidth=2.5 if shared else 1.0,
                    )
                )
                ax.text(x0 + p / 2, y + 1.0, _t("page", lang, p=page), ha="center", va="top")
        ax.set_xlim(-0.2, cols * (p + 1))
        ax.set_ylim(len(seq_ids) + 0.3, -0.3)
        ax.set_yticks([y + 0.4 for y in range(len(seq_ids))], [repr(s) for s in seq_ids])
        ax.set_xticks([])
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        return fig

    caption = _t("pages_caption", lang, n=cache.num_pages, p=p, free=cache.free_pages)
    return plotting.figure(
        draw, label=_t("pages_label", lang), caption=caption, name=f"serving-pages-{lang}"
    )


# ---------------------------------------------------------------- batch invariance

_INV = {
    "head": {
        "en": "| library | `impl` | packed: rows equal alone | paged: rows equal alone | padded "
        "(`key_lengths`): largest difference | decode vs full prefill: largest difference |",
        "ja": "| ライブラリ | `impl` | 詰めたバッチ:単独と一致 | ページ化:単独と一致 | パディング"
        "(`key_lengths`):最大の差 | decode と全体の prefill:最大の差 |",
    },
    "yes": {"en": "bit for bit", "ja": "ビット単位で一致"},
    "no": {"en": "no", "ja": "不一致"},
}
_LIBS = ("numpy", "torch", "jax", "array_api_strict")
_IMPLS = ("auto", "invariant")  # the default, and the path whose every row is invariant


def _one_library(name: str, impl: str) -> tuple[bool, bool, float, float] | None:
    """The four comparisons on one library and ``impl`` (float64, H=4, d=16); None if missing."""
    try:
        lib = pa.testing.load_backend(name)
    except ImportError:
        return None
    to = lib.from_numpy
    rng = np.random.default_rng(3)
    h, d, n, m = 4, 16, 37, 64
    q, k, v = (rng.standard_normal((n, h, d)) for _ in range(3))
    oq, ok, ov = (rng.standard_normal((m, h, d)) for _ in range(3))

    def heads(x: np.ndarray) -> Any:
        return to(np.transpose(x, (1, 0, 2))[None])

    def rows(out: Any) -> np.ndarray:
        return np.transpose(to_numpy(out)[0], (1, 0, 2))

    ref = rows(pa.attention(heads(q), heads(k), heads(v), causal=True, impl=impl))
    last = rows(pa.attention(heads(q[-1:]), heads(k), heads(v), causal="bottom_right", impl=impl))
    cu = [0, m, m + n]
    packed = [to(np.concatenate(xs)) for xs in ((oq, q), (ok, k), (ov, v))]
    got = pa.attention_varlen(*packed, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, impl=impl)
    packed_ok = bool(np.array_equal(to_numpy(got)[m:], ref))
    paged_ok = _paged_equal(lib.xp, to, (q, k, v), (oq, ok, ov), last, impl=impl)
    lens = to(np.asarray([[n], [m]], dtype=np.int32))  # (B, 1): shared by the heads
    batch = [
        to(np.stack([np.pad(x, ((0, m - n), (0, 0), (0, 0))), y]).transpose(0, 2, 1, 3))
        for x, y in ((q, oq), (k, ok), (v, ov))
    ]
    padded = pa.attention(
        *batch,
        causal=True,
        key_lengths=lens,
        query_lengths=lens,
        impl=impl,
    )
    pad_diff = float(np.abs(rows(padded)[:n] - ref).max())
    return packed_ok, paged_ok, pad_diff, float(np.abs(last[0] - ref[-1]).max())


def _paged_equal(
    xp: Any, to: Any, mine: tuple[Any, ...], other: tuple[Any, ...], last: Any, *, impl: str
) -> bool:
    """The watched sequence's last token, decoded from a cache it shares, against it alone."""
    q, k, v = mine
    oq, ok, ov = other
    h, d = k.shape[1:]
    cache = pa.PagedKVCache(16, 8, h, d, xp=xp, dtype=xp.float64)
    cache.add("other")
    cache.add("me")
    for a in range(0, len(ok), 16):  # two sequences filled in turns: their pages interleave
        b = min(a + 16, len(k))
        kk = np.concatenate([ok[a : a + 16], k[a:b]])
        vv = np.concatenate([ov[a : a + 16], v[a:b]])
        cu = [0, len(ok[a : a + 16]), len(kk)]
        cache.append(["other", "me"], to(kk), to(vv), cu_seqlens=cu)
    ids = ["other", "me"]
    out = pa.paged_attention(
        to(np.concatenate([oq[-1:], q[-1:]])), cache.k_pages, cache.v_pages,
        block_table=cache.block_table(ids), seq_lens=cache.seq_lens(ids), cu_seqlens_q=[0, 1, 2],
        impl=impl,
    )  # fmt: skip
    return bool(np.array_equal(to_numpy(out)[1:], last))


@cache
def invariance() -> dict[tuple[str, str], tuple[bool, bool, float, float]]:
    """Each installed library's comparisons, by (library, impl).

    Kept on disk between builds (``sitegen.diskcache``), keyed by this file,
    portattn's source and the libraries' versions: eager JAX compiles every
    call once: the eight rows took 122 of the 1060 s that the pages' code
    ran in a cold build (under cProfile, 2 loaded cores), the most of any
    uncached table.
    """
    key = code_key(
        __file__,
        libraries=("numpy", "torch", "jax", "jaxlib", "array-api-strict", "array-api-compat"),
    )
    path = cache_dir("serving") / f"invariance-{key}.json"
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        return {(name, impl): tuple(row) for name, impl, row in stored}
    rows = {
        (name, impl): row
        for name in _LIBS
        for impl in _IMPLS
        if (row := _one_library(name, impl)) is not None
    }
    write_atomic(path, json.dumps([[n, i, list(r)] for (n, i), r in rows.items()]).encode())
    return rows


def invariance_markdown(*, lang: str = "en") -> str:
    """The batch-invariance table, computed on each library installed."""
    lines = [_INV["head"][lang], "|---|---|---|---|---|---|"]
    yes, no = _INV["yes"][lang], _INV["no"][lang]
    for (name, impl), (packed, paged, pad, dec) in invariance().items():
        diffs = " | ".join(yes if x == 0 else f"{x:.1e}" for x in (pad, dec))
        lines.append(
            f'| {name} | `"{impl}"` | {yes if packed else no} | {yes if paged else no} | {diffs} |'
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the record

_REC = {
    "speed_head": {
        "en": "| case | subject | median time | time ÷ the first row's (lower is faster) |",
        "ja": "| 測定 | 対象 | 時間の中央値 | 1行目の時間との比(小さいほど速い) |",
    },
    "tokens_head": {
        "en": '| workload | attention | tokens/s | speed against `"sdpa"` |',
        "ja": '| 負荷 | attention | トークン/秒 | `"sdpa"` に対する速さ |',
    },
    # The record's continuous-batching workloads, in the table's order.
    "continuous": {
        "en": "short prompts (1 to 30 tokens)",
        "ja": "短いプロンプト(1〜30トークン)",
    },
    "continuous_long": {
        "en": "long prompts (64 to 512 tokens)",
        "ja": "長いプロンプト(64〜512トークン)",
    },
    "missing": {
        "en": "*(not in this record: run `python benchmarks/serving.py`)*",
        "ja": "*(この記録にはない。`python benchmarks/serving.py` で測る)*",
    },
}


@cache
def record(path: str = str(RECORD)) -> dict[str, Any]:
    """The serving record, or an empty one when the file is missing."""
    p = Path(path)
    data = json.loads(p.read_text()) if p.is_file() else {}
    return data if isinstance(data, dict) else {}


def _time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def speed_markdown(*, lang: str = "en") -> str:
    """The varlen and paged rows of the record: median times and paired ratios."""
    rec = record()
    lines = [_REC["speed_head"][lang], "|---|---|---|---|"]
    for case in ("varlen", "paged"):
        rows = rec.get(case, {})
        for subject, row in rows.items():
            ratio = next((v for key, v in row.items() if key.startswith("ratio_to_")), None)
            shown = "1 (peer)" if subject == next(iter(rows)) else f"{ratio:.2f}\u00d7"
            lines.append(f"| {case} | `{subject}` | {_time(row['median_s'])} | {shown} |")
    return "\n".join(lines) if len(lines) > 2 else _REC["missing"][lang]


def tokens_markdown(*, lang: str = "en") -> str:
    """Continuous batching's tokens/s, portattn against sdpa, per workload, from the record."""
    workloads = [w for w in ("continuous", "continuous_long") if record().get(w)]
    if not workloads:
        return _REC["missing"][lang]
    lines = [_REC["tokens_head"][lang], "|---|---|---|---|"]
    for workload in workloads:
        label = _REC[workload][lang]
        for name, row in record()[workload].items():
            speed = row.get("speed_vs_sdpa", 1.0)
            lines.append(f"| {label} | `{name}` | {row['tokens_per_s']:.0f} | {speed:.2f}\u00d7 |")
    return "\n".join(lines)


def record_config() -> dict[str, Any]:
    """How the record was measured (rounds, torch version, threads)."""
    return dict(record().get("config", {}))
