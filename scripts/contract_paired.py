"""Two stacks on the default scenario (the burst included, whole run), seed by seed: per-tier SLO attainment
and the paired difference A − B per tier, mean ± 95% Student-t half-width over the seeds.

    python scripts/contract_paired.py tierserve+tierserve niyama+deadline_slack 0-9

The runs are those of `tierserve reproduce contract`'s default section (`experiments.contract.scenario_run`).
"""
from __future__ import annotations

import sys

from tierserve.experiments.contract import default_scenario, scenario_run, stack_config
from tierserve.metrics.stability import mean_ci95


def seeds_from(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def attainment_pct(stack: str, seed: int) -> dict[str, float]:
    cfg = stack_config(default_scenario(3000), stack).model_dump(mode="json")
    run = scenario_run(cfg, seed, None, True)
    return {t: 100 * v["attainment"] for t, v in run["tiers"].items()}


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    a, b, seeds = sys.argv[1], sys.argv[2], seeds_from(sys.argv[3])
    diffs: dict[str, list[float]] = {}
    for seed in seeds:
        att_a, att_b = attainment_pct(a, seed), attainment_pct(b, seed)
        cells = []
        for t in att_a:
            diffs.setdefault(t, []).append(att_a[t] - att_b[t])
            cells.append(f"{t} {att_a[t]:.2f} vs {att_b[t]:.2f}")
        print(f"seed {seed}: " + "; ".join(cells), flush=True)
    for t, d in diffs.items():
        iv = mean_ci95(d)
        below = sum(1 for x in d if x < 0)
        print(f"{t}: {a} − {b} = {iv.mean:+.2f} ± {iv.half_width:.2f} points (95%, paired, {len(d)} seeds; "
              f"{below} seeds below)")


if __name__ == "__main__":
    main()
