# /// script
# dependencies = ["nox>=2025.2.9"]
# ///
"""The test matrix: one session per backend, one where all CPU backends meet, lint, docs, bench.

``nox`` runs everything a machine without a GPU can run; the GPU sessions skip
there with the reason. Dependencies come from pyproject.toml's extras and
dependency groups, never from this file.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
TEST_GROUPS = nox.project.dependency_groups(PYPROJECT, "test")
# torch is also the outside oracle (scaled_dot_product_attention), so every
# test session installs it; jax, the other oracle, is in the test group. On
# CI, .ci/run pins torch's CPU wheel through PIP_CONSTRAINT; users elsewhere
# get whatever torch their pip resolves.
ORACLES = ".[torch]"


def _cuda_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    return subprocess.run([smi, "-L"], capture_output=True, check=False).returncode == 0


def _pytest(session: nox.Session, backends: str) -> None:
    session.run(
        "pytest",
        "tests",
        "--ignore=tests/site",
        *session.posargs,
        env={"PORTATTN_BACKENDS": backends},
    )


@nox.session(name="tests-numpy")
def tests_numpy(session: nox.Session) -> None:
    """Run the suite on NumPy (plain and read-only arrays)."""
    session.install(ORACLES, *TEST_GROUPS)
    _pytest(session, "numpy,numpy_readonly")


@nox.session(name="tests-torch")
def tests_torch(session: nox.Session) -> None:
    """Run the suite on PyTorch (CPU)."""
    session.install(ORACLES, *TEST_GROUPS)
    _pytest(session, "torch")


@nox.session(name="tests-strict")
def tests_strict(session: nox.Session) -> None:
    """Run the suite on array-api-strict, proof that only the standard is used."""
    session.install(f"{ORACLES[:-1]},strict]", *TEST_GROUPS)
    _pytest(session, "array_api_strict")


@nox.session(name="tests-all")
def tests_all(session: nox.Session) -> None:
    """All CPU backends in one environment, compared with each other; run the doctests."""
    session.install(f"{ORACLES[:-1]},strict]", *TEST_GROUPS)
    _pytest(session, "numpy,numpy_readonly,torch,array_api_strict,jax")
    session.run("pytest", "--doctest-modules", "--pyargs", "portattn", "-p", "no:cacheprovider")


@nox.session(name="tests-torch-cuda")
def tests_torch_cuda(session: nox.Session) -> None:
    """Run the suite on PyTorch CUDA; skips without an NVIDIA GPU."""
    if not _cuda_present():
        session.skip("no CUDA device available (nvidia-smi found none)")
    session.install(ORACLES, *TEST_GROUPS)
    _pytest(session, "torch_cuda")


@nox.session(name="tests-cupy")
def tests_cupy(session: nox.Session) -> None:
    """Run the suite on CuPy; skips without an NVIDIA GPU."""
    if not _cuda_present():
        session.skip("no CUDA device available (nvidia-smi found none)")
    session.install(f"{ORACLES[:-1]},cupy]", *TEST_GROUPS)
    _pytest(session, "cupy")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, mypy --strict on src."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session(default=False)
def docs(session: nox.Session) -> None:
    """Build the site strictly and test it in Chromium; ``nox -s docs -- serve`` serves it."""
    session.install(".[torch,strict,plot]", *nox.project.dependency_groups(PYPROJECT, "docs"))
    if session.posargs and session.posargs[0] == "serve":
        session.run("mkdocs", "serve", "--dev-addr", "127.0.0.1:8000", *session.posargs[1:])
        return
    session.run("mkdocs", "build", "--strict")
    # The browser test serves the site just built instead of building it again.
    session.run("pytest", "tests/site", "-p", "no:cacheprovider", env={"PORTATTN_SITE_DIR": "site"})


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks against torch SDPA and plain NumPy; writes benchmarks/results/."""
    session.install(".[torch,plot]", *nox.project.dependency_groups(PYPROJECT, "bench"))
    # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, set on some machines, slow current
    # NumPy; unset for this run only (the JSON records the BLAS kernel used).
    slow = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in slow}
    session.run("python", "benchmarks/run.py", *session.posargs, env=env)
