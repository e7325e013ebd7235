"""Error rates of the work stability verdict against queues whose answer is known.

Analytic part: M/M/2 and M/G/4 with batches of 8 (lognormal sizes, CV 2, a fixed cost per batch), each under
FCFS, two-class priority, EDF and SRPF (`tierserve.experiments.queues`), at ρ = 0.8, 0.95, 1.05 and 1.2 of
their exact capacity. Every seed runs the sequential verdict (START requests, doubled while undecided, up to
MOST); false stable = judged stable at ρ > 1, false unstable = judged unstable at ρ < 1. Targets: both ≤ 5% at
ρ = 0.8 and 1.2, for every order; ρ = 0.95 and 1.05 are reported.

Simulator part (--sim): one Llama-3-8B/A100 replica under vllm (FCFS), priority, sarathi_edf and
sarathi_srpf, at ρ = 0.5 and 2 of the FCFS stack's stable-only capacity; the reference is one run of
REF requests (at least 20× the warm-up the verdict found, checked), against which the sequential verdicts of
fresh seeds are counted.

    python benchmarks/stability_verdict.py [--reps 40] [--start 2000] [--most 32000] [--sim]
"""
from __future__ import annotations

import argparse
import time

RHOS = (0.8, 0.95, 1.05, 1.2)
TARGET = 0.05


def analytic(reps: int, start: int, most: int) -> bool:
    from tierserve.experiments.queues import ORDERS, SPECS, error_rates
    print(f"work verdict, sequential {start}→{most} requests, {reps} seeds per cell")
    print(f"{'queue':<15}{'order':<10}{'rho':>6}{'false stable':>14}{'false unstable':>16}{'undecided':>11}"
          f"{'mean length':>13}{'max length':>12}")
    ok = True
    for queue in SPECS:
        for order in ORDERS:
            for rho in RHOS:
                r = error_rates(queue, order, rho, reps, start, most)
                mean = sum(r.lengths) / len(r.lengths)
                held = r.false_stable <= TARGET and r.false_unstable <= TARGET
                if rho in (0.8, 1.2) and not held:
                    ok = False
                flag = "" if rho not in (0.8, 1.2) else ("  ok" if held else "  MISSED")
                print(f"{queue:<15}{order:<10}{rho:>6.2f}{r.false_stable:>14.1%}{r.false_unstable:>16.1%}"
                      f"{r.undecided / r.reps:>11.1%}{mean:>13.0f}{max(r.lengths):>12d}{flag}")
    return ok


def simulated(reps: int, start: int, most: int, ref: int) -> bool:
    from tierserve.experiments.capacity import RunLength, ScenarioRunner, judged_run, scenario_capacity
    from tierserve.experiments.scenario import ScenarioConfig
    from tierserve.metrics.stability import STABLE, UNSTABLE
    loose = [{"ttft_s": 10.0, "attainment": 0.9}, {"ttlt_s": 600.0, "attainment": 0.9}]

    def cfg(policy: str) -> ScenarioConfig:
        return ScenarioConfig.from_dict({"cluster": {"num_replicas": 1, "local_policy": policy},
                                         "workload": {"num_requests": start,
                                                      "tiers": {"num_tiers": 2, "mix": "uniform", "slos": loose}}})
    cap = scenario_capacity(cfg("vllm"), 1.0, 32.0, seeds=(0, 1, 2), rel_tol=0.05,
                            run_length=RunLength(start, most)).stable_rate
    print(f"\nsimulator: vllm stable-only capacity {cap:.3g} req/s (1 replica); reference runs {ref} requests")
    print(f"{'policy':<14}{'rho':>5}{'reference':>11}{'warm-up share':>15}{'agree':>8}{'mean length':>13}")
    ok = True
    for policy in ("vllm", "priority", "sarathi_edf", "sarathi_srpf"):
        runner = ScenarioRunner(cfg(policy))
        for rho, truth in ((0.5, STABLE), (2.0, UNSTABLE)):
            reference = runner(rho * cap, 1000, ref).work
            long_enough = reference.warmup_fraction <= 1 / 20 or truth == UNSTABLE
            runs = [judged_run(runner, rho * cap, s, RunLength(start, most)) for s in range(reps)]
            agree = sum(r.work.verdict == truth for r in runs)
            good = reference.verdict == truth and long_enough and agree >= (1 - TARGET) * reps
            ok &= good
            mean = sum(r.num_requests for r in runs) / reps
            print(f"{policy:<14}{rho:>5.1f}{reference.verdict:>11}{reference.warmup_fraction:>15.1%}"
                  f"{agree:>5d}/{reps:<2d}{mean:>13.0f}" + ("" if good else "  MISSED"))
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--start", type=int, default=2000)
    p.add_argument("--most", type=int, default=32000)
    p.add_argument("--sim", action="store_true", help="also the simulator part")
    p.add_argument("--sim-reps", type=int, default=10)
    p.add_argument("--ref", type=int, default=20000)
    a = p.parse_args()
    t0 = time.perf_counter()
    ok = analytic(a.reps, a.start, a.most)
    if a.sim:
        ok &= simulated(a.sim_reps, 1000, 8000, a.ref)
    print(f"\n{'all targets met' if ok else 'TARGET MISSED'} ({time.perf_counter() - t0:.0f} s)")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
