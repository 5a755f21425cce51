"""Words that figures and generated tables show, in English and Japanese.

Pages pass ``lang="en"`` or ``lang="ja"`` to a generator; everything it draws
takes its words from here, and its numbers from portattn, so the two editions
show the same computed values in two languages.
"""

from __future__ import annotations

LANGS = ("en", "ja")

_WORDS: dict[str, dict[str, str]] = {
    "key_axis": {"en": "key (attended to) →", "ja": "キー(注目される側)→"},
    "query_axis": {"en": "query ↓", "ja": "クエリ ↓"},
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
}


def t(key: str, lang: str = "en", **fmt: object) -> str:
    """The word or phrase ``key`` in ``lang``, formatted with ``fmt``."""
    if lang not in LANGS:
        msg = f"expected lang to be one of {LANGS}, got {lang!r}"
        raise ValueError(msg)
    return _WORDS[key][lang].format(**fmt)
