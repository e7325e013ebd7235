"""What a policy promises, and that every registered policy's promises keep the simulator exact.

One `PolicyTraits` per policy (policies/local/traits.py) says what the executor may skip. Over every registered
local policy, and a subclass of a shipped policy whose waiting order depends on the clock:
  * skip-ahead (decode runs, chunk runs, iterations started without a plan) equals stepping, every plan asked
    for and none repeated;
  * starting iterations without a plan equals asking the policy for each.
The clock subclass redefines `order_waiting` under llumlet's inherited plan without declaring that its plans
keep llumlet's promises: its traits must withdraw them — kept, they make skip-ahead wrong (the last test
shows how wrong, so the comparison above can fail).
"""
from __future__ import annotations

import dataclasses

import pytest

from conftest import make_requests, register_stepwise
from test_sim_executor import per_request, skip_and_step
from test_sim_plan_skipping import run as run_plans
from tierserve.policies.local import LOCAL_POLICIES
from tierserve.policies.local.llumlet import LlumletPolicy
from tierserve.policies.local.traits import traits_of

CLOCK = "clock_ordered_test"


class ClockOrderedLlumlet(LlumletPolicy):
    """Llumlet whose waiting order puts requests waiting over 0.3 s first: an order that moves with the clock
    (`_now` is the time of llumlet's last plan), under llumlet's own `plan`."""

    def order_waiting(self, waiting):
        now = self._now
        return sorted(waiting, key=lambda s: (now - s.arrival_s < 0.3, s.tier, s.arrival_s, s.id))


@pytest.fixture
def clock_policy(monkeypatch):
    monkeypatch.setitem(LOCAL_POLICIES.table, CLOCK, f"{__name__}:ClockOrderedLlumlet")


POLICIES = LOCAL_POLICIES.names + [CLOCK]
# KV short enough that waiting requests do not fit and queues build: preemptions, admissions that stop early.
CFG = dict(num_replicas=2, cluster_policy="jsq", replica={"num_blocks": 400})


def _requests():
    return make_requests(220, rate=30.0, num_tiers=3, prompt=(20, 900), output=(1, 200))


def test_every_registered_policy_has_traits_and_the_shipped_ones_keep_their_promises():
    withdrawn = {}
    for name in LOCAL_POLICIES.names:
        traits = traits_of(LOCAL_POLICIES.create(name))
        if not traits.steady:
            withdrawn[name] = traits.why_not_steady
    assert not withdrawn, withdrawn
    promises = {n: traits_of(LOCAL_POLICIES.create(n)) for n in ("vllm", "sarathi", "llumlet", "vllm_v0", "niyama")}
    assert promises["vllm"].keeps_decode_batch and promises["vllm"].admission_cap == 0
    assert promises["sarathi"].repeats_chunk and promises["sarathi"].hold_rule == "whole_prompt"
    assert promises["vllm_v0"].keeps_decode_batch and promises["vllm_v0"].admission_cap is None
    assert promises["niyama"].iteration_hook and "on_arrival" in promises["niyama"].hooks
    assert promises["llumlet"].fixed_waiting_key is not None and promises["vllm"].fixed_waiting_key is None


def test_a_clock_dependent_subclass_is_detected_and_keeps_no_promise():
    traits = traits_of(ClockOrderedLlumlet())
    assert not traits.steady and "order_waiting" in traits.why_not_steady
    assert not traits.keeps_decode_batch and traits.admission_cap is None and traits.fixed_waiting_key is None
    # the same order replaced on an instance is caught too; a replaced plan makes its own promises
    p = LOCAL_POLICIES.create("vllm_priority")
    p.order_waiting = lambda waiting: list(waiting)
    assert not traits_of(p).steady
    q = LOCAL_POLICIES.create("vllm")
    q.plan = lambda view, plan=q.plan: plan(view)
    assert traits_of(q).steady and not traits_of(q).keeps_decode_batch   # decode_batch refuses a replaced plan


@pytest.mark.parametrize("policy", POLICIES)
def test_skip_ahead_equals_stepping_for_every_policy(policy, clock_policy):
    skipped, stepped = skip_and_step(_requests(), 3, policy, **CFG)
    assert per_request(skipped) == per_request(stepped)
    assert [s.service_s for s in skipped.states] == pytest.approx([s.service_s for s in stepped.states], rel=1e-9)
    assert skipped.duration_s == stepped.duration_s
    assert skipped.stats["iterations"] == stepped.stats["iterations"]
    assert [h.counts for h in skipped.tbt_by_tier] == [h.counts for h in stepped.tbt_by_tier]


@pytest.mark.parametrize("policy", POLICIES)
def test_starting_without_a_plan_equals_asking_for_every_policy(policy, clock_policy, monkeypatch):
    reqs = _requests()
    skipped, plans_skipped = run_plans(policy, reqs, monkeypatch, True, **CFG)
    asked, plans_asked = run_plans(policy, reqs, monkeypatch, False, **CFG)
    assert skipped == asked
    assert plans_skipped <= plans_asked


@pytest.mark.pure_python          # patches the executor's reading of the traits (compiled code cannot be patched)
def test_kept_promises_make_the_clock_subclass_inexact(clock_policy, monkeypatch):
    """The old behaviour: llumlet's promises kept for the subclass. Requests then differ from stepping."""
    import tierserve.sim.replica_state as state

    def as_promised(policy):
        honest = traits_of(policy)
        return dataclasses.replace(honest, steady=True, keeps_decode_batch=True, admission_cap=0)

    register_stepwise()
    monkeypatch.setattr(state, "traits_of", as_promised)
    skipped, stepped = skip_and_step(_requests(), 3, CLOCK, **CFG)
    differ = sum(a != b for a, b in zip(per_request(skipped), per_request(stepped)))
    assert differ > 10, differ
