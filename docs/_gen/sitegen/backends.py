"""Which array libraries this build can see, and how closely each agrees with a float64 reference.

Run while the site builds, in whatever environment builds it: a backend that
is missing here is listed as missing, with the reason, never left out.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

import portattn as pa
from portattn.testing import backends, load_backend, max_relative_error

from .i18n import translate


@dataclass
class Backend:
    """One library on one device, or the reason it is not here."""

    name: str
    device_label: str
    package: str  # distribution whose version is reported
    dtypes: tuple[str, ...] = ()
    xp: Any = None
    device: Any = None
    missing: str | None = None
    convert: Callable[[np.ndarray, Any], Any] = field(default=lambda a, dt: a, repr=False)

    @property
    def version(self) -> str:
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return "—"


@cache
def discover() -> tuple[Backend, ...]:
    """Every library portattn knows (the shared backend list), present or not, in a fixed order."""
    out: list[Backend] = []
    for spec in backends():
        if spec.variant:
            continue
        try:
            got = load_backend(spec.name)
        except ImportError:
            out.append(_entry(spec, missing="not installed"))
            continue
        except RuntimeError as exc:
            out.append(_entry(spec, missing=f"{exc} here"))
            continue

        def convert(a: np.ndarray, dt: str, got: Any = got) -> Any:
            return got.xp.astype(got.from_numpy(np.asarray(a)), getattr(got.xp, dt))

        out.append(_entry(spec, xp=got.xp, device=got.device, convert=convert))
    return tuple(out)


def _entry(spec: Any, **kwargs: Any) -> Backend:
    return Backend(spec.label, spec.device_label, spec.distribution, spec.dtypes, **kwargs)


# Sizes small enough for a docs build, large enough to exercise broadcasting,
# the causal triangle and several key blocks of the blockwise path.
SHAPE = {"batch": 2, "lq": 24, "lk": 24, "d": 16, "dv": 8}
BLOCK = (8, 8)


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to ``dtype`` and back to float64, so the reference sees the same inputs."""
    if dtype == "bfloat16":
        # NumPy has no bfloat16: keep the top 16 bits of the float32, rounding
        # to nearest even. The result is exactly representable in bfloat16, so
        # every backend then receives it without a second rounding.
        bits = a.astype(np.float32).view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
            0xFFFF0000
        )
        return bits.view(np.float32).astype(np.float64)
    return a.astype(dtype).astype(np.float64)


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool) -> np.ndarray:
    """The textbook formula in float64 NumPy, written independently of portattn."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


CHECKS = (
    ("no mask", {"causal": False}),
    ("causal", {"causal": True}),
    ("causal, blockwise", {"causal": True, "impl": "blockwise", "block_size": BLOCK}),
)


@cache
def agreement() -> tuple[tuple[Backend, str | None, dict[str, float | str]], ...]:
    """``(backend, dtype, {check: max relative error})`` per backend and dtype.

    A check that raises is reported with the exception's type in place of
    the error, so the table shows the failure instead of hiding the backend.
    """
    rng = np.random.Generator(np.random.PCG64(2017))
    b, lq, lk, d, dv = (SHAPE[k] for k in ("batch", "lq", "lk", "d", "dv"))
    base = {
        "q": rng.standard_normal((b, lq, d)),
        "k": rng.standard_normal((b, lk, d)),
        "v": rng.standard_normal((b, lk, dv)),
    }
    rows: list[tuple[Backend, str | None, dict[str, float | str]]] = []
    for be in discover():
        if be.missing:
            rows.append((be, None, {}))
            continue
        for dt in be.dtypes:
            exact = {n: _rounded(a, dt) for n, a in base.items()}
            q, k, v = (be.convert(exact[n], dt) for n in ("q", "k", "v"))
            errors: dict[str, float | str] = {}
            for label, kwargs in CHECKS:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        out = pa.attention(q, k, v, **kwargs)
                except Exception as exc:
                    first = str(exc).splitlines()[0] if str(exc) else ""
                    errors[label] = f"{type(exc).__name__}: {first}"
                    continue
                want = reference(exact["q"], exact["k"], exact["v"], causal=kwargs["causal"])
                errors[label] = max_relative_error(out, want)
            rows.append((be, dt, errors))
    return tuple(rows)


EPS = {
    "float16": float(np.finfo(np.float16).eps),
    "bfloat16": 2.0**-7,
    "float32": float(np.finfo(np.float32).eps),
    "float64": float(np.finfo(np.float64).eps),
}


_WORDS = {
    "en": {
        "head": "| backend | dtype | {checks} | worst, in eps |",
        "absent": "**not present**",
        "fails": "**fails**",
        "failures": "Failures on this table, with the first line of each error:",
        "none": "No backend was measured.",
        "worst": "The worst entry on the table is {r:.2g} epsilons of its dtype "
        "({name} on {device}, `{dt}`, {check}).",
        "no mask": "no mask",
        "causal": "causal",
        "causal, blockwise": "causal, blockwise",
    },
    "ja": {
        "head": "| バックエンド | dtype | {checks} | 最悪値(eps 単位) |",
        "absent": "**存在しない**",
        "fails": "**失敗**",
        "failures": "この表での失敗と、それぞれのエラーの1行目:",
        "none": "測ったバックエンドがない。",
        "worst": "表の中で最悪の値は、その dtype のイプシロンの {r:.2g} 倍だった"
        "({name}、{device}、`{dt}`、{check})。",
        "no mask": "マスクなし",
        "causal": "因果マスク",
        "causal, blockwise": "因果マスク、blockwise",
    },
}
# Why a backend is absent, as discover() says it, on the Japanese page.
_MISSING_JA = (
    ("not installed", "インストールされていない"),
    ("no CUDA device available here", "この計算機には CUDA デバイスがない"),
)


def _missing(reason: str, lang: str) -> str:
    return translate(reason, _MISSING_JA, lang)


def agreement_markdown(*, lang: str = "en") -> str:
    """The agreement table: maximum relative error against float64 per backend and dtype."""
    words = _WORDS[lang]
    head = words["head"].format(checks=" | ".join(words[c] for c, _ in CHECKS))
    lines = [head, "|---|---|" + "---:|" * (len(CHECKS) + 1)]
    failures: dict[str, str] = {}
    for be, dt, errors in agreement():
        who = (
            f"{be.name} {be.version}, {be.device_label}"
            if not be.missing
            else (f"{be.name}, {be.device_label}")
        )
        if dt is None:
            rest = " | ".join("—" for _ in CHECKS)
            lines.append(
                f"| {who} | {words['absent']}: {_missing(be.missing, lang)} | {rest} | — |"
            )
            continue
        cells = []
        for check, _ in CHECKS:
            e = errors[check]
            if isinstance(e, str):
                failures.setdefault(f"{be.name}, {words[check]}", e)
                cells.append(f"{words['fails']} (`{e.split(':')[0]}`)")
            else:
                cells.append(f"{e:.1e}")
        measured = [e for e in errors.values() if not isinstance(e, str)]
        worst = f"{max(measured) / EPS[dt]:.2g}" if measured else "—"
        lines.append(f"| {who} | `{dt}` | {' | '.join(cells)} | {worst} |")
    out = "\n".join(lines) + "\n"
    if failures:
        out += f"\n{words['failures']}\n\n"
        out += "".join(f"- {where}: `{what}`\n" for where, what in failures.items())
    return out


def support_markdown(*, lang: str = "en") -> str:
    """The home page's support matrix: what portattn supports, and what this build found."""
    nox_session = {
        "NumPy": "`tests-backend(numpy)`",
        "PyTorch": "`tests-backend(torch)`",
        "array-api-strict": "`tests-backend(strict)`",
        "CuPy": "`tests-cupy`",
        "JAX": "`tests-backend(jax)`",
    }
    head = {
        "en": "| library | device | dtypes | tested by | in the build of this site |",
        "ja": "| ライブラリ | デバイス | dtype | 検査するセッション | このサイトのビルド環境 |",
    }
    absent = {"en": "not present ({})", "ja": "なし({})"}[lang]
    lines = [head[lang], "|---|---|---|---|---|"]
    for be in discover():
        session = nox_session[be.name]
        if be.name == "PyTorch" and be.device_label == "CUDA":
            session = "`tests-torch-cuda`"
        here = absent.format(_missing(be.missing, lang)) if be.missing else be.version
        dts = ", ".join(be.dtypes)
        lines.append(f"| {be.name} | {be.device_label} | {dts} | {session} | {here} |")
    return "\n".join(lines) + "\n"


def permutation_rows() -> list[tuple[str, str, Any]]:
    """``(backend, dtype, PermutationReport)`` for every present CPU backend in float32/64."""
    from portattn import chapter

    out = []
    for be in discover():
        if be.missing or be.device_label != "CPU":
            continue
        for dt in ("float32", "float64"):
            if dt not in be.dtypes:
                continue
            dtype = getattr(be.xp, dt)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out.append((be.name, dt, chapter.permutation_check(xp=be.xp, dtype=dtype)))
    return out


def worst_in_eps(*, lang: str = "en") -> str:
    """The largest error on the agreement table, in epsilons of its dtype, as a sentence."""
    worst = None
    for be, dt, errors in agreement():
        for check, e in errors.items():
            if dt is None or isinstance(e, str):
                continue
            r = e / EPS[dt]
            if worst is None or r > worst[0]:
                worst = (r, be, dt, check)
    if worst is None:
        return _WORDS[lang]["none"]
    r, be, dt, check = worst
    return _WORDS[lang]["worst"].format(
        r=r, name=be.name, device=be.device_label, dt=dt, check=_WORDS[lang][check]
    )
