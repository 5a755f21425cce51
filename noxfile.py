# /// script
# dependencies = ["nox>=2025.2.9", "uv"]
# ///
"""The test matrix: a fast default, and every other suite one ``-s`` away.

``nox`` alone runs ``tests`` (every CPU backend once, compared with each
other, plus the doctests) and ``lint``: under ten minutes on two cores. The
per-backend sessions, the large-N / cluster / model suites, the inductor
suite, the docs and the benchmarks are named sessions (``nox -l`` lists
them). The GPU sessions skip there with the reason.

All CPU sessions, ``lint`` and ``bench`` run in ONE environment, ``.nox/cpu-env``
(the ``cpu-env`` session builds it, the others require it), so ``.nox``
holds one torch, not one per session. With uv installed next to nox, nox
builds environments with uv, whose cache hard-links the wheels instead of
copying them. Dependencies come from pyproject.toml's extras and dependency
groups, never from this file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

PYPROJECT = nox.project.load_toml("pyproject.toml")

# torch is also the outside oracle (scaled_dot_product_attention), so every
# test environment installs it; jax, the other oracle, is in the test group.
# On CI, .ci/run pins torch's CPU wheel through PIP_CONSTRAINT/UV_CONSTRAINT;
# users elsewhere get whatever torch their installer resolves.
CPU_EXTRAS = ".[torch,strict,plot,transformers]"
# lint runs here too: mypy must see torch and transformers as the code does
# (without them, subclassing torch.autograd.Function is "subclassing Any").
CPU_GROUPS = ("test", "bench", "lint")
CPU_BACKENDS = "numpy,numpy_readonly,torch,array_api_strict,jax,jax32"

# What the default run leaves out (pyproject.toml registers the markers):
# large-N, LocalCluster and Hugging Face model suites run in tests-extra (CI
# runs it); inductor compiles run only in their own opt-in session.
DEFAULT_MARKERS = "not slow and not cluster and not models and not inductor and not parallel"
EXTRA_MARKERS = "(slow or cluster or models or parallel) and not inductor"

_CPU_ENV: dict[str, str] = {}


def _groups(*names: str) -> list[str]:
    return [req for name in names for req in nox.project.dependency_groups(PYPROJECT, name)]


def _install(session: nox.Session, *args: str) -> None:
    # uv keeps an installed local package even when its source changed.
    fresh = ("--reinstall-package", "portattn") if session.venv_backend == "uv" else ()
    session.install(*fresh, *args)


def _cuda_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    return subprocess.run([smi, "-L"], capture_output=True, check=False).returncode == 0


@nox.session(name="cpu-env", default=False)
def cpu_env(session: nox.Session) -> None:
    """Build the one environment that the CPU test sessions and bench share."""
    _install(session, CPU_EXTRAS, *_groups(*CPU_GROUPS))
    _CPU_ENV.update(bin=session.bin, root=str(session.virtualenv.location))


def _shared(**kwargs: Any) -> Any:
    """A session that runs in cpu-env's environment instead of one of its own."""
    return nox.session(venv_backend="none", requires=["cpu-env"], **kwargs)


def _run(
    session: nox.Session,
    *args: str,
    env: dict[str, str | None] | None = None,
) -> None:
    """Run ``python *args`` in the shared environment."""
    path = _CPU_ENV["bin"] + os.pathsep + os.environ.get("PATH", "")
    python = os.path.join(_CPU_ENV["bin"], "python")
    session.run(
        python,
        *args,
        env={"VIRTUAL_ENV": _CPU_ENV["root"], "PATH": path, **(env or {})},
    )


def _jax_cache() -> dict[str, str | None]:
    """Keep JAX's compiled programs between runs, in the user's cache directory.

    JAX compiles every eager operation once per shape and dtype, and the
    suite runs hundreds of small shapes: bare nox took 783 s of CPU with this
    cache cold and 530 s warm. It lives outside the clone (entries are keyed
    by the program and the JAX version) so that a fresh clone finds it warm,
    like uv's wheels. A user's own JAX_* settings win.
    """
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    wanted = {
        "JAX_COMPILATION_CACHE_DIR": os.path.join(home, "portattn", "jax"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    return {k: v for k, v in wanted.items() if k not in os.environ}


def _pytest(session: nox.Session, backends: str, markers: str) -> None:
    # pytest's exit code 5 (the markers selected no test) fails the session:
    # a suite that silently shrank to nothing is not a pass.
    _run(
        session,
        "-m",
        "pytest",
        "tests",
        "--ignore=tests/site",
        "-m",
        markers,
        *session.posargs,
        env={"PORTATTN_BACKENDS": backends, **_jax_cache()},
    )


@_shared()
def tests(session: nox.Session) -> None:
    """Every CPU backend once (NumPy, torch, array-api-strict, JAX), compared; the doctests."""
    _pytest(session, CPU_BACKENDS, DEFAULT_MARKERS)
    _run(
        session,
        "-m",
        "pytest",
        "--doctest-modules",
        "--pyargs",
        "portattn",
        env=_jax_cache(),
    )


@_shared(name="tests-extra", default=False)
def tests_extra(session: nox.Session) -> None:
    """The suites kept out of the default: large N (slow), LocalCluster, HF models."""
    _pytest(session, CPU_BACKENDS, EXTRA_MARKERS)


@_shared(name="tests-numpy", default=False)
def tests_numpy(session: nox.Session) -> None:
    """The default suite on NumPy only (plain and read-only arrays)."""
    _pytest(session, "numpy,numpy_readonly", DEFAULT_MARKERS)


@_shared(name="tests-torch", default=False)
def tests_torch(session: nox.Session) -> None:
    """The default suite on PyTorch (CPU) only."""
    _pytest(session, "torch", DEFAULT_MARKERS)


@_shared(name="tests-strict", default=False)
def tests_strict(session: nox.Session) -> None:
    """The default suite on array-api-strict only, proof that only the standard is used."""
    _pytest(session, "array_api_strict", DEFAULT_MARKERS)


@_shared(name="tests-jax", default=False)
def tests_jax(session: nox.Session) -> None:
    """The default suite on JAX (CPU) only."""
    _pytest(session, "jax", DEFAULT_MARKERS)


# The oldest torch pyproject.toml allows: autograd behaviour that changed
# between versions (asarray(copy=True) in 2.13, setup_context, autocast's
# device-type queries) is held to the floor here. PyPI's torch 2.5.1 wheel is
# a CUDA build (906.5 MB, plus nvidia-* wheels), hence its own opt-in session.
OLDEST_TORCH = "torch==2.5.1"


@nox.session(name="tests-torch-oldest", default=False)
def tests_torch_oldest(session: nox.Session) -> None:
    """Gradients, autocast and torch.func on the oldest supported torch (a large download)."""
    _install(session, OLDEST_TORCH, ".[strict]", *_groups("test"))
    session.run(
        "pytest",
        "tests/test_grad.py",
        "tests/test_lse.py",
        "-m",
        DEFAULT_MARKERS,
        *session.posargs,
        env={"PORTATTN_BACKENDS": "numpy,torch"},
    )


@_shared(default=False)
def inductor(session: nox.Session) -> None:
    """torch.compile with inductor (about a minute per CPU compile); CI does not run it."""
    _pytest(session, "torch", "inductor")


# Without a GPU the CUDA sessions skip before building an environment.
GPU_VENV = None if _cuda_present() else "none"


def _pytest_gpu(session: nox.Session, extras: str, backend: str) -> None:
    """The default suite on one GPU backend, in the session's own environment."""
    if GPU_VENV == "none":
        session.skip("no CUDA device available (nvidia-smi found none)")
    _install(session, extras, *_groups("test"))
    session.run(
        "pytest",
        "tests",
        "--ignore=tests/site",
        "-m",
        DEFAULT_MARKERS,
        *session.posargs,
        env={"PORTATTN_BACKENDS": backend},
    )


@nox.session(name="tests-torch-cuda", venv_backend=GPU_VENV)
def tests_torch_cuda(session: nox.Session) -> None:
    """The default suite on PyTorch CUDA; skips without an NVIDIA GPU."""
    _pytest_gpu(session, ".[torch]", "torch_cuda")


@nox.session(name="tests-cupy", venv_backend=GPU_VENV)
def tests_cupy(session: nox.Session) -> None:
    """The default suite on CuPy; skips without an NVIDIA GPU."""
    _pytest_gpu(session, ".[torch,cupy]", "cupy")


@_shared()
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, mypy --strict on src."""
    _run(session, "-m", "ruff", "check", ".")
    _run(session, "-m", "ruff", "format", "--check", ".")
    _run(session, "-m", "mypy")


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


@_shared(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks against torch SDPA and plain NumPy; writes benchmarks/results/."""
    # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, set on some machines, slow current
    # NumPy; unset for this run only (the JSON records the BLAS kernel used).
    # (None removes a variable; leaving it out of env would inherit it.)
    unset: dict[str, str | None] = {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}
    _run(session, "benchmarks/run.py", *session.posargs, env=unset)
