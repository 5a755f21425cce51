"""MkDocs hooks: make ``sitegen`` importable for the pages, and render math at build time.

Math is written as ``$...$`` and ``$$...$$`` in the pages (marked up by
``pymdownx.arithmatex`` in generic mode) and as ``:math:`...``` in numpydoc
docstrings. Both become MathML here, which browsers draw natively, so the site
ships no math renderer and fetches nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

os.environ.setdefault("MPLBACKEND", "Agg")

from sitegen.mathml import render_math, tidy_roles  # noqa: E402


def on_page_content(html: str, /, *, page: Any, config: Any, files: Any) -> str:
    """Replace arithmatex spans and docstring ``:math:`` roles with MathML."""
    return tidy_roles(render_math(html))
