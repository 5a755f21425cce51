"""Show portattn's real source on a page, read with :mod:`inspect` while the site builds."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any

import portattn


def _relative(path: str) -> str:
    root = Path(portattn.__file__).resolve().parents[2]
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return Path(path).name


def show(obj: Any, *, start: str | None = None, stop: str | None = None) -> str:
    """A fenced Python block with the source of ``obj``, numbered as in the file.

    ``start`` and ``stop`` pick the lines from the first one containing
    ``start`` through the first later one containing ``stop``, so a page can
    quote the few lines of a long function that matter, and the quote moves
    with the code. A marker that is missing raises, and the build fails.
    """
    lines, first = inspect.getsourcelines(obj)
    lo, hi = 0, len(lines)
    if start is not None:
        lo = next((i for i, line in enumerate(lines) if start in line), -1)
        if lo < 0:
            msg = f"{start!r} not found in the source of {obj.__qualname__}"
            raise LookupError(msg)
    if stop is not None:
        hi = next((i + 1 for i in range(lo, len(lines)) if stop in lines[i]), -1)
        if hi < 0:
            msg = f"{stop!r} not found after {start!r} in the source of {obj.__qualname__}"
            raise LookupError(msg)
    text = textwrap.dedent("".join(lines[lo:hi])).rstrip()
    where = _relative(inspect.getsourcefile(obj) or "")
    title = f"{where}, lines {first + lo} to {first + hi - 1}"
    return f'```python linenums="{first + lo}" title="{title}"\n{text}\n```\n'
