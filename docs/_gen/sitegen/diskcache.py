"""Results that cost seconds to compute, kept between builds in ``~/.cache/portattn/<name>/``.

The key is a hash of the code that computes them: the generator's own file,
portattn's whole source, and the versions of the libraries involved. A rebuild
without changes reads the stored result; any change to the code computes it
again. The folder sits beside the JAX compilation cache (``XDG_CACHE_HOME``
wins), outside the clone, so a fresh clone of an unchanged tree finds it warm.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

import portattn


def cache_dir(name: str) -> Path:
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(home) / "portattn" / name


def code_key(*files: str | Path, libraries: tuple[str, ...] = (), extra: str = "") -> str:
    """A hash of ``files``, of portattn's source, of ``libraries``' versions and of ``extra``."""
    h = hashlib.sha256(extra.encode())
    for f in files:
        h.update(Path(f).read_bytes())
    package = Path(portattn.__file__).parent
    for src in sorted(package.rglob("*.py")):
        h.update(src.relative_to(package).as_posix().encode())
        h.update(src.read_bytes())
    for lib in libraries:
        try:
            h.update(f"{lib}=={importlib.metadata.version(lib)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{lib} missing".encode())
    return h.hexdigest()[:24]


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file, so that a build killed mid-write leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
