"""The typed API, as a user's type checker sees it.

A user's snippet (the plain call, ``return_lse``, a layer, mods and a block
mask) must pass ``mypy --strict`` and ``pyright --strict`` with 0 errors, and
a wrong use (``.shape`` on the ``return_lse=True`` pair, an unknown
``causal``) must be reported by both, or the first check proves nothing.
``typing.get_type_hints`` must work on every public callable, so that
runtime tools (dataclass-like validators, documentation generators,
``help``) can read the annotations.

The checkers run in a subprocess on files written to a temporary folder,
against the portattn being tested (installed, or the clone's ``src``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import portattn

GOOD = """\
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

import portattn as pa

q = np.ones((1, 2, 8, 4), dtype=np.float32)

out = pa.attention(q, q, q, causal=True)
shape: tuple[int, ...] = out.shape

out2, lse = pa.attention(q, q, q, return_lse=True)
both: tuple[tuple[int, ...], tuple[int, ...]] = (out2.shape, lse.shape)

flag = bool(q.size)
either = pa.attention(q, q, q, return_lse=flag)
pair = pa.attention_varlen(
    q[0], q[0], q[0], cu_seqlens_q=[0, 2], cu_seqlens_k=[0, 2], return_lse=True
)
packed, packed_lse = pair
weights = pa.attention_weights(q, q, causal="bottom_right")
merged, merged_lse = pa.merge_attention([out2], [lse])


def shifted(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return score + 0.5 * (q_idx - kv_idx)


bm = pa.create_block_mask(
    pa.and_masks(pa.mods.causal, pa.mods.sliding_window(4)), None, None, 8, 8, block_size=4
)
modded = pa.attention(q, q, q, score_mod=shifted, block_mask=bm)
alibi = pa.attention(q, q, q, score_mod=pa.mods.alibi(pa.mods.alibi_slopes(2)))

mha = pa.MultiHeadAttention.random(8, 2, seed=0)
y = mha(np.ones((3, 5, 8), dtype=np.float32), causal=True)
head = pa.Head.random(8, 4, seed=0)
z: npt.NDArray[Any] = np.asarray(head(np.ones((5, 8), dtype=np.float32)))
print(shape, both, either, packed.shape, packed_lse.shape, weights.shape)
print(merged.shape, merged_lse.shape, modded.shape, alibi.shape, y.shape, z.shape)
"""

# Each line is one wrong use; both checkers must report an error on each.
BAD = """\
import numpy as np

import portattn as pa

q = np.ones((1, 2, 8, 4), dtype=np.float32)
pair = pa.attention(q, q, q, return_lse=True)
cu = [0, 2]
packed = pa.attention_varlen(q[0], q[0], q[0], cu_seqlens_q=cu, cu_seqlens_k=cu, return_lse=True)
print(pair.shape)
print(pa.attention(q, q, q, causal="lower"))
print(packed.ndim)
"""
BAD_LINES = (9, 10, 11)

# What the snippet leans on that the checkers need not read: large, and
# not what is being checked.
SKIPPED = ("torch", "jax", "dask", "distributed", "transformers", "array_api_strict", "cupy")


def _tool(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (the lint group; `nox -s tests` installs it)")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the two snippets and both checkers' configurations."""
    root = tmp_path_factory.mktemp("typing")
    (root / "good.py").write_text(GOOD)
    (root / "bad.py").write_text(BAD)
    src = Path(portattn.__file__).resolve().parents[1]
    installed = "site-packages" in src.parts or "dist-packages" in src.parts
    extra = [] if installed else [str(src)]
    skipped = ",".join(f"{name}.*" for name in SKIPPED)
    mypy_ini = ["[mypy]", "strict = True", "follow_imports = silent"]
    if extra:
        mypy_ini.append(f"mypy_path = {extra[0]}")
    mypy_ini += [f"[mypy-{skipped}]", "follow_imports = skip", "ignore_missing_imports = True"]
    (root / "mypy.ini").write_text("\n".join(mypy_ini) + "\n")
    pyright = {
        "typeCheckingMode": "strict",
        "extraPaths": extra,
        "pythonVersion": f"{sys.version_info.major}.{sys.version_info.minor}",
        "exclude": ["**/.mypy_cache"],
    }
    (root / "pyrightconfig.json").write_text(json.dumps(pyright))
    return root


def _mypy(project: Path) -> str:
    cmd = [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-pretty"]
    return _run(cmd, project)


def _pyright(project: Path) -> str:
    return _run([sys.executable, "-m", "pyright", "--pythonpath", sys.executable], project)


def _run(cmd: list[str], project: Path) -> str:
    """Both snippets in one run of the checker (its start-up dominates); its whole report."""
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    got = subprocess.run(
        [*cmd, "good.py", "bad.py"], cwd=project, capture_output=True, text=True, env=env
    )
    assert got.returncode in (0, 1), got.stdout + got.stderr  # 1: errors found; else it broke
    return got.stdout


CHECKERS = {"mypy": _mypy, "pyright": _pyright}


@pytest.fixture(scope="module", params=list(CHECKERS))
def report(request: pytest.FixtureRequest, project: Path) -> str:
    """What mypy --strict or pyright --strict says about the two snippets."""
    _tool(request.param)
    return CHECKERS[request.param](project)


def _lines_with_errors(output: str, name: str) -> set[int]:
    """Line numbers of the errors both checkers print as ``.../name:LINE:... error``."""
    found = set()
    for line in output.splitlines():
        _, _, rest = line.strip().partition(f"{name}:")
        number = rest.split(":", 1)[0]
        if number.isdigit() and "error" in rest:
            found.add(int(number))
    return found


def test_a_users_snippet_type_checks_strictly(report: str) -> None:
    assert _lines_with_errors(report, "good.py") == set(), report


def test_wrong_uses_are_reported(report: str) -> None:
    assert _lines_with_errors(report, "bad.py") == set(BAD_LINES), report


def test_the_snippet_runs() -> None:
    """What the checkers accept is code that runs, on NumPy alone."""
    exec(compile(GOOD, "good.py", "exec"), {"__name__": "snippet"})


# --- get_type_hints on every public callable ------------------------------------------

PUBLIC_MODULES = ("portattn", "portattn.mods", "portattn.parallel", "portattn.testing")


def _public_callables() -> list[tuple[str, object]]:
    """Every callable a public module exports, and every public method of the classes."""
    found: list[tuple[str, object]] = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            label = f"{module_name}.{name}"
            if not callable(obj):
                continue
            found.append((label, obj))
            if inspect.isclass(obj):
                found += [(f"{label}.{attr}", fn) for attr, fn in _methods(obj)]
    return found


def _methods(cls: type) -> list[tuple[str, object]]:
    out = []
    for attr in dir(cls):
        if attr.startswith("_") and attr not in ("__init__", "__call__"):
            continue
        raw = inspect.getattr_static(cls, attr)
        if isinstance(raw, (classmethod, staticmethod)):
            raw = raw.__func__
        elif isinstance(raw, property):
            raw = raw.fget
        if callable(raw) and (getattr(raw, "__module__", None) or "").startswith("portattn"):
            out.append((attr, raw))
    return out


PUBLIC = _public_callables()


def test_every_public_module_is_covered() -> None:
    labels = {label for label, _ in PUBLIC}
    assert len(PUBLIC) > 80, len(PUBLIC)
    for must in ("portattn.attention", "portattn.MultiHeadAttention.random", "portattn.mods.alibi"):
        assert must in labels


@pytest.mark.parametrize(("label", "fn"), PUBLIC, ids=[label for label, _ in PUBLIC])
def test_get_type_hints_works(label: str, fn: object) -> None:
    hints = typing.get_type_hints(fn)
    assert "return" in hints or inspect.isclass(fn) or label.endswith("__init__"), hints


def test_the_return_type_follows_return_lse() -> None:
    """Read at runtime too: attention's overloads say Array for False, a pair for True."""
    overloads = typing.get_overloads(portattn.attention) if sys.version_info >= (3, 11) else []
    if not overloads:
        pytest.skip("typing.get_overloads needs Python 3.11")
    returns = {
        str(typing.get_type_hints(o)["return_lse"]): typing.get_type_hints(o)["return"]
        for o in overloads
    }
    assert returns["typing.Literal[False]"] is typing.Any
    assert returns["typing.Literal[True]"] == tuple[typing.Any, typing.Any]
