"""`deadline_slack` reads driver-kept deadline load (issue 9 item 6): the kept load equals the O(queue) walk of
the policy's definition at every dispatch of randomized overloaded runs (preemptions, swaps, relegations), and
so do the dispatch decisions; the prefix-sum structure against brute force."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.core import SLO, ConfigError
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.sim.deadline_load import PrefixSums
from tierserve.policies.cluster.deadline_slack import DeadlineSlackDispatch
from tierserve.policies.local.deadlines import prefill_deadline
from tierserve.sim import ClusterConfig, simulate

FAST = (SLO(ttft_s=0.5, tbt_s=0.03), SLO(ttlt_s=5.0), SLO(ttlt_s=15.0))


def reference_deadline_load(inst, deadline: float) -> tuple[int, int, int]:
    """The O(queue) definition (deadline_slack's docstring): a walk over every running, waiting and swapped
    request of the replica."""
    ahead = decodes = context = 0
    for q in inst.running:
        left = q.num_tokens - q.num_computed_tokens
        if left > 1 or q.num_generated == 0:
            if not q.relegated and prefill_deadline(q) <= deadline:
                ahead += left
        else:
            decodes += 1
            context += q.num_computed_tokens + 1
    for queue in (inst.waiting, inst.swapped):
        for q in queue:
            if not q.relegated and prefill_deadline(q) <= deadline:
                ahead += q.num_tokens - q.num_computed_tokens
    return ahead, decodes, context


def reference_dispatch(pol: DeadlineSlackDispatch, state, instances, now: float) -> int:
    """argmax slack from the reference walk (ties: fewer outstanding, lower index)."""
    deadline = prefill_deadline(state)
    c = pol.chunk_tokens
    keys = []
    for i, inst in enumerate(instances):
        ahead, decodes, context = reference_deadline_load(inst, deadline)
        t = inst.predictor.iteration_time(c, c * c * 0.5, decodes, context)
        slack = deadline - (now + (ahead + state.num_tokens - state.num_computed_tokens) / c * t)
        keys.append((-slack, inst.num_outstanding, i))
    return min(keys)[2]


def _checked_run(monkeypatch, local_policy, params, reqs, **cfg):
    """Simulate with deadline_slack, checking every dispatch against the reference; returns (result, checks)."""
    checks = {"dispatches": 0, "loads": 0, "queued_seen": 0, "rebuilds": 0}
    original = DeadlineSlackDispatch.dispatch

    def checking_dispatch(self, state, instances, now):
        deadline = prefill_deadline(state)
        for inst in instances:
            assert inst.deadline_load(deadline) == reference_deadline_load(inst, deadline)
            checks["loads"] += 1
            checks["queued_seen"] += len(inst.waiting) + len(inst.swapped)
        choice = original(self, state, instances, now)
        assert choice == reference_dispatch(self, state, instances, now)
        checks["dispatches"] += 1
        checks["rebuilds"] = sum(inst._deadline_load.rebuilds for inst in instances)
        return choice

    monkeypatch.setattr(DeadlineSlackDispatch, "dispatch", checking_dispatch)
    cfg.setdefault("num_replicas", 4)
    res = simulate(ClusterConfig(local_policy=local_policy, local_policy_params=params,
                                 cluster_policy="deadline_slack", **cfg), reqs, 3, predictor=LinearPredictor())
    return res, checks


def _overload(n, rate, seed):
    return [replace(r, slo=FAST[r.tier]) for r in make_requests(n, rate=rate, seed=seed, num_tiers=3,
                                                                    prompt=(20, 1500), output=(1, 200))]


def test_kept_load_and_decisions_equal_the_queue_walk_under_niyama_with_relegation_and_preemption(monkeypatch):
    reqs = _overload(700, rate=160.0, seed=7)
    res, checks = _checked_run(monkeypatch, "niyama", {}, reqs,
                               replica={"num_blocks": 400, "block_size": 16})
    assert checks["dispatches"] == len(reqs) - len(res.reasons)
    assert checks["queued_seen"] > 20 * checks["loads"]              # deep queues: the O(queue) case
    assert checks["rebuilds"] == 0                                     # every change seen by a hook or a read
    assert sum(s.relegated for s in res.states) > 50                   # relegations happened while queued
    assert sum(s.num_preemptions for s in res.states) > 0


def test_kept_load_and_decisions_equal_the_queue_walk_with_swaps_and_recomputed_decodes(monkeypatch):
    reqs = _overload(600, rate=120.0, seed=11)
    for mode, field in (("swap", "num_swaps"), ("recompute", "num_preemptions")):
        monkeypatch.undo()
        res, checks = _checked_run(monkeypatch, "vllm", {"preempt_mode": mode}, reqs,
                                   replica={"num_blocks": 300, "block_size": 16})
        assert checks["dispatches"] > 500 and checks["rebuilds"] == 0
        assert sum(getattr(s, field) for s in res.states) > 20        # decodes went back to a queue


def test_a_path_no_hook_sees_is_caught_by_the_count_check_and_rebuilt():
    from tierserve.sim.deadline_load import DeadlineLoad
    from tierserve.core import Request, RequestState

    class Replica:
        running, waiting, swapped = [], [], []

    rep = Replica()
    load = DeadlineLoad(rep)
    states = [RequestState(Request(i, 0.0, 100 + i, 10, slo=FAST[0])) for i in range(3)]
    for s in states:
        rep.waiting.append(s)
        load.queued(s)
    assert load.load(1.0) == (303, 0, 0)
    rep.waiting.pop()                       # left without a hook (and never seen running)
    assert load.load(1.0) == (201, 0, 0) and load.rebuilds == 1
    states[0].relegated_s = 0.1
    load.relegated(states[0])
    assert load.load(1.0) == (101, 0, 0) and load.rebuilds == 1
    rep.waiting.remove(states[1])           # ran and finished between two reads: the driver reports the finish
    load.finished(states[1])
    assert load.load(1.0) == (0, 0, 0) and load.rebuilds == 1


def test_prefix_sums_match_brute_force_over_random_inserts_and_removes():
    rng = random.Random(3)
    ps, live, seq = PrefixSums(), {}, 0
    for step in range(4000):                # > 2 blocks' worth: splits and empty blocks both happen
        if live and rng.random() < 0.4:
            key = rng.choice(list(live))
            ps.remove(key)
            del live[key]
        else:
            seq += 1
            key = (float(rng.randrange(60)) / 4, seq)       # many equal deadlines: ties on the bound
            live[key] = rng.randrange(1, 3000)
            ps.insert(key, live[key])
        if step % 97 == 0:
            for d in (-1.0, 0.0, 3.25, 7.5, 14.75, 100.0):
                assert ps.sum_upto(d) == sum(v for k, v in live.items() if k[0] <= d)
    assert ps.count == len(live)
    with pytest.raises(KeyError):
        ps.remove((-5.0, 0))


def test_deadline_slack_uses_the_replicas_predictor_and_rejects_a_bad_one():
    class Spy(LinearPredictor):
        policy_calls = 0

        def iteration_time(self, prefill, pairs, decodes, context):
            Spy.policy_calls += (prefill, pairs) == (997, 997 * 997 * 0.5)     # the policy's chunk of 997
            return super().iteration_time(prefill, pairs, decodes, context)

    reqs = _overload(60, rate=20.0, seed=1)
    simulate(ClusterConfig(num_replicas=2, local_policy="niyama", cluster_policy="deadline_slack",
                           cluster_policy_params={"chunk_tokens": 997}), reqs, 3, predictor=Spy())
    # each replica priced with the replicas' model, and again only when its running decodes changed
    assert 2 <= Spy.policy_calls < 2 * len(reqs)
    with pytest.raises(ConfigError, match="predictor"):
        CLUSTER_POLICIES.create("deadline_slack", predictor=object())
