"""How a received value appears in an error message; imported by the checks and the compat layer."""

from __future__ import annotations

__all__ = ["shown"]


def shown(value: object) -> str:
    """How a received value appears in a message: its repr (shortened), typed when ambiguous."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if isinstance(value, (bool, int, float, str, tuple, list)) or value is None:
        return text
    return f"{type(value).__name__} {text}"
