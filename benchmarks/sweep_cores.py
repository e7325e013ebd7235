"""Does a >= 40-point sweep keep every core busy? Runs a sweep (2 stacks × 6 rates × 4 seeds = 48 points by
default) on the process pool and prints the pool's CPU utilisation.

    PYTHONPATH=$PWD python benchmarks/sweep_cores.py [--workers 2] [--requests 400] [--serial]

Printed: wall time; CPU seconds of the sweep's process and its workers (`SweepRun.cpu_s`, from getrusage);
utilisation = CPU seconds / (wall × workers); from psutil samples every 0.5 s, each worker's mean share of a
core and the fraction of samples in which every worker ran above half a core; the machine's load average
before and after (on a shared machine other processes take cores, which lowers utilisation without the pool
being idle). `--serial` runs the same sweep serially too and prints the speed-up and whether the two tables
are identical.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def spec(requests: int, seeds: int) -> dict:
    return {"name": "cores", "seeds": list(range(seeds)),
            "base": {"cluster": {"num_replicas": 2},
                     "workload": {"num_requests": requests, "arrivals": {"kind": "poisson", "rate": 5.0}}},
            "params": {"stack": ["vllm+round_robin", "vllm_priority+round_robin"],
                       "rate": [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]}}


class Sampler(threading.Thread):
    """CPU share of each child process of this one, every `period_s`."""

    def __init__(self, period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        import psutil
        self.me, self.period = psutil.Process(), period_s
        self.samples: list[list[float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil
        last: dict[int, float] = {}
        t_last = time.monotonic()
        while not self.stop.wait(self.period):
            now, shares, seen = time.monotonic(), [], {}
            for c in self.me.children():
                try:
                    t = c.cpu_times()
                except psutil.Error:
                    continue
                seen[c.pid] = t.user + t.system
                if c.pid in last:
                    shares.append((seen[c.pid] - last[c.pid]) / (now - t_last))
            last, t_last = seen, now
            if shares:
                self.samples.append(shares)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--requests", type=int, default=400, help="requests per point")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--serial", action="store_true", help="also run it serially (speed-up, identical tables)")
    args = ap.parse_args(argv)
    from tierserve.experiments.sweep import Sweep, read_table, run_sweep
    sweep = Sweep.from_dict(spec(args.requests, args.seeds))
    n = len(sweep.points)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        sampler = Sampler()
        sampler.start()
        pool = run_sweep(sweep, Path(tmp) / "pool", executor="process", workers=args.workers, progress=False)
        sampler.stop.set()
        sampler.join()
        load1 = os.getloadavg()
        util = pool.cpu_s / (pool.wall_s * args.workers)
        full = [s for s in sampler.samples if len(s) >= args.workers]
        per_worker = [sum(sorted(s, reverse=True)[i] for s in full) / len(full) for i in range(args.workers)] if full else []
        all_busy = sum(1 for s in full if sum(x > 0.5 for x in s) >= args.workers) / len(full) if full else 0.0
        print(f"sweep: {n} points ({' × '.join(sweep.param_names)} × {args.seeds} seeds), {args.requests} requests "
              f"each, process pool of {args.workers} workers on {os.cpu_count()} cores")
        print(f"wall {pool.wall_s:.1f} s; CPU {pool.cpu_s:.1f} s; pool CPU utilisation {util:.0%} of "
              f"{args.workers} cores")
        print(f"psutil, {len(sampler.samples)} samples of 0.5 s: workers' mean core share "
              + ", ".join(f"{x:.0%}" for x in per_worker)
              + f"; every worker above half a core in {all_busy:.0%} of the samples with {args.workers} workers")
        print(f"load average (1 min) {load0[0]:.2f} before, {load1[0]:.2f} after (other processes share the cores)")
        if args.serial:
            serial = run_sweep(sweep, Path(tmp) / "serial", executor="serial", progress=False)
            same = (json.dumps(read_table(serial.table_path), sort_keys=True, default=str)
                    == json.dumps(read_table(pool.table_path), sort_keys=True, default=str))
            print(f"serial: wall {serial.wall_s:.1f} s; speed-up {serial.wall_s / pool.wall_s:.2f}× with "
                  f"{args.workers} workers; tables identical: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
