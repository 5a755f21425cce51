"""House rules the source keeps: every dotted ``portattn._...`` name in its prose resolves."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "portattn"
DOTTED = re.compile(r"\bportattn(?:\.[A-Za-z_][A-Za-z0-9_]*)*\._[A-Za-z0-9_]+(?:\.[A-Za-z_]\w*)*")


def _prose(text: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python source, with their first line numbers."""
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


def _places() -> list[tuple[str, str]]:
    """``(where, dotted name)`` for every ``portattn._...`` name in the prose."""
    places = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        for line, text in _prose(path.read_text()):
            places.extend((f"{where}:{line}", m.group(0)) for m in DOTTED.finditer(text))
    arch = ROOT / "ARCHITECTURE.md"
    for line, text in enumerate(arch.read_text().splitlines(), start=1):
        places.extend((f"ARCHITECTURE.md:{line}", m.group(0)) for m in DOTTED.finditer(text))
    return places


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute (of an attribute...) of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_prose_names_dotted_references():
    """The scan finds names in docstrings, comments and ARCHITECTURE.md (it is not empty)."""
    wheres = {where.split(":")[0] for where, _ in _places()}
    assert "ARCHITECTURE.md" in wheres or any(w.startswith("src/") for w in wheres)
    assert len(wheres) >= 3


@pytest.mark.parametrize(
    ("dotted", "expected"),
    [
        ("portattn._core._problem.Problem.allowed", True),
        ("portattn._core._variant", True),
        ("portattn._problem.Problem", False),  # a module that moved
        ("portattn._core._problem.Problem.no_such_method", False),
        ("portattn._blockwise_grad.blockwise_backward", False),
    ],
)
def test_resolving_tells_a_stale_name(dotted, expected):
    assert _resolves(dotted) is expected


def test_every_dotted_portattn_reference_resolves():
    stale = [f"{where} {dotted}" for where, dotted in _places() if not _resolves(dotted)]
    assert not stale, "stale references:\n" + "\n".join(stale)
