"""Iterations the executor starts without asking the policy give exactly what asking gives.

A policy that names its steady plans (`decode_batch`: every running request decoding, nothing waiting;
`repeats_prefill_chunk`: the same decodes beside one prefill's next chunk; `admits_waiting`: the decodes, then
the waiting requests admitted) lets the simulator start the next decode run, chunk iteration or admission
without calling `plan`. Every request, histogram (bins, counts and sums), the
KV block-seconds and every statistic must be bit-identical to a run where `plan` is asked each time — and
the skipping must really happen, or the comparison proves nothing.
"""
from __future__ import annotations

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.policies.local import LOCAL_POLICIES
from tierserve.sim import ClusterConfig, simulate
from test_sim_deferred_apply import fingerprint

# the ones that declare their steady plans
POLICIES = ["sarathi", "vllm", "vllm_priority", "vllm_priority_sorted", "llumlet", "vllm_v0"]


def run_counting_plans(policy: str, reqs, monkeypatch, skip: bool, params: dict | None = None, **cfg) -> tuple:
    """One run; with `skip` False every plan is asked for (the policy's `plan` replaced on each instance by
    the same function, which its declarations must refuse). Returns the result and the `plan` calls."""
    cls = next(c for c in LOCAL_POLICIES.get_class(policy).__mro__ if "plan" in c.__dict__)   # defines `plan`
    calls = {"plan": 0}
    original_plan = cls.plan

    def counted_plan(self, view):
        calls["plan"] += 1
        return original_plan(self, view)

    original_create = LOCAL_POLICIES.create

    def create(name, **kw):
        p = original_create(name, **kw)
        if not skip:
            p.plan = lambda view, p=p: counted_plan(p, view)   # the same plan, replaced on the instance
        return p

    with monkeypatch.context() as m:
        m.setattr(cls, "plan", counted_plan)
        m.setattr(LOCAL_POLICIES, "create", create)
        res = simulate(ClusterConfig(local_policy=policy, local_policy_params=params or {}, **cfg), reqs, 3,
                       predictor=LinearPredictor())
    return res, calls["plan"]


def run(policy: str, reqs, monkeypatch, skip: bool, params: dict | None = None, **cfg) -> tuple:
    res, plans = run_counting_plans(policy, reqs, monkeypatch, skip, params, **cfg)
    return fingerprint(res), plans


CASES = {
    "light": dict(rate=8.0, cfg=dict(num_replicas=2)),
    # queues build and the KV runs short: evictions, and the fallbacks to `plan` when blocks do not fit
    "pressure": dict(rate=40.0, cfg=dict(num_replicas=2, replica={"num_blocks": 260})),
    "one_replica_many_tiers": dict(rate=12.0, cfg=dict(num_replicas=1, cluster_policy="round_robin")),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("policy", POLICIES)
def test_starting_without_a_plan_equals_asking_for_it(policy, case, monkeypatch):
    spec = CASES[case]
    reqs = make_requests(300, rate=spec["rate"], num_tiers=3, prompt=(20, 1500))
    skipped, plans_skipped = run(policy, reqs, monkeypatch, True, **spec["cfg"])
    asked, plans_asked = run(policy, reqs, monkeypatch, False, **spec["cfg"])
    assert skipped == asked
    if case == "pressure":                            # queues rarely empty: few plans can be skipped
        assert plans_skipped < plans_asked
        assert skipped[3]["preemptions"] > 0          # the comparison covered evictions
    else:
        assert plans_skipped < 0.8 * plans_asked      # the plans were really skipped
    if policy != "vllm_v0" and case != "pressure":     # admissions beside decodes start without a plan
        assert plans_skipped < 0.5 * plans_asked


def test_a_replaced_or_overridden_plan_gets_no_promise():
    for name in POLICIES:
        p = LOCAL_POLICIES.create(name)
        assert p.decode_batch([]) == []
        assert (p.admits_waiting() is not None) == (name != "vllm_v0")
        p.plan = lambda view: None
        assert p.decode_batch([]) is None and not p.repeats_prefill_chunk() and p.admits_waiting() is None
    from tierserve.policies.local.sarathi_fcfs import SarathiFCFSPolicy   # a subclass with its own plan
    sub = SarathiFCFSPolicy()
    assert sub.decode_batch([]) is None and not sub.repeats_prefill_chunk() and sub.admits_waiting() is None
    # a subclass serving running requests in its own order gets no promise from its parent's declaration
    from tierserve.policies.local.vllm import VLLMPolicy, VLLMPriorityPolicy

    class Reversed(VLLMPriorityPolicy):
        def running_order(self, running):
            return list(reversed(running))

    class OwnResumable(VLLMPolicy):
        def resumable(self, view):
            return list(view.waiting)

    assert Reversed().decode_batch([]) is None and Reversed().admits_waiting() is None
    assert OwnResumable().decode_batch([]) is None and OwnResumable().admits_waiting() is None
    # llumlet's aging reorders waiting requests by the time of the plan: its decodes are promised, not admissions
    aging = LOCAL_POLICIES.create("llumlet", promote_after_s=0.5)
    assert aging.decode_batch([]) == [] and aging.admits_waiting() is None
    assert LOCAL_POLICIES.create("vllm", long_prefill_threshold=64).admits_waiting() == 64


def test_admissions_capped_by_long_prefill_threshold_equal_asking(monkeypatch):
    # v1 caps each request's chunk: admissions started without a plan must cap it the same way
    reqs = make_requests(300, rate=8.0, num_tiers=3, prompt=(20, 1500))
    params = {"long_prefill_threshold": 128}
    skipped, plans_skipped = run("vllm", reqs, monkeypatch, True, params, num_replicas=2)
    asked, plans_asked = run("vllm", reqs, monkeypatch, False, params, num_replicas=2)
    assert skipped == asked
    assert plans_skipped < 0.8 * plans_asked


def test_llumlet_aging_decode_runs_equal_asking(monkeypatch):
    # promotion re-ranks waiting requests as time passes; decode runs started without a plan must not miss it
    reqs = make_requests(300, rate=12.0, num_tiers=3, prompt=(20, 1500))
    params = {"promote_after_s": 0.2}
    skipped, plans_skipped = run("llumlet", reqs, monkeypatch, True, params, num_replicas=1,
                                 cluster_policy="round_robin")
    asked, plans_asked = run("llumlet", reqs, monkeypatch, False, params, num_replicas=1,
                             cluster_policy="round_robin")
    assert skipped == asked
    assert plans_skipped < 0.8 * plans_asked
