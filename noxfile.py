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

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent / "docs" / "_gen"))
from jaxcache import jax_cache_env  # shared with docs/_gen/hooks.py

nox.needs_version = ">=2025.2.9"

# Python keeps the bytecode it compiles in nox's environments. uv installs
# without .pyc files, and where PYTHONDONTWRITEBYTECODE is set (as on CI's
# machines) every process would compile torch, JAX and transformers from
# source again: collecting the default suite took 47 s of CPU that way and
# 17 s with the bytecode kept, in each xdist worker, each rank a test spawns
# and each docs build.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

PYPROJECT = nox.project.load_toml("pyproject.toml")

# torch is also the outside oracle (scaled_dot_product_attention), so every
# test environment installs it; jax, the other oracle, is in the test group.
# On CI, .ci/run pins torch's CPU wheel through PIP_CONSTRAINT/UV_CONSTRAINT;
# users elsewhere get whatever torch their installer resolves.
CPU_EXTRAS = ".[torch,jax,strict,transformers]"
# lint runs here too: mypy must see torch and transformers as the code does
# (without them, subclassing torch.autograd.Function is "subclassing Any").
CPU_GROUPS = ("test", "bench", "lint")
CPU_BACKENDS = "numpy,numpy_readonly,torch,array_api_strict,jax,jax32"

# What the default run leaves out (pyproject.toml registers the markers):
# large-N, LocalCluster and Hugging Face model suites run in tests-extra (CI
# runs it); inductor compiles run only in their own opt-in session.
DEFAULT_MARKERS = (
    "not slow and not cluster and not models and not inductor and not parallel and not examples"
)
EXTRA_MARKERS = "(slow or cluster or models or parallel) and not inductor and not examples"
IN_PROCESS_EXTRA = f"({EXTRA_MARKERS}) and not cluster and not parallel"
SPAWNING_EXTRA = f"({EXTRA_MARKERS}) and (cluster or parallel)"

_CPU_ENV: dict[str, str] = {}


def _groups(*names: str) -> list[str]:
    return [req for name in names for req in nox.project.dependency_groups(PYPROJECT, name)]


def _install(session: nox.Session, *args: str, env: dict[str, str | None] | None = None) -> None:
    # uv keeps an installed local package even when its source changed.
    fresh = ("--reinstall-package", "portattn") if session.venv_backend == "uv" else ()
    session.install(*fresh, *args, env=env)


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


def _workers() -> tuple[str, ...]:
    """pytest-xdist's workers for the default suite: one per core, four at most.

    Each worker imports torch and JAX (about 1 GB), hence the cap. On two
    quiet cores a sample of 737 tests took 72 s against 113 s in one process.
    ``nox -s tests -- -n 0`` runs in one process (the last ``-n`` wins).
    """
    cores = min(os.cpu_count() or 1, 4)
    return ("-n", str(cores)) if cores > 1 else ()


def _pytest(
    session: nox.Session, backends: str, markers: str, *, workers: tuple[str, ...] = ()
) -> None:
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
        *workers,
        *session.posargs,
        env={"PORTATTN_BACKENDS": backends, **jax_cache_env()},
    )


@_shared()
def tests(session: nox.Session) -> None:
    """Every CPU backend once (NumPy, torch, array-api-strict, JAX), compared; the doctests."""
    # The slowest tests are listed, so that the next test to mark slow is in every log.
    _pytest(session, CPU_BACKENDS, DEFAULT_MARKERS, workers=(*_workers(), "--durations=30"))
    _run(
        session,
        "-m",
        "pytest",
        "--doctest-modules",
        "--pyargs",
        "portattn",
        env=dict(jax_cache_env()),
    )


@_shared(name="tests-extra", default=False)
def tests_extra(session: nox.Session) -> None:
    """The suites kept out of the default: large N (slow), LocalCluster, HF models, ranks.

    The in-process suites spread over xdist's workers, as the default does;
    the LocalCluster and context-parallel tests start processes of their
    own, with bounded timeouts, and run one at a time after them.
    """
    _pytest(session, CPU_BACKENDS, IN_PROCESS_EXTRA, workers=_workers())
    _pytest(session, CPU_BACKENDS, SPAWNING_EXTRA)


# One backend at a time: `nox -s "tests-backend(numpy)"`, or every one in turn
# with `nox -s tests-backend`.
ONE_BACKEND = {
    "numpy": "numpy,numpy_readonly",
    "torch": "torch",
    "strict": "array_api_strict",
    "jax": "jax",
}


@_shared(name="tests-backend", default=False)
@nox.parametrize("backend", list(ONE_BACKEND), ids=list(ONE_BACKEND))
def tests_backend(session: nox.Session, backend: str) -> None:
    """The default suite on one backend: numpy (plain and read-only), torch, strict or jax."""
    _pytest(session, ONE_BACKEND[backend], DEFAULT_MARKERS)


# Every Python that pyproject.toml's classifiers list. Only a 3.11 CPU wheel of
# torch lies on CI's disk (elsewhere torch is a multi-GB CUDA download), so
# these environments have no torch: NumPy and array-api-strict run the
# default suite in full (read-only NumPy, a property of NumPy's arrays and not
# of Python, is left to `tests`), JAX runs its subset (the
# dtype-width tests marked jax32, on jax and jax32, and the cross-backend
# agreement), and the modules that import torch skip, saying so.
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
NO_TORCH_BACKENDS = "numpy,array_api_strict"
NO_TORCH_EXTRAS = ".[strict,jax]"
JAX_SUBSET = ("tests/test_cross_backend.py", "tests/test_block_mask.py", "tests/test_mods.py")


def _pyenv_pythons() -> None:
    """Put pyenv's real ``python3.X`` first on PATH, for each X in PYTHONS that pyenv holds.

    pyenv's shims answer "command not found" for every version that is not
    selected (``pyenv global``/``PYENV_VERSION``), and nox and uv would take
    that shim for the interpreter. Links in ``.nox/pythons`` name only
    ``python3.X``, so nothing else on PATH changes; the newest patch wins.
    """
    root = os.environ.get("PYENV_ROOT") or os.path.join(os.path.expanduser("~"), ".pyenv")
    links = Path(__file__).resolve().parent / ".nox" / "pythons"
    found = {}
    for minor in PYTHONS:
        pattern = os.path.join(root, "versions", f"{minor}.*", "bin", f"python{minor}")
        exact = [p for p in glob.glob(pattern) if re.search(rf"/{re.escape(minor)}\.\d+/bin/", p)]
        if exact:
            found[minor] = max(exact, key=lambda p: int(p.split("/")[-3].split(".")[2]))
    if not found:
        return
    links.mkdir(parents=True, exist_ok=True)
    for minor, real in found.items():
        link = links / f"python{minor}"
        if not link.is_symlink() or os.readlink(link) != real:
            link.unlink(missing_ok=True)
            link.symlink_to(real)
    os.environ["PATH"] = str(links) + os.pathsep + os.environ.get("PATH", "")


_pyenv_pythons()


def _no_torch_suite(session: nox.Session) -> None:
    """The default suite without torch: NumPy and array-api-strict in full, JAX's subset."""
    env = {"PORTATTN_BACKENDS": NO_TORCH_BACKENDS, **jax_cache_env()}
    session.run(
        "pytest", "tests", "--ignore=tests/site", "-m", DEFAULT_MARKERS, *session.posargs, env=env
    )
    env["PORTATTN_BACKENDS"] = "jax,jax32"
    session.run("pytest", *JAX_SUBSET, "-m", f"jax32 and ({DEFAULT_MARKERS})", env=env)
    env["PORTATTN_BACKENDS"] = "numpy,jax"
    session.run("pytest", "tests/test_cross_backend.py", "-m", DEFAULT_MARKERS, env=env)


@nox.session(name="tests-python", python=PYTHONS, default=False)
def tests_python(session: nox.Session) -> None:
    """Every supported Python: NumPy and array-api-strict in full, JAX's subset (no torch)."""
    _install(session, NO_TORCH_EXTRAS, *_groups("test"))
    _no_torch_suite(session)


@nox.session(name="tests-lowest", python=PYTHONS[0], default=False)
def tests_lowest(session: nox.Session) -> None:
    """The lower bounds pyproject.toml declares (uv --resolution lowest-direct), oldest Python."""
    if session.venv_backend != "uv":
        session.error("tests-lowest needs uv (pip cannot resolve to the lowest versions)")
    _install(session, "--resolution=lowest-direct", NO_TORCH_EXTRAS, *_groups("test"))
    _no_torch_suite(session)


@nox.session(name="tests-latest", default=False)
def tests_latest(session: nox.Session) -> None:
    """The newest releases, unpinned (torch's CUDA wheel runs on the CPU)."""
    env = {"UV_CONSTRAINT": None, "PIP_CONSTRAINT": None, **jax_cache_env()}
    _install(session, "--upgrade", CPU_EXTRAS, *_groups("test"), env=env)
    versions = "import torch, jax, transformers as t; "
    versions += "print(torch.__version__, jax.__version__, t.__version__)"
    session.run("python", "-c", versions)
    session.run(
        "pytest",
        "tests",
        "--ignore=tests/site",
        "-m",
        DEFAULT_MARKERS,
        *session.posargs,
        env={"PORTATTN_BACKENDS": "numpy,torch,jax", **jax_cache_env()},
    )


# What a built distribution must not carry (CI's machine pins, maintainer
# scripts, benchmark images) and what the wheel alone must not import.
NOT_IN_SDIST = (".ci/", "scripts/", ".png", ".github/")
IMPORT_CHECK = """
import sys, importlib.metadata as md, portattn
heavy = sorted({"torch", "jax", "dask"} & set(sys.modules))
assert not heavy, f"import portattn imported {heavy}"
wheel = md.version("portattn")
assert portattn.__version__ == wheel, (portattn.__version__, wheel)
print("portattn", wheel, "imported", len(sys.modules), "modules, none of torch/jax/dask")
"""


@nox.session(default=False)
def build(session: nox.Session) -> None:
    """sdist and wheel, twine check --strict, check-wheel-contents, the wheel alone in a venv."""
    session.install(*_groups("release"))
    tmp = Path(session.create_tmp()).resolve()
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    # The wheel is built from the sdist, so a file the sdist lacks fails here.
    session.run("python", "-m", "build", "--installer=uv", "--outdir", str(dist))
    sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        session.error(f"expected one sdist and one wheel in {dist}, got {sdists + wheels}")
    import tarfile

    with tarfile.open(sdists[0]) as tar:
        stray = [n for n in tar.getnames() if any(bad in n for bad in NOT_IN_SDIST)]
    if stray:
        session.error(f"the sdist carries files it must not: {stray}")
    version = wheels[0].name.split("-")[1]
    cited = re.search(r'^version: "(.+)"$', Path("CITATION.cff").read_text(), re.M)
    if cited is None or cited.group(1) != version:
        session.error(
            f"CITATION.cff cites version {cited and cited.group(1)}, the wheel is {version}"
        )
    if f"## [{version}]" not in Path("CHANGELOG.md").read_text():
        session.error(f"CHANGELOG.md has no section for {version}")
    session.run("twine", "check", "--strict", *map(str, sdists + wheels))
    session.run("check-wheel-contents", str(wheels[0]))
    venv = tmp / "wheel-alone"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("uv", "venv", "--quiet", "--python", sys.executable, str(venv))
    python = str(venv / "bin" / "python")
    session.run("uv", "pip", "install", "--quiet", "--python", python, str(wheels[0]))
    # Run outside the clone, so that nothing imports src/ by accident.
    with session.chdir(tmp):
        session.run(python, "-c", IMPORT_CHECK, external=True)
        session.run(python, "-m", "portattn", external=True)


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


@_shared(default=False)
def examples(session: nox.Session) -> None:
    """The context-parallel examples train as one process does (tens of minutes on 2 cores)."""
    _pytest(session, CPU_BACKENDS, "examples")


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
    session.install(".[torch,strict]", *nox.project.dependency_groups(PYPROJECT, "docs"))
    if session.posargs and session.posargs[0] == "serve":
        session.run("mkdocs", "serve", "--dev-addr", "127.0.0.1:8000", *session.posargs[1:])
        return
    session.run("mkdocs", "build", "--strict")
    # The browser test serves the site just built instead of building it again;
    # the slowest tests are listed, so that a test that slows the session shows.
    session.run(
        "pytest", "tests/site", "-p", "no:cacheprovider", "--durations=15",
        env={"PORTATTN_SITE_DIR": "site"},
    )  # fmt: skip


@_shared(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks against torch SDPA and plain NumPy; writes benchmarks/results/."""
    # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, set on some machines, slow current
    # NumPy; unset for this run only (the JSON records the BLAS kernel used).
    # (None removes a variable; leaving it out of env would inherit it.)
    unset: dict[str, str | None] = {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}
    _run(session, "benchmarks/run.py", *session.posargs, env=unset)
