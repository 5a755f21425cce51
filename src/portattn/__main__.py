"""``python -m portattn``: the chapter's results, computed on every installed backend."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from . import __version__, chapter
from ._lib._backends import BACKENDS, load
from ._lib._convert import to_numpy
from ._lib._terminal import heatmap

__all__ = ["available_backends", "heatmap", "main"]

# Every library of the shared backend list; read-only NumPy is the same library.
_CANDIDATES = tuple(b.name for b in BACKENDS if not b.variant)


# How to get each backend, for the report's "not available" line.
INSTALL_HINTS = {
    "numpy": "pip install numpy",
    "torch": "pip install 'portattn[torch]'",
    "torch_cuda": "a CUDA build of torch and an NVIDIA GPU",
    "cupy": "pip install 'portattn[cupy]' and an NVIDIA GPU",
    "array_api_strict": "pip install 'portattn[strict]'",
    "jax": "pip install 'portattn[jax]'",
}

DESCRIPTION = (
    "Recompute the chapter's results on every installed array library and check that they "
    "agree. The chapter is the first page of portattn's teaching site (docs/chapter.md in the "
    "source): why scores are divided by sqrt(d), why order is invisible to attention, and what "
    "a causal mask changes."
)
EPILOG = (
    "more: 'python -m portattn hf' runs a tiny random Hugging Face model with portattn as its "
    "attention and prints its heatmaps (needs portattn[transformers]; 'hf --help'). "
    "NO_COLOR (no-color.org) turns colour off, as --no-color does."
)


def available_backends(
    names: Sequence[str] = _CANDIDATES,
) -> tuple[list[tuple[str, ModuleType]], list[str]]:
    """Split ``names`` into importable backends (with namespaces) and missing ones (with why).

    Each missing one says why and how to get it.
    """
    found, missing = [], []
    for name in names:
        try:
            found.append((name, load(name).xp))
        except Exception as exc:  # ImportError, no device, a broken CUDA install
            why = exc if isinstance(exc, RuntimeError) else type(exc).__name__
            hint = INSTALL_HINTS.get(name)
            missing.append(f"{name} ({why}; {hint})" if hint else f"{name} ({why})")
    return found, missing


def use_color(*, no_color_flag: bool, stream: object) -> bool:
    """Colour only on a terminal, and never with --no-color or a non-empty NO_COLOR."""
    if no_color_flag or os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def verdict(weights: Sequence[tuple[str, object]], missing: Sequence[str]) -> str:
    """The closing line: which backends agree on the demo's weights, and what to run next."""
    names = [n for n, _ in weights]
    arrays = [to_numpy(w) for _, w in weights]
    worst = max((float(abs(a - arrays[0]).max()) for a in arrays[1:]), default=0.0)
    nxt = (
        f"next: {INSTALL_HINTS[missing[0].split()[0]]} to compare one more"
        if missing and missing[0].split()[0] in INSTALL_HINTS
        else "next: 'python -m portattn hf' for a Hugging Face model, or read the chapter"
    )
    if len(names) == 1:
        return f"verdict: ran on {names[0]} alone, nothing to compare with; {nxt}"
    if worst <= 1e-5:
        return f"verdict: {', '.join(names)} agree (largest difference {worst:.1e}); {nxt}"
    return (
        f"verdict: the backends DISAGREE by up to {worst:.1e} ({', '.join(names)}); please report"
    )


def _report(name: str, xp: ModuleType, *, color: bool) -> str:
    out = [f"== backend: {name} =="]
    out.append("Why divide by sqrt(d): mean largest weight per query (uniform = 1/6 = 0.167)")
    out.append(f"{'d':>6} {'unscaled':>10} {'scaled':>10}")
    for row in chapter.scaling_table(xp=xp):
        out.append(f"{row.d:>6} {row.unscaled:>10.3f} {row.scaled:>10.3f}")
    perm = chapter.permutation_check(xp=xp)
    out.append(
        f"Order is invisible: attention(x[{list(perm.perm)}]) vs attention(x)[{list(perm.perm)}]: "
        f"max |diff| = {perm.max_abs_diff:.3g} ({perm.max_ulp:.0f} ULP)"
    )
    caus = chapter.causality_check(xp=xp)
    out.append(
        f"Causality: last token multiplied by -{caus.factor:g}; changed bits in earlier rows: "
        f"with mask {list(caus.changed_bits_masked)}, without {list(caus.changed_bits_unmasked)}"
    )
    tokens = chapter.DEMO_TOKENS
    for causal in (True, False):
        w = to_numpy(chapter.demo_weights(tokens, causal=causal, xp=xp))
        out.append(
            f"\nWho attends to whom, causal mask {'ON' if causal else 'OFF'} (rows = queries):"
        )
        out.append(heatmap(tokens, w, color=color))
        out.append(chapter.describe_row(tokens, w, 2))
    return "\n".join(out)


# What a shell reports for a process ended by SIGPIPE (128 + 13), as `yes | head -1` does.
EXIT_CLOSED_PIPE = 141
EXIT_WRITE_ERROR = 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m portattn``.

    Output problems end the program without a traceback: a reader that goes
    away (``python -m portattn | head -1``) ends it quietly with status 141,
    like a program killed by SIGPIPE; any other failure to write (standard
    output closed with ``>&-``, a full disk as with ``>/dev/full``) prints
    one line to standard error and returns 1.
    """
    try:
        if sys.stdout is None:  # started with stdout closed: Python leaves it as None
            raise OSError(errno.EBADF, "standard output is closed")
        code = _main(argv)
        sys.stdout.flush()  # a write error in the buffer surfaces here, not at exit
    except BrokenPipeError:
        _detach_stdout()
        return EXIT_CLOSED_PIPE
    except OSError as exc:
        _detach_stdout()
        reason = exc.strerror or str(exc)
        if sys.stderr is not None:
            print(f"python -m portattn: cannot write the report: {reason}", file=sys.stderr)
        return EXIT_WRITE_ERROR
    return code


def _detach_stdout() -> None:
    """Point stdout at /dev/null so that Python's final flush has nowhere to fail."""
    stream = sys.stdout
    if stream is None:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        return


def _main(argv: Sequence[str] | None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    if args_in[:1] == ["hf"]:  # a tiny Hugging Face model (needs portattn[transformers])
        try:
            from .integrations.transformers import main as hf_main
        except ImportError as exc:
            print(exc, file=sys.stderr)
            return 2
        return hf_main(args_in[1:])
    parser = argparse.ArgumentParser(
        prog="python -m portattn", description=DESCRIPTION, epilog=EPILOG
    )
    parser.add_argument("--version", action="version", version=f"portattn {__version__}")
    parser.add_argument(
        "--backend",
        action="append",
        choices=_CANDIDATES,
        help="run only on this backend (repeatable); default: every installed one",
    )
    parser.add_argument("--no-color", action="store_true", help="plain text heatmaps")
    args = parser.parse_args(args_in)
    found, missing = available_backends(args.backend or _CANDIDATES)
    if args.backend and missing:
        print(f"requested backend(s) not available: {', '.join(missing)}", file=sys.stderr)
        return 2
    color = use_color(no_color_flag=args.no_color, stream=sys.stdout)
    print("portattn: the single-head chapter, recomputed")
    print("(the chapter: the first page of portattn's teaching site, docs/chapter.md)")
    print(
        f"backends: {', '.join(n for n, _ in found)}"
        + (f"; not available: {', '.join(missing)}" if missing else "")
    )
    for name, xp in found:
        print()
        print(_report(name, xp, color=color))
    demo = [(n, chapter.demo_weights(chapter.DEMO_TOKENS, causal=False, xp=xp)) for n, xp in found]
    print()
    print(verdict(demo, missing) if demo else "verdict: no backend could run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
