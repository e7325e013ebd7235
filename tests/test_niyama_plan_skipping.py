"""Niyama's decode runs started without a plan (`decode_batch`) give exactly what asking `plan` gives.

With every running request decoding and nothing waiting, niyama's plan is those decodes oldest first,
repeatable, with no revision point; the simulator then starts the decode run itself, although niyama has an
iteration hook (the prefill-throughput EWMA). Every request (relegations included), histogram and statistic
must be bit-identical to runs where each plan is asked for — and plans must really be skipped.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import make_requests
from tierserve.core import SLO, RequestState
from tierserve.policies.local import LOCAL_POLICIES
from tierserve.policies.local.deadlines import DecodeLengthEstimator
from test_sim_deferred_apply import fingerprint
from test_sim_plan_skipping import run_counting_plans

TIGHT = (SLO(ttft_s=0.5, tbt_s=0.03), SLO(ttlt_s=5.0), SLO(ttlt_s=15.0))     # deadlines that bind
ROOMY = (SLO(ttft_s=6.0, tbt_s=0.05), SLO(ttlt_s=600.0), SLO(ttlt_s=1800.0))  # Niyama's QoS classes


def run(reqs, monkeypatch, skip: bool, params: dict, **cfg) -> tuple:
    """One niyama run (`run_counting_plans`): (fingerprint, relegations, plan calls)."""
    res, plans = run_counting_plans("niyama", reqs, monkeypatch, skip, params, **cfg)
    relegations = [(s.id, s.relegated_s, s.relegation_reason) for s in res.states]
    return fingerprint(res), relegations, plans


def _requests(n, rate, slos, seed=1):
    return [replace(r, slo=slos[r.tier]) for r in make_requests(n, rate=rate, seed=seed, num_tiers=3,
                                                                prompt=(20, 1500))]


CASES = {
    # light: queues empty between arrivals, so most plans are decode-only (skipped)
    "light": dict(rate=6.0, slos=ROOMY, params={}, cfg=dict(num_replicas=2)),
    # deadlines bind: relegations, slack-withheld prefills, revision points
    "tight": dict(rate=60.0, slos=TIGHT, params={}, cfg=dict(num_replicas=2)),
    "tight_ranks": dict(rate=40.0, slos=TIGHT, params={"tier_importance": [0, 1, 2], "priority": "latest_start"},
                        cfg=dict(num_replicas=1, cluster_policy="round_robin")),
    # the KV runs short: evictions of partial prefills and decodes, and fallbacks to `plan`
    "pressure": dict(rate=40.0, slos=TIGHT, params={"selective_preemption": False},
                     cfg=dict(num_replicas=2, replica={"num_blocks": 260})),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_niyama_decode_runs_without_a_plan_equal_asking_for_it(case, monkeypatch):
    spec = CASES[case]
    reqs = _requests(300, spec["rate"], spec["slos"])
    skipped, releg_skipped, plans_skipped = run(reqs, monkeypatch, True, spec["params"], **spec["cfg"])
    asked, releg_asked, plans_asked = run(reqs, monkeypatch, False, spec["params"], **spec["cfg"])
    assert skipped == asked and releg_skipped == releg_asked
    assert plans_skipped < plans_asked                    # decode runs really started without a plan
    if case == "light":
        assert plans_skipped < 0.7 * plans_asked
    if case.startswith("tight"):
        assert skipped[3]["relegated"] > 0                # the comparison covered relegations
    if case == "pressure":
        assert skipped[3]["preemptions"] > 0              # and evictions


def test_a_replaced_or_overridden_niyama_plan_gets_no_promise():
    pol = LOCAL_POLICIES.create("niyama")
    assert pol.decode_batch([]) == []
    pol.plan = lambda view: None
    assert pol.decode_batch([]) is None

    class OwnPlan(LOCAL_POLICIES.get_class("niyama")):
        def plan(self, view):
            return super().plan(view)
    assert OwnPlan().decode_batch([]) is None


def test_decode_length_estimate_is_recomputed_after_each_observation():
    # The estimate is kept per key between observations: a kept value must never outlive its key's next one.
    kept, fresh_values = DecodeLengthEstimator(), []
    probe = _requests(1, 1.0, ROOMY)[0]
    probe_state = RequestState(replace(probe, app="chat"))
    for i, n in enumerate((100, 300, 120, 900, 40)):
        done = RequestState(replace(probe, id=100 + i, app="chat"))
        done.num_generated = n
        kept.total_tokens(probe_state)                      # read before the observation (kept)
        kept.observe(done)
        fresh = DecodeLengthEstimator()
        for m in (100, 300, 120, 900, 40)[:i + 1]:
            d = RequestState(replace(probe, id=200 + m, app="chat"))
            d.num_generated = m
            fresh.observe(d)
        fresh_values.append(fresh.total_tokens(probe_state))
        assert kept.total_tokens(probe_state) == fresh_values[-1]
    assert len(set(fresh_values)) == len(fresh_values)     # every observation moved the estimate


def test_a_subclass_cannot_override_what_the_core_decides():
    from tierserve.policies.local.niyama import NiyamaPolicy
    with pytest.raises(TypeError, match="overrides priority_value of NiyamaPolicy.*override `plan` instead"):
        class EdfOnly(NiyamaPolicy):        # noqa: F841 - the class statement is what is refused
            def priority_value(self, state):
                return state.arrival_s

    class Logged(NiyamaPolicy):             # replacing the plan itself is allowed
        def plan(self, view):
            return super().plan(view)
    assert Logged().decode_batch([]) is None     # and gets no decode-batch promise


def test_niyama_plans_leave_no_reference_cycles(monkeypatch):
    # Each plan's candidate state is freed by reference counting: the cyclic collector, run often during the
    # simulation, finds nothing to free (nested functions that call each other once left a cycle per plan).
    import contextlib
    import gc
    import importlib

    from conftest import LinearPredictor
    from tierserve.sim import ClusterConfig, simulate

    freed = {"objects": 0, "collections": 0}

    def count(phase, info):
        if phase == "stop":
            freed["objects"] += info["collected"]
            freed["collections"] += 1

    simulate_module = importlib.import_module("tierserve.sim.simulate")    # (the package exports the function)
    monkeypatch.setattr(simulate_module, "collect_less_often", contextlib.nullcontext)
    reqs = make_requests(300, rate=12.0, num_tiers=3)
    old = gc.get_threshold()
    gc.collect()
    gc.set_threshold(50, 10, 10)
    gc.callbacks.append(count)
    try:
        res = simulate(ClusterConfig(num_replicas=2, local_policy="niyama"), reqs, 3, predictor=LinearPredictor())
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*old)
    assert res.stats["iterations"] > 300 and freed["collections"] > 20     # many plans, many collections
    assert freed["objects"] == 0, freed
