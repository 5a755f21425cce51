"""The arrays a mod captures, so that gradients can reach them and their library be checked.

A ``score_mod`` is an ordinary Python function; the learned arrays it reads
(ALiBi slopes, a T5 bucket table) hide in its closure cells, its defaults,
the object it is bound to, a ``functools.partial``, or module globals it
names. torch's autograd cannot see through the custom ``autograd.Function``
the blockwise path is, so those tensors are found here and passed to it as
extra inputs; its backward then differentiates the mod per tile and returns
their gradients. The mod protocol (``_core/_modspec``) also walks them
once per call, to refuse arrays of another library than the inputs'.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["captured"]

# How deep into nested containers and objects the search goes: far enough
# for a module holding a parameter list, not so far as to walk a whole model.
_MAX_DEPTH = 4


def captured(fn: Callable[..., Any], keep: Callable[[Any], bool]) -> list[Any]:
    """Every object reachable from ``fn`` for which ``keep`` holds, once each, in a fixed order."""
    found: dict[int, Any] = {}
    seen: set[int] = set()
    for x in _reachable(fn, seen, 0):
        if keep(x) and id(x) not in found:
            found[id(x)] = x
    return list(found.values())


def _reachable(x: Any, seen: set[int], depth: int) -> Iterator[Any]:
    if id(x) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(x))
    yield x
    for child in _children(x):
        yield from _reachable(child, seen, depth + 1)


def _children(x: Any) -> list[Any]:
    """What ``x`` refers to that a function's result could depend on."""
    if isinstance(x, (str, bytes, int, float, complex, bool, type(None))):
        return []
    if isinstance(x, functools.partial):
        return [x.func, *x.args, *x.keywords.values()]
    if isinstance(x, (list, tuple, set, frozenset)):
        return list(x)
    if isinstance(x, dict):
        return list(x.values())
    code = getattr(x, "__code__", None)
    if code is not None and callable(x):  # a Python function: closure, defaults, globals
        out: list[Any] = [c.cell_contents for c in (x.__closure__ or ()) if _filled(c)]
        out += list(x.__defaults__ or ())
        out += list((x.__kwdefaults__ or {}).values())
        glb = getattr(x, "__globals__", {})
        out += [glb[n] for n in code.co_names if n in glb and not _is_module(glb[n])]
        return out
    if hasattr(x, "__self__") and hasattr(x, "__func__"):  # a bound method
        return [x.__func__, x.__self__]
    if _is_tensor_like(x) or _is_module(x) or isinstance(x, type):
        return []
    params = getattr(x, "parameters", None)
    if callable(params) and hasattr(x, "named_buffers"):  # a torch.nn.Module
        return [*params(), *(b for _, b in x.named_buffers())]
    if hasattr(x, "__dict__"):  # a callable object, or one holding arrays
        return list(vars(x).values())
    return []


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


def _is_module(x: Any) -> bool:
    return type(x).__name__ == "module"


def _is_tensor_like(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")
