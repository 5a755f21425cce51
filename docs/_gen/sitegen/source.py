"""Show portattn's real source on a page, read with :mod:`inspect` while the site builds."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any

import portattn


def _relative(path: str) -> str:
    """``src/portattn/...``: the file's place in the repository, wherever portattn is installed.

    A site built against an installed copy (nox installs the package) would
    otherwise show ``site-packages/portattn/...``.
    """
    package = Path(portattn.__file__).resolve().parent
    try:
        inside = Path(path).resolve().relative_to(package).as_posix()
    except ValueError:
        return Path(path).name
    return f"src/portattn/{inside}"


def find(marker: str) -> Any:
    """The first function or method in portattn whose source contains ``marker``.

    Lets a page quote "the line that mixes the values" without naming the
    module it lives in, so the quote survives code moving between modules.
    A marker found nowhere raises, and the build fails.
    """
    import importlib
    import pkgutil

    for info in sorted(pkgutil.walk_packages(portattn.__path__, "portattn."), key=lambda i: i.name):
        module = importlib.import_module(info.name)
        for _, obj in sorted(vars(module).items()):
            candidates = [obj]
            if inspect.isclass(obj):
                candidates += [v for _, v in sorted(vars(obj).items())]
            for c in candidates:
                c = getattr(c, "__func__", c)
                if not inspect.isfunction(c) or c.__module__ != info.name:
                    continue
                try:
                    text = inspect.getsource(c)
                except (OSError, TypeError):  # generated code (dataclasses) has no file
                    continue
                if marker in text:
                    return c
    msg = f"{marker!r} not found in any function of portattn"
    raise LookupError(msg)


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
    last = first + hi - 1
    lines_ = f"line {last}" if hi - lo == 1 else f"lines {first + lo} to {last}"
    title = f"{where}, {lines_}"
    return f'```python linenums="{first + lo}" title="{title}"\n{text}\n```\n'
