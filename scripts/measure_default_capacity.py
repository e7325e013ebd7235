"""Measure the capacity of the default scenario's FCFS baseline (vllm + round_robin), from which the
default workload's rate is set (ρ = 0.9) — rerun after changing the default cluster, workload or model.

    python scripts/measure_default_capacity.py [--seeds 0,1,2] [--requests 3000]

Capacity = the highest Poisson rate at which every tier meets its SLO attainment goal and every tier's
queue is stable (tierserve.experiments.capacity), found by bisection with common random numbers.
"""
from __future__ import annotations

import argparse
import time

from tierserve.experiments.capacity import scenario_capacity
from tierserve.experiments.scenario import ScenarioConfig, baseline_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--executor", default="process")
    args = ap.parse_args()
    base = baseline_scenario()
    data = base.model_dump()
    data["workload"]["num_requests"] = args.requests
    data["workload"]["arrivals"] = {"kind": "poisson", "rate": 10.0}     # the search varies this rate
    cfg = ScenarioConfig.from_dict(data)
    t0 = time.perf_counter()
    cap = scenario_capacity(cfg, lo=4.0, hi=80.0, seeds=[int(s) for s in args.seeds.split(",")], rel_tol=0.02,
                            executor=args.executor)
    print(cap)
    print(f"stack capacity {cap.rate:.2f} req/s (stable-only {cap.stable_rate:.2f}); searched in "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
