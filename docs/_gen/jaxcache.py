"""Where JAX keeps its compiled programs for portattn's tests and docs: one helper for both.

``noxfile.py`` passes :func:`jax_cache_env` to every test session and
``docs/_gen/hooks.py`` sets it before any page imports JAX. Standard library
only: nox imports it before any environment exists.
"""

from __future__ import annotations

import os

__all__ = ["jax_cache_env"]


def jax_cache_env() -> dict[str, str]:
    """The JAX_* settings keeping compiled programs in ``~/.cache/portattn/jax``, less the user's.

    JAX compiles every eager operation once per shape and dtype, and the
    suite runs hundreds of small shapes: bare nox took 783 s of CPU with this
    cache cold and 530 s warm; the docs build saves about five seconds. It
    lives outside the clone (entries are keyed by the program and the JAX
    version) so that a fresh clone finds it warm, like uv's wheels
    (``XDG_CACHE_HOME`` wins over ``~/.cache``). A JAX_* variable the user
    has set is left out, so theirs wins.
    """
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    wanted = {
        "JAX_COMPILATION_CACHE_DIR": os.path.join(home, "portattn", "jax"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    return {k: v for k, v in wanted.items() if k not in os.environ}
