"""The context-parallel examples train as one process does: the loss curves agree.

``examples/cp_llama.py`` (a tiny transformers Llama, 2 gloo ranks it starts
itself on loopback through a ``file://`` store) and ``examples/cp_jax.py`` (a
pure-JAX transformer on 4 simulated devices) each train 30 AdamW steps with
context parallelism and on one process, in float32 and float64, and write
both curves; each runs in a subprocess with a deadline and is killed at it.
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

pytestmark = [pytest.mark.parallel, pytest.mark.examples]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEADLINE = 1500  # seconds per example: a shared 2-core machine compiles and trains slowly
TOLERANCE = {"float32": 1e-5, "float64": 1e-10}


def _curves(script: str, tmp_path: Path, *extra: str) -> list[dict[str, Any]]:
    record = tmp_path / "curves.json"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "RANK", "WORLD_SIZE")}
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / script),
            "--dtype",
            "float32,float64",
            "--record",
            str(record),
        ],
        env=env,
        timeout=DEADLINE,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and record.exists(), done.stdout + done.stderr
    got: list[dict[str, Any]] = json.loads(record.read_text())
    return got


def _check(records: list[dict[str, Any]], world: int) -> None:
    assert [r["dtype"] for r in records] == ["float32", "float64"]
    for r in records:
        assert r["world"] == world and r["steps"] == 30 == len(r["cp"]) == len(r["single"])
        gaps = [abs(a - b) for a, b in zip(r["single"], r["cp"], strict=True)]
        assert max(gaps) < TOLERANCE[r["dtype"]], (r["dtype"], gaps)
        assert r["single"][-1] < r["single"][0] - 0.1, "the model should learn something"


def test_llama_two_ranks_follow_one_process(tmp_path: Path) -> None:
    needs("transformers", "torch")
    # the example kills the ranks it starts at its own deadline, before ours kills it
    _check(_curves("cp_llama.py", tmp_path, "--timeout", str(DEADLINE - 60)), world=2)


def test_jax_four_devices_follow_one_device(tmp_path: Path) -> None:
    needs("jax", "jax")
    _check(_curves("cp_jax.py", tmp_path), world=4)
