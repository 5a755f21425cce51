"""The Performance page, read from the benchmark record (``benchmarks/results/cpu.json``).

The record's format belongs to the benchmark script and may grow: everything
here reads it with ``.get`` and skips what is missing, so a new field never
breaks the build and a missing one shows as "not in this record".

Series are grouped: colour names the code path (auto, blockwise, ...) and
line style and marker name the library, with the Okabe-Ito palette.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from . import plotting
from .i18n import t

RECORD = Path("benchmarks/results/cpu.json")
LIBRARIES = ("numpy", "torch", "jax", "cupy", "dask", "array-api-strict")


@cache
def record(path: str = str(RECORD)) -> dict[str, Any]:
    """The benchmark record, or an empty one when the file is missing."""
    p = Path(path)
    if not p.is_file():
        return {}
    data = json.loads(p.read_text())
    return data if isinstance(data, dict) else {}


def split(row: dict[str, Any]) -> tuple[str, str]:
    """A row's library and code path, read from its subject fields (``benchmarks/core.py``).

    A portattn row's path is its ``impl`` (with its ``setting``: ``"blockwise,
    no pool"``); a reference's is marked as one: ``"SDPA (reference)"``.
    """
    lib, path = str(row.get("library", "?")), str(row.get("impl", "?"))
    if row.get("setting"):
        path = f"{path}, {row['setting']}"
    return lib, path if row.get("kind") == "portattn" else f"{path} (reference)"


def _split_by_label(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each row label's (library, path), in the record's order."""
    return {str(r.get("subject")): split(r) for r in rows}


def _order(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _styles(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each row label's colour (its path), line style and marker (its library)."""
    by_label = _split_by_label(rows)
    libs = _order(lib for lib, _ in by_label.values())
    paths = _order(path for _, path in by_label.values())
    out = {}
    for s, (lib, path) in by_label.items():
        li, pi = libs.index(lib), paths.index(path)
        out[s] = {
            "color": plotting.SERIES[pi % len(plotting.SERIES)],
            "ls": plotting.LINESTYLES[li % len(plotting.LINESTYLES)],
            "marker": plotting.MARKERS[li % len(plotting.MARKERS)],
        }
    return out


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _rows(section: str) -> list[dict[str, Any]]:
    """The record's list ``section`` ("throughput", "memory"), less entries that are not dicts."""
    return [r for r in record().get(section, []) or [] if isinstance(r, dict)]


def measured_markdown(*, lang: str = "en") -> str:
    """The paragraph saying where and how the record was measured."""
    rec = record()
    if not rec:
        return f"No benchmark record at `{RECORD}`: run `nox -s bench`.\n"
    m = rec.get("machine", {}) or {}
    blas = ", ".join(
        f"{b.get('internal_api', '?')} {b.get('version', '')} "
        f"({b.get('architecture', '?')}, {b.get('num_threads', '?')} threads)"
        for b in m.get("blas", []) or []
    )
    parts = [
        t(
            "perf_measured",
            lang,
            date=str(rec.get("date", "?"))[:10],
            cpu=m.get("cpu", "?"),
            cores=m.get("cores", "?"),
            python=m.get("python", "?"),
            numpy=m.get("numpy", "?"),
            blas=t("perf_blas", lang, blas=blas) if blas else "",
            torch=m.get("torch", "?"),
            threads=m.get("torch_threads", "?"),
        )
    ]
    if "load_before" in rec:
        parts.append(
            t("perf_load", lang, before=rec.get("load_before"), after=rec.get("load_after"))
        )
    out = " ".join(parts) + "\n\n"
    c = rec.get("config", {}) or {}
    if c:
        shapes = {k: c.get(k) for k in ("B", "H", "d", "dtype")}
        out += t("perf_shapes", lang, **shapes) + "\n\n"
    for s in rec.get("skipped", []) or []:
        out += t("perf_skipped", lang, what=skipped_words(s, lang)) + "\n\n"
    return out


# The sentences benchmarks/run.py writes under "skipped", in Japanese: the
# numbers are the record's, read out of the sentence by these patterns.
_SKIPPED_JA: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"materialize and plain numpy above N=(\d+) \(throughput\) and materialize above "
            r"N=(\d+) \(memory\): \(N, N\) scores for (\d+) heads take ([\d.]+ \S+) per "
            r"temporary at N=(\d+), ([\d.]+ \S+) at N=(\d+)"
        ),
        r"N=\1 を超える materialize と素の numpy(スループット)、N=\2 を超える materialize"
        r"(メモリ)。\3 ヘッドの (N, N) のスコアは、一時配列1つで N=\5 なら \4、N=\7 なら \6 になる",
    ),
    (
        re.compile(r"materialize and plain numpy above N=(\d+) in this run \((--[\w-]+)\).*"),
        r"この実行では N=\1 を超える materialize と素の numpy(`\2`)。負荷のある計算機では"
        r"1ラウンドに数分かかる",
    ),
    (
        re.compile(r"memory above N=(\d+) in this run \((--[\w-]+)\)"),
        r"この実行では N=\1 を超えるメモリ(`\2`)",
    ),
    (
        re.compile(r"throughput above N=(\d+) in this run \((--[\w-]+)\).*"),
        r"この実行では N=\1 を超えるスループット(`\2`)。共有の計算機で短く済ませるため",
    ),
    (
        re.compile(r"N=(\d+): above (--[\w-]+)=(\d+) in this run"),
        r"N=\1(この実行の `\2=\3` を超える)",
    ),
)


def skipped_words(sentence: str, lang: str = "en") -> str:
    """A record's "skipped" sentence in ``lang``; one no pattern knows stays in English."""
    if lang == "ja":
        for pattern, words in _SKIPPED_JA:
            if pattern.fullmatch(sentence):
                return pattern.sub(words, sentence)
    return sentence


def throughput_figure(*, lang: str = "en") -> str:
    """GFLOP/s against N, not causal and causal; legend outside the axes; stacked on phones."""
    import matplotlib.pyplot as plt

    rows = _rows("throughput")
    rows = [r for r in rows if _num(r.get("n")) and _num(r.get("gflops"))]
    if not rows:
        return "<p>No throughput in this record.</p>"
    subjects = _order(str(r.get("subject")) for r in rows)
    style = _styles(rows)
    panels = [c for c in (False, True) if any(bool(r.get("causal")) == c for r in rows)]

    def draw(narrow: bool) -> Any:
        shape = (len(panels), 1) if narrow else (1, len(panels))
        size = (plotting.width(narrow), 3.3 * len(panels) + 1.6 if narrow else 5.0)
        fig, axes = plt.subplots(*shape, figsize=size, sharey=True, squeeze=False)
        for ax, causal in zip(axes.flat, panels, strict=True):
            for s in subjects:
                pts = sorted(
                    (float(r["n"]), float(r["gflops"]))
                    for r in rows
                    if r.get("subject") == s and bool(r.get("causal")) == causal
                )
                if pts:
                    ax.plot(*zip(*pts, strict=True), label=s, lw=1.6, ms=4, **style[s])
            ax.set(xscale="log", yscale="log", xlabel="N (= Lq = Lk)")
            ax.set_title(t("causal" if causal else "not_causal", lang))
            ax.set_ylabel("GFLOP/s")
            ax.grid(True, which="major", lw=0.5)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        if narrow:
            fig.legend(handles, labels, loc="lower center", ncols=2, bbox_to_anchor=(0.5, 0))
            fig.tight_layout(rect=(0, 0.22 if len(subjects) > 4 else 0.12, 1, 1))
        else:
            # Below the panels, not beside them: a legend to the right made the
            # drawing wider than the column and its text 7 px on the page.
            fig.legend(handles, labels, loc="lower center", ncols=3, bbox_to_anchor=(0.5, 0))
            fig.tight_layout(rect=(0, 0.24, 1, 1))
        return fig

    return plotting.figure(
        draw,
        label=t("throughput_label", lang),
        name=f"perf-throughput-{lang}",
        caption=t("throughput_caption", lang),
    )


def _pivot(
    rows: list[dict[str, Any]], value: str, fmt: str, caption: str, key: str, *, short: bool = False
) -> str:
    subjects = _order(str(r.get("subject")) for r in rows)
    ns = sorted({int(r["n"]) for r in rows})
    cell = {(int(r["n"]), str(r.get("subject"))): r for r in rows}
    # The caption names the library, so a column is named by its path alone.
    by_label = _split_by_label(rows)
    head = "".join(f"<th>{by_label[s][1] if short else s}</th>" for s in subjects)
    body = ""
    for n in ns:
        tds = []
        for s in subjects:
            r = cell.get((n, s))
            v = _num(r.get(value)) if r else None
            tds.append(f"<td>{fmt.format(v) if v is not None else '—'}</td>")
        body += f"<tr><td>{n}</td>{''.join(tds)}</tr>"
    return (
        f'<table data-pa-table="{key}"><caption>{caption}</caption>'
        f"<thead><tr><th>N</th>{head}</tr></thead><tbody>{body}</tbody></table>\n"
    )


def throughput_tables(*, lang: str = "en") -> str:
    """Pivot tables N by subject, one per (causal, library): GFLOP/s."""
    rows = _rows("throughput")
    rows = [r for r in rows if _num(r.get("n")) is not None and "subject" in r]
    if not rows:
        return ""
    out = []
    for causal in (False, True):
        part = [r for r in rows if bool(r.get("causal")) == causal]
        for lib in _order(split(r)[0] for r in part):
            mine = [r for r in part if split(r)[0] == lib]
            what = t("causal" if causal else "not_causal", lang)
            out.append(
                '<div class="pa-table-wrap">'
                + _pivot(
                    mine,
                    "gflops",
                    "{:.1f}",
                    t("perf_gflops_caption", lang, lib=lib, what=what),
                    f"throughput-{lib}-{'causal' if causal else 'full'}",
                    short=True,
                )
                + "</div>"
            )
    return "\n".join(out)


def memory_figure(*, lang: str = "en") -> str:
    """Peak extra memory against N, with the 2 x (inputs + output) target."""
    import matplotlib.pyplot as plt

    rows = _rows("memory")
    rows = [r for r in rows if _num(r.get("n")) and _num(r.get("peak_bytes"))]
    if not rows:
        return "<p>No memory measurements in this record.</p>"
    subjects = _order(str(r.get("subject")) for r in rows)
    style = _styles(rows)

    def draw(narrow: bool) -> Any:
        fig, ax = plt.subplots(figsize=(plotting.width(narrow), 4.6 if not narrow else 4.2))
        for s in subjects:
            pts = sorted(
                (float(r["n"]), float(r["peak_bytes"]) / 2**20) for r in rows if r["subject"] == s
            )
            ax.plot(*zip(*pts, strict=True), label=s, lw=1.6, ms=4, **style[s])
        target = sorted(
            {
                (float(r["n"]), 2 * float(r["inputs_plus_output_bytes"]) / 2**20)
                for r in rows
                if _num(r.get("inputs_plus_output_bytes"))
            }
        )
        if target:
            ax.plot(
                *zip(*target, strict=True),
                ls=":",
                color=plotting.MUTED,
                label=t("memory_target", lang),
            )
        ax.set(xscale="log", yscale="log", xlabel="N", ylabel=t("peak_mib", lang))
        ax.grid(True, which="major", lw=0.5)
        if narrow:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=1)
        else:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3)
        fig.tight_layout()
        return fig

    return plotting.figure(
        draw,
        label=t("memory_label", lang),
        name=f"perf-memory-{lang}",
        caption=t("memory_caption", lang),
    )


def memory_table(*, lang: str = "en") -> str:
    """Pivot N by subject: peak MiB."""
    rows = _rows("memory")
    rows = [r for r in rows if _num(r.get("n")) is not None and "subject" in r]
    if not rows:
        return ""
    mib = [
        dict(r, peak_mib=float(r["peak_bytes"]) / 2**20) for r in rows if _num(r.get("peak_bytes"))
    ]
    return (
        '<div class="pa-table-wrap">'
        + _pivot(mib, "peak_mib", "{:.1f}", t("perf_peak_caption", lang), "memory")
        + "</div>"
    )


def small_calls_markdown(*, lang: str = "en") -> str:
    """The per-call overhead table at the chapter's size."""
    ch = record().get("chapter", {}) or {}
    med = ch.get("median_us", {}) or {}
    ratio = ch.get("ratio_to_plain", {}) or {}
    if not med:
        return "Not in this record.\n"
    peers = ch.get("peers", {}) or {}
    lines = [
        t("perf_calls_head", lang),
        "| --- | ---: | ---: | --- |",
    ]
    for name, us in med.items():
        r = _num(ratio.get(name))
        peer = peers.get(name, "plain numpy")
        lines.append(
            f"| {name} | {float(us):.1f} | {f'{r:.2f}' if r is not None else '—'} | {peer} |"
        )
    return "\n".join(lines) + "\n"


# --- the second round's targets, and the profiles that explain the misses -------

_THROUGHPUT_TARGETS = (
    ("portattn torch auto", 0.95),
    ("portattn torch blockwise", 0.8),
    ("portattn numpy blockwise", 0.7),
)
_TRAINING_TARGET = 0.5
_SMALL_CALL_TARGET = 2.0


def _verdict(value: float | None, ok: bool, lang: str = "en") -> str:
    if value is None:
        return t("perf_not_measured", lang)
    return t("perf_met" if ok else "perf_missed", lang)


def targets_markdown(n: int = 2048, *, lang: str = "en") -> str:
    """Every target of the performance round, read from the record, marked met or missed."""
    rec = record()
    rows = {
        (r.get("subject"), r.get("n"), bool(r.get("causal"))): r
        for r in rec.get("throughput", []) or []
        if isinstance(r, dict)
    }
    lines = [
        t("perf_targets_head", lang),
        "| --- | ---: | ---: | ---: |",
    ]
    for subject, target in _THROUGHPUT_TARGETS:
        cells = []
        for causal in (False, True):
            x = _num((rows.get((subject, n, causal)) or {}).get("vs_sdpa"))
            cells.append(
                _verdict(None, False, lang)
                if x is None
                else f"{x:.2f}× ({_verdict(x, x >= target, lang)})"  # noqa: RUF001
            )
        lines.append(f"| {subject}, N={n} | ≥ {target}× | {cells[0]} | {cells[1]} |")  # noqa: RUF001
    native = [
        _num((rows.get(("portattn torch native", n, causal)) or {}).get("vs_sdpa"))
        for causal in (False, True)
    ]
    if any(x is not None for x in native):
        cells = [_verdict(None, False, lang) if x is None else f"{x:.2f}×" for x in native]  # noqa: RUF001
        lines.append(f"| {t('perf_native_row', lang, n=n)} | — | {cells[0]} | {cells[1]} |")
    train = [
        r for r in (rec.get("training", {}) or {}).get("rows", []) or [] if isinstance(r, dict)
    ]
    for tn in sorted({int(r["n"]) for r in train if _num(r.get("n"))}):
        cells = []
        for causal in (False, True):
            r = next(
                (
                    r
                    for r in train
                    if r.get("n") == tn
                    and bool(r.get("causal")) == causal
                    and r.get("subject") == "portattn torch blockwise"
                ),
                {},
            )
            x = _num(r.get("vs_sdpa"))
            cells.append(
                _verdict(None, False, lang)
                if x is None
                else f"{x:.2f}× ({_verdict(x, x >= _TRAINING_TARGET, lang)})"  # noqa: RUF001
            )
        lines.append(
            f"| {t('perf_training_row', lang, n=tn)} | ≥ {_TRAINING_TARGET}× | "  # noqa: RUF001
            f"{cells[0]} | {cells[1]} |"
        )
    ch = rec.get("chapter", {}) or {}
    ratio = ch.get("ratio_to_plain", {}) or {}
    plain, causal_r = _num(ratio.get("portattn")), _num(ratio.get("portattn causal"))

    def small(x: float | None) -> str:
        if x is None:
            return _verdict(None, False, lang)
        return f"{x:.2f}× ({_verdict(x, x <= _SMALL_CALL_TARGET, lang)})"  # noqa: RUF001

    lines.append(
        f"| {t('perf_small_row', lang)} | "
        f"≤ {_SMALL_CALL_TARGET}× | "  # noqa: RUF001
        f"{small(plain)} | {small(causal_r)} |"
    )
    return "\n".join(lines) + "\n"


def tile_markdown(*, lang: str = "en") -> str:
    """Per-pass tile times, and a whole call built up from its matmuls: the ceiling."""
    prof = record().get("profile", {}) or {}
    libs = [lib for lib in prof if isinstance(prof[lib], dict)]
    if not libs:
        return "The record holds no tile profile.\n"
    out = []
    for lib in libs:
        p = prof[lib]
        med = p.get("median_us", {}) or {}
        share = p.get("share", {}) or {}
        out += [
            t("perf_tile", lang, lib=lib, tile=p.get("tile")),
            "",
            t("perf_tile_head", lang),
            "| --- | ---: | ---: |",
        ]
        for name, us in med.items():
            s = _num(share.get(name))
            out.append(f"| {name} | {float(us):.0f} | {f'{s:.0%}' if s is not None else '—'} |")
        out.append("")
        call = p.get("call_ms", {}) or {}
        if call:
            out += [
                t("perf_buildup", lang, lib=lib),
                "",
                "| | ms | SDPA ÷ this |",
                "| --- | ---: | ---: |",
            ]
            sdpa = _num(call.get("torch SDPA"))
            for name, ms in call.items():
                r = f"{sdpa / float(ms):.2f}" if sdpa and _num(ms) else "—"
                out.append(f"| {name} | {float(ms):.1f} | {r} |")
            out += ["", _gap_sentence(lib, p, call, lang=lang)]
        out.append("")
    return "\n".join(out) + "\n"


def training_markdown(*, lang: str = "en") -> str:
    """Forward + backward rows: time against SDPA and peak memory against the I/O."""
    tr = record().get("training", {}) or {}
    rows = [r for r in tr.get("rows", []) or [] if isinstance(r, dict)]
    if not rows:
        return "The record holds no forward + backward rows.\n"
    lines = [
        t("perf_backward", lang, what=tr.get("backward", "?")),
        "",
        t("perf_training_head", lang),
        "| ---: | :---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = _num(r.get("peak_over_io"))
        causal = t("yes" if r.get("causal") else "no", lang)
        lines.append(
            f"| {r.get('n')} | {causal} | {r.get('subject')} | "
            f"{float(r.get('median_s', 0)) * 1e3:.1f} | {float(r.get('vs_sdpa', 0)):.2f} | "
            f"{float(r.get('peak_bytes', 0)) / 2**20:.1f} | "
            f"{f'{ratio:.2f}' if ratio is not None else '—'} |"
        )
    return "\n".join(lines) + "\n"


def small_call_stages_markdown(*, lang: str = "en") -> str:
    """Each stage of a 6 x 8 call as a share of the whole call, timed together with it.

    The stage loop times the whole call too, faster than the table above does
    (a warmer loop); printing both times gave one call two numbers, so the
    stages are given as shares of their own loop's whole call.
    """
    ch = record().get("chapter", {}) or {}
    stages = dict(ch.get("stages_us", {}) or {})
    whole = _num(stages.pop("whole call", None))
    if not stages or whole is None:
        return "The record holds no stage timings.\n"
    lines = [t("perf_stages_head", lang), "| --- | ---: |"]
    for name, us in stages.items():
        try:
            said = t(f"perf_stage_{name}", lang)
        except KeyError:  # a stage this page has no words for yet
            said = name
        lines.append(f"| {said} | {100 * float(us) / whole:.0f}% |")
    return "\n".join(lines) + "\n"


def _gap_sentence(
    lib: str, p: dict[str, Any], call: dict[str, Any], n: int = 2048, *, lang: str = "en"
) -> str:
    """What separates portattn's call from SDPA's, from the build-up and the per-pass times."""
    sdpa = _num(call.get("torch SDPA"))
    floor = _num(call.get("two matmuls + exp per tile"))
    ours = _num(call.get(f"portattn {lib} blockwise"))
    tile = p.get("tile") or []
    if sdpa is None or floor is None or ours is None or len(tile) < 4:
        return ""
    tiles = -(-n // int(tile[2])) * -(-n // int(tile[3]))
    heavy = ("scores matmul", "exp")
    other_us = sum(
        float(us)
        for name, us in (p.get("median_us", {}) or {}).items()
        if name not in heavy and not name.startswith("value matmul")
    )
    passes = other_us * tiles / 1e3
    rest = ours - floor - passes
    return t(
        "perf_gap",
        lang,
        lib=lib,
        floor_ratio=sdpa / floor,
        more=ours - floor,
        passes=passes,
        tiles=tiles,
        rest=rest,
    )


_POOL_WORDS = {
    "none": {
        "en": "This record does not say how the thread pool was set up.\n",
        "ja": "この記録には、スレッドプールの設定が書かれていない。\n",
    },
    "cost": {
        "en": "The cost: each worker holds its own score tiles, so the pool's peak memory is up "
        "to one tile ({tile_mib:g} MiB at the default size in {dtype}) more per extra worker. "
        "Calls below 2<sup>{exp}</sup> multiply-adds (`_MIN_WORK` in `_lib/_threads.py`) "
        "never use the pool",
        "ja": "代償もある。各ワーカーは自分のスコアのタイルを持つので、プールのメモリの最大値は"
        "ワーカーが1つ増えるごとに最大でタイル1枚分(既定の大きさ、{dtype} で {tile_mib:g} MiB)"
        "増える。積和が 2<sup>{exp}</sup> 回に満たない呼び出し(`_lib/_threads.py` の "
        "`_MIN_WORK`)はプールを使わない",
    },
    "small": {
        "en": ": at N={n}, the largest size of this record below it, the pool forced on "
        "measured {extra_ms:+.2f} ms against the same call without it ({speedup:.2f}×).",  # noqa: RUF001
        "ja": "。この記録でそれを下回る最大の大きさ N={n} では、プールを強制すると、プールなしの"
        "同じ呼び出しと比べて {extra_ms:+.2f} ms だった({speedup:.2f}×)。",  # noqa: RUF001
    },
    "no_small": {
        "en": "; this record has no size below it.",
        "ja": "。この記録にはそれを下回る大きさがない。",
    },
}


def pool_cost_markdown(*, lang: str = "en") -> str:
    """What the NumPy thread pool costs: memory per worker, start-up, and its threshold.

    The tile size, the threshold and the start-up cost are all read from
    the record: the tile and threshold as the benchmark's portattn set them
    (``config``), the cost from its smallest thread-pool row.
    """
    words = {k: v[lang] for k, v in _POOL_WORDS.items()}
    cfg = record().get("config", {})
    tile_elems, threshold = cfg.get("numpy_tile_elements"), cfg.get("pool_min_work")
    if not isinstance(tile_elems, int) or not isinstance(threshold, int):
        return words["none"]
    itemsize = {"float32": 4, "float64": 8, "float16": 2}.get(str(cfg.get("dtype")), 4)
    text = words["cost"].format(
        tile_mib=tile_elems * itemsize / 2**20,
        dtype=cfg.get("dtype", "float32"),
        exp=threshold.bit_length() - 1,
    )
    rows = [
        r
        for r in record().get("threads", {}).get("rows", [])
        if not r.get("causal") and r.get("default_pools") is False
    ]
    if not rows:
        return text + words["no_small"] + "\n"
    small = max(rows, key=lambda r: r["n"])
    extra_ms = (small["pool_s"] - small["no_pool_s"]) * 1e3
    return (
        text
        + words["small"].format(n=small["n"], extra_ms=extra_ms, speedup=small["speedup"])
        + "\n"
    )


# --- decode and grouped-query attention (the record's "decode", benchmarks/decode.py) ----

_DECODE_WORDS = {
    "head": {
        "en": "| case | (B, H, Hkv, Lq, Lk, d) | subject | time | peer | time over peer "
        "(quartiles) | target | |",
        "ja": "| 場合 | (B, H, Hkv, Lq, Lk, d) | 対象 | 時間 | 比較相手 | 相手に対する時間比"
        "(四分位) | 目標 | |",
    },
    "how": {
        "en": "Measured {date}: every library on {threads} thread, timed by the process's CPU "
        "clock ({clock}), {rounds} interleaved rounds; each ratio is the median over rounds "
        "of the call's time over its peer's in the same round. Load average {before} before "
        "and {after} after.",
        "ja": "測定 {date}。どのライブラリも {threads} スレッドで、プロセスの CPU 時間で計測"
        "({clock})、交互に {rounds} ラウンド。比は、同じラウンドの相手の時間に対する時間の比の、"
        "ラウンドにわたる中央値。ロードアベレージは実行前 {before}、実行後 {after}。",
    },
    "speed": {"en": "speed ≥ {x}", "ja": "速さ ≥ {x}"},
    "ratio": {"en": "time ≤ {x}×", "ja": "時間 ≤ {x} 倍"},  # noqa: RUF001
    "memory": {
        "en": "Peak extra memory (tracemalloc, NumPy): a ({h}, 1, {d}) query per batch entry "
        "over {kv} keys takes {big} bytes: {ratio:.2f} of G = {g} times the {small} bytes "
        "of a ({hs}, 1, {d}) query over the same keys (target at most 1: {verdict}).",
        "ja": "追加メモリの最大値(tracemalloc、NumPy): バッチあたり ({h}, 1, {d}) のクエリが "
        "{kv} のキーに対して {big} バイト。同じキーに対する ({hs}, 1, {d}) のクエリの {small} "
        "バイトの G = {g} 倍に対して {ratio:.2f}(目標は 1 以下: {verdict})。",
    },
}


def _dw(key: str, lang: str, **fields: Any) -> str:
    return _DECODE_WORDS[key]["ja" if lang == "ja" else "en"].format(**fields)


def _seconds(x: float) -> str:
    return f"{x * 1e3:.2f} ms" if x >= 1e-3 else f"{x * 1e6:.1f} µs"


def _decode_row(r: dict[str, Any], lang: str) -> str:
    ratio, quart = _num(r.get("ratio")), r.get("ratio_quartiles") or []
    rq = "—"
    if ratio is not None:
        rq = f"{ratio:.2f}"
        if len(quart) == 2:
            rq += f" [{float(quart[0]):.2f}, {float(quart[1]):.2f}]"
    target, goal = r.get("target") or {}, ""
    for kind, x in target.items():  # a speed target is shown as the time ratio it allows
        goal = _dw("ratio", lang, x=f"{1 / x:.2f}")
        goal += f" ({_dw('speed', lang, x=x)})" if kind == "speed" else ""
        goal = goal if kind == "speed" else _dw("ratio", lang, x=x)
    verdict = _verdict(ratio, bool(r.get("met")), lang) if goal else ""
    peer = r.get("peer") or ""
    return (
        f"| {r.get('case')} | {tuple(r.get('shape', []))} | {r.get('subject')} | "
        f"{_seconds(float(r.get('median_s', 0)))} | {peer} | {rq} | {goal} | {verdict} |"
    )


def decode_markdown(*, lang: str = "en") -> str:
    """The decode and GQA table: each subject against its peer, its target and verdict."""
    rec = record().get("decode", {}) or {}
    rows = [r for r in rec.get("rows", []) or [] if isinstance(r, dict)]
    if not rows:
        return "Not in this record.\n"
    cfg = rec.get("config", {}) or {}
    how = _dw(
        "how",
        lang,
        date=str(rec.get("date", "?"))[:10],
        threads=cfg.get("threads", "?"),
        clock=cfg.get("clock", "?"),
        rounds=cfg.get("rounds", "?"),
        before=", ".join(map(str, rec.get("load_before", []) or [])),
        after=", ".join(map(str, rec.get("load_after", []) or [])),
    )
    lines = [how, "", _dw("head", lang), "| --- | --- | --- | ---: | --- | ---: | --- | --- |"]
    lines += [_decode_row(r, lang) for r in rows]
    mem = rec.get("memory", {}) or {}
    peak = mem.get("peak_bytes", {}) or {}
    heads, keys = mem.get("query_heads") or [], mem.get("keys") or []
    if len(heads) == 2 and len(keys) == 4 and all(str(h) in peak for h in heads):
        ratio = float(mem.get("ratio", 0))
        lines += [
            "",
            _dw(
                "memory",
                lang,
                h=heads[0],
                hs=heads[1],
                d=keys[3],
                kv=tuple(keys),
                big=f"{peak[str(heads[0])]:,}",
                small=f"{peak[str(heads[1])]:,}",
                g=heads[0] // keys[1],
                ratio=ratio,
                verdict=_verdict(ratio, bool(mem.get("met")), lang),
            ),
        ]
    return "\n".join(lines) + "\n"
