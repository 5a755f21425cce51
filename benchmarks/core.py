"""What the CPU and GPU benchmarks share: the method, the machine, and the record's row schema.

``run.py`` (CPU, ``nox -s bench``) and ``gpu.py`` import this module; each
keeps only what differs on its device (CUDA events and synchronisation,
tracemalloc against the device allocator, which subjects exist).

Method: every subject at one point is timed in the same rounds, interleaved,
so that load from other processes hits peers alike; ratios are taken within
a run, and the chapter's ratios within one round (see :func:`per_call`).

Record rows (``throughput``, ``training``, ``memory``) name their subject
twice: ``subject``, the label shown in tables and legends, and the fields of
:class:`Subject` (``library``, ``impl``, ``kind``, ``setting``), which is what
readers such as the docs' Performance page group by. Nothing needs to parse
the label.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

B, H, D = 1, 8, 64  # batch, heads, head size of every throughput point
CHAPTER_SHAPE = (6, 8)  # tokens, features: the chapter's worked example

Timer = Callable[[Callable[[], Any], int], float]  # (call, reps) -> seconds per call


@dataclass(frozen=True)
class Subject:
    """What one timed call is, as fields a reader groups by.

    ``kind`` is ``"portattn"`` for a portattn call (``impl`` its ``impl=``)
    and ``"reference"`` for a peer it is held to (``impl`` ``"SDPA"`` for
    torch's kernel, ``"plain"`` for the hand-written formula). ``setting``
    names a non-default condition of the same call (``"no pool"``: NumPy's
    thread pool off), or is None.
    """

    library: str
    impl: str
    kind: Literal["portattn", "reference"] = "portattn"
    setting: str | None = None

    @property
    def label(self) -> str:
        """The row's ``subject``: ``"portattn torch blockwise"``, ``"torch SDPA"``, ..."""
        if self.kind == "reference":  # the record's labels: "torch SDPA", "plain numpy"
            head = (
                f"{self.impl} {self.library}"
                if self.impl == "plain"
                else f"{self.library} {self.impl}"
            )
        else:
            head = f"portattn {self.library} {self.impl}"
        return head if self.setting is None else f"{head}, {self.setting}"

    def fields(self) -> dict[str, Any]:
        """The row's subject columns: ``subject`` (the label) and the fields themselves."""
        return {"subject": self.label, **asdict(self)}


def sdpa(library: str = "torch") -> Subject:
    return Subject(library, "SDPA", "reference")


def plain(library: str) -> Subject:
    return Subject(library, "plain", "reference")


def gflop(n: int, causal: bool, *, heads: int = H, batch: int = B, d: int = D) -> float:
    """GFLOP of one (n x n) call: 4 B H N^2 d, halved when causal (half the pairs are hidden)."""
    flops = 4.0 * batch * heads * n * n * d
    return (flops / 2 if causal else flops) / 1e9


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict[str, Any]:
    """The host: CPU, versions, and each BLAS as threadpoolctl sees it."""
    import array_api_compat
    import numpy as np
    import torch
    from threadpoolctl import threadpool_info

    import portattn

    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "array_api_compat": array_api_compat.__version__,
        "portattn": portattn.__version__,
        "torch_threads": torch.get_num_threads(),
        "blas": [
            {k: info.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for info in threadpool_info()
            if info.get("user_api") == "blas"
        ],
        "openblas_env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
    }


def wall_time(fn: Callable[[], Any], reps: int = 1) -> float:
    """Seconds per call of ``fn`` over ``reps`` calls back to back, by ``time.perf_counter``."""
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def time_interleaved(
    funcs: Mapping[str, Callable[[], Any]],
    rounds: int,
    *,
    timers: Mapping[str, Timer] | None = None,
    pause_s: float = 0.0,
    rewarm: bool = False,
) -> dict[str, list[float]]:
    """Per round, each subject in turn: one time per subject per round.

    ``timers`` gives a subject's own timer (default :func:`wall_time`; the
    GPU's synchronises its device). With ``pause_s``, each subject starts
    after a pause; with ``rewarm``, after one untimed call: each is then
    timed in its own steady state, whatever ran before it.
    """
    timers = timers or {}
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(rounds):
        for name, f in funcs.items():
            if pause_s:
                time.sleep(pause_s)
            if rewarm:
                f()
            times[name].append(timers.get(name, wall_time)(f, 1))
    return times


def per_call(
    funcs: Mapping[str, Callable[[], Any]],
    peers: Mapping[str, str],
    *,
    rounds: int,
    loops: int,
    timers: Mapping[str, Timer] | None = None,
    pause_s: float = 0.0,
) -> dict[str, Any]:
    """Time per call of small calls, each held to its peer (``peers[name]``) by paired ratios.

    Per round, each call runs ``loops`` times back to back. A ratio is each
    round's time over its peer's in the same round (milliseconds apart), then
    the median over rounds: the machine's speed drifts between rounds (on a
    shared VM by up to 2x), and a ratio within one round cancels that drift,
    where a ratio of two medians would not.
    """
    timers = timers or {}
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(rounds):
        if pause_s:
            time.sleep(pause_s)
        for name, f in funcs.items():
            times[name].append(timers.get(name, wall_time)(f, loops))
    ratio = {
        name: statistics.median(t / p for t, p in zip(ts, times[peers[name]], strict=True))
        for name, ts in times.items()
    }
    return {
        "shape": list(CHAPTER_SHAPE),
        "loops": loops,
        "median_us": {name: statistics.median(ts) * 1e6 for name, ts in times.items()},
        "peers": dict(peers),
        "ratio_to_plain": ratio,
    }


def profile_passes(
    passes: Mapping[str, Callable[[], Any]],
    *,
    tile: list[int],
    rounds: int,
    time_pass: Callable[[Callable[[], Any]], float],
) -> dict[str, Any]:
    """One blockwise tile's passes, each timed alone: median microseconds and share of the tile.

    ``time_pass`` times one pass (the CPU takes the median of many calls, the
    GPU the mean between two synchronisations); the median over ``rounds``
    counts.
    """
    for f in passes.values():
        f()  # kernels, plans, first touch
    runs = [{name: time_pass(f) for name, f in passes.items()} for _ in range(rounds)]
    med = {name: statistics.median(r[name] for r in runs) for name in passes}
    total = sum(med.values())
    return {
        "tile": tile,
        "median_us": {k: t * 1e6 for k, t in med.items()},
        "share": {k: t / total for k, t in med.items()},
    }
