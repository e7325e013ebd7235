"""`tierserve plan`: the cheapest fleet meeting every tier, found by doubling then bisection on replicas."""
from __future__ import annotations

import json

import pytest

from tierserve.core import ConfigError
from tierserve.experiments.plan import Fleet, PlanMix, probe_fleet
from tierserve.experiments.plan_whatif import burst_job, overflow_rules, plan_fleet
from tierserve.experiments.plan_output import vllm_args, write_plan

SLOS = [{"ttft_s": 0.5, "tbt_s": 0.05, "attainment": 0.99}, {"ttft_s": 1.5, "tbt_s": 0.1, "attainment": 0.95},
        {"ttlt_s": 60.0, "attainment": 0.9}]


def small_mix(**over) -> PlanMix:
    data = {"name": "t", "rate": 10.0,
            "workload": {"num_requests": 300, "tiers": {"num_tiers": 3, "mix": "weights", "weights": [0.2, 0.5, 0.3],
                                                        "slos": SLOS}},
            "search": {"gpus": ["A100-80GB"], "tp": [1], "stacks": ["vllm_priority+round_robin"], "seeds": [0, 1]},
            "burst": {"factor": 3.0, "start_s": 10.0, "length_s": 8.0, "after_s": 15.0, "overflow_factors": [1.5]}}
    data.update(over)
    return PlanMix.from_dict(data)


@pytest.fixture(scope="module")
def plan():
    return plan_fleet(small_mix(), executor="serial", progress=False, extras=False)


def test_plan_is_the_fewest_replicas_that_pass(plan):
    chosen = plan.chosen
    assert chosen is not None and chosen.passes
    assert all(a >= chosen.goals[t] for t, a in chosen.attainment.items())
    probed = {p.fleet.replicas: p for p in plan.all_probes()}
    r = chosen.fleet.replicas
    assert r > 1, "the small mix should need more than one A100"
    assert not probed[r - 1].passes                   # bisection checked one fewer, and it misses
    assert chosen.cost_usd_h == pytest.approx(r * small_mix().price("A100-80GB"))
    assert plan.pareto()[-1].worst_margin >= plan.pareto()[0].worst_margin


def test_plan_file_has_rows_with_their_reproduction(plan, tmp_path):
    paths = write_plan(plan, tmp_path)
    doc = json.loads(paths["plan"].read_text())
    row = doc["rows"][0]
    assert row["replicas"] == plan.chosen.fleet.replicas and row["passes"]
    assert "tierserve simulate -c" in row["reproduce"] and (tmp_path / "rows").is_dir()
    assert "--scheduler-cls tierserve.engines.vllm.scheduler.TierScheduler" in row["vllm"]
    assert len(doc["probes"]) == len(plan.all_probes())


def test_vllm_args_follow_the_gpu_defaults():
    mix = small_mix()
    a100 = vllm_args(mix, Fleet("A100-80GB", 2, "vllm_priority+round_robin", 3))
    assert "--tensor-parallel-size 2" in a100 and "--max-num-batched-tokens 2048" in a100 and "×3" in a100
    assert "--max-num-batched-tokens 8192" in vllm_args(mix, Fleet("H100-80GB", 1, "vllm+round_robin", 1))
    assert "--max-num-batched-tokens 512" in vllm_args(mix, Fleet("A100-80GB", 1, "sarathi+round_robin", 1))


def test_a_clear_miss_stops_after_one_seed():
    p = probe_fleet(small_mix(), Fleet("A100-80GB", 1, "vllm_priority+round_robin", 1), [0, 1, 2], clear_miss=0.1)
    assert p.clear_miss and p.seeds_run == 1 and not p.passes


def test_burst_names_the_tier_that_breaks_first_and_its_overflow():
    mix = small_mix()
    data = mix.model_dump(mode="json")
    fleet = {"gpu": "A100-80GB", "tp": 1, "stack": "vllm_priority+round_robin", "replicas": 2}
    b = burst_job(data, fleet, 3.0)
    assert b["breaks_first"] in b["tiers"]
    broken = b["tiers"][b["breaks_first"]]
    assert broken["window_attainment"] < broken["goal"]
    rules = overflow_rules({3.0: b}, {t: v["goal"] for t, v in b["tiers"].items()}, 8.0)
    assert rules[b["breaks_first"]]["beyond"]["factor"] == 3.0
    assert sum(rules[b["breaks_first"]]["beyond"][k] for k in ("late", "relegated", "rejected", "censored")) > 0


@pytest.mark.parametrize("over, field", [({"rate": -1}, "rate"), ({"search": {"gpus": ["V100"]}}, "gpu"),
                                         ({"prices": {"A100-80GB": "cheap"}}, "prices"),
                                         ({"workload": {"arrivals": {"kind": "poisson", "rate": 1}}}, "arrivals"),
                                         ({"search": {"stacks": ["vllm"]}}, "stacks")])
def test_bad_mix_names_the_field(over, field):
    with pytest.raises(ConfigError, match=field):
        mix = small_mix(**over)
        plan_fleet(mix, executor="serial", progress=False, extras=False)


def test_the_plan_check_holds_at_new_seeds(plan):
    from tierserve.experiments.plan_output import check_outcome, next_cheaper, verify_plan
    checks = verify_plan(plan, seeds=(100, 101), executor="serial")
    assert [c.role for c in checks] == ["plan", "next-cheaper neighbour"]
    assert checks[1].probe.fleet == next_cheaper(plan)
    assert all(c.probe.seeds_run == 2 for c in checks)           # every seed run, no early stop
    ok, line = check_outcome(checks)
    assert checks[0].probe.passes and not checks[1].probe.passes and ok, line
    assert "misses" in line
    fake = [checks[0], type(checks[1])("next-cheaper neighbour", checks[0].probe)]   # a neighbour that passes
    assert check_outcome(fake)[0] is False
