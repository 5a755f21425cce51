"""The "Beyond one machine" page: the task grid read from a real dask graph, and the bench record.

Nothing here types a number: the grid comes from the graph that
``pa.attention`` builds on dask arrays (read, never computed), and the
timings from ``benchmarks/results/dask.json`` written by ``benchmarks/run.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

import portattn as pa

from .i18n import translate

RECORD = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "dask.json"

# The page's example: a sequence of N tokens cut into CHUNKS query chunks and
# as many key chunks (small, so the figure stays legible).
N, CHUNKS, D = 4096, 8, 64


@dataclass(frozen=True)
class Grid:
    """Which (query chunk, key chunk) pairs got a task, and the graph's task counts."""

    title: str
    chunks: int
    pairs: frozenset[tuple[int, int]]
    merges: int
    tasks: int  # the schedule's tasks: pairs, merges and output chunks (not the inputs')


@cache
def grid(options: tuple[tuple[str, Any], ...] = (("causal", True),), title: str = "") -> Grid:
    """Build (not compute) attention on dask arrays and read its pair and merge tasks."""
    import dask.array as da

    from portattn.testing import dask_schedule

    rng = np.random.default_rng(0)
    q, k, v = (
        da.from_array(rng.standard_normal((1, N, D), dtype=np.float32), chunks=(1, N // CHUNKS, D))
        for _ in range(3)
    )
    schedule = dask_schedule(pa.attention(q, k, v, **dict(options)))
    return Grid(title, CHUNKS, schedule.pairs, schedule.merge_tasks, schedule.tasks)


def grids() -> tuple[Grid, ...]:
    """The three schedules the figure shows: full, causal, and a causal sliding window."""
    window = N // CHUNKS * 2
    return (
        grid((), "no mask"),
        grid((("causal", True),), "causal"),
        grid((("causal", True), ("window", (window, 0))), f"causal, window {window}"),
    )


_FIG = {
    "en": {
        "query": "query chunk i",
        "key": "key chunk j",
        "title": "{title}: {pairs} of {all} pairs\n{merges} merge tasks, {tasks} tasks in all",
        "label": "Task grids read from the dask graph: filled squares are pair tasks, "
        "hatched squares are pairs that the mask hides and that get no task",
    },
    "ja": {
        "query": "クエリのチャンク i",
        "key": "キーのチャンク j",
        "title": "{title}: {all} 組中 {pairs} 組\n統合タスク {merges}、全タスク {tasks}",
        "label": "dask のグラフから読んだタスクの格子。塗りつぶしは組のタスク、"
        "斜線はマスクで隠れてタスクを持たない組",
    },
}
# The schedules' titles (see grids) in Japanese, phrase by phrase.
_TITLES_JA = (("no mask", "マスクなし"), ("causal", "因果"), (", window ", "、ウィンドウ "))


def grid_svg(*, lang: str = "en") -> str:
    """The (query chunk x key chunk) grid of each schedule; hidden pairs are drawn as skipped."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from sitegen import plotting

    gs = grids()

    def draw(narrow: bool) -> Any:
        # Side by side on screens, stacked on phones (text stays >= 9 px at 390 px).
        shape = (len(gs), 1) if narrow else (1, len(gs))
        size = (plotting.NARROW_IN, 3.9 * len(gs)) if narrow else (3.3 * len(gs), 3.6)
        fig, axes = plt.subplots(*shape, figsize=size, squeeze=False)
        for ax, g in zip(axes.flat, gs, strict=True):
            _draw_grid(ax, g, Rectangle, lang=lang)
        axes.flat[0].set_ylabel(_FIG[lang]["query"])
        fig.tight_layout()
        return fig

    return plotting.figures_only(
        draw,
        label=_FIG[lang]["label"],
        name=f"dask-grid-{lang}",
    )


def _draw_grid(ax: Any, g: Grid, rectangle: Any, *, lang: str = "en") -> None:
    """One schedule's grid: pair tasks filled, hidden pairs hatched."""
    for i in range(g.chunks):
        for j in range(g.chunks):
            task = (i, j) in g.pairs
            ax.add_patch(
                rectangle(
                    (j, i),
                    0.92,
                    0.92,
                    facecolor="#3f51b5" if task else "none",
                    edgecolor="#3f51b5" if task else "#bbbbbb",
                    hatch=None if task else "////",
                    linewidth=0.8,
                )
            )
    ax.set_xlim(-0.1, g.chunks)
    ax.set_ylim(g.chunks, -0.1)
    ax.set_aspect("equal")
    ax.set_xticks([c + 0.46 for c in range(g.chunks)], range(g.chunks))
    ax.set_yticks([c + 0.46 for c in range(g.chunks)], range(g.chunks))
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    words = _FIG[lang]
    ax.set_xlabel(words["key"])
    title = translate(g.title, _TITLES_JA, lang)
    ax.set_title(
        words["title"].format(
            title=title, pairs=len(g.pairs), all=g.chunks**2, merges=g.merges, tasks=g.tasks
        )
    )


def grid_numbers() -> dict[str, str]:
    """Values the prose quotes."""
    full, causal, window = grids()
    return {
        "n": str(N),
        "chunks": str(CHUNKS),
        "chunk": str(N // CHUNKS),
        "full": str(len(full.pairs)),
        "causal": str(len(causal.pairs)),
        "window": str(len(window.pairs)),
        "saved": f"{1 - len(causal.pairs) / len(full.pairs):.0%}",
    }


def cluster_grid(n: int = 65536, chunk: int = 4096) -> dict[str, str]:
    """The cluster test's schedule, read from its graph (lazy zeros: nothing is allocated)."""
    import dask.array as da

    from portattn.testing import dask_schedule

    q = da.zeros((1, n, D), dtype=np.float32, chunks=(1, chunk, D))
    counts = {}
    for name, causal in (("full", False), ("causal", True)):
        counts[name] = dask_schedule(pa.attention(q, q, q, causal=causal)).pair_tasks
    return {
        "n": str(n),
        "chunk": str(chunk),
        "chunks": str(n // chunk),
        "full": str(counts["full"]),
        "causal": str(counts["causal"]),
        "scores_gib": f"{n * n * 4 / 2**30:.0f}",
    }


def record() -> dict[str, Any] | None:
    """The dask rows of the benchmark record, or ``None`` before the first run."""
    if not RECORD.exists():
        return None
    data: dict[str, Any] = json.loads(RECORD.read_text())
    return data


_SCALING = {
    "en": {
        "none": "*No benchmark record yet: run `python benchmarks/run.py --dask-only` "
        "to write `benchmarks/results/dask.json`.*\n",
        "measured": "Measured {date} on {cpu}, {cores} cores, NumPy {numpy}; load average "
        "{before} before and {after} after the run. B={B}, H={H}, d={d}, {dtype}; median of "
        "{runs} or more interleaved runs.",
        "head": "| N | causal | subject | median ms | GFLOP/s | speed-up |",
        "yes": "yes",
        "no": "no",
        "busy": "The machine was oversubscribed during this run (load {load:.1f} on {cores} "
        "cores): numpy's BLAS threads spin while they wait for a core, which slows the default "
        "(multi-threaded BLAS) rows most, and no core was free for dask's second thread. Read "
        "these figures as a record of that run, not as what dask gains on an idle machine.",
        "skipped": "Not measured: {why}.",
        "overhead": "Overhead per task, from a graph of {tasks} chunks of shape {shape} run by "
        "the threads scheduler: {build:.0f} µs to build the graph, {sched:.0f} µs to schedule "
        "and run it beyond the {kernel:.0f} µs the kernel itself takes on such a chunk.",
    },
    "ja": {
        "none": "*ベンチマークの記録はまだない。`python benchmarks/run.py --dask-only` を"
        "実行すると `benchmarks/results/dask.json` に書かれる。*\n",
        "measured": "{date} に {cpu}({cores} コア、NumPy {numpy})で測定。ロードアベレージは"
        "実行前 {before}、実行後 {after}。B={B}、H={H}、d={d}、{dtype}。交互に並べた "
        "{runs} 回以上の実行の中央値。",
        "head": "| N | 因果マスク | 測定対象 | 中央値 ms | GFLOP/s | 高速化 |",
        "yes": "あり",
        "no": "なし",
        "busy": "この測定中、計算機は過負荷だった({cores} コアに対してロード {load:.1f})。"
        "NumPy の BLAS スレッドはコアを待つ間も空回りするので、既定の(マルチスレッド BLAS の)"
        "行がいちばん遅くなり、dask の2本目のスレッドに空くコアもなかった。これらの数値は"
        "その実行の記録として読むべきもので、空いた計算機で dask が稼ぐ分ではない。",
        "skipped": "測定していないもの: {why}。",
        "overhead": "タスクあたりのオーバーヘッド。形 {shape} のチャンク {tasks} 個のグラフを "
        "threads スケジューラで動かすと、グラフを作るのに {build:.0f} µs、そのような"
        "チャンクでカーネル自体にかかる {kernel:.0f} µs を超えてスケジュールと実行に "
        "{sched:.0f} µs かかった。",
    },
}


def scaling_markdown(*, lang: str = "en") -> str:
    """The benchmark's dask rows as a table, with the machine and the per-task overhead."""
    rec = record()
    w = _SCALING[lang]
    if rec is None:
        return w["none"]
    m, c = rec["machine"], rec["config"]
    lines = [
        w["measured"].format(
            date=rec["date"][:10],
            cpu=m["cpu"],
            cores=m["cores"],
            numpy=m["numpy"],
            before=rec["load_before"],
            after=rec["load_after"],
            B=c["B"],
            H=c["H"],
            d=c["d"],
            dtype=c["dtype"],
            runs=min(r["runs"] for r in rec["throughput"]),
        ),
        "",
        w["head"],
        "| ---: | :---: | --- | ---: | ---: | ---: |",
    ]
    for r in rec["throughput"]:
        lines.append(
            f"| {r['n']} | {w['yes'] if r['causal'] else w['no']} | {r['subject']} | "
            f"{r['median_s'] * 1e3:.0f} | {r['gflops']:.1f} | {r['speedup']:.2f}x |"
        )
    load = max(rec["load_before"][0], rec["load_after"][0])
    if load > m["cores"]:
        lines += ["", w["busy"].format(load=load, cores=m["cores"])]
    lines += [""] + [w["skipped"].format(why=why) for why in rec.get("skipped", [])]
    o = rec["overhead"]
    lines += [
        "",
        w["overhead"].format(
            tasks=o["tasks"],
            shape="x".join(map(str, o["chunk_shape"])),
            build=o["graph_build_us_per_task"],
            sched=o["scheduling_us_per_task"],
            kernel=o["kernel_us_per_call"],
        ),
    ]
    return "\n".join(lines) + "\n"


def best_speedup() -> str:
    """The largest speed-up over plain portattn in the record, for the prose."""
    rec = record()
    if rec is None:
        return "n/a"
    best = max(
        (r for r in rec["throughput"] if r["subject"].startswith("dask")),
        key=lambda r: r["speedup"],
    )
    causal = ", causal" if best["causal"] else ""
    return f"{best['speedup']:.2f}x ({best['subject']}, N={best['n']}{causal})"


def thread_scaling() -> str:
    """Dask on all cores against the same kernel on one core, both with one BLAS thread."""
    rec = record()
    if rec is None:
        return "n/a"
    ratios = []
    for r in rec["throughput"]:
        if r["subject"].startswith("dask") and r["subject"].endswith("BLAS 1 thread"):
            one = next(
                x
                for x in rec["throughput"]
                if x["subject"] == "portattn numpy, BLAS 1 thread"
                and (x["n"], x["causal"]) == (r["n"], r["causal"])
            )
            ratios.append(one["median_s"] / r["median_s"])
    return f"{min(ratios):.2f}x to {max(ratios):.2f}x on {rec['workers']} threads"
