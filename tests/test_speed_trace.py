"""`ReplicaConfig.speed_trace`: piecewise-constant speed factors over simulated time (sim_to_real's speed replay)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from conftest import LinearPredictor, make_requests, register_stepwise
from tierserve.core import ConfigError
from tierserve.sim import ClusterConfig, simulate


class ScaledPredictor(LinearPredictor):
    """LinearPredictor's times × `factor` (decode runs read the base time and context coefficient separately)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.decode_context_coef_s = LinearPredictor.decode_context_coef_s * factor

    def iteration_time(self, prefill_tokens, prefill_attn_pairs, decode_count, decode_context_sum):
        return (0.005 + 5e-5 * (prefill_tokens + decode_count) + 1e-8 * prefill_attn_pairs
                + LinearPredictor.decode_context_coef_s * decode_context_sum) * self.factor

    def decode_base_time(self, decode_count):
        return super().decode_base_time(decode_count) * self.factor


def outcome(res):
    return ([(s.id, s.first_token_s, s.finish_s, s.num_generated, s.num_preemptions, s.tbt_max_s)
             for s in sorted(res.states, key=lambda s: s.id)], res.stats["iterations"],
            [h.counts for h in res.tbt_by_tier])


def run(reqs, predictor=None, policy="vllm", **replica):
    cfg = ClusterConfig(num_replicas=1, local_policy=policy, replica={"num_blocks": 300, **replica})
    return simulate(cfg, reqs, 3, seed=2, predictor=predictor or LinearPredictor())


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "vllm_v0"])
def test_a_factor_from_zero_equals_a_scaled_step_model(policy):
    reqs = make_requests(300, rate=30.0, num_tiers=3)
    traced, scaled = run(reqs, policy=policy, speed_trace=[(0.0, 1.7)]), run(reqs, ScaledPredictor(1.7), policy=policy)
    assert traced.stats["iterations"] == scaled.stats["iterations"]
    for a, b in zip(sorted(traced.states, key=lambda s: s.id), sorted(scaled.states, key=lambda s: s.id)):
        assert (a.num_generated, a.num_preemptions) == (b.num_generated, b.num_preemptions)
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9)   # (x·f summed vs x summed · f)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9)
    assert outcome(run(reqs, policy=policy, speed_trace=[(0.0, 1.0)])) == outcome(run(reqs, policy=policy))


def test_a_slow_period_delays_only_what_runs_after_it():
    reqs = make_requests(300, rate=30.0, num_tiers=3)
    base = {s.id: s for s in run(reqs).states}
    start = reqs[150].arrival_s
    slow = {s.id: s for s in run(reqs, speed_trace=[(start, 2.0), (start + 1.0, 1.0)]).states}
    done_before = [i for i, s in base.items() if s.finish_s < start]
    assert done_before and all(slow[i].finish_s == base[i].finish_s for i in done_before)
    running_then = [i for i, s in base.items() if s.first_token_s < start < s.finish_s]
    assert running_then and all(slow[i].finish_s > base[i].finish_s for i in running_then)


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_skip_ahead_equals_stepping_with_a_speed_trace(policy):
    register_stepwise()
    reqs = make_requests(300, rate=40.0, num_tiers=3)
    trace = [(0.0, 1.2), (1.3, 0.7), (2.9, 1.9), (4.05, 1.0)]
    kw = {"num_blocks": 300, "speed_trace": trace}
    results = [simulate(ClusterConfig(num_replicas=1, local_policy=p, local_policy_params=params, replica=kw,
                                      skip_ahead=skip), reqs, 3, seed=2, predictor=LinearPredictor())
               for p, params, skip in ((policy, {}, True), (policy, {}, False), ("stepwise", {"inner": policy}, True))]
    assert outcome(results[0]) == outcome(results[1]) == outcome(results[2])
    assert results[0].stats["events"] < results[2].stats["events"] / 2


@pytest.mark.parametrize("trace, words", [
    ([(1.0, 1.0), (0.5, 2.0)], "pair 1: from_s 0.5 must come after"),
    ([(0.0, 0.0)], "pair 0: factor 0.0 must be a finite number > 0"),
    ([(-1.0, 1.0)], "pair 0: from_s -1.0 must be a finite time >= 0"),
    ([(0.0, float("nan"))], "pair 0: factor nan"),
])
def test_a_bad_trace_names_the_pair(trace, words):
    with pytest.raises(ValidationError) as err:
        ClusterConfig(replica={"speed_trace": trace})
    assert "replica.speed_trace" in str(err.value) and words in str(err.value)


def test_refused_with_live_migration():
    cfg = ClusterConfig(num_replicas=2, local_policy="llumlet", cluster_policy="llumnix_k",
                        cluster_policy_params={"num_tiers": 3}, replica={"num_blocks": 300, "speed_trace": [(0.0, 2.0)]})
    with pytest.raises(ConfigError, match=r"replica.speed_trace.*live-migrating cluster policy \('llumnix_k'"):
        simulate(cfg, make_requests(20, rate=10.0, num_tiers=3), 3, predictor=LinearPredictor())
