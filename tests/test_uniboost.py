"""UniBoost (seed 001) and the size-based baselines: boost functions against their closed forms and limits,
the unknown-size boost by hand, γ-Ada's anchor on M/M/1, MemGuard's revision bound, exact skip-ahead for
every new policy, and clear errors on bad parameters."""
from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import LinearPredictor, make_requests
from test_sim_executor import per_request, skip_and_step
from tierserve.core import ConfigError, Status, true_output_tokens
from tierserve.policies.local import LOCAL_POLICIES
from tierserve.policies.local.boost import (attained_boost, empirical_mgf, fcfs_tail_decay_rate,
                                            general_tail_decay_rate, known_size_boost)
from tierserve.policies.local.uniboost import (UniBoostPolicy, memguard_next_threshold, memguard_threshold_below,
                                               revision_bound)
from tierserve.sim import ClusterConfig, simulate

NEW_POLICIES = ["fcfs", "sjf", "srpt", "las", "distboost", "uniboost_base", "uniboost_memguard", "uniboost"]


# ----- boost functions -----
def test_known_size_boost_is_the_closed_form_and_its_own_inverse():
    for gamma in (0.05, 1.0, 7.0):
        for s in (1e-3, 0.3, 2.0, 40.0):
            assert known_size_boost(s, gamma) == pytest.approx(math.log(1.0 / (1.0 - math.exp(-gamma * s))) / gamma,
                                                               rel=1e-9)
            if gamma * s < 30:      # beyond, the boost underflows to 0 (the job is plain FCFS)
                assert known_size_boost(known_size_boost(s, gamma), gamma) == pytest.approx(s, rel=1e-6)
    assert known_size_boost(0.0, 1.0) == math.inf
    assert known_size_boost(1.0, 1.0) > known_size_boost(2.0, 1.0) > 0          # shorter jobs get more boost


def _order(jobs, gamma):
    return sorted(range(len(jobs)), key=lambda i: jobs[i][0] - known_size_boost(jobs[i][1], gamma))


def test_boost_orders_as_fcfs_for_large_gamma_and_as_sjf_for_small_gamma():
    jobs = [(0.0, 5.0), (0.5, 1.0), (1.0, 0.2), (1.2, 3.0)]           # (arrival s, size s)
    assert _order(jobs, 200.0) == [0, 1, 2, 3]                          # by arrival
    assert _order(jobs, 1e-4) == [2, 1, 3, 0]                           # by size


def test_attained_boost_on_a_two_point_distribution_matches_a_hand_computation():
    sizes = [1.0, 3.0] * 5              # S = 1 or 3 with probability 1/2 each
    e = math.e
    # Age 0: R = S; Δ = 1 gives (½e)/(½(e−1) + ½(e−1)); Δ = 3 gives (½e + ½e³)/(½(e−1) + ½(e³−1)); γ = 1.
    j0 = max(0.5 * e / (e - 1.0), (0.5 * e + 0.5 * e ** 3) / (0.5 * (e - 1.0) + 0.5 * (e ** 3 - 1.0)))
    assert attained_boost(sorted(sizes), 0.0, 1.0) == pytest.approx(math.log(j0), rel=1e-12)
    # Age 2: only S = 3 remains, R = 1: the known-size boost of the remainder.
    assert attained_boost(sorted(sizes), 2.0, 1.0) == pytest.approx(math.log(e / (e - 1.0)), rel=1e-12)
    assert attained_boost(sorted(sizes), 2.0, 1.0) == pytest.approx(known_size_boost(1.0, 1.0), rel=1e-12)
    # Age 0.5, γ = 2: R ∈ {0.5, 2.5}.
    g = 2.0
    a, b = math.exp(g * 0.5), math.exp(g * 2.5)
    j = max(0.5 * a / ((a - 1) / g), (0.5 * a + 0.5 * b) / (0.5 * (a - 1) / g + 0.5 * (b - 1) / g))
    assert attained_boost(sorted(sizes), 0.5, g) == pytest.approx(math.log(j / g) / g, rel=1e-12)
    assert attained_boost(sorted(sizes), 5.0, 1.0) == 0.0             # older than anything seen: no boost


def test_gamma_ada_root_for_mm1_is_mu_minus_lambda():
    mu, lam = 1.0 / 0.3, 2.1

    def mgf(g):
        return mu / (mu - g) if g < mu else math.inf
    assert fcfs_tail_decay_rate(lam, mgf, 1 / mu) == pytest.approx(mu - lam, rel=1e-9)
    rng = np.random.default_rng(3)
    sizes = rng.exponential(1 / mu, 400_000)
    assert fcfs_tail_decay_rate(lam, empirical_mgf(sizes), sizes.mean()) == pytest.approx(mu - lam, rel=0.03)
    gaps = rng.exponential(1 / lam, 400_000)
    assert general_tail_decay_rate(sizes, gaps) == pytest.approx(mu - lam, rel=0.03)
    assert fcfs_tail_decay_rate(1.2 * mu, mgf, 1 / mu) == 0.0                   # overload: no decay


# ----- MemGuard -----
def test_memguard_thresholds_are_geometric():
    k = 256
    assert [memguard_threshold_below(g, k) for g in (0, 255, 256, 511, 512, 1023, 1024, 5000)] == \
           [0, 0, 256, 256, 512, 512, 1024, 4096]
    assert [memguard_next_threshold(g, k) for g in (0, 255, 256, 600, 1024)] == [256, 256, 512, 1024, 2048]
    assert revision_bound(10_000, 256) == 1 + math.floor(math.log2(10_000 / 256)) == 6    # the seed's example
    assert revision_bound(100, 256) == 0


class _KeyRecorder(UniBoostPolicy):
    """UniBoost that records every distinct key each request has had while it decodes."""

    seen: dict = {}

    def key(self, s):
        k = super().key(s)
        if s.num_generated > 0:
            self.seen.setdefault(s.id, set()).add(k)
        return k


def test_memguard_revises_a_request_at_most_log_times_and_preempts_it_no_more_often():
    _KeyRecorder.seen = {}
    LOCAL_POLICIES.table["keyrec_test"] = f"{__name__}:_KeyRecorder"
    k = 16
    try:
        reqs = make_requests(400, rate=60.0, output=(1, 400))
        params = {"phases": ["unified", "memguard"], "k": k, "delta": 4, "tier_mode": "none"}
        res = simulate(ClusterConfig(num_replicas=1, local_policy="keyrec_test", local_policy_params=params,
                                     replica={"num_blocks": 300}), reqs, predictor=LinearPredictor())
        base = simulate(ClusterConfig(num_replicas=1, local_policy="uniboost_base",
                                      local_policy_params={"tier_mode": "none"}, replica={"num_blocks": 300}),
                        reqs, predictor=LinearPredictor())
    finally:
        del LOCAL_POLICIES.table["keyrec_test"]
    prio = 0
    for s in res.states:
        assert s.status == Status.FINISHED
        bound = revision_bound(true_output_tokens(s), k)
        assert len(_KeyRecorder.seen.get(s.id, ())) - 1 <= bound       # key revised only at thresholds
        assert s.policy_data.get("priority_preemptions", 0) <= bound
        prio += s.policy_data.get("priority_preemptions", 0)
    assert max(len(v) for v in _KeyRecorder.seen.values()) > 2           # requests did cross thresholds
    assert prio > 0                                                       # priority preemption was exercised
    base_prio = sum(s.policy_data.get("priority_preemptions", 0) for s in base.states)
    assert base_prio > 2 * prio                                           # without MemGuard: far more churn


# ----- exact skip-ahead -----
@pytest.mark.parametrize("policy,params", [(p, {}) for p in NEW_POLICIES] + [
    ("uniboost", {"k": 8, "delta": 3}),                                  # many MemGuard revision points
    ("uniboost", {"tier_mode": "strict", "boost": "attained", "ada_every": 20}),
    ("uniboost", {"ada_min_samples": 30, "ada_every": 20, "ada_period_s": 0.5}),   # γ moves during the run
    ("distboost", {"phases": ["memguard"], "k": 8}),
    ("srpt", {"C": 1.0, "preempt_mode": "swap"}),
    ("sjf", {"starvation_steps": 20, "quantum_steps": 3}),
])
def test_skip_ahead_equals_single_iteration_stepping_for_new_policies(policy, params):
    reqs = make_requests(400, rate=30.0, num_tiers=3)
    skipped, stepped = skip_and_step(reqs, 3, policy, params, num_replicas=2, cluster_policy="jsq",
                                     replica={"num_blocks": 500, "swap_space_gib": 0.01})
    assert per_request(skipped) == per_request(stepped)
    assert [s.policy_data for s in skipped.states] == [s.policy_data for s in stepped.states]
    assert skipped.duration_s == stepped.duration_s
    assert skipped.stats["iterations"] == stepped.stats["iterations"]
    assert [h.counts for h in skipped.tbt_by_tier] == [h.counts for h in stepped.tbt_by_tier]
    factor = 1.0 if params else 0.8       # tight revision points in the variants skip less, but still skip
    assert skipped.stats["events"] < factor * stepped.stats["events"]    # skipping really skipped
    assert skipped.stats["preemptions"] > 0                              # under memory pressure


def test_gamma_ada_moves_gamma_with_load():
    """γ-Ada's γ at two loads on the same job sizes: each is the FCFS tail decay rate of its own arrival rate,
    and the heavier load decays slower (a γ that ignored the arrivals would be equal at both)."""
    rng = np.random.default_rng(0)
    sizes = [2e-4 * float(rng.exponential(200.0)) for _ in range(300)]    # S ≈ 40 ms of GPU time
    gammas = {}
    for rate in (10.0, 20.0):                                             # ρ ≈ 0.4 and 0.8
        policy = UniBoostPolicy(ada_min_samples=50, ada_every=50, ada_period_s=1.0, seconds_per_token=2e-4)
        policy.tau = 2e-4
        for t in np.cumsum(np.random.default_rng(1).exponential(1 / rate, 400)):
            policy._arrivals.append(float(t))
        for x in sizes:
            policy._sizes.append(x)
        policy.ada_beta = 1.0
        policy._update_gamma(100.0)
        lam = 399 / (policy._arrivals[-1] - policy._arrivals[0])
        sz = np.fromiter(policy._sizes, float)
        assert policy.gamma == pytest.approx(fcfs_tail_decay_rate(lam, empirical_mgf(sz), sz.mean()), rel=1e-9)
        assert 0 < policy.gamma < 1 / sz.mean()
        gammas[rate] = policy.gamma
    assert gammas[20.0] < 0.8 * gammas[10.0], gammas                      # it moved with the load


def test_gamma_ada_sizes_are_gpu_time_shares_that_add_up_to_the_busy_time():
    """γ-Ada's S is each request's share of its iterations' GPU time: the shares add up to the replica's busy
    time, so λE[S] is the busy fraction (ALGORITHMS.md §3), not τ·tokens at a full batch."""
    reqs = make_requests(300, rate=1.0)       # busy ≈ 0.58 here
    res = simulate(ClusterConfig(num_replicas=1, local_policy="uniboost",
                                 local_policy_params={"ada_min_samples": 50, "ada_every": 50, "ada_period_s": 1.0}),
                   reqs, predictor=LinearPredictor())
    assert all(s.status == Status.FINISHED for s in res.states) and res.stats["preemptions"] == 0
    shares = [s.policy_data["gpu_share_s"] for s in res.states]
    assert min(shares) > 0
    busy_s = res.stats["busy_fraction"] * res.duration_s
    assert sum(shares) == pytest.approx(busy_s, rel=1e-6, abs=len(shares) * 1e-7)
    loads = [s.policy_data["gamma_load"] for s in res.states if not math.isnan(s.policy_data["gamma_load"])]
    assert 0.3 < res.stats["busy_fraction"] < 0.9
    assert loads and loads[-1] == pytest.approx(res.stats["busy_fraction"], rel=0.1)   # λE[S] over the last window


def test_strict_tier_priority_serves_tier0_first_under_overload():
    reqs = make_requests(400, rate=80.0, num_tiers=3)
    res = simulate(ClusterConfig(num_replicas=1, local_policy="uniboost",
                                 local_policy_params={"tier_mode": "strict"}, replica={"num_blocks": 400}),
                   reqs, 3, predictor=LinearPredictor())
    ttft = {t: sorted(s.first_token_s - s.arrival_s for s in res.states if s.tier == t) for t in range(3)}
    med = {t: v[len(v) // 2] for t, v in ttft.items()}
    assert med[0] < med[1] < med[2]


# ----- bad input -----
@pytest.mark.parametrize("policy,params,field", [
    ("uniboost", {"gamma": 0.0}, "gamma"), ("uniboost", {"gamma": -1.0}, "gamma"),
    ("distboost", {"k": 0}, "k"), ("uniboost", {"k": 0.5}, "k"),
    ("srpt", {"C": 1.5}, "C"), ("srpt", {"C": -0.1}, "C"),
    ("uniboost", {"phases": ["unified", "memgaurd"]}, "phases"), ("uniboost", {"phases": "warp"}, "phases"),
    ("uniboost", {"boost": "magic"}, "boost"), ("uniboost", {"tier_mode": "fair"}, "tier_mode"),
    ("sjf", {"starvation_steps": 0}, "starvation_steps"), ("las", {"q0_s": 0}, "q0_s"),
    ("fcfs", {"chunk": -1}, "chunk"),
])
def test_bad_parameters_raise_config_errors_naming_them(policy, params, field):
    with pytest.raises(ConfigError) as err:
        LOCAL_POLICIES.create(policy, **params)
    assert err.value.field == field
    assert repr(next(iter(params.values()))) in str(err.value)


def test_only_sjf_and_srpt_declare_the_oracle():
    assert {p for p in NEW_POLICIES if LOCAL_POLICIES.get_class(p).needs_oracle} == {"sjf", "srpt"}
