"""The bad-input table: every case is called while the site builds, and what it raised is shown.

Nothing in the table is typed by hand except the calls themselves: the
exception type and message come from running each call against the portattn
being documented. A case that no longer raises fails the build, so the table
can never show an error the library stopped giving.
"""

from __future__ import annotations

import html
import importlib
from dataclasses import dataclass

__all__ = ["CASES", "Case", "Outcome", "errors_markdown", "run_case", "setup_markdown"]

# Run once before every case; the names it defines are the ones the calls use.
SETUP = """\
import numpy as np
import portattn as pa
q = np.ones((2, 4, 3)); k = np.ones((2, 5, 3)); v = np.ones((2, 5, 6))
x = np.ones((4, 4), dtype=np.float32)
x4 = np.ones((1, 2, 8, 4))  # (B, H, L, d), as score_mod and block_mask take
"""


@dataclass(frozen=True)
class Case:
    """One bad call: the section it belongs to and the code, exactly as run."""

    section: str
    code: str
    # a module the call imports (bound to its last name), or "longdouble" (wider than float64)
    needs: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What a case did: the exception's type and message, or why it was not run."""

    case: Case
    kind: str
    message: str


CASES: tuple[Case, ...] = (
    # attention: the arrays
    Case("attention", "pa.attention(None, k, v)"),
    Case("attention", "pa.attention(q, k, None)"),
    Case("attention", "pa.attention(q.astype(int), k, v)"),
    Case("attention", "pa.attention(q.astype(np.longdouble), k, v)", needs="longdouble"),
    Case("attention", "pa.attention(q[0, 0], k, v)"),
    Case("attention", "pa.attention(q, np.ones((2, 5, 4)), v)"),
    Case("attention", "pa.attention(q, k, np.ones((2, 6, 6)))"),
    Case("attention", "pa.attention(q, k, v, mask=np.ones((4, 5)))"),
    Case("attention", "pa.attention(q, k, v, mask=np.ones((4, 6), dtype=bool))"),
    Case("attention", "pa.attention(q, k, v, bias=np.ones((4, 5), dtype=bool))"),
    Case("attention", "pa.attention(q, k, v, key_lengths=np.array([3.0, 4.0]))"),
    Case("attention", "pa.attention(np.ma.masked_array(q), k, v)"),
    Case("attention", "pa.attention([[1.0, 0.0, 0.0]], k, v)"),
    Case("attention", "pa.attention(q, k, v, bias=0.5)"),
    Case("attention", "pa.attention(q, k, v, key_lengths=[5, 3])"),
    Case("attention", "pa.attention_weights(q, k, mask=[[True]])"),
    # attention: the options
    Case("attention options", "pa.attention(q, k, v, causal=True)"),
    Case("attention options", "pa.attention(q, q, q, causal=1)"),
    Case("attention options", "pa.attention(q, q, q, causal='lower')"),
    Case("attention options", "pa.attention(q, q, q, window=True)"),
    Case("attention options", "pa.attention(q, q, q, window=(2, -1))"),
    Case("attention options", "pa.attention(q, q, q, window=1.5)"),
    Case("attention options", "pa.attention(q, k, v, window=2)"),
    Case("attention options", "pa.attention(q, k, v, scale='0.5')"),
    Case("attention options", "pa.attention(q, k, v, scale=float('nan'))"),
    Case("attention options", "pa.attention(q, k, v, impl='fast')"),
    Case("attention options", "pa.attention(q, k, v, block_size=0)"),
    Case("attention options", "pa.attention(q, k, v, block_size='4')"),
    Case("attention options", "pa.attention(q, k, v, return_lse='no')"),
    # coming from torch: SDPA's and FlexAttention's names, pointed to portattn's
    Case("from torch", "pa.attention(q, k, v, attn_mask=np.ones((4, 5), dtype=bool))"),
    Case("from torch", "pa.attention(q, q, q, is_causal=True)"),
    Case("from torch", "pa.attention(q, k, v, dropout_p=0.1)"),
    Case("from torch", "pa.attention_weights(q, k, enable_gqa=True)"),
    Case(
        "from torch",
        "pa.attention(np.ones((2, 8, 4, 3)), np.ones((2, 3, 5, 3)), np.ones((2, 3, 5, 3)))",
    ),
    Case("from torch", "pa.attention(x4, x4, x4, score_mod=lambda score, b, h, q_idx: score)"),
    Case(
        "from torch",
        "pa.create_block_mask(lambda q_idx, kv_idx: q_idx >= kv_idx, None, None, 8, 8)",
    ),
    Case("from torch", "pa.and_masks(pa.mods.causal, lambda b, h, q_idx: q_idx >= 0)"),
    Case(
        "from torch",
        "pa.attention(x4, x4, x4, block_mask=flex_attention.create_block_mask("
        "lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 8, 8, device='cpu'))",
        needs="torch.nn.attention.flex_attention",
    ),
    # position masks
    Case("masks", "pa.causal_mask(-1, 3)"),
    Case("masks", "pa.causal_mask(2, 3, align='middle')"),
    Case("masks", "pa.window_mask(3, 3, window=1, causal='no')"),
    Case("masks", "pa.window_mask(3, 3, window=True)"),
    # softmax
    Case("softmax", "pa.softmax(np.arange(3))"),
    Case("softmax", "pa.softmax(x, axis=2)"),
    Case("softmax", "pa.softmax(x, axis=1.0)"),
    Case("softmax", "pa.softmax(np.ma.masked_array(x, mask=x > 0))"),
    # linear attention
    Case("linear attention", "pa.linear_attention(x, x, x, causal=1)"),
    Case("linear attention", "pa.linear_attention(x, x, x, chunk_size=0)"),
    Case("linear attention", "pa.linear_attention(x, x, x, eps=-1)"),
    Case("linear attention", "pa.linear_attention(x, x, np.ma.masked_array(x))"),
    Case("linear attention", "pa.linear_attention_step(x[0], x[0], x[0], (1, 2))"),
    Case(
        "linear attention",
        "pa.linear_attention_step(x[0], x[0], x[0], "
        "pa.LinearAttentionState(np.zeros((4, 3)), np.zeros(4)))",
    ),
    # merging
    Case("merge_attention", "pa.merge_attention(3, [np.zeros(4)])"),
    Case("merge_attention", "pa.merge_attention([np.ma.zeros((4, 2))], [np.zeros(4)])"),
    Case("merge_attention", "pa.merge_attention([np.zeros((4, 2))], [np.zeros(4)] * 2)"),
    Case("merge_attention", "pa.merge_attention([np.zeros((4, 2))], [np.zeros(3)])"),
    # the KV cache
    Case("KVCache", "pa.KVCache(2, 4, dtype='float32')"),
    Case("KVCache", "pa.KVCache(2, 4, xp=torch, dtype=np.float32)", needs="torch"),
    Case("KVCache", "pa.KVCache(2, 4, capacity=-1)"),
    Case("KVCache", "pa.KVCache(0, 4)"),
    Case(
        "KVCache",
        "pa.KVCache(1, 4, capacity=1).append(x[None, :2], x[None, :2])",
    ),
    Case("KVCache", "pa.KVCache(1, 4).append(np.ones((1, 1, 4)), np.ones((1, 1, 4)))"),
    Case("KVCache", "pa.KVCache(1, 4).append(np.ones((1, 1, 4), np.float32), None)"),
    # positions
    Case("positions", "pa.sinusoidal_encoding(4, 5)"),
    Case("positions", "pa.sinusoidal_encoding(4, 4, base=1)"),
    Case("positions", "pa.sinusoidal_encoding(4, 4, dtype=torch.float32)", needs="torch"),
    Case("positions", "pa.apply_rope(x, layout='pairs')"),
    Case("positions", "pa.rope_positions(-1)"),
    # heads
    Case("Head and MultiHeadAttention", "pa.Head.random(0, 2)"),
    Case("Head and MultiHeadAttention", "pa.Head.random(4, 2, std='1')"),
    Case("Head and MultiHeadAttention", "pa.Head.identity(True)"),
    Case("Head and MultiHeadAttention", "pa.Head.identity(4)([[1.0, 2.0, 3.0, 4.0]])"),
    Case("Head and MultiHeadAttention", "pa.Head.identity(4).scores(x, scaled=1)"),
    Case(
        "Head and MultiHeadAttention",
        "pa.MultiHeadAttention(*[np.zeros((8, 8))] * 4, num_heads=2, rope='half', rope_base=0)",
    ),
    Case(
        "Head and MultiHeadAttention",
        "pa.MultiHeadAttention.random(8, 2)(np.ones((5, 8), np.float32), cache={})",
    ),
    Case(
        "Head and MultiHeadAttention",
        "pa.MultiHeadAttention.from_torch(torch.nn.Linear(4, 4))",
        needs="torch",
    ),
    Case(
        "Head and MultiHeadAttention",
        "pa.MultiHeadAttention.random(8, 2)(np.ones((3, 5, 8), np.float32), "
        "mask=np.ones((3, 3, 5, 5), dtype=bool))",
    ),
    Case(
        "Head and MultiHeadAttention",
        "pa.MultiHeadAttention.random(8, 2)(np.ones((3, 5, 8), np.float32), "
        "key_lengths=np.full((3, 1), 5))",
    ),
    Case(
        "Head and MultiHeadAttention",
        "pa.MultiHeadAttention.random(8, 2)(np.ones((2, 5, 8), np.float32), "
        "key_lengths=np.array([5, 5, 5]))",
    ),
    # testing helpers
    Case("testing", "pa.testing.assert_close([1.0, 2.0], np.array([1.0, 2.0]), rtol=0)"),
    Case("testing", "pa.testing.assert_close(np.ones(2), np.ones(2), rtol='0')"),
    # programmable attention: captured arrays against the call's sizes
    Case("mods", "pa.attention(x4, x4, x4, score_mod=pa.mods.alibi(np.ones(3)))"),
    Case("mods", "pa.attention(x4, x4, x4, score_mod=pa.mods.t5_relative_bias(np.ones((32, 3))))"),
    Case("mods", "pa.mods.t5_relative_bias(np.ones((32, 2)), max_distance=8)"),
    Case("mods", "pa.create_block_mask(pa.mods.documents(np.zeros(6, int)), None, None, 8, 8)"),
    Case("mods", "pa.create_block_mask(pa.mods.prefix_lm(np.array([3])), 2, None, 8, 8)"),
    Case(
        "mods", "pa.create_block_mask(lambda b, h, q, kv: np.arange(4)[q] < kv, None, None, 8, 8)"
    ),
    # programmable attention: captured arrays against the call's library
    Case("mods", "pa.attention(x4, x4, x4, score_mod=pa.mods.alibi(torch.ones(2)))", needs="torch"),
    Case(
        "mods",
        "pa.create_block_mask(pa.mods.documents(torch.arange(8)), None, None, 8, 8)",
        needs="torch",
    ),
    # programmable attention: what a score_mod returns, what a BlockMask holds
    Case("mods", "pa.attention(x4, x4, x4, score_mod=lambda s, b, h, q, kv: q - kv)"),
    Case("mods", "pa.attention(x4, x4, x4, score_mod=lambda s, b, h, q, kv: s[..., :1, :])"),
    Case(
        "mods",
        "pa.BlockMask(np.full((1, 1, 1, 1), 7, np.int8), mask_mod=pa.mods.causal, "
        "shape=(1, 1, 8, 8), block_size=8)",
    ),
    Case(
        "mods",
        "pa.BlockMask(np.ones((1, 1, 1, 1), np.int8), mask_mod=pa.mods.causal, "
        "shape=(1, 1, 8, 8), block_size=(0, 8))",
    ),
    Case(
        "mods",
        "pa.BlockMask(np.ones((1, 1, 1, 1), np.int8), mask_mod=pa.mods.causal, "
        "shape=(8, 8), block_size=8)",
    ),
    Case("mods", "pa.create_block_mask(pa.mods.causal, None, None, 8, 8).mask_mod = None"),
)


def run_case(case: Case) -> Outcome:
    """Run ``case`` in a fresh namespace; raise if it raises no TypeError, ValueError or
    AttributeError (an immutable object refusing an assignment)."""
    env: dict[str, object] = {}
    exec(SETUP, env)  # the code is this module's own table
    importlib.import_module("portattn.testing")
    if case.needs == "longdouble":
        import numpy as np

        if np.finfo(np.longdouble).bits <= 64:
            return Outcome(case, "not run", "on this platform np.longdouble is float64")
    elif case.needs is not None:
        try:
            env[case.needs.rsplit(".", 1)[-1]] = importlib.import_module(case.needs)
        except ImportError as exc:
            return Outcome(case, "not run", f"{case.needs} is not installed in this build ({exc})")
    try:
        exec(case.code, env)
    except (TypeError, ValueError, AttributeError) as exc:
        return Outcome(case, type(exc).__name__, str(exc))
    msg = f"bad-input case {case.code!r} no longer raises: update docs/_gen/sitegen/errors.py"
    raise RuntimeError(msg)


def _cell(text: str) -> str:
    return html.escape(text).replace("|", "&#124;").replace("\n", " ")


_HEAD = {"en": "| Input | Exception | Message |", "ja": "| 入力 | 例外 | メッセージ |"}
# Section titles that are words, not API names, on the Japanese page.
_SECTIONS_JA = {
    "Head and MultiHeadAttention": "Head と MultiHeadAttention",
    "attention options": "attention のオプション",
    "masks": "マスク",
    "positions": "位置",
}


def errors_markdown(*, lang: str = "en") -> str:
    """The table, one section per part of the API, as Markdown (the messages stay as raised)."""
    out: list[str] = []
    section = None
    for case in CASES:
        got = run_case(case)
        if case.section != section:
            section = case.section
            title = _SECTIONS_JA.get(section, section) if lang == "ja" else section
            out += ["", f"### {title}", "", _HEAD[lang], "|---|---|---|"]
        out.append(f"| <code>{_cell(case.code)}</code> | {got.kind} | {_cell(got.message)} |")
    return "\n".join(out).strip() + "\n"


def setup_markdown() -> str:
    """The setup every case runs after, as a code block."""
    return "```python\n" + SETUP + "```\n"
