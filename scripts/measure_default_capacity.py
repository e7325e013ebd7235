"""Measure the capacity of the default scenario's FCFS baseline (vllm + round_robin), from which the
default workload's rate is set (ρ = 0.9) — rerun after changing the default cluster, workload or model.

    python scripts/measure_default_capacity.py [--stack vllm+round_robin] [--executor serial]

Capacity = the highest Poisson rate at which every tier meets its SLO attainment goal and the run is stable
(tierserve.experiments.capacity), found by the one search of the default mix that `tierserve reproduce
contract` also runs for every stack (`tierserve.experiments.contract.DEFAULT_MIX_SEARCH`: its seeds, run
lengths, range and tolerance), so the committed constant and the study's FCFS row are the same measurement.
Prints the bisection bracket, the stability verdicts of the probes, and the seed interval (`goal_interval`).
"""
from __future__ import annotations

import argparse
import time

from tierserve.experiments.contract import DEFAULT_MIX_SEARCH, FCFS, default_mix_capacity, goal_interval


def _r(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default=FCFS)
    ap.add_argument("--executor", default="process")
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"search: {DEFAULT_MIX_SEARCH}")
    cap = default_mix_capacity(args.stack, DEFAULT_MIX_SEARCH, executor=args.executor)
    print(cap)
    for rate in sorted(cap.runs):
        print(f"  probe {rate:.3f} req/s: " + "; ".join(r.verdict_line() for r in cap.runs[rate])
              + f" ({', '.join(str(r.num_requests) for r in cap.runs[rate])} requests)")
    gi = goal_interval(cap)
    for p in gi["probes"]:
        tiers = ", ".join(f"{t} {100 * v['mean']:.2f}% ± {100 * v['half_width']:.2f}" for t, v in p["tiers"].items())
        mark = "clearly passes" if p["clear_pass"] else "clearly fails" if p["clear_fail"] else "undecided"
        print(f"  {p['rate']:.3f} req/s: {tiers} ({'stable' if p['stable'] else 'unstable'}; {mark})")
    print(f"{args.stack} capacity {cap.rate:.2f} req/s, bracket [{cap.interval[0]:.2f}, {cap.interval[1]:.2f}), "
          f"seed interval [{_r(gi['passes'])}, {_r(gi['fails'])}] (stable-only {cap.stable_rate:.2f}); searched in "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
