"""tierserve.experiments.capacity: bisection over rate with common random numbers, per stack and per tier,
and the stability verdict on simulated stacks at ρ = 0.6 and 1.2 of their measured capacity.

Small stacks (1–2 Llama-3-8B/A100 replicas, 1,000 requests, 2 seeds) keep each search to a few seconds.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tierserve.experiments.capacity import (
    ScenarioRunner, StackCapacity, find_capacity, rate_of, rho, scenario_capacity, with_rate,
)
from tierserve.experiments.scenario import ScenarioConfig
from tierserve.metrics import ALL, RunSummary, TierSummary, bisect_rate
from tierserve.metrics.stability import STABLE, UNSTABLE, StabilityVerdict, SteadyRun, seeds_verdict
from tierserve.workload import build_workload

SEEDS = (0, 1)
# Loose SLOs: the queue, not the SLO, bounds capacity, so ρ > 1 means overload.
LOOSE = [{"ttft_s": 10.0, "attainment": 0.9}, {"ttlt_s": 600.0, "attainment": 0.9}]


def scenario(replicas: int = 1, slos=None, n: int = 1000) -> ScenarioConfig:
    tiers = {"num_tiers": len(slos or LOOSE), "mix": "uniform", "slos": slos or LOOSE}
    return ScenarioConfig.from_dict({"cluster": {"num_replicas": replicas},
                                     "workload": {"num_requests": n, "tiers": tiers}})


@pytest.fixture(scope="module")
def cap1() -> StackCapacity:
    return scenario_capacity(scenario(1), lo=1.0, hi=16.0, seeds=SEEDS, rel_tol=0.05)


# ---- common random numbers ------------------------------------------------------------------------------
def test_rates_reuse_the_same_draws():
    cfg = scenario(1, n=300)
    slow, fast = (build_workload(with_rate(cfg, r).workload).requests for r in (2.0, 5.0))
    assert [(r.prompt_tokens, r.output_tokens, r.tier) for r in slow] == \
           [(r.prompt_tokens, r.output_tokens, r.tier) for r in fast]
    np.testing.assert_allclose([r.arrival_s * 2.0 for r in slow], [r.arrival_s * 5.0 for r in fast], rtol=1e-12)
    assert rate_of(with_rate(cfg, 5.0)) == 5.0


def test_with_rate_sets_the_field_each_arrival_kind_uses():
    base = scenario(1, n=100).model_dump(mode="json")
    for arrivals, field in (({"kind": "gamma", "rate": 3.0, "cv": 2.0}, "rate"),
                            ({"kind": "piecewise", "rates": [1.0, 3.0], "durations_s": [10.0, 10.0]}, "mean_rate"),
                            ({"kind": "diurnal", "mean_rate": 3.0}, "mean_rate")):
        base["workload"]["arrivals"] = arrivals
        cfg = with_rate(ScenarioConfig.from_dict(base), 7.5)
        assert getattr(cfg.workload.arrivals, field) == 7.5 and rate_of(cfg) == 7.5
    base["workload"]["arrivals"] = {"kind": "piecewise", "rates": [1.0, 3.0], "durations_s": [10.0, 30.0]}
    assert rate_of(ScenarioConfig.from_dict(base)) == pytest.approx(2.5)  # time average of the profile


# ---- bisection ------------------------------------------------------------------------------------------
def test_bisect_rate_geometric_brackets_the_threshold_within_rel_tol():
    seen: list[float] = []

    def passes(r: float) -> bool:
        seen.append(r)
        return r <= 6.3

    rate, saturated = bisect_rate(passes, 1.0, 20.0, rel_tol=0.01)
    failing = min(r for r in seen if r > 6.3)
    assert not saturated and rate <= 6.3 < failing <= rate * 1.01
    assert math.isnan(bisect_rate(lambda r: False, 1.0, 2.0, rel_tol=0.1)[0])
    assert bisect_rate(lambda r: True, 1.0, 2.0, rel_tol=0.1) == (2.0, True)
    with pytest.raises(ValueError):
        bisect_rate(passes, 0.0, 2.0, rel_tol=0.1)  # a geometric grid needs lo > 0


def test_a_stricter_criterion_never_bisects_higher():
    rng = np.random.default_rng(0)
    for _ in range(200):
        # noisy, non-monotone criteria, the strict one implied by the loose one's failure pointwise
        cut = rng.uniform(1, 20)
        noise = {}

        def loose(r: float) -> bool:
            noise.setdefault(r, rng.uniform(-2, 2))
            return r + noise[r] <= cut

        def strict(r: float) -> bool:
            return loose(r) and r <= cut * 0.9 + noise[r]

        a, _ = bisect_rate(strict, 0.5, 30.0, rel_tol=0.02)
        b, _ = bisect_rate(loose, 0.5, 30.0, rel_tol=0.02)
        assert math.isnan(a) or a <= b


# ---- find_capacity on synthetic runs: the criteria, without the simulator ---------------------------------
def synthetic_run(rate: float, seed: int) -> SteadyRun:
    """tier0 meets 99% up to 3 req/s; tier1's queue grows above 5 req/s (in seeds 0 and 1 of 0..2)."""
    t0 = TierSummary("tier0", 0, total=100, slo_met=100 if rate <= 3.0 else 90, attainment_goal=0.99)
    t1 = TierSummary("tier1", 1, total=100, slo_met=100, attainment_goal=0.99)
    summary = RunSummary(10.0, {"tier0": t0, "tier1": t1, ALL: TierSummary(ALL, -1, total=200, slo_met=190)})
    grows = rate > 5.0 and seed in (0, 1)
    stability = {"tier0": StabilityVerdict(STABLE), "tier1": StabilityVerdict(UNSTABLE if grows else STABLE),
                 ALL: StabilityVerdict(STABLE)}
    return SteadyRun(summary, stability, seed, rate)


def test_find_capacity_applies_attainment_and_majority_stability_per_tier():
    cap = find_capacity(synthetic_run, 1.0, 10.0, seeds=(0, 1, 2), rel_tol=0.01)
    assert 3.0 / 1.01 <= cap.rate <= 3.0 and cap.tiers["tier0"].rate == cap.rate
    assert 5.0 / 1.01 <= cap.tiers["tier1"].rate <= 5.0          # 2 of 3 seeds unstable above 5
    assert 5.0 / 1.01 <= cap.stable_rate <= 5.0
    only_seed2 = find_capacity(synthetic_run, 1.0, 10.0, seeds=(2,), rel_tol=0.01)
    assert only_seed2.tiers["tier1"].saturated and only_seed2.stable_rate == 10.0
    lenient = find_capacity(synthetic_run, 1.0, 10.0, seeds=(0, 1, 2), rel_tol=0.01, goals=0.8)
    assert 5.0 / 1.01 <= lenient.rate <= 5.0                     # 90% meets a goal of 80%: stability binds
    assert rho(2.0, cap) == pytest.approx(2.0 / cap.rate)


# ---- on the simulator ---------------------------------------------------------------------------------
def test_verdict_is_unstable_at_rho_1_2_and_stable_at_rho_0_6(cap1):
    assert cap1.stack.feasible and not cap1.stack.saturated
    run = ScenarioRunner(scenario(1, n=1500))
    fresh = (10, 11, 12, 13, 14)  # seeds the search did not use
    low = [run(0.6 * cap1.rate, s) for s in fresh]
    high = [run(1.2 * cap1.rate, s) for s in fresh]
    assert all(r.stable for r in low), [r.verdict_line() for r in low]
    # over seeds, by the capacity's own majority rule: a seed's lengths can leave its own knee above 1.2×
    assert seeds_verdict(low) == STABLE and seeds_verdict(high) == UNSTABLE, [r.verdict_line() for r in high]
    assert all(r.work.growth_high < r.work.tolerance for r in low)
    assert all(r.work.growth > 0.05 for r in high if r.verdict_line() == UNSTABLE)   # overload: work piles up


def test_capacity_search_is_reproducible(cap1):
    again = scenario_capacity(scenario(1), lo=1.0, hi=16.0, seeds=SEEDS, rel_tol=0.05)
    assert again.to_dict() == cap1.to_dict()
    assert cap1.lengths[0] == 1000 and "runs of 1000–" in str(cap1)      # the run lengths are stated
    assert [p.rate for p in again.stack.probes] == [p.rate for p in cap1.stack.probes]


def test_more_replicas_never_give_less_capacity(cap1):
    cap2 = scenario_capacity(scenario(2), lo=1.0, hi=32.0, seeds=SEEDS, rel_tol=0.05)
    assert cap2.stack.feasible and not cap2.stack.saturated
    assert cap2.rate > cap1.rate and cap2.stable_rate > cap1.stable_rate
    for tier, rate in cap2.tier_rates().items():
        assert rate >= cap1.tiers[tier].rate


def test_a_higher_slo_goal_never_gives_higher_capacity():
    tight = [{"ttft_s": 0.5, "tbt_s": 0.05}, {"ttlt_s": 600.0}]  # tier0's attainment falls with load
    runner = ScenarioRunner(scenario(1, tight))
    memo: dict[tuple[float, int], SteadyRun] = {}

    def make_run(rate: float, seed: int) -> SteadyRun:  # the goal does not change a run: share them
        if (rate, seed) not in memo:
            memo[(rate, seed)] = runner(rate, seed)
        return memo[(rate, seed)]

    goals = (0.5, 0.9, 0.99)
    caps = {g: find_capacity(make_run, 1.0, 16.0, SEEDS, 0.05, goals=g) for g in goals}
    rates = [caps[g].rate for g in goals]
    assert all(a >= b or math.isnan(b) for a, b in zip(rates, rates[1:])), rates
    assert rates[0] > (rates[2] if not math.isnan(rates[2]) else 0.0), rates  # the goal does bind here
    for g_low, g_high in zip(goals, goals[1:]):
        for tier in caps[g_low].tiers:
            hi_rate, lo_rate = caps[g_high].tiers[tier].rate, caps[g_low].tiers[tier].rate
            assert math.isnan(hi_rate) or hi_rate <= lo_rate
