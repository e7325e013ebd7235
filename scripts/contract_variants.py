"""Compare variants of the `tierserve` stack on the default scenario (the burst included, whole run), one
change at a time: per-tier SLO attainment, mean ± 95% over the seeds, each seed's figures and verdicts.

    python scripts/contract_variants.py '{"base": [{}, {}], "redispatch": [{}, {"redispatch": true}]}' [0,1,2]

The argument maps a label to [local_policy_params, cluster_policy_params]; the runs are those of
`tierserve reproduce contract`'s default section (`experiments.contract.scenario_run`).
"""
from __future__ import annotations

import json
import sys

from tierserve.experiments.contract import TIERSERVE, default_scenario, scenario_run, stack_config, summarise_runs


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    variants = json.loads(sys.argv[1])
    seeds = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "0,1,2").split(",")]
    base = default_scenario(3000)
    for label, (local, cluster) in variants.items():
        cfg = stack_config(base, TIERSERVE, local, cluster).model_dump(mode="json")
        runs = [scenario_run(cfg, s, None, True) for s in seeds]
        out = summarise_runs(runs)
        tiers = " ".join(f"{t} {100 * v['attainment']['mean']:.2f}% ± {100 * (v['attainment']['half_width'] or 0):.2f}"
                         for t, v in out["tiers"].items())
        per_seed = [[round(100 * r["tiers"][t]["attainment"], 2) for t in r["tiers"]] for r in runs]
        print(f"{label}: {tiers}; goodput {out['all']['goodput']['mean']:.2f} req/s; per seed {per_seed}; "
              f"verdicts {out['verdicts']}", flush=True)


if __name__ == "__main__":
    main()
