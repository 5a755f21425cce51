"""Context parallelism on a JAX mesh: 4 simulated CPU devices, in a subprocess.

``XLA_FLAGS=--xla_force_host_platform_device_count=4`` must be set before JAX
is imported, so ``tests/parallel/jax_worker.py`` runs every case in a fresh
interpreter: ``portattn.parallel.attention`` inside ``jax.shard_map`` under
``jax.jit``, ``jax.grad`` through it, against ``pa.attention`` on the whole
sequence in float64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import needs

pytestmark = pytest.mark.parallel

WORKER = Path(__file__).parent / "parallel" / "jax_worker.py"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    needs("jax", "jax")
    out = tmp_path_factory.mktemp("cpjax") / "result.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out)],
        env=env,
        timeout=600,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.exists(), done.stdout + done.stderr
    got: dict[str, Any] = json.loads(out.read_text())
    assert "crash" not in got, got["crash"]
    return got


def test_four_simulated_devices(results: dict[str, Any]) -> None:
    assert results["devices"] == 4


def test_exact_with_jax_grad(results: dict[str, Any]) -> None:
    """Output, lse and jax.grad of q, k, v, sinks and captured slopes to 1e-12 (float64)."""
    cases = {k: v for k, v in results.items() if k not in ("devices", "errors")}
    assert len(cases) >= 8
    for name, errs in cases.items():
        for what, err in errs.items():
            assert err < 1e-12, f"{name}: {what} off by {err}"
        if "everything" in name:
            assert {"dsinks", "dslopes"} <= set(errs), name


def test_bad_axis_and_group_are_named(results: dict[str, Any]) -> None:
    e = results["errors"]
    assert "expected axis_name= for JAX arrays" in e["no_axis"]
    assert "got 'y'" in e["wrong_axis"]
    assert "expected group=None for JAX arrays" in e["group"]
    assert "P=4" in e["ulysses"] and "H=3" in e["ulysses"], e["ulysses"]
