"""Context parallelism on torch.distributed (gloo, CPU): time, balance, bytes and memory per rank.

Run as ``python benchmarks/parallel.py`` (``python benchmarks/run.py --only
parallel``, which ``nox -s bench`` runs too). Writes
``benchmarks/results/parallel.json``.

Two measurements, each one group of processes started here (a ``file://``
store in a temporary folder, gloo on the loopback interface, one torch
thread per rank):

- ``speed`` (P=2, forward, causal, float32, B=1, H=8, d=64): per round, in
  this order and in the same processes, rank 0 alone runs
  :func:`portattn.attention` (blockwise) on the whole sequence with 2
  threads while rank 1 waits at a barrier ("one process"), then both ranks
  run :func:`portattn.parallel.attention` with ring/zigzag, ring/contiguous,
  all-gather and Ulysses. A case's time is the slowest rank's; ratios are
  against "one process" of the same round, and the record keeps the median.
  Each rank's visible tiles, its busy time and the bytes it sent are kept too.
- ``memory`` (P=4, forward + backward, causal): each strategy in fresh
  processes; each rank's resident high-water mark above what it held
  before the call (``/proc/self/clear_refs``), against the size of its own
  q, k, v shards.

Record: ``{date, machine, load_before, load_after, speed: {n, world, rounds,
cases: {name: {median_s, ratio_vs_one_process, rank_s, tiles, bytes_sent,
kv_bytes}}}, memory: {n, world, rows: [{strategy, peak_bytes (per rank),
shard_bytes}]}, skipped}``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
H, D = 8, 64
CASES = {  # name: (strategy, layout); "one process" is the whole sequence on rank 0
    "ring zigzag": ("ring", "zigzag"),
    "ring contiguous": ("ring", "contiguous"),
    "allgather": ("allgather", "zigzag"),
    "ulysses": ("ulysses", "zigzag"),
}


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def _inputs(n: int, *, grad: bool = False) -> tuple[Any, Any, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    return tuple(  # type: ignore[return-value]
        torch.randn(1, H, n, D, generator=g).requires_grad_(grad) for _ in range(3)
    )


def _speed_rank(rank: int, world: int, n: int, rounds: int) -> dict[str, Any]:
    """Every round: one process on rank 0 (2 threads), then each strategy on every rank."""
    import torch
    import torch.distributed as dist

    import portattn as pa
    from portattn import parallel

    q, k, v = _inputs(n)
    mine = {
        name: tuple(parallel.shard(x, rank=rank, world=world, layout=lay) for x in (q, k, v))
        for name, (_, lay) in CASES.items()
    }
    times: dict[str, list[float]] = {"one process": [], **{c: [] for c in CASES}}
    busy: dict[str, list[float]] = {c: [] for c in CASES}
    facts: dict[str, Any] = {}
    for i in range(rounds + 1):  # round 0 warms up (first-call setup), and is not kept
        if i == 1:
            times = {name: [] for name in times}
            busy = {name: [] for name in busy}
        dist.barrier()
        if rank == 0:
            torch.set_num_threads(2)
            t0 = time.perf_counter()
            pa.attention(q, k, v, causal=True, impl="blockwise")
            times["one process"].append(time.perf_counter() - t0)
            torch.set_num_threads(1)
        dist.barrier()  # rank 1 waits here, idle, while rank 0 runs alone
        for name, (strategy, layout) in CASES.items():
            dist.barrier()
            t0 = time.perf_counter()
            parallel.attention(*mine[name], causal=True, strategy=strategy, layout=layout)
            mine_s = time.perf_counter() - t0
            slowest = torch.tensor([mine_s], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[name].append(float(slowest))
            busy[name].append(mine_s)
            s = parallel.last_stats()
            assert s is not None
            kv = mine[name][1]
            facts[name] = {
                "tiles": s.tiles,
                "pairs": s.pairs,
                "hidden": s.hidden,
                "bytes_sent": s.bytes_sent,
                "kv_bytes": 2 * kv.numel() * kv.element_size() * world,
            }
    return {"times": times, "busy": busy, "facts": facts}


def _memory_rank(rank: int, world: int, n: int, strategy: str) -> dict[str, Any]:
    """This rank's resident high-water mark over one forward + backward, above its inputs."""
    import torch

    from portattn import parallel

    torch.set_num_threads(1)
    small = tuple(parallel.shard(x, rank=rank, world=world) for x in _inputs(64 * world))
    warm = [x.detach().requires_grad_(True) for x in small]
    parallel.attention(*warm, causal=True, strategy=strategy).sum().backward()  # lazy setup
    q, k, v = (
        parallel.shard(x.detach(), rank=rank, world=world).requires_grad_(True) for x in _inputs(n)
    )
    d_out = torch.ones_like(q)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark restarts from the current resident size
    base = _status("VmRSS:")
    parallel.attention(q, k, v, causal=True, strategy=strategy).backward(d_out)
    peak = _status("VmHWM:") - base
    return {"peak_bytes": peak, "shard_bytes": 3 * q.numel() * q.element_size()}


def _rank_main(argv: list[str]) -> None:
    """``--rank R --world P --store URL --task speed|memory:STRATEGY --n N --rounds K --out F``."""
    import torch
    import torch.distributed as dist

    a = dict(zip(argv[::2], argv[1::2], strict=True))
    rank, world, n = int(a["--rank"]), int(a["--world"]), int(a["--n"])
    torch.set_num_threads(1)
    dist.init_process_group(
        init_method=a["--store"], rank=rank, world_size=world, timeout=dt.timedelta(seconds=600)
    )
    task = a["--task"]
    if task == "speed":
        got = _speed_rank(rank, world, n, int(a["--rounds"]))
    else:
        got = _memory_rank(rank, world, n, task.split(":")[1])
    Path(f"{a['--out']}.{rank}").write_text(json.dumps(got))
    dist.barrier()
    dist.destroy_process_group()


def _group(world: int, task: str, n: int, rounds: int = 1, timeout: float = 3000) -> list[Any]:
    """Run ``task`` on ``world`` fresh ranks of this script; every rank's result, in rank order."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        out = f"{folder}/result"
        argv = [sys.executable, __file__, "--rank"]
        rest = ["--world", str(world), "--store", f"file://{folder}/store", "--task", task]
        rest += ["--n", str(n), "--rounds", str(rounds), "--out", out]
        procs = [subprocess.Popen([*argv, str(r), *rest], env=env) for r in range(world)]
        end = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(1.0, end - time.monotonic()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]


def speed(n: int, rounds: int, world: int = 2) -> dict[str, Any]:
    ranks = _group(world, "speed", n, rounds)
    times = ranks[0]["times"]
    one = times["one process"]
    cases: dict[str, Any] = {
        "one process": {"median_s": statistics.median(one), "ratio_vs_one_process": 1.0}
    }
    for name in CASES:
        ratios = [t / o for t, o in zip(times[name], one, strict=True)]
        cases[name] = {
            "median_s": statistics.median(times[name]),
            "ratio_vs_one_process": statistics.median(ratios),
            "ratios": ratios,
            "rank_s": [statistics.median(r["busy"][name]) for r in ranks],
            **{
                key: [r["facts"][name][key] for r in ranks]
                for key in ("tiles", "pairs", "hidden", "bytes_sent", "kv_bytes")
            },
        }
        print(f"N={n} P={world} {name:16s} x{cases[name]['ratio_vs_one_process']:.2f}")
    return {"n": n, "world": world, "rounds": rounds, "H": H, "d": D, "cases": cases}


def memory(n: int, world: int = 4) -> dict[str, Any]:
    rows = []
    for strategy in ("ring", "allgather", "ulysses"):
        ranks = _group(world, f"memory:{strategy}", n)
        rows.append(
            {
                "strategy": strategy,
                "peak_bytes": [r["peak_bytes"] for r in ranks],
                "shard_bytes": ranks[0]["shard_bytes"],
            }
        )
        print(f"N={n} P={world} {strategy:10s} peak per rank {rows[-1]['peak_bytes']}")
    return {"n": n, "world": world, "rows": rows}


def run(
    out: Path, *, n: int = 16384, memory_n: int = 32768, rounds: int = 3, note: str = ""
) -> dict[str, Any]:
    """Both measurements into ``out/parallel.json``; ``note`` says why sizes were cut."""
    from core import load, machine

    record: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": load(),
        "speed": speed(n, rounds),
        "memory": memory(memory_n),
        "load_after": load(),
        "skipped": [note] if note else [],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "parallel.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out / 'parallel.json'}")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16384, help="sequence length of the timings")
    parser.add_argument("--memory-n", type=int, default=32768, help="sequence length, memory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--note", default="", help="why this run's sizes differ from the issue's")
    args = parser.parse_args()
    run(args.out, n=args.n, memory_n=args.memory_n, rounds=args.rounds, note=args.note)


if __name__ == "__main__":
    if "--rank" in sys.argv:
        _rank_main(sys.argv[1:])
    else:
        sys.path.insert(0, str(HERE))
        main()
