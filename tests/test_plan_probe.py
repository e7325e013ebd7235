"""The planner's cheap probes: a watched run is the plain run unless stopped, the watch stops only on certain
misses, and the one-replica capacity bounds the replica search from below."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tierserve.experiments.capacity import with_seed
from tierserve.experiments.plan import Fleet, probe_fleet, scenario_for, search_config
from tierserve.experiments.plan_probe import ClearMiss, replica_capacity, replica_lower_bound, watched_run
from tierserve.experiments.scenario import run_scenario

from test_plan import small_mix

STACK = "vllm_priority+round_robin"


@pytest.mark.parametrize("replicas", [1, 3])
def test_an_unstopped_watched_run_is_the_plain_run(replicas):
    cfg = with_seed(scenario_for(small_mix(), Fleet("A100-80GB", 1, STACK, replicas)), 1)
    plain, watched = run_scenario(cfg), watched_run(cfg, None)
    for col in ("arrival_s", "first_token_s", "finish_s", "generated_tokens", "tier"):
        assert np.array_equal(np.asarray(plain.table[col]), np.asarray(watched.table[col]), equal_nan=True), col
    assert plain.summary.tiers["all"].slo_met == watched.summary.tiers["all"].slo_met
    assert plain.sim.duration_s == watched.sim.duration_s


def test_the_watch_stops_only_where_the_whole_run_misses_by_more_than_clear_miss():
    mix = small_mix()
    over = with_seed(scenario_for(mix, Fleet("A100-80GB", 1, STACK, 1)), 0)    # 10 req/s on one ~9 req/s A100
    with pytest.raises(ClearMiss) as stop:
        watched_run(over, 0.10)
    full = run_scenario(over)
    t = full.table
    k = next(tier.index for tier in full.workload.tier_set if tier.name == stop.value.tier)
    goal = full.workload.tier_set[k].slo.attainment
    whole = float(t.meets_slo[t.tier == k].mean())
    assert whole < goal - 0.10                                       # the full run confirms the stop
    assert stop.value.at_s < full.sim.duration_s                     # and it stopped before the end
    fine = with_seed(scenario_for(mix, Fleet("A100-80GB", 1, STACK, 3)), 0)
    watched_run(fine, 0.10)                                          # a passing fleet is never stopped


def test_a_stopped_probe_is_a_clear_miss_after_one_seed():
    p = probe_fleet(small_mix(), Fleet("A100-80GB", 1, STACK, 1), [0, 1, 2], clear_miss=0.1)
    assert p.clear_miss and p.seeds_run == 1 and not p.passes and p.stopped.startswith("stopped at")


def test_the_capacity_bound_is_below_the_answer():
    mix = small_mix(rate=30.0)
    cap = replica_capacity(scenario_for(mix, Fleet("A100-80GB", 1, STACK, 1)), 0)
    assert 0 < cap < 30.0
    s = search_config(mix.model_dump(mode="json"), "A100-80GB", 1, STACK)
    assert s.best is not None and s.replica_capacity_rps == cap
    assert s.bound == replica_lower_bound(30.0, cap) >= 1              # the bound skipped small fleets
    assert s.bound < s.best.fleet.replicas
    probed = {p.fleet.replicas: p for p in s.probes}
    assert not probed[s.best.fleet.replicas - 1].passes              # the count below the answer was probed
    assert min(probed) > 1                                           # and one replica was never probed
    assert math.isfinite(s.wall_s)
