"""Every docstring example runs on NumPy alone (a plain ``pip install portattn``).

The ``tests`` session runs the doctests in an environment that has every
library; this test runs them again with the optional libraries made
unimportable, through the standard library's :mod:`doctest` (what
``python -m doctest`` runs), in a subprocess. A module that needs an
optional library to import at all (the torch autograd adapter, the
transformers integration, ...) is skipped, with its examples: that is the
only way an optional library may appear in an example.
"""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = (
    "torch",
    "jax",
    "jaxlib",
    "dask",
    "distributed",
    "array_api_strict",
    "transformers",
    "cupy",
    "ndonnx",
    "onnxruntime",
    "matplotlib",
)

RUNNER = """
import doctest, importlib, importlib.abc, json, pkgutil, sys

BLOCKED = set(sys.argv[1].split(","))


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


sys.meta_path.insert(0, Block())
import portattn

report = {"skipped": {}, "failed": {}, "attempted": 0, "modules": 0}
names = ["portattn"] + [m.name for m in pkgutil.walk_packages(portattn.__path__, "portattn.")]
for name in names:
    if name == "portattn.__main__":
        continue
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # ModuleNotFoundError, or an adapter naming its extra
        if (exc.name or "").split(".")[0] not in BLOCKED:
            raise
        report["skipped"][name] = exc.name
        continue
    result = doctest.testmod(module, verbose=False, report=False)
    report["attempted"] += result.attempted
    report["modules"] += 1
    if result.failed:
        report["failed"][name] = result.failed
heavy = sorted(BLOCKED & set(sys.modules))
report["imported"] = heavy
print(json.dumps(report))
"""


def test_every_example_runs_on_numpy_alone():
    got = subprocess.run(
        [sys.executable, "-c", RUNNER, ",".join(OPTIONAL)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert got.returncode == 0, got.stderr[-4000:]
    report = json.loads(got.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}, got.stdout[-4000:]
    assert report["imported"] == []
    # the modules skipped are the adapters of an optional library, and only they
    allowed = ("._grad._torch", "._grad._jax", ".integrations.", ".parallel._", "._paths._dask")
    wrong = [m for m in report["skipped"] if not any(a in m for a in allowed)]
    assert wrong == [], report["skipped"]
    assert report["attempted"] > 60, report  # the examples did run
