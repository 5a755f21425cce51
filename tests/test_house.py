"""House rules the source keeps: every dotted ``portattn._...`` name in its prose resolves."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _house_metrics() -> ModuleType:
    """``scripts/house_metrics.py``, whose walk of the prose this test shares."""
    spec = importlib.util.spec_from_file_location(
        "house_metrics", ROOT / "scripts" / "house_metrics.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_HOUSE = _house_metrics()
_places = _HOUSE.dotted_places
_resolves = _HOUSE.resolves


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
