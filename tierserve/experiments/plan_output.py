"""What a plan row implies and how a plan is checked: the vLLM launch per replica, plan.json with one scenario
YAML per ranked row (its reproduction), and verification of the chosen fleet and its next-cheaper neighbour at
new seeds. Split from `plan` (the search) along the seam between finding a plan and using it."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tierserve.core import ConfigError
from tierserve.experiments.plan import (
    PRICE_SOURCE, SCHEDULER_CLS, Fleet, Plan, PlanMix, Probe, probe_fleet, scenario_for,
)


# ---- what a row implies ----------------------------------------------------------------------------------------
def vllm_args(mix: PlanMix, fleet: Fleet) -> str:
    """The vLLM launch of one replica of this fleet (run `replicas` of them behind the cluster policy)."""
    from tierserve.hardware.specs import engine_defaults, get_model
    from tierserve.policies.local import LOCAL_POLICIES
    local, _, glob = fleet.stack.partition("+")
    cls = LOCAL_POLICIES.get_class(local)
    budget, seqs = (engine_defaults(fleet.gpu) if getattr(cls, "follows_engine_defaults", False)
                    else (cls.default_token_budget, cls.default_max_num_seqs))
    spec = get_model(mix.model)
    hf = next((a for a in spec.aliases if "/" in a), spec.name)
    conf = json.dumps({"tierserve": {"policy": local}})
    return (f"vllm serve {hf} --tensor-parallel-size {fleet.tp} --max-num-batched-tokens {budget} "
            f"--max-num-seqs {seqs} --scheduler-cls {SCHEDULER_CLS} --additional-config '{conf}'"
            f"  # ×{fleet.replicas}, routed by {glob}")


def write_plan(plan: Plan, outdir: str | Path) -> dict[str, Path]:
    """plan.json (every probe, ranked rows, extras) and one scenario YAML per ranked row (its reproduction),
    through the output layer: under the folder's lock, each file written atomically in place (plan.json names
    the rows by their final paths), then `publish_in_place` removes the previous plan's files this one does not
    write (no old row YAML beside a new plan.json) and writes manifest.json last."""
    from tierserve.core.outputs import MANIFEST_JSON, FolderLock, publish_in_place, read_manifest
    out = Path(outdir)
    (out / "rows").mkdir(parents=True, exist_ok=True)
    with FolderLock(out):
        old = read_manifest(out)
        (out / MANIFEST_JSON).unlink(missing_ok=True)      # while the files change, the folder vouches for nothing
        paths = _write_plan_files(plan, out)
        publish_in_place(out, [str(p.relative_to(out)) for p in paths], old)
    return {"plan": out / "plan.json", "rows": out / "rows"}


def _write_plan_files(plan: Plan, out: Path) -> list[Path]:
    import yaml

    from tierserve.core.outputs import write_text_atomic
    files = []
    rows = []
    for i, p in enumerate(plan.ranked, 1):
        cfg = scenario_for(plan.mix, p.fleet)
        f = out / "rows" / f"{i:02d}_{p.fleet.gpu}_tp{p.fleet.tp}_{p.fleet.stack.replace('+', '__')}_r{p.fleet.replicas}.yaml"
        files.append(write_text_atomic(f, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)))
        rows.append({**_probe_dict(p), "rank": i, "scenario": str(f), "reproduce": reproduce_command(plan, f),
                     "vllm": vllm_args(plan.mix, p.fleet), "headroom": plan.headroom.get(p.fleet.label(), {})})
    doc = {"mix": plan.mix.model_dump(mode="json"), "price_source": PRICE_SOURCE, "rows": rows,
           "probes": [_probe_dict(p) for p in plan.all_probes()],
           "pareto": [_probe_dict(p) for p in plan.pareto()],
           "skipped": [{"gpu": s.gpu, "tp": s.tp, "stack": s.stack, "why": s.skipped} for s in plan.searches
                       if s.best is None],
           "pool_per_class": [{"tier": t, **(_probe_dict(s.best) if s and s.best else {"missing": True})}
                              for t, s in plan.pool_per_class],
           "burst": plan.burst, "overflow": plan.overflow, "hourly_replicas": plan.hourly, "wall_s": plan.wall_s}
    return [*files, write_text_atomic(out / "plan.json", json.dumps(_no_nan(doc), indent=1) + "\n")]


def reproduce_command(plan: Plan, scenario_file: Path) -> str:
    seeds = plan.mix.search.seeds
    return (f"tierserve simulate -c {scenario_file} --seed {seeds[0]} --seeds {len(seeds)} --steady-state")


def _probe_dict(p: Probe) -> dict[str, Any]:
    return {"gpu": p.fleet.gpu, "tp": p.fleet.tp, "stack": p.fleet.stack, "replicas": p.fleet.replicas,
            "gpus": p.fleet.gpus, "cost_usd_h": p.cost_usd_h, "passes": p.passes, "attainment": p.attainment,
            "goals": p.goals, "worst_margin": p.worst_margin, "seeds_run": p.seeds_run,
            "stable_seeds": p.stable_seeds, "clear_miss": p.clear_miss}


def _no_nan(x: Any) -> Any:
    import numpy as np
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_no_nan(v) for v in x]
    return x


# ---- checking a plan -------------------------------------------------------------------------------------------
@dataclass
class Verification:
    role: str                      # "plan" or "next-cheaper neighbour"
    probe: Probe


def verify_plan(plan: Plan, seeds: Sequence[int] = (100, 101, 102), executor: str = "process",
                workers: int | None = None) -> list[Verification]:
    """The chosen fleet and its next-cheaper neighbour (`next_cheaper`) at seeds the search never used, every seed run (no early stop): the plan should meet every tier, the neighbour miss one."""
    from tierserve.experiments.runs import run_many
    chosen = plan.chosen
    if chosen is None:
        raise ConfigError("plan", "no passing fleet", "a plan with a chosen fleet to verify")
    fleets = [("plan", chosen.fleet)]
    neighbour = next_cheaper(plan)
    if neighbour is not None:
        fleets.append(("next-cheaper neighbour", neighbour))
    data = plan.mix.model_dump(mode="json")
    probes = run_many(verify_job, [{"mix": data, "fleet": asdict(f), "seeds": list(seeds)} for _, f in fleets],
                      executor=executor, workers=workers, progress=False)
    return [Verification(role, p) for (role, _), p in zip(fleets, probes)]


def next_cheaper(plan: Plan) -> Fleet | None:
    """The dearest probed fleet that costs less than the plan (any configuration; ties: the larger margin),
    else the plan's configuration with one replica fewer; None for a single replica with nothing cheaper."""
    chosen = plan.chosen
    assert chosen is not None
    cheaper = [p for p in plan.all_probes() if p.cost_usd_h < chosen.cost_usd_h]
    if cheaper:
        return max(cheaper, key=lambda p: (p.cost_usd_h, p.worst_margin)).fleet
    f = chosen.fleet
    return Fleet(f.gpu, f.tp, f.stack, f.replicas - 1) if f.replicas > 1 else None


def verify_job(mix: dict[str, Any], fleet: dict[str, Any], seeds: list[int]) -> Probe:
    return probe_fleet(PlanMix.model_validate(mix), Fleet(**fleet), seeds, None)


def check_outcome(checks: Sequence[Verification]) -> tuple[bool, str]:
    """Did the check hold — the plan meets every tier at the new seeds and its neighbour misses at least one —
    and a line saying how."""
    plan = next(c.probe for c in checks if c.role == "plan")
    nb = next((c.probe for c in checks if c.role != "plan"), None)
    short = [t for t, a in plan.attainment.items() if not math.isnan(a) and a < plan.goals[t]]
    line = (f"the plan ({plan.fleet.label()}) meets every tier at seeds it was not searched on"
            if plan.passes else f"the plan ({plan.fleet.label()}) misses "
            + (", ".join(short) if short else f"stability ({plan.stable_seeds}/{plan.seeds_run} seeds stable)"))
    if nb is None:
        return plan.passes, line + "; it has no cheaper neighbour (one replica, nothing cheaper probed)"
    missed = [t for t, a in nb.attainment.items() if not math.isnan(a) and a < nb.goals[t]]
    why = (", ".join(f"{t} {100 * nb.attainment[t]:.1f}% < {100 * nb.goals[t]:.0f}%" for t in missed) if missed
           else f"stability ({nb.stable_seeds}/{nb.seeds_run} seeds stable)")
    line += (f"; the next-cheaper neighbour ({nb.fleet.label()}) misses: {why}" if not nb.passes else
             f"; but the next-cheaper neighbour ({nb.fleet.label()}) meets every tier too")
    return plan.passes and not nb.passes, line
