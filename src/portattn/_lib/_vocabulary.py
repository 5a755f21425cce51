"""Errors in the user's vocabulary: torch's names for what portattn calls otherwise.

A user who comes from ``torch.nn.functional.scaled_dot_product_attention``
or FlexAttention types its names first. Python's own "unexpected keyword
argument", a bare arity error from inside a mod, or "expected a
portattn.BlockMask" would leave them to guess the translation; the
messages here name portattn's equivalent instead.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from ._shown import shown

__all__ = ["MOD_SIGNATURES", "SDPA_KEYWORDS", "check_mod_arity", "foreign_block_mask", "sdpa_names"]

P = ParamSpec("P")
R = TypeVar("R")

#: SDPA's keyword names, and what portattn takes instead.
SDPA_KEYWORDS: dict[str, str] = {
    "attn_mask": (
        "expected mask= (a boolean array, True where a query may attend) or bias= "
        "(a floating array added to the scores, as SDPA's floating attn_mask)"
    ),
    "is_causal": (
        "expected causal=: SDPA's is_causal=True is causal='top_left' "
        "(causal=True where Lq == Lk; 'bottom_right' aligns the last query with the last key)"
    ),
    "dropout_p": (
        "expected no dropout: portattn has none (dropout_p=0.0 means leave it out); to drop "
        "attention weights as SDPA does, take w = pa.attention_weights(q, k, ...), multiply it "
        "by a random keep mask divided by (1 - p), then compute w @ v; or apply dropout to "
        "attention's output"
    ),
    "enable_gqa": (
        "expected nothing: grouped-query attention is implicit, a key and value with Hkv heads "
        "serve a query with H heads whenever H is a multiple of Hkv (leave enable_gqa out)"
    ),
}

#: What each kind of mod is called with, FlexAttention's convention.
MOD_SIGNATURES: dict[str, tuple[str, ...]] = {
    "score_mod": ("score", "b", "h", "q_idx", "kv_idx"),
    "mask_mod": ("b", "h", "q_idx", "kv_idx"),
}


def sdpa_names(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, refusing SDPA's keyword names with portattn's equivalent.

    Only the four names of :data:`SDPA_KEYWORDS` are caught; any other
    unknown keyword still gets Python's own TypeError, so a typo is never
    swallowed, and ``fn``'s typed, keyword-only signature is what
    ``inspect.signature`` and type checkers see.
    """

    @functools.wraps(fn)
    def refusing(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except TypeError:
            # Asked only after a TypeError: a call that names one of SDPA's
            # keywords fails to bind, before fn runs, so the error is Python's
            # "unexpected keyword argument", replaced here. A call that
            # succeeds (every decode step) pays for no look at its keywords.
            for name in SDPA_KEYWORDS:
                if name in kwargs:
                    msg = f"{fn.__name__}() got torch SDPA's {name}=; {SDPA_KEYWORDS[name]}"
                    raise TypeError(msg) from None
            raise

    return refusing


def check_mod_arity(role: str, mod: object) -> None:
    """TypeError naming ``mod`` unless it can be called as ``role`` (a key of MOD_SIGNATURES).

    Plain functions are read from their code object (no ``inspect`` on the
    hot path); other callables (partials, bound methods, instances with
    ``__call__``) through :func:`inspect.signature`, and callables without
    a readable signature (some builtins) pass unchecked. Skipped while torch
    traces: dynamo would have to trace the introspection itself.
    """
    params = MOD_SIGNATURES[role]
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        return
    if _accepts(mod, len(params)) is not False:
        return
    try:
        got = f"{_name(mod)}{inspect.signature(mod)}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        got = _name(mod)
    msg = (
        f"expected {role} to take {len(params)} positional arguments "
        f"({', '.join(params)}), got {got}"
    )
    raise TypeError(msg)


def _accepts(mod: object, n: int) -> bool | None:
    """Whether ``mod(*n args)`` binds; ``None`` where no signature can be read."""
    if isinstance(mod, types.FunctionType):
        code = mod.__code__
        required_kwonly = code.co_kwonlyargcount - len(mod.__kwdefaults__ or {})
        most = code.co_argcount
        fewest = most - len(mod.__defaults__ or ())
        varargs = bool(code.co_flags & inspect.CO_VARARGS)
        return required_kwonly == 0 and fewest <= n and (n <= most or varargs)
    if isinstance(mod, functools.partial) and not mod.keywords:
        return _accepts(mod.func, n + len(mod.args))  # the bound arguments come first
    try:
        signature = inspect.signature(mod)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(n))
    except TypeError:
        return False
    return True


def _name(mod: object) -> str:
    if isinstance(mod, functools.partial):
        return f"functools.partial({_name(mod.func)}, ...)"
    return str(getattr(mod, "__name__", None) or type(mod).__name__)


def foreign_block_mask(block_mask: object) -> str:
    """The "got ..." part of a refused ``block_mask=``, with a pointer for torch's own."""
    kind = type(block_mask)
    if kind.__module__.startswith("torch") and kind.__name__ == "BlockMask":
        return (
            "got torch's BlockMask (torch.nn.attention.flex_attention); build portattn's with "
            "pa.create_block_mask(mask_mod, B, H, q_len, kv_len): the same mask_mod works"
        )
    return f"got {shown(block_mask)}"
