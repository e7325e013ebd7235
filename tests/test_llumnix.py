"""K-tier Llumnix: freeness and headroom arithmetic, dispatch, candidate choice, tier isolation, bad inputs."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from conftest import LinearPredictor, make_requests
from tierserve.core import ConfigError, Request, RequestState, Status
from tierserve.metrics import RequestTable
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.policies.cluster.freeness import ExponentialHeadroom, FlatHeadroom, freeness, measure
from tierserve.policies.cluster.infaas import InfaasDispatch
from tierserve.policies.cluster.llumnix_k import LlumnixK, LlumnixKAdaptive
from tierserve.policies.cluster.migration_policy import pick_candidate
from tierserve.sim import ClusterConfig, ReplicaConfig, simulate


@dataclass
class FakeView:
    index: int
    used_blocks: int = 0
    running: list = field(default_factory=list)
    waiting: list = field(default_factory=list)
    swapped: list = field(default_factory=list)
    total_blocks: int = 1000
    block_size: int = 16
    max_num_seqs: int = 256
    migrating: bool = False
    terminating: bool = False

    @property
    def num_outstanding(self) -> int:
        return len(self.running) + len(self.waiting)


def running_state(rid: int, tier: int, blocks: int, generated: int = 5) -> RequestState:
    s = RequestState(Request(rid, 0.0, 100, 500, tier=tier))
    s.status = Status.RUNNING
    s.num_blocks = blocks
    s.num_generated = generated
    s.num_tokens = 100 + generated
    s.num_computed_tokens = s.num_tokens - 1
    return s


def waiting_state(rid: int, tier: int, prompt: int = 160, arrival: float = 0.0) -> RequestState:
    return RequestState(Request(rid, arrival, prompt, 50, tier=tier))


# ----- arithmetic -----
def test_freeness_matches_hand_computation():
    # (M − used − HOL − headroom) / (running + [waiting > 0]) = (1000 − 400 − 50 − 0) / (5 + 1)
    assert freeness(1000, 400, 50, 0, 5, 2) == pytest.approx(550 / 6)
    assert freeness(1000, 400, 0, 0, 5, 0) == pytest.approx(120.0)
    assert freeness(1000, 0, 0, 0, 0, 0) == math.inf            # empty instance is the freest
    assert freeness(1000, 0, 0, 0, 3, 0, terminating=True) == -math.inf


def test_freer_instance_has_higher_freeness():
    light = measure(FakeView(0, used_blocks=100, running=[running_state(1, 1, 100)]))
    heavy = measure(FakeView(1, used_blocks=800, running=[running_state(2, 1, 800)]))
    assert light.freeness() > heavy.freeness()


def test_exponential_headroom_budgets():
    # H_p = M · 0.2 · 3^{−p}
    assert ExponentialHeadroom(3).budgets(900) == pytest.approx([180.0, 60.0, 20.0])
    assert ExponentialHeadroom(1).budgets(900) == [0.0]       # K = 1: no headroom
    assert FlatHeadroom(2).budgets(1000) == [900.0, 0.0]      # artifact: M − 1600/16


def test_headroom_charged_once_per_tier_present():
    view = FakeView(0, used_blocks=300, running=[running_state(i, 0, 50) for i in range(4)]
                    + [running_state(9, 2, 100)])
    load = measure(view, num_tiers=3)
    budgets = ExponentialHeadroom(3).budgets(1000)          # [200, 66.7, 22.2]
    assert load.headroom(budgets) == pytest.approx(200 + 200 / 9)   # four tier-0 requests pay one H_0
    assert load.headroom(budgets, below=2) == pytest.approx(200)    # what a tier-2 request is charged
    assert load.freeness(load.headroom(budgets)) == pytest.approx((1000 - 300 - 200 - 200 / 9) / 5)


def test_waiting_head_counts_its_prompt_demand_only():
    view = FakeView(0, used_blocks=0, waiting=[waiting_state(1, 1, prompt=160), waiting_state(2, 0, prompt=320)])
    load = measure(view)
    assert load.hol_blocks == 20            # head of a tier-then-arrival queue: the tier-0 request, 320/16
    assert load.freeness() == pytest.approx((1000 - 20) / 1)


# ----- dispatch -----
def test_llumnix_k_dispatches_to_freest_and_steers_low_tiers_from_tier0():
    pol = LlumnixK(num_tiers=3)
    a = FakeView(0, used_blocks=300, running=[running_state(1, 0, 300)])      # holds tier 0
    b = FakeView(1, used_blocks=400, running=[running_state(2, 2, 400)])
    assert pol.dispatch(waiting_state(10, 0), [a, b], 0.0) == 0   # tier 0 is charged nothing: a is freer
    assert pol.dispatch(waiting_state(11, 2), [a, b], 0.0) == 1   # tier 2 pays H_0 on a: b is freer


def test_llumnix_k_holds_when_every_instance_is_busy_and_orders_by_tier():
    pol = LlumnixK(num_tiers=2)
    full = FakeView(0, used_blocks=995, running=[running_state(i, 1, 199) for i in range(5)])
    assert pol.dispatch(waiting_state(1, 1), [full], 0.0) is None
    q = [waiting_state(1, 1, arrival=0.0), waiting_state(2, 0, arrival=1.0), waiting_state(3, 1, arrival=0.5)]
    assert [s.id for s in pol.dispatch_order(q, 0.0)] == [2, 1, 3]


def test_infaas_picks_least_loaded_instance_that_fits():
    pol = InfaasDispatch()
    a = FakeView(0, used_blocks=990)                    # cannot fit 10 blocks + queue
    b = FakeView(1, used_blocks=500, waiting=[waiting_state(5, 0, prompt=1600)])
    c = FakeView(2, used_blocks=550)
    assert pol.dispatch(waiting_state(1, 0, prompt=160), [a, b, c], 0.0) == 2   # b commits 600, c 550


# ----- candidates -----
def test_tier0_is_never_a_migration_candidate():
    running = [running_state(1, 0, 5), running_state(2, 0, 50)]
    waiting = [waiting_state(3, 0)]
    for policy in ("tiered", "SR", "LR", "LCR", "FCW"):
        assert pick_candidate(running, waiting, policy, protected_tiers=1) is None


def test_tiered_candidate_prefers_queued_then_small_low_tier():
    running = [running_state(1, 1, 5), running_state(2, 2, 80), running_state(3, 2, 40)]
    assert pick_candidate(running, [waiting_state(4, 1)], "tiered").id == 4
    assert pick_candidate(running, [], "tiered").id == 3      # lowest tier, least KV
    assert pick_candidate(running, [], "LCR").id == 3


# ----- bad inputs -----
@pytest.mark.parametrize("kwargs,field_name", [
    ({"num_tiers": 0}, "num_tiers"),
    ({"num_tiers": 3, "h_max": 1.0}, "h_max"),
    ({"num_tiers": 3, "h_max": -0.1}, "h_max"),
    ({"num_tiers": 3, "decay": -1.0}, "decay"),
    ({"num_tiers": 3, "request_policy": "random"}, "request_policy"),
    ({"num_tiers": 3, "rebalance_period_s": 0}, "rebalance_period_s"),
])
def test_bad_parameters_raise_config_error_naming_the_field(kwargs, field_name):
    with pytest.raises(ConfigError) as e:
        LlumnixK(**kwargs)
    assert e.value.field == field_name


def test_tier_outside_range_raises_config_error():
    pol = LlumnixK(num_tiers=2)
    with pytest.raises(ConfigError) as e:
        pol.dispatch(waiting_state(1, 2), [FakeView(0)], 0.0)
    assert e.value.field == "request.tier" and e.value.value == 2 and "0..1" in e.value.allowed


def test_registry_names_and_defaults():
    for name in ("infaas", "llumnix", "llumnix_k", "llumnix_k_adaptive"):
        assert name in CLUSTER_POLICIES.names
    pol = CLUSTER_POLICIES.create("llumnix_k", num_tiers=4)
    assert pol.migrates and pol.rebalance_period_s == pytest.approx(0.05)
    assert not getattr(CLUSTER_POLICIES.create("infaas"), "migrates", False)


# ----- tier isolation under load (end to end) -----
def loaded_config(policy: str, k: int) -> ClusterConfig:
    return ClusterConfig(num_replicas=4, replica=ReplicaConfig(num_blocks=600), local_policy="llumlet",
                         cluster_policy=policy, cluster_policy_params={"num_tiers": k})


def run(policy: str, requests: list[Request], k: int):
    res = simulate(loaded_config(policy, k), requests, num_tiers=k, seed=0, predictor=LinearPredictor())
    return res, RequestTable.from_states(res.states, res.reasons)


@pytest.fixture(scope="module")
def loaded_requests():
    return make_requests(1500, rate=60.0, seed=3, num_tiers=3)


def test_tier_isolation_at_k3_uniform(loaded_requests):
    res, tab = run("llumnix_k", loaded_requests, 3)
    fin = tab.finished
    assert fin.all()
    med = [float(np.median(tab.ttft_s[fin & (tab.tier == t)])) for t in range(3)]
    assert med[0] < 0.5 * med[2], med


def test_no_tier_ordering_at_k1(loaded_requests):
    flat = [Request(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, tier=0) for r in loaded_requests]
    res, tab = run("llumnix_k", flat, 1)
    groups = np.array([r.tier for r in loaded_requests])     # the K = 3 labels, ignored by the policy
    med = [float(np.median(tab.ttft_s[groups == t])) for t in range(3)]
    assert max(med) < 2.0 * min(med), med


def test_adaptive_headroom_moves_budgets_and_finishes_everything(loaded_requests):
    res, tab = run("llumnix_k_adaptive", loaded_requests, 3)
    assert tab.finished.all()
    assert res.stats["migrations_live_committed"] + res.stats["migrations_queued"] > 0
    # the budgets themselves: a tier missing its TTFT target grows its multiplier, one meeting it shrinks
    from tierserve.core import SLO
    pol = LlumnixKAdaptive(num_tiers=3, gain=0.25, smoothing=1.0)
    before = list(pol.scales)
    for rid in range(20):
        tier = 0 if rid < 10 else 2
        st = RequestState(Request(rid, 0.0, 160, 50, tier=tier, slo=SLO(ttft_s=1.0, attainment=0.9)))
        st.first_token_s = 3.0 if tier == 0 else 0.5            # tier 0 misses by 2 s, tier 2 meets
        pol._pending.append(st)
    pol.adapt(4.0)
    assert pol.scales[0] == pytest.approx(min(before[0] * 1.25, pol._s_max[0]))
    assert pol.scales[0] > before[0] and pol.scales[2] == pytest.approx(before[2] * (1 - 0.125))
    assert pol.history and pol.history[-1] == (4.0, pol.scales)


def test_adaptive_promotes_long_waiting_requests():
    pol = LlumnixKAdaptive(num_tiers=4, promote_after_s=2.0)
    s = waiting_state(1, 3, arrival=0.0)
    assert pol.effective_tier(s, 1.0) == 3
    assert pol.effective_tier(s, 4.5) == 1
    assert pol.effective_tier(s, 100.0) == 1          # never into tier 0 (promote_floor = 1)
    assert LlumnixKAdaptive(num_tiers=4, promote_after_s=2.0, promote_floor=0).effective_tier(s, 100.0) == 0


def test_adaptive_budgets_grow_for_a_missing_tier_and_shrink_for_a_meeting_one():
    from tierserve.core import SLO
    pol = LlumnixKAdaptive(num_tiers=3, gain=0.25, smoothing=1.0)
    before = list(pol.scales)
    pending = []
    for i in range(20):
        late = RequestState(Request(i, 0.0, 100, 10, tier=0, slo=SLO(ttft_s=0.5, attainment=0.99)))
        late.first_token_s = 2.0                                   # TTFT 2 s > 0.5 s: tier 0 misses
        ok = RequestState(Request(100 + i, 0.0, 100, 10, tier=2, slo=SLO(ttft_s=5.0, attainment=0.9)))
        ok.first_token_s = 1.0                                     # TTFT 1 s ≤ 5 s: tier 2 meets
        pending += [late, ok]
    pol._pending = pending
    pol.adapt(now=3.0)
    after = pol.scales
    assert after[0] == pytest.approx(min(before[0] * 1.25, pol._s_max[0]))
    assert after[0] > before[0]
    assert after[2] == pytest.approx(max(before[2] * (1 - 0.125), pol.s_min)) and after[2] < before[2]
    assert pol.miss_rate[0] == 1.0 and pol.miss_rate[2] == 0.0
