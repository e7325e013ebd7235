"""Constant-time load reads: the executor's counters equal a walk over the queues, and the lane-kept global
queue retries requests in exactly the order re-sorting gives."""
from __future__ import annotations

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.policies.cluster import CLUSTER_POLICIES, ClusterPolicy
from tierserve.policies.cluster.freeness import measure, measure_by_walk
from tierserve.policies.cluster.infaas import InfaasDispatch, committed_blocks
from tierserve.policies.cluster.llumnix_k import LlumnixK
from tierserve.sim import ClusterConfig, simulate

READS = {"n": 0}


def assert_counters_match_walk(instances, num_tiers):
    for v in instances:
        fast, walked = measure(v, num_tiers), measure_by_walk(v, num_tiers)
        assert fast == walked
        assert list(fast.tier_counts) == list(walked.tier_counts)     # same order: headroom sums bit-identical
        bs = v.block_size
        assert committed_blocks(v) == v.used_blocks + sum(-(-s.num_tokens // bs) for s in v.waiting + v.swapped)
        READS["n"] += 1


class CheckedLlumnixK(LlumnixK):
    def loads(self, instances):
        assert_counters_match_walk(instances, self.num_tiers)
        return super().loads(instances)


class CheckedInfaas(InfaasDispatch):
    def dispatch(self, state, instances, now):
        assert_counters_match_walk(instances, None)
        return super().dispatch(state, instances, now)


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setitem(CLUSTER_POLICIES.table, "checked_llumnix_k", f"{__name__}:CheckedLlumnixK")
    monkeypatch.setitem(CLUSTER_POLICIES.table, "checked_infaas", f"{__name__}:CheckedInfaas")
    READS["n"] = 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_load_counters_equal_a_walk_over_every_request_under_preemption_and_migration(checked, mode):
    reqs = make_requests(700, rate=70.0, seed=4, num_tiers=3)
    cfg = ClusterConfig(num_replicas=4, local_policy="llumlet",
                        local_policy_params={"preempt_mode": mode, "promote_after_s": 0.5},
                        cluster_policy="checked_llumnix_k", cluster_policy_params={"num_tiers": 3},
                        replica={"num_blocks": 300, "swap_space_gib": 0.01})
    res = simulate(cfg, reqs, 3, predictor=LinearPredictor())
    assert READS["n"] > 1000
    assert res.stats["preemptions"] > 0 and res.stats["migrations_live_committed"] > 0
    if mode == "swap":
        assert res.stats["swap_outs"] > 0


def test_infaas_committed_blocks_from_counters_equal_a_walk(checked):
    reqs = make_requests(500, rate=60.0, seed=6, num_tiers=2)
    cfg = ClusterConfig(num_replicas=3, local_policy="vllm", local_policy_params={"preempt_mode": "swap"},
                        cluster_policy="checked_infaas", replica={"num_blocks": 300})
    simulate(cfg, reqs, 2, predictor=LinearPredictor())
    assert READS["n"] > 1000


@pytest.mark.parametrize("policy,params", [
    ("llumnix_k", {"num_tiers": 3}),
    ("llumnix_k_adaptive", {"num_tiers": 3, "promote_after_s": 0.3}),
])
def test_lane_queue_retries_in_the_order_resorting_gives(monkeypatch, policy, params):
    """The same saturated run with the global queue re-sorted on every retry (no lanes) and kept in lanes."""
    reqs = make_requests(800, rate=90.0, seed=8, num_tiers=3)
    # Equal arrival times with ids out of order: the lane must still order them by (arrival, id).
    reqs[10], reqs[11] = type(reqs[10])(11, reqs[10].arrival_s, 50, 5, tier=1), \
        type(reqs[10])(10, reqs[10].arrival_s, 60, 5, tier=1)
    cfg = ClusterConfig(num_replicas=3, local_policy="llumlet", cluster_policy=policy,
                        cluster_policy_params=params, replica={"num_blocks": 300})

    def outcome():
        res = simulate(cfg, reqs, 3, predictor=LinearPredictor())
        return [(s.id, s.replica, s.dispatch_s, s.first_token_s, s.finish_s) for s in res.states], res

    with_lanes, res = outcome()
    held = sum(1 for s in res.states if s.dispatch_s > s.arrival_s)
    assert held > 50                                          # the global queue was really used
    cls = type(CLUSTER_POLICIES.create(policy, **params))
    monkeypatch.setattr(cls, "queue_lane", ClusterPolicy.queue_lane)
    resorted, _ = outcome()
    assert with_lanes == resorted
