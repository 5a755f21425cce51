"""A griffe extension: numpydoc's grouped parameters as one row, not one row per name.

numpydoc lets several parameters share one line, ``wq, wk, wv : array``.
griffe parses that into one entry per name, each repeating the description,
so the API page showed the same text three times. This extension folds such
a run back into one entry named ``wq, wk, wv``.

It never invents a description: an entry without one stays empty, and
``tests/site/test_api_docs.py`` fails on it, because that is a docstring to fix.
"""

from __future__ import annotations

from typing import Any

import griffe

_SECTIONS = {"parameters", "other parameters", "attributes"}


def _text(x: Any) -> str:
    return "" if x is None else str(x)


def _merge_repeats(items: list[Any]) -> list[Any]:
    """Fold any remaining run of equal (description, annotation) into one entry."""
    out: list[Any] = []
    for it in items:
        prev = out[-1] if out else None
        if (
            prev is not None
            and (it.description or "").strip()
            and prev.description == it.description
            and _text(prev.annotation) == _text(it.annotation)
        ):
            out[-1] = type(it)(
                name=f"{prev.name}, {it.name}",
                annotation=prev.annotation,
                description=it.description,
                value=getattr(prev, "value", None),
            )
        else:
            out.append(it)
    return out


def tidy(docstring: griffe.Docstring) -> list[Any]:
    """The parsed sections with stacked and grouped entries merged (numpydoc parser)."""
    sections = docstring.parse("numpy")
    for section in sections:
        if section.kind.value in _SECTIONS and isinstance(section.value, list):
            section.value = _merge_repeats(section.value)
    return sections


class GroupedParameters(griffe.Extension):
    """Store the merged sections as the docstring's parsed form, for mkdocstrings to render."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        # After the whole package is loaded, so a class docstring already
        # knows its __init__ signature when it is parsed.
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.__dict__["parsed"] = tidy(obj.docstring)


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    out = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            out += _walk(member)  # type: ignore[arg-type]
    return out
