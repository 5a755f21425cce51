"""Exercises at the end of the teaching pages, d2l-style: questions shown, answers folded away.

Each page's exercises are a tuple of (question, answer) templates per language,
and a function that computes the numbers the answers need with portattn (or
with the page's own generator), so that no number in an answer is typed by
hand. :func:`render` writes them as Markdown: the question as a paragraph, the
answer in a collapsed ``??? question`` admonition (``pymdownx.details``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import portattn as pa

Items = Sequence[tuple[str, str]]

_TITLE = {"en": ("Exercise", "Answer"), "ja": ("練習", "答え")}


def render(items: Items, values: dict[str, Any], *, lang: str) -> str:
    """Numbered questions, each answer folded away under it; ``{name}`` is filled from values."""
    exercise, answer = _TITLE[lang]
    out = []
    for i, (question, reply) in enumerate(items, start=1):
        out.append(f"**{exercise} {i}.** {question.format(**values)}\n")
        out.append(f'??? question "{answer}"\n    {reply.format(**values)}\n')
    return "\n".join(out)


# ---------------------------------------------------------------- Beyond one head

_BEYOND = {
    "en": (
        (
            "A layer has $H = {H}$ query heads and $H_\\text{{kv}} = {Hkv}$ key/value heads. "
            "Which KV head does query head {h} read, and how many times smaller is its KV "
            "cache than that of a multi-head layer with {H} KV heads?",
            "KV head {kv_of_h} (`{h} // ({H} // {Hkv})`). After {L} tokens the cache holds "
            "keys of shape {gqa_shape} against {mha_shape}: {ratio:g} times smaller, values "
            "alike (read off `KVCache.keys` of both layers).",
        ),
        (
            "How many of the $8 \\times 8$ weights can `window=(2, 0)` leave non-zero, against "
            "the causal mask's? And for $L = {big}$ tokens?",
            "{w8} against {c8}; for $L = {big}$, {wbig:,} against {cbig:,} (counted on "
            "`pa.window_mask` and `pa.causal_mask`). The window grows as $3L - 3$, linearly; "
            "the causal triangle as $L(L+1)/2$.",
        ),
        (
            "The recurrent form of linear attention carries a state from token to token. "
            "With $d = {d}$ and $d_v = {dv}$, how many numbers does it hold after {L} tokens? "
            "After a million?",
            "{state} numbers (`kv` {kv_shape} and `normalizer` {z_shape}, read off the state "
            "`pa.linear_attention_step` returns), after any number of tokens. A KV cache grows "
            "by $d + d_v = {grow}$ numbers per token instead.",
        ),
    ),
    "ja": (
        (
            "見る側(クエリ)のヘッドが $H = {H}$ 個、キーと値のヘッドが "
            "$H_\\text{{kv}} = {Hkv}$ 個の層がある。クエリのヘッド {h} はどの KV ヘッドを"
            "読むか。KV キャッシュは、KV ヘッドが {H} 個の multi-head の層の何分の1になるか。",
            "KV ヘッド {kv_of_h} を読む(`{h} // ({H} // {Hkv})`)。{L} トークンの後、キャッシュの"
            "キーの形は {gqa_shape} で、multi-head では {mha_shape} だ。{ratio:g} 分の1であり、"
            "値も同じだ(両方の層の `KVCache.keys` から読んだ)。",
        ),
        (
            "`window=(2, 0)` で 0 でない値をとりうる注目の重みは、$8 \\times 8$ のうちいくつか。"
            "因果マスクではいくつか。$L = {big}$ トークンではどうか。",
            "{w8} 個と {c8} 個だ。$L = {big}$ では {wbig:,} 個と {cbig:,} 個になる"
            "(`pa.window_mask` と `pa.causal_mask` で数えた)。窓は $3L - 3$ で線形に増え、"
            "因果マスクの三角形は $L(L+1)/2$ で増える。",
        ),
        (
            "線形 attention の再帰形は、トークンからトークンへ状態を運ぶ。$d = {d}$、"
            "$d_v = {dv}$ のとき、{L} トークンの後の状態はいくつの数を持つか。100万トークンの後は"
            "どうか。",
            "何トークンの後でも {state} 個だ(`kv` が {kv_shape}、`normalizer` が {z_shape}。"
            "`pa.linear_attention_step` が返す状態から読んだ)。KV キャッシュなら、1トークンごとに "
            "$d + d_v = {grow}$ 個ずつ増える。",
        ),
    ),
}


def _beyond_values() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16))
    shapes = {}
    for name, hkv in (("gqa", 2), ("mha", 8)):
        layer = pa.MultiHeadAttention.random(16, 8, num_kv_heads=hkv, dtype=np.float64, seed=0)
        cache = layer.new_cache()
        layer(x, causal=True, cache=cache)
        shapes[name] = tuple(int(n) for n in cache.keys.shape)
    big = 1024
    d, dv = 8, 8
    state = None
    for t in range(x.shape[0]):
        _, state = pa.linear_attention_step(x[t, :d], x[t, d:], x[t, :dv], state)
    assert state is not None
    return {
        "H": 8,
        "Hkv": 2,
        "h": 5,
        "kv_of_h": 5 // (8 // 2),
        "L": x.shape[0],
        "gqa_shape": shapes["gqa"],
        "mha_shape": shapes["mha"],
        "ratio": np.prod(shapes["mha"]) / np.prod(shapes["gqa"]),
        "w8": int(np.asarray(pa.window_mask(8, 8, window=(2, 0))).sum()),
        "c8": int(np.asarray(pa.causal_mask(8, 8)).sum()),
        "big": big,
        "wbig": int(np.asarray(pa.window_mask(big, big, window=(2, 0))).sum()),
        "cbig": int(np.asarray(pa.causal_mask(big, big)).sum()),
        "d": d,
        "dv": dv,
        "state": int(np.size(state.kv) + np.size(state.normalizer)),
        "kv_shape": tuple(np.shape(state.kv)),
        "z_shape": tuple(np.shape(state.normalizer)),
        "grow": d + dv,
    }


# ---------------------------------------------------------------- What attention learns

_LEARNED = {
    "en": (
        (
            "A head that spreads its weight evenly over the {n} tokens of a reversal sequence: "
            "what share does it put on the reversed position? Compare with the best head.",
            "$1/{n} = {uniform:.3f}$. Head {best} puts {best_score:.3f} there, "
            "{times:.1f} times the even share.",
        ),
        (
            "In the induction head view, the query is the token **{tok}** at position {qpos} "
            "(counted from 1), in the second copy. Which key should an induction head look "
            "at? How much weight does head {ind} give it?",
            "The earlier **{tok}** stands at position {prev}, so the key is the token after it: "
            "**{nxt}** at position {key}, which is indeed the next token. Head {ind} gives it "
            "{weight:.2f}.",
        ),
        (
            "How many of the model's {total:,} parameters are the attention projections "
            "($W_Q, W_K, W_V, W_O$ of both layers)?",
            "{attn:,}, that is {share:.0f}%: $4 \\times {width}^2$ per layer. The rest are "
            "the embeddings, the layer norms and the output layer.",
        ),
    ),
    "ja": (
        (
            "反転課題の {n} トークンに注目の重みを均等に配るヘッドは、反転した位置にどれだけの"
            "重みを置くか。最もよいヘッドと比べよ。",
            "$1/{n} = {uniform:.3f}$ だ。ヘッド {best} はそこに {best_score:.3f} を置き、"
            "均等な配分の {times:.1f} 倍になる。",
        ),
        (
            "帰納課題のヘッドビューで、見る側(クエリ)は2回目のパターンの中、位置 {qpos}"
            "(1から数える)のトークン **{tok}** だ。帰納ヘッドはどの見られる側(キー)を"
            "見るべきか。ヘッド {ind} はそこにどれだけの重みを置くか。",
            "前の **{tok}** は位置 {prev} にあるので、見るべきキーはその次、位置 {key} の "
            "**{nxt}** だ。これは実際に次に来るトークンである。ヘッド {ind} はそこに "
            "{weight:.2f} を置く。",
        ),
        (
            "モデルのパラメータ {total:,} 個のうち、attention の射影(両層の "
            "$W_Q, W_K, W_V, W_O$)はいくつか。",
            "{attn:,} 個で、{share:.0f}% にあたる。1層あたり $4 \\times {width}^2$ だ。残りは"
            "埋め込み、LayerNorm、出力層である。",
        ),
    ),
}


def _learned_values() -> dict[str, Any]:
    from . import heads, learned

    rev, ind = learned.trained("reverse"), learned.trained("induction")
    n = rev.settings.length // 2
    best, best_score = heads.strongest("reverse", "anti_diagonal")
    name, _ = heads.strongest("induction", "induction", layer=1)
    layer, head = (int(c) - 1 for c in name.split("."))
    data = heads.view_data("induction")
    tokens = data["tokens"]
    # The last query of the second copy whose next token is in it too: the key an
    # induction head needs is the one after the earlier occurrence, the next token.
    seen = [t in tokens[:i] for i, t in enumerate(tokens)]
    q = max(i for i in range(len(tokens) - 1) if seen[i] and seen[i + 1])
    prev = tokens.index(tokens[q])
    if tokens[prev + 1] != tokens[q + 1]:
        msg = f"the induction example does not repeat its pattern: {tokens}"
        raise AssertionError(msg)
    attn = sum(
        p.numel() for b in ind.model.blocks for p in (*b.qkv.parameters(), *b.out.parameters())
    )
    return {
        "n": n,
        "uniform": 1 / n,
        "best": best,
        "best_score": best_score,
        "times": best_score * n,
        "tok": tokens[q],
        "qpos": q + 1,
        "prev": prev + 1,
        "key": prev + 2,
        "nxt": tokens[prev + 1],
        "ind": name,
        "weight": data["weights"][layer][head][q][prev + 1],
        "total": ind.parameters,
        "attn": attn,
        "share": 100 * attn / ind.parameters,
        "width": ind.settings.width,
    }


# ---------------------------------------------------------------- Serving

_SERVING = {
    "en": (
        (
            "The packed batch above holds sequences of {lengths} tokens, causal. How many "
            "(query, key) pairs are computed? How many would a batch padded to {longest} "
            "tokens compute, and one causal mask over all {total} tokens?",
            "{packed} pairs, each sequence's own triangle. Padded: {padded}; one mask over "
            "the {total} tokens: {whole}, of which {cross} pair tokens of different "
            "sequences and would have to be masked out.",
        ),
        (
            "In the paged cache above (pages of {page} tokens), sequence `a` holds {a_len} "
            "tokens. How many pages does it own, and how many of their slots are empty?",
            "{a_pages} pages, with {a_empty} empty slots in the last one. A page is "
            "allocated whole, so a sequence wastes at most {waste} slots.",
        ),
        (
            "`a2` is forked from `a` after the prefill. Before the decode step, how many pages "
            "does the fork cost? And after one decode token each?",
            "None at first: {free_before} pages free before the fork, {free_fork} after it. "
            "Both sequences then write to their shared, partly filled last page, so one of them "
            "gets a copy (copy-on-write): {free_after} pages are free after the step.",
        ),
    ),
    "ja": (
        (
            "上の packed バッチは {lengths} トークンの系列を因果マスクつきで持つ。計算される"
            "(見る側, 見られる側)の組はいくつか。{longest} トークンに padding したバッチでは"
            "いくつか。{total} トークン全体に因果マスクを1枚かけるとどうなるか。",
            "{packed} 組で、各系列自身の三角形だけだ。padding では {padded} 組、{total} "
            "トークン全体のマスクでは {whole} 組になり、そのうち {cross} 組は別の系列の"
            "トークンどうしなのでマスクで消す必要がある。",
        ),
        (
            "上のページつきキャッシュ(1ページ {page} トークン)で、系列 `a` は {a_len} "
            "トークンを持つ。`a` はいくつのページを持ち、空きスロットはいくつか。",
            "{a_pages} ページで、最後のページに {a_empty} 個の空きがある。ページは丸ごと"
            "割り当てるので、1系列の無駄は最大 {waste} スロットだ。",
        ),
        (
            "`a2` は prefill の後に `a` から fork される。decode の前に fork はいくつの"
            "ページを使うか。1トークンずつ decode した後はどうか。",
            "最初は0ページだ。fork の前も後も空きページは {free_before} → {free_fork} で"
            "変わらない。その後、両方の系列が共有する、まだ埋まっていない最後のページに書くので、"
            "片方にコピーが作られる(copy-on-write)。decode の後の空きは {free_after} ページだ。",
        ),
    ),
}


def _serving_values() -> dict[str, Any]:
    from . import serving

    lengths = list(serving.LENGTHS)
    total, longest = sum(lengths), max(lengths)
    whole = int(np.asarray(pa.causal_mask(total, total)).sum())
    packed = sum(int(np.asarray(pa.causal_mask(n, n)).sum()) for n in lengths)
    # The page's cache, step by step: 12 pages of 4 tokens, Hkv = 2, d = 16.
    rng = np.random.default_rng(0)
    cache = pa.PagedKVCache(12, 4, 2, 16)
    for name in ("a", "b"):
        cache.add(name)
    kv = rng.standard_normal((9, 2, 16)).astype(np.float32)
    cache.append(["a", "b"], kv, kv, cu_seqlens=[0, 6, 9])
    free_before = cache.free_pages
    a_len = int(cache.seq_lens(["a"])[0])
    a_pages = int(cache.block_table(["a"]).shape[1])  # one sequence: no padding
    cache.fork("a", "a2")
    free_fork = cache.free_pages
    one = rng.standard_normal((3, 2, 16)).astype(np.float32)
    cache.append(["a", "b", "a2"], one, one, cu_seqlens=[0, 1, 2, 3])
    page = 4
    # The answer's words: the fork takes no page, the step copies exactly one.
    if not (free_fork == free_before and free_fork - cache.free_pages == 1 and a_len % page):
        msg = f"serving exercise broken: free pages {free_before, free_fork, cache.free_pages}"
        raise AssertionError(msg)
    return {
        "lengths": ", ".join(map(str, lengths)),
        "total": total,
        "longest": longest,
        "packed": packed,
        "padded": len(lengths) * int(np.asarray(pa.causal_mask(longest, longest)).sum()),
        "whole": whole,
        "cross": whole - packed,
        "page": page,
        "a_len": a_len,
        "a_pages": a_pages,
        "a_empty": a_pages * page - a_len,
        "waste": page - 1,
        "free_before": free_before,
        "free_fork": free_fork,
        "free_after": cache.free_pages,
    }


# ---------------------------------------------------------------- Beyond one device

_PARALLEL = {
    "en": (
        (
            "$L = {L}$ positions on $P = {P}$ ranks, zigzag. Which positions does rank {r} hold?",
            "{rows}: chunks {r} and $2P - 1 - {r} = {other}$ of {chunks} chunks of {size} "
            '(`parallel.positions({L}, rank={r}, world={P}, layout="zigzag")`).',
        ),
        (
            "A causal grid of {n} x {n} tiles on {P2} ranks. How many visible tiles does each "
            "rank compute in the contiguous layout, and in zigzag?",
            "Contiguous: {contiguous}; zigzag: {zigzag}. The last contiguous rank does "
            "{ratio:.1f} times the first one's work; zigzag's ranks are even.",
        ),
        (
            "Ulysses needs $P$ to divide the number of heads. With $H = {H}$ query heads and "
            "$H_\\text{{kv}} = {Hkv}$, which of $P$ = {candidates} can it use?",
            "$P$ = {ok}: it must divide both {H} and {Hkv}. The ring and allgather strategies "
            "take any $P$ that cuts the sequence evenly.",
        ),
    ),
    "ja": (
        (
            "$L = {L}$ 個の位置を $P = {P}$ ランクに zigzag で分ける。ランク {r} はどの位置を"
            "持つか。",
            "{rows} だ。長さ {size} の {chunks} 個のチャンクのうち、チャンク {r} と "
            "$2P - 1 - {r} = {other}$ である"
            '(`parallel.positions({L}, rank={r}, world={P}, layout="zigzag")`)。',
        ),
        (
            "{n} x {n} タイルの因果マスクの格子を {P2} ランクで計算する。contiguous と zigzag "
            "で、各ランクが計算する見えるタイルはいくつか。",
            "contiguous では {contiguous}、zigzag では {zigzag} だ。contiguous の最後のランクは"
            "最初のランクの {ratio:.1f} 倍の仕事をし、zigzag のランクは均等になる。",
        ),
        (
            "Ulysses では $P$ がヘッド数を割り切る必要がある。クエリのヘッドが $H = {H}$ 個、"
            "$H_\\text{{kv}} = {Hkv}$ 個のとき、$P$ = {candidates} のうち使えるのはどれか。",
            "$P$ = {ok} だ。{H} と {Hkv} の両方を割り切る必要がある。ring と allgather は、"
            "系列を均等に切れる $P$ なら何でもよい。",
        ),
    ),
}


def _parallel_values() -> dict[str, Any]:
    from portattn import parallel

    from . import parallel as cp

    length, world, rank = 16, 4, 1
    n, world2 = 8, 2
    contiguous = cp.visible_tiles(n, world2, "contiguous")
    heads, kv_heads, candidates = 12, 4, (2, 3, 4, 6, 8)
    return {
        "L": length,
        "P": world,
        "r": rank,
        "other": 2 * world - 1 - rank,
        "chunks": 2 * world,
        "size": length // (2 * world),
        "rows": parallel.positions(length, rank=rank, world=world, layout="zigzag").tolist(),
        "n": n,
        "P2": world2,
        "contiguous": contiguous,
        "zigzag": cp.visible_tiles(n, world2, "zigzag"),
        "ratio": contiguous[-1] / contiguous[0],
        "H": heads,
        "Hkv": kv_heads,
        "candidates": ", ".join(map(str, candidates)),
        "ok": ", ".join(str(p) for p in candidates if heads % p == 0 and kv_heads % p == 0),
    }


_PAGES: dict[str, tuple[dict[str, Items], Callable[[], dict[str, Any]]]] = {
    "beyond": (_BEYOND, _beyond_values),
    "learned": (_LEARNED, _learned_values),
    "serving": (_SERVING, _serving_values),
    "parallel": (_PARALLEL, _parallel_values),
}


def values(page: str) -> dict[str, Any]:
    """The numbers the answers of ``page`` show, as computed for the build (the tests read them)."""
    return _PAGES[page][1]()


def exercises(page: str, *, lang: str = "en") -> str:
    """The exercises of ``page`` ("beyond", "learned", "serving", "parallel") in ``lang``."""
    return render(_PAGES[page][0][lang], values(page), lang=lang)
