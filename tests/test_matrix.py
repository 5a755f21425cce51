"""The backend matrix itself: asked-for backends never skip, unknown names are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import portattn as pa

TESTS = Path(__file__).parent


def _pytest(backends: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PORTATTN_BACKENDS": backends}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(TESTS / "test_softmax_masks.py"),
            "-k",
            "bad_axis",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=TESTS.parent,
        timeout=300,
        check=False,
    )


@pytest.mark.slow  # among the default run's slowest (10-50 s); tests-extra runs it
def test_requested_backend_that_cannot_run_fails_the_run():
    # torch is importable here, but asking for its CUDA device on a machine
    # without one must fail, and the reason must be printed.
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present, so torch_cuda can run")
    run = _pytest("numpy,torch_cuda")
    assert run.returncode == 1, run.stdout
    assert "backend 'torch_cuda' was requested in PORTATTN_BACKENDS but cannot run" in run.stdout
    assert "no CUDA device available" in run.stdout
    assert "1 passed" in run.stdout  # numpy still ran


def test_unknown_backend_name_is_a_usage_error():
    run = _pytest("numpy,jaxx")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "unknown backends ['jaxx']" in run.stdout + run.stderr


@pytest.mark.parametrize("module", [np, torch])
def test_xp_accepts_library_modules(module):
    m = pa.causal_mask(2, 3, xp=module)
    assert type(m).__module__.split(".")[0] == module.__name__
    head = pa.Head.random(3, 2, xp=module)
    assert type(head.wq).__module__.split(".")[0] == module.__name__
