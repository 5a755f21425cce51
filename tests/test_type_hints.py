"""Every public callable's annotations resolve at runtime: typing.get_type_hints works on each.

Tools that read types at runtime (pydantic, typeguard, beartype, IDEs) call
``get_type_hints``; a name that exists only for the type checker (a
``TYPE_CHECKING`` import) raises ``NameError`` there.
"""

from __future__ import annotations

import inspect
import typing

import pytest

import portattn as pa


def _public_callables() -> list[tuple[str, object]]:
    """Each public function, and each public class with its methods (inherited ones too)."""
    found: list[tuple[str, object]] = []
    for name in pa.__all__:
        obj = getattr(pa, name)
        if not callable(obj):
            continue
        found.append((name, obj))
        if not inspect.isclass(obj):
            continue
        for attr in dir(obj):
            if attr.startswith("_") and attr not in ("__init__", "__call__"):
                continue
            raw = inspect.getattr_static(obj, attr)
            member = raw.fget if isinstance(raw, property) else getattr(obj, attr)
            if callable(member) and getattr(member, "__module__", "").startswith("portattn"):
                found.append((f"{name}.{attr}", member))
    return found


CALLABLES = _public_callables()


@pytest.mark.parametrize(("name", "obj"), CALLABLES, ids=[name for name, _ in CALLABLES])
def test_get_type_hints_resolves(name, obj):
    typing.get_type_hints(obj)


def test_the_layers_methods_are_all_covered():
    names = {name for name, _ in CALLABLES}
    for method in ("random", "from_torch", "from_torch_weights", "to_torch", "weights"):
        assert f"MultiHeadAttention.{method}" in names
    assert {"KVCache.append", "KVCache.keys", "Head.random", "MultiHeadAttention.__call__"} <= names


def test_alternative_constructors_return_the_class():
    for method in ("random", "from_torch", "from_torch_weights"):
        hints = typing.get_type_hints(getattr(pa.MultiHeadAttention, method))
        assert hints["return"] is pa.MultiHeadAttention
