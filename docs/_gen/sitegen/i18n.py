"""Words that figures and generated tables show, in English and Japanese.

Pages pass ``lang="en"`` or ``lang="ja"`` to a generator; everything it draws
takes its words from here, and its numbers from portattn, so the two editions
show the same computed values in two languages.
"""

from __future__ import annotations

from collections.abc import Iterable

LANGS = ("en", "ja")

_WORDS: dict[str, dict[str, str]] = {
    "key_axis": {"en": "key (attended to) →", "ja": "見られる側(キー)→"},
    "query_axis": {"en": "query ↓", "ja": "見る側(クエリ)↓"},
    "masked": {"en": "masked", "ja": "マスク"},
    "scale_title": {"en": "attention weight", "ja": "注目の重み"},
    "width_log": {"en": "head width d (log scale)", "ja": "ヘッドの幅 d(対数目盛)"},
    "mean_max": {"en": "mean largest attention weight", "ja": "最大の重みの平均"},
    "without": {"en": "without ÷√d", "ja": "÷√d なし"},
    "with": {"en": "with ÷√d", "ja": "÷√d あり"},
    "uniform": {"en": "uniform, 1/{n}", "ja": "一様, 1/{n}"},
    "init_constant": {
        "en": "weights N(0, {std}²) for every d",
        "ja": "重み N(0, {std}²)(d によらず)",
    },
    "init_scaled": {"en": "weights N(0, 1/d)", "ja": "重み N(0, 1/d)"},
    "d": {"en": "d", "ja": "d"},
    "chapter_printed": {"en": "source chapter (printed)", "ja": "原典の章(印刷値)"},
    "computed": {"en": "computed here", "ja": "このサイトの計算"},
    "mask_on": {"en": "Causal mask on", "ja": "因果マスク ON"},
    "mask_off": {"en": "Causal mask off", "ja": "因果マスク OFF"},
    # Performance page
    "causal": {"en": "causal", "ja": "因果マスクあり"},
    "not_causal": {"en": "not causal", "ja": "因果マスクなし"},
    "throughput_label": {"en": "throughput against N", "ja": "N に対するスループット"},
    "throughput_caption": {
        "en": "Throughput against N. Colour: the code path; line style and marker: the "
        "library. Higher is better.",
        "ja": "N に対するスループット。色はコードの経路、線の種類と印はライブラリを表す。"
        "高いほどよい。",
    },
    "peak_mib": {"en": "peak extra MiB", "ja": "追加メモリの最大値(MiB)"},
    "memory_target": {"en": "2 × (inputs + output)", "ja": "2 × (入力 + 出力)"},  # noqa: RUF001
    "memory_label": {"en": "peak memory against N", "ja": "N に対するメモリの最大値"},
    "memory_caption": {
        "en": "Peak extra memory of one call against N. Lower is better.",
        "ja": "1回の呼び出しが追加で使うメモリの最大値と N の関係。低いほどよい。",
    },
    # Performance page: sentences and headers built from the benchmark record
    "perf_measured": {
        "en": "**Measured** {date} on {cpu}, {cores} cores (Python {python}, NumPy {numpy}{blas}; "
        "torch {torch} with {threads} threads).",
        "ja": "**測定** {date}、{cpu}、{cores} コア(Python {python}、NumPy {numpy}{blas}、"
        "torch {torch} は {threads} スレッド)。",
    },
    "perf_blas": {"en": " with {blas}", "ja": "、{blas}"},
    "perf_load": {
        "en": "Load average {before} before the run and {after} after: other work shared the "
        "cores, so compare ratios within the run rather than absolute times.",
        "ja": "ロードアベレージは実行前 {before}、実行後 {after}。ほかの仕事がコアを共有して"
        "いたので、絶対時間ではなく、同じ実行の中での比を比べること。",
    },
    "perf_shapes": {
        "en": "Shapes: B={B}, H={H}, d={d}, {dtype}. Throughput counts 4·B·H·Lq·Lk·d FLOPs "
        "(halved for causal), over the median of interleaved runs.",
        "ja": "形: B={B}、H={H}、d={d}、{dtype}。スループットは 4·B·H·Lq·Lk·d FLOP(因果マスク"
        "つきはその半分)を、交互に並べた実行の中央値で割ったもの。",
    },
    "perf_skipped": {"en": "Not measured: {what}.", "ja": "測定していないもの: {what}。"},
    "perf_gflops_caption": {"en": "GFLOP/s, {lib}, {what}", "ja": "GFLOP/s、{lib}、{what}"},
    "perf_peak_caption": {"en": "Peak extra MiB", "ja": "追加メモリの最大値(MiB)"},
    "perf_targets_head": {
        "en": "| what (against torch SDPA, same run) | target | not causal | causal |",
        "ja": "| 対象(同じ実行の torch SDPA と比べて) | 目標 | 因果マスクなし | 因果マスクあり |",
    },
    "perf_not_measured": {"en": "not measured", "ja": "未測定"},
    "perf_met": {"en": "met", "ja": "達成"},
    "perf_missed": {"en": "**missed**", "ja": "**未達**"},
    "perf_tile": {
        "en": "**{lib}**, one tile of shape {tile}:",
        "ja": "**{lib}**、形 {tile} のタイル1枚:",
    },
    "perf_tile_head": {"en": "| pass | µs | share |", "ja": "| パス | µs | 割合 |"},
    "perf_buildup": {
        "en": "A whole N = 2048 call on {lib}, built up (ms, median of interleaved rounds):",
        "ja": "{lib} での N = 2048 の呼び出し全体を段階的に組み立てたもの(ms、交互に並べた"
        "ラウンドの中央値):",
    },
    "perf_gap": {
        "en": "On {lib}, the two matmuls and one `exp` per tile, with nothing else, run at "
        "{floor_ratio:.2f}× SDPA: the ceiling of a composition of separate array operations on "  # noqa: RUF001
        "this machine. portattn's call takes {more:.1f} ms more than that floor: the other "
        "passes above (row max, subtraction, row sum) account for {passes:.1f} ms over the "
        "call's {tiles} tiles, and the remaining {rest:.1f} ms is the online softmax's "
        "rescaling of its running sums between key blocks, the writing of each query block's "
        "output, and the dispatch between operations.",
        "ja": "{lib} では、タイルごとの二つの行列積と1回の `exp` だけなら SDPA の "
        "{floor_ratio:.2f} 倍で動く。これが、この計算機で別々の配列演算を組み合わせたときの上限だ。"
        "portattn の呼び出しは、その下限より {more:.1f} ms 長くかかる。上の表のほかのパス"
        "(行の最大値、引き算、行和)が呼び出しの {tiles} 枚のタイル全体で {passes:.1f} ms を"
        "占め、残りの {rest:.1f} ms は、オンライン softmax がキーのブロックの間で累積和を"
        "再スケールする分、各クエリブロックの出力を書く分、演算の間の呼び出しの分だ。",
    },
    "perf_backward": {
        "en": "Backward of the blockwise path in the recorded run: {what}.",
        "ja": "記録した実行での blockwise 経路の逆伝播: {what}。",
    },
    "perf_training_head": {
        "en": "| N | causal | subject | median ms | × SDPA | peak MiB | peak ÷ I/O |",  # noqa: RUF001
        "ja": "| N | 因果マスク | 測定対象 | 中央値 ms | SDPA 比 | 最大 MiB | 最大 ÷ I/O |",
    },
    "yes": {"en": "yes", "ja": "あり"},
    "no": {"en": "no", "ja": "なし"},
    "perf_calls_head": {
        "en": "| call | median µs | × its peer | peer |",  # noqa: RUF001
        "ja": "| 呼び出し | 中央値 µs | 比較相手の何倍か | 比較相手 |",
    },
    "perf_stages_head": {
        "en": "| stage (timed on its own) | share of the whole call |",
        "ja": "| 段階(単独で測定) | 呼び出し全体に占める割合 |",
    },
    "perf_stage_namespace lookup": {"en": "namespace lookup", "ja": "名前空間の検索"},
    "perf_stage_validation (prepare)": {"en": "validation (prepare)", "ja": "入力の検査(prepare)"},
    "perf_stage_path and cast back (solve)": {
        "en": "path and cast back (solve)",
        "ja": "経路の計算と dtype の戻し(solve)",
    },
    "perf_native_row": {
        "en": "portattn torch native, N={n}: the same SDPA call `auto` makes, "
        "so its distance from 1.00× is this run's noise",  # noqa: RUF001
        "ja": "portattn torch native、N={n}: `auto` と同じ SDPA の呼び出しなので、"
        "1.00× からの隔たりはこの実行の揺らぎ",  # noqa: RUF001
    },
    "perf_training_row": {
        "en": "blockwise forward + backward, torch, N={n}",
        "ja": "blockwise の順伝播 + 逆伝播、torch、N={n}",
    },
    "perf_small_row": {
        "en": "a 6 × 8 call, against the hand-written NumPy formula (causal: with the mask)",  # noqa: RUF001
        "ja": "6 × 8 の呼び出し、手書きの NumPy の式と比べて(因果マスクつきはマスクを含む式と)",  # noqa: RUF001
    },
}


def t(key: str, lang: str = "en", **fmt: object) -> str:
    """The word or phrase ``key`` in ``lang``, formatted with ``fmt``."""
    if lang not in LANGS:
        msg = f"expected lang to be one of {LANGS}, got {lang!r}"
        raise ValueError(msg)
    return _WORDS[key][lang].format(**fmt)


def translate(text: str, phrases: Iterable[tuple[str, str]], lang: str) -> str:
    """``text`` for the ``lang`` page: on the Japanese one, each English phrase of
    ``phrases`` replaced by its Japanese, in order (so a longer phrase goes first)."""
    if lang == "ja":
        for en, ja in phrases:
            text = text.replace(en, ja)
    return text
