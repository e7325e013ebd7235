"""The replica executor and cluster: exact skip-ahead, invariants, determinism, rejection."""
from __future__ import annotations

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.core import Request, Status
from tierserve.policies.local import LOCAL_POLICIES
from tierserve.sim import ClusterConfig, simulate

BASELINES = ["vllm", "vllm_priority", "vllm_v0", "sarathi", "orca", "llumlet"]


def per_request(result):
    return [(s.id, s.status, s.replica, s.dispatch_s, s.first_token_s, s.finish_s, s.num_generated,
             s.num_preemptions, s.tbt_max_s) for s in result.states]


@pytest.mark.parametrize("policy", BASELINES)
def test_skip_ahead_gives_identical_per_request_results(policy):
    reqs = make_requests(400, rate=30.0, num_tiers=3)
    results = []
    for skip in (True, False):
        cfg = ClusterConfig(num_replicas=2, local_policy=policy, skip_ahead=skip, cluster_policy="jsq",
                            replica={"num_blocks": 600})
        results.append(simulate(cfg, reqs, 3, predictor=LinearPredictor()))
    skipped, stepped = results
    assert per_request(skipped) == per_request(stepped)
    assert skipped.duration_s == stepped.duration_s
    assert [h.counts for h in skipped.tbt_by_tier] == [h.counts for h in stepped.tbt_by_tier]
    # Skipping must actually skip: far fewer events than iterations.
    assert skipped.stats["events"] < stepped.stats["events"]


@pytest.mark.parametrize("policy", BASELINES)
def test_every_request_finishes_and_all_kv_is_returned_under_memory_pressure(policy):
    reqs = make_requests(300, rate=40.0)
    cfg = ClusterConfig(num_replicas=2, local_policy=policy, replica={"num_blocks": 300})
    res = simulate(cfg, reqs, predictor=LinearPredictor())
    assert len(res.states) == len(reqs)
    for s in res.states:
        assert s.status in (Status.FINISHED, Status.REJECTED)
        if s.status == Status.FINISHED:
            assert s.num_generated == s.request.output_tokens     # each token produced once
            assert s.num_blocks == 0
            assert s.request.arrival_s <= s.first_token_s <= s.finish_s
        else:
            assert s.id in res.reasons
    assert res.stats["kv_utilization_max"] <= 1.0
    if policy in ("vllm", "vllm_v0"):
        assert res.stats["preemptions"] > 0      # the pressure was real


def test_same_config_and_seed_give_identical_output_files(tmp_path):
    from tierserve.experiments.scenario import ScenarioConfig, run_scenario, write_result
    cfg = ScenarioConfig.from_dict({"seed": 7, "workload": {"num_requests": 300}})
    a = write_result(run_scenario(cfg), tmp_path / "a")
    b = write_result(run_scenario(cfg), tmp_path / "b")
    for name in a:
        assert a[name].read_bytes() == b[name].read_bytes(), name


def test_request_larger_than_kv_capacity_is_rejected_with_a_reason():
    reqs = [Request(0, 0.0, 100, 10), Request(1, 0.1, 5000, 10), Request(2, 0.2, 50, 5)]
    cfg = ClusterConfig(num_replicas=1, replica={"num_blocks": 64})      # 1,024 tokens
    res = simulate(cfg, reqs, predictor=LinearPredictor())
    assert [s.status for s in res.states] == [Status.FINISHED, Status.REJECTED, Status.FINISHED]
    assert "KV capacity" in res.reasons[1] and "5010" in res.reasons[1]


def test_time_limit_censors_the_rest_and_counts_everyone():
    reqs = make_requests(200, rate=50.0)
    cfg = ClusterConfig(num_replicas=1, time_limit_s=2.0)
    res = simulate(cfg, reqs, predictor=LinearPredictor())
    assert len(res.states) == 200
    censored = [s for s in res.states if s.status not in (Status.FINISHED, Status.REJECTED)]
    assert censored and all(s.id in res.reasons for s in censored)


def test_unsorted_requests_are_refused():
    reqs = [Request(0, 1.0, 10, 2), Request(1, 0.5, 10, 2)]
    with pytest.raises(ValueError, match="sorted by arrival"):
        simulate(ClusterConfig(num_replicas=1), reqs, predictor=LinearPredictor())


def test_policy_that_overcommits_memory_is_stopped():
    from tierserve.core import BatchPlan
    from tierserve.policies.local.base import LocalPolicy, PolicyError

    class Greedy(LocalPolicy):
        def plan(self, view):
            return BatchPlan([(r, r.num_tokens - r.num_computed_tokens) for r in view.waiting + view.running])

    LOCAL_POLICIES.table["greedy_test"] = f"{__name__}:Greedy"
    globals()["Greedy"] = Greedy
    try:
        reqs = [Request(i, 0.0, 500, 5) for i in range(4)]
        cfg = ClusterConfig(num_replicas=1, local_policy="greedy_test", replica={"num_blocks": 64, "token_budget": 4096})
        with pytest.raises(PolicyError, match="KV blocks"):
            simulate(cfg, reqs, predictor=LinearPredictor())
    finally:
        del LOCAL_POLICIES.table["greedy_test"]


def test_priority_policy_serves_tier0_first_under_overload():
    reqs = make_requests(400, rate=80.0, num_tiers=3)
    cfg = ClusterConfig(num_replicas=1, local_policy="vllm_priority", replica={"num_blocks": 400})
    res = simulate(cfg, reqs, 3, predictor=LinearPredictor())
    ttft = {t: sorted(s.first_token_s - s.arrival_s for s in res.states if s.tier == t) for t in range(3)}
    med = {t: v[len(v) // 2] for t, v in ttft.items()}
    assert med[0] < med[1] < med[2]


def test_swap_preemption_keeps_progress_and_costs_pcie_time():
    reqs = make_requests(300, rate=40.0)
    runs = {}
    for mode in ("recompute", "swap"):
        cfg = ClusterConfig(num_replicas=1, local_policy="vllm", local_policy_params={"preempt_mode": mode},
                            replica={"num_blocks": 300})
        runs[mode] = simulate(cfg, reqs, predictor=LinearPredictor())
    for res in runs.values():
        assert all(s.status == Status.FINISHED and s.num_generated == s.request.output_tokens for s in res.states)
        assert res.stats["preemptions"] > 0
    # Swapped requests keep their computed tokens, so fewer iterations recompute prompts.
    assert runs["swap"].stats["iterations"] != runs["recompute"].stats["iterations"]


def test_swap_mode_skip_ahead_is_exact_too():
    reqs = make_requests(300, rate=40.0)
    out = []
    for skip in (True, False):
        cfg = ClusterConfig(num_replicas=1, local_policy="vllm", local_policy_params={"preempt_mode": "swap"},
                            skip_ahead=skip, replica={"num_blocks": 300})
        out.append(per_request(simulate(cfg, reqs, predictor=LinearPredictor())))
    assert out[0] == out[1]


def test_llumlet_promotion_keeps_skip_ahead_exact_and_lifts_starved_tiers():
    reqs = make_requests(400, rate=70.0, num_tiers=3)
    out = {}
    for promote in (None, 0.5):
        for skip in (True, False):
            cfg = ClusterConfig(num_replicas=1, local_policy="llumlet", skip_ahead=skip,
                                local_policy_params={"promote_after_s": promote}, replica={"num_blocks": 400})
            out[promote, skip] = simulate(cfg, reqs, 3, predictor=LinearPredictor())
    for promote in (None, 0.5):
        assert per_request(out[promote, True]) == per_request(out[promote, False])

    def worst_tier2_ttft(res):
        return max(s.first_token_s - s.arrival_s for s in res.states if s.tier == 2)
    assert worst_tier2_ttft(out[0.5, True]) < worst_tier2_ttft(out[None, True])
