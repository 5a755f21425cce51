"""The API reference has no parameter without a description, checked from griffe's data.

griffe is what mkdocstrings renders the API page from, parsed here with the
same parser and the site's own extension (docs/_gen/sitegen/griffe_grouped.py),
so an empty cell on the page is an empty description here. The built page is
checked too.
"""

from __future__ import annotations

import re
from pathlib import Path

import griffe
import pytest
from sitegen.griffe_grouped import tidy

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"parameters", "other parameters", "attributes"}


def _documented(obj: griffe.Object, seen: set[str]) -> list[griffe.Object]:
    out: list[griffe.Object] = []
    for member in obj.members.values():
        target = member
        if member.is_alias:
            try:
                target = member.final_target  # type: ignore[assignment]
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
        if target.path in seen or (target.name.startswith("_") and target.name != "__init__"):
            continue
        seen.add(target.path)
        out.append(target)
        if target.is_class or target.is_module:
            out += _documented(target, seen)
    return out


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    return griffe.load("portattn", search_paths=[str(ROOT / "src")], docstring_parser="numpy")


def test_no_parameter_without_a_description(package: griffe.Module) -> None:
    empty = []
    for obj in _documented(package, set()):
        if obj.docstring is None:
            continue
        for section in tidy(obj.docstring):
            if section.kind.value in SECTIONS:
                empty += [
                    f"{obj.path}: {item.name}"
                    for item in section.value
                    if not (item.description or "").strip()
                ]
    assert empty == [], "parameters without a description:\n" + "\n".join(empty)


def test_grouped_parameters_are_one_row(package: griffe.Module) -> None:
    head = package["Head"]
    names = [
        item.name for s in tidy(head.docstring) if s.kind.value == "parameters" for item in s.value
    ]
    assert "wq, wk, wv" in names


def test_built_api_page_has_no_empty_description_cell(site_dir: Path) -> None:
    page = (site_dir / "api" / "index.html").read_text()
    # mkdocstrings' table style: name | type | description | default.
    rows = re.findall(r"<tr class=\"doc-section-item\">(.*?)</tr>", page, re.S)
    assert rows, "no parameter table found on the API page"
    empty = [
        r[:120] for r in rows if re.search(r"<td class=\"doc-[^\"]*description[^\"]*\">\s*</td>", r)
    ]
    assert empty == [], empty
