"""The replica executor and cluster: exact skip-ahead, invariants, determinism, rejection."""
from __future__ import annotations

import pytest

from conftest import LinearPredictor, make_requests, register_stepwise
from tierserve.core import Request, Status, true_output_tokens
from tierserve.policies.local import LOCAL_POLICIES
from tierserve.sim import ClusterConfig, simulate

BASELINES = ["vllm", "vllm_priority", "vllm_priority_sorted", "vllm_v0", "sarathi", "orca", "llumlet"]


def per_request(result):
    return [(s.id, s.status, s.replica, s.dispatch_s, s.first_token_s, s.finish_s, s.num_generated,
             s.num_preemptions, s.num_swaps, s.num_migrations, s.tbt_max_s, s.attained_tokens, s.service_tokens,
             s.last_scheduled_s) for s in result.states]


def skip_and_step(reqs, num_tiers: int, policy: str, params: dict | None = None, **cfg):
    """The same run twice: with skip-ahead, and with every plan forced through the single-iteration path."""
    register_stepwise()
    params = params or {}
    skipped = simulate(ClusterConfig(local_policy=policy, local_policy_params=params, **cfg), reqs, num_tiers,
                       predictor=LinearPredictor())
    stepped = simulate(ClusterConfig(local_policy="stepwise", local_policy_params={"inner": policy, **params}, **cfg),
                       reqs, num_tiers, predictor=LinearPredictor())
    return skipped, stepped


def assert_identical(skipped, stepped) -> None:
    assert per_request(skipped) == per_request(stepped)
    # Seconds of service are summed per iteration when stepping and per run when skipping: equal to rounding.
    assert [s.service_s for s in skipped.states] == pytest.approx([s.service_s for s in stepped.states], rel=1e-9)
    assert skipped.duration_s == stepped.duration_s
    assert skipped.stats["iterations"] == stepped.stats["iterations"]
    assert [h.counts for h in skipped.tbt_by_tier] == [h.counts for h in stepped.tbt_by_tier]
    assert skipped.stats["events"] < stepped.stats["events"] / 2      # skipping really skipped


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", BASELINES)
def test_skip_ahead_equals_single_iteration_stepping(policy, mode):
    if mode == "swap" and policy not in ("vllm", "vllm_priority", "vllm_priority_sorted", "llumlet"):
        pytest.skip(f"{policy} has no swap mode")
    params = {"preempt_mode": mode} if mode == "swap" else {}
    reqs = make_requests(400, rate=30.0, num_tiers=3)
    skipped, stepped = skip_and_step(reqs, 3, policy, params, num_replicas=2, cluster_policy="jsq",
                                     replica={"num_blocks": 500, "swap_space_gib": 0.01})
    assert_identical(skipped, stepped)
    if policy in ("vllm", "vllm_priority"):
        assert skipped.stats["preemptions"] > 0         # the comparison covered preemption
    if mode == "swap" and policy == "vllm":
        assert skipped.stats["swap_outs"] > 0 and skipped.stats["swap_fallbacks"] > 0   # both swap paths ran


def test_skip_ahead_equals_stepping_under_live_migration_and_promotion():
    reqs = make_requests(600, rate=60.0, num_tiers=3)
    skipped, stepped = skip_and_step(reqs, 3, "llumlet", {"promote_after_s": 0.5}, num_replicas=4,
                                     cluster_policy="llumnix_k", cluster_policy_params={"num_tiers": 3},
                                     replica={"num_blocks": 400})
    assert_identical(skipped, stepped)
    assert skipped.stats["migrations_live_committed"] > 0 and skipped.stats["migrations_queued"] > 0


@pytest.mark.parametrize("policy", BASELINES)
def test_every_request_finishes_and_all_kv_is_returned_under_memory_pressure(policy):
    reqs = make_requests(300, rate=40.0)
    cfg = ClusterConfig(num_replicas=2, local_policy=policy, replica={"num_blocks": 300})
    res = simulate(cfg, reqs, predictor=LinearPredictor())
    assert len(res.states) == len(reqs)
    for s in res.states:
        assert s.status in (Status.FINISHED, Status.REJECTED)
        if s.status == Status.FINISHED:
            assert s.num_generated == true_output_tokens(s)     # each token produced once
            assert s.num_blocks == 0
            assert s.arrival_s <= s.first_token_s <= s.finish_s
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
        assert all(s.status == Status.FINISHED and s.num_generated == true_output_tokens(s) for s in res.states)
        assert res.stats["preemptions"] > 0
    swap, recompute = runs["swap"], runs["recompute"]
    assert swap.stats["swap_outs"] > 0 and swap.stats["swap_fallbacks"] == 0
    # Progress kept: a swapped request never computes a token twice; a recomputed one does.
    assert all(s.service_tokens == s.attained_tokens - 1 for s in swap.states)
    assert any(s.service_tokens > s.attained_tokens - 1 for s in recompute.states if s.num_preemptions)
    # PCIe time charged: every swapped block crossed twice (out and back in), at the per-block cost.
    per_block = 0.0
    from tierserve.hardware.memory import swap_time_s
    per_block = swap_time_s(1, "Llama-3-8B", "A100-80GB", 1, 16, 0.8)
    assert swap.stats["swap_blocks_out"] == swap.stats["swap_blocks_in"] > 0
    assert swap.stats["swap_pcie_s"] == pytest.approx(2 * swap.stats["swap_blocks_out"] * per_block)


def test_full_host_swap_space_falls_back_to_recompute():
    reqs = make_requests(300, rate=40.0)
    cfg = ClusterConfig(num_replicas=1, local_policy="vllm", local_policy_params={"preempt_mode": "swap"},
                        replica={"num_blocks": 300, "swap_space_gib": 0.0})
    res = simulate(cfg, reqs, predictor=LinearPredictor())
    assert res.stats["preemptions"] > 0 and res.stats["swap_outs"] == 0
    assert res.stats["swap_fallbacks"] == res.stats["preemptions"]
    assert all(s.status == Status.FINISHED for s in res.states)


def test_llumlet_promotion_lifts_starved_tiers():
    reqs = make_requests(400, rate=70.0, num_tiers=3)
    out = {}
    for promote in (None, 0.5):
        cfg = ClusterConfig(num_replicas=1, local_policy="llumlet",
                            local_policy_params={"promote_after_s": promote}, replica={"num_blocks": 400})
        out[promote] = simulate(cfg, reqs, 3, predictor=LinearPredictor())

    def worst_tier2_ttft(res):
        return max(s.first_token_s - s.arrival_s for s in res.states if s.tier == 2)
    assert worst_tier2_ttft(out[0.5]) < worst_tier2_ttft(out[None])
