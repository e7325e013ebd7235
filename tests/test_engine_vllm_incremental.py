"""The vLLM adapter's kept waiting order (`PolicyDriver.incremental`) against the full path, without vLLM.

A fake engine drives two drivers over the same requests through random arrivals, aborts, planned and
engine-made preemptions, partial admissions, late token deliveries (as under asynchronous scheduling) and
finishes; at every step both must give the same victims, service order, admissions, held-back order, budget,
relegations and planned batch. Also: which policies get the kept order, that a step without changes computes
no key, and `KeptWaitingQueue`'s view of the queue around vLLM's loop.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from tierserve.engines.vllm import EngineSettings, PolicyDriver
from tierserve.engines.vllm.driver import fixed_waiting_key, make_policy
from tierserve.policies.local.base import declares_steady_plans
from tierserve.engines.vllm.queues import KeptWaitingQueue
from tierserve.policies.local.vllm import VLLMPriorityPolicy

BLOCK = 16


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def new_request(i: int, rng: random.Random, now: float):
    prompt = rng.randint(4, 120)
    slo = rng.choice([{}, {"ttft_s": rng.uniform(0.01, 0.5), "tbt_s": rng.uniform(0.001, 0.05)},
                      {"ttlt_s": rng.uniform(0.05, 2.0)}])
    tier = rng.randint(0, 2)
    return SimpleNamespace(request_id=f"r{i}", priority=tier, arrival_time=now,
                           sampling_params=SimpleNamespace(extra_args=dict(slo, tier=tier) if slo or i % 2 else None),
                           max_tokens=rng.randint(1, 12), num_prompt_tokens=prompt, num_output_tokens=0,
                           num_tokens_with_spec=prompt, num_tokens=prompt, num_output_placeholders=0,
                           num_computed_tokens=0)


def blocks(req) -> int:
    return -(-req.num_computed_tokens // BLOCK)


def ids(reqs) -> list[str]:
    return [r.request_id for r in reqs]


def run_pair(policy: str, seed: int, steps: int = 250, total_blocks: int = 12, params: dict | None = None) -> int:
    """Drive a kept-order driver and a full-path driver side by side; returns the number of victims seen."""
    rng = random.Random(seed)
    clock = Clock()
    limits = dict(block_size=BLOCK, total_blocks=total_blocks, token_budget=128, max_num_seqs=4, clock=clock)
    settings = EngineSettings(policy=policy, policy_params=params or {})
    kept = PolicyDriver(settings, incremental=True, **limits)
    full = PolicyDriver(settings, incremental=False, **limits)
    assert kept.incremental and not full.incremental
    both = (kept, full)
    running: list = []
    waiting: list = []
    late: list = []          # steps whose output is delivered only after the next plan (asynchronous engine)
    n_req = victims = 0

    def finish(req) -> None:
        for d in both:
            d.finished(req)

    def evict(req, planned: bool) -> None:
        running.remove(req)
        req.num_computed_tokens = 0
        req.num_output_placeholders = 0
        waiting.insert(0, req)
        for d in both:
            d.engine_preempted(req, planned)

    for step in range(steps):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 5]) if step < steps - 60 else 0):
            req = new_request(n_req, rng, clock.t)
            n_req += 1
            waiting.append(req)
            for d in both:
                d.admit(req)
        if rng.random() < 0.05 and (waiting or running):             # an abort, waiting or running
            req = rng.choice(waiting + running)
            (waiting if req in waiting else running).remove(req)
            finish(req)
        free = total_blocks - sum(blocks(r) for r in running)
        shuffled = waiting[:]
        rng.shuffle(shuffled)                                        # the full path must not depend on it
        hk = kept.plan_step(running, None, free)
        hf = full.plan_step(running, shuffled, free)
        assert ids(hk.preempt) == ids(hf.preempt), step
        assert ids(hk.running) == ids(hf.running), step
        assert ids(hk.admit) == ids(hf.admit), step
        assert ids(hk.held) == ids(hf.held), step
        assert hk.budget == hf.budget and kept._last_plan == full._last_plan, step
        assert kept.relegations == full.relegations, step
        assert sorted(ids(hk.held) + ids(hk.admit)) == sorted(ids(waiting)), step
        for req in hk.preempt:
            victims += 1
            evict(req, True)
        running[:] = [r for r in hk.running if r in running]
        admit = hk.admit[:rng.randint(0, len(hk.admit))] if rng.random() < 0.2 else hk.admit   # allocation short
        engine_evicted = []
        if running and rng.random() < 0.05:                          # vLLM's own fallback: the tail
            engine_evicted.append(running[-1].request_id)
            evict(running[-1], False)
            admit = []                                               # v1 admits nothing in a step that preempted
        for req in admit:
            waiting.remove(req)
            running.append(req)
        left = hk.budget
        scheduled = {}
        for req in running:
            n = min(req.num_tokens - req.num_computed_tokens, left)
            if n <= 0:
                continue
            left -= n
            req.num_computed_tokens += n
            scheduled[req.request_id] = n
        t_sched = clock.t
        for d in both:
            d.record_schedule(scheduled, {r.request_id: r for r in running}, engine_evicted, t_sched)
        for late_step in late:               # the previous step's output, after this step's evictions (async)
            late_step()
        late.clear()
        for req in running:
            if req.request_id in scheduled and req.num_computed_tokens == req.num_tokens:
                req.num_output_tokens += 1
                req.num_tokens = req.num_tokens_with_spec = req.num_tokens + 1
        clock.t += rng.uniform(0.001, 0.05)
        reqs = {r.request_id: r for r in running + waiting}
        deliver = [lambda d=d, t=clock.t, reqs=reqs: d.record_output(t, reqs, True) for d in both]
        if rng.random() < 0.3:
            late.extend(deliver)
        else:
            for f in deliver:
                f()
        for req in [r for r in running if r.num_output_tokens >= r.max_tokens]:
            running.remove(req)
            finish(req)
    for f in late:
        f()
    assert kept.stats() == full.stats()
    free = total_blocks - sum(blocks(r) for r in running)
    assert ids(kept.plan_step(running, None, free).held) == ids(full.plan_step(running, waiting, free).held)
    assert len(kept._wstates) == len(waiting)        # admitted last step: left the kept order once seen running
    return victims


@pytest.mark.parametrize("policy", ["vllm_priority", "vllm_priority_sorted", "vllm_edf", "llumlet"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_kept_order_plans_exactly_as_the_full_path(policy, seed):
    victims = run_pair(policy, seed)
    assert victims > 0                      # KV contention reached: preemption and re-entry were exercised


def test_which_policies_keep_their_waiting_order():
    assert fixed_waiting_key(make_policy("vllm_priority")) is not None
    assert fixed_waiting_key(make_policy("vllm_edf")) is not None
    assert fixed_waiting_key(make_policy("llumlet")) is not None
    assert fixed_waiting_key(make_policy("llumlet", {"promote_after_s": 1.0})) is None   # re-ranks over time
    assert fixed_waiting_key(make_policy("vllm")) is None          # FCFS: the engine's queue order itself

    class WithHook(VLLMPriorityPolicy):
        def on_preempt(self, state, mode, view):
            pass

    class OwnOrder(VLLMPriorityPolicy):
        def order_waiting(self, waiting):
            return sorted(waiting, key=lambda s: (s.relegated, s.tier, s.arrival_s, s.id))

    assert fixed_waiting_key(WithHook()) is None and fixed_waiting_key(OwnOrder()) is None

    def relegated_last(s):
        return (s.relegated, s.tier, s.arrival_s, s.id)

    class UndeclaredOrder(VLLMPriorityPolicy):      # its own order and key, under the inherited plan
        waiting_order_key = staticmethod(relegated_last)

        def order_waiting(self, waiting):
            return sorted(waiting, key=relegated_last)

    # the traits' rule, shared with the simulator: behaviour defined under an inherited plan keeps no promise
    # until the class declares its steady plans
    assert fixed_waiting_key(UndeclaredOrder()) is None
    DeclaredOrder = declares_steady_plans(type("DeclaredOrder", (UndeclaredOrder,), {}))
    assert fixed_waiting_key(DeclaredOrder()) is relegated_last
    p = VLLMPriorityPolicy()
    p.order_waiting = lambda waiting: waiting
    assert fixed_waiting_key(p) is None
    d = PolicyDriver(EngineSettings(policy="vllm_priority", incremental_waiting=False), block_size=16,
                     total_blocks=64, token_budget=128, max_num_seqs=4)
    assert not d.incremental


def test_a_step_without_changes_computes_no_waiting_key():
    clock = Clock()
    d = PolicyDriver(EngineSettings(policy="vllm_priority"), block_size=16, total_blocks=64, token_budget=128,
                     max_num_seqs=2, clock=clock)
    calls = []
    key = d._waiting_key
    d._waiting_key = lambda s: calls.append(s.id) or key(s)
    rng = random.Random(0)
    reqs = [new_request(i, rng, clock.t) for i in range(200)]
    for r in reqs:
        d.admit(r)
    assert len(calls) == 200
    hints = d.plan_step([], None, 64)
    running = hints.admit
    for r in running:
        r.num_computed_tokens = r.num_tokens
    calls.clear()
    for _ in range(3):                      # the admitted run; nothing else changes
        hints = d.plan_step(running, None, 40)
        assert not hints.admit and len(hints.held) == 198
    assert calls == []


def test_the_kept_queue_shows_vllms_loop_only_the_admissions():
    q = KeptWaitingQueue()
    reqs = [SimpleNamespace(request_id=f"r{i}") for i in range(6)]
    for r in reqs:
        q.add_request(r)
    assert len(q) == 6 and bool(q)
    q.show([reqs[3], reqs[1]])
    assert len(q) == 2 and q.peek_request() is reqs[3]
    assert q.pop_request() is reqs[3]
    q.prepend_request(reqs[5])              # vLLM evicting a running request mid-loop (not queued twice below)
    q.remove_request(reqs[1])
    assert list(q) == [reqs[5]]
    assert q.pop_request() is reqs[5] and not q
    with pytest.raises(IndexError):
        q.peek_request()
    q.prepend_requests([reqs[5]])           # skipped by the loop: back in the queue
    q.hide()
    assert len(q) == 4 and {r.request_id for r in q} == {"r0", "r2", "r4", "r5"}
    q.remove_requests([reqs[0], reqs[2]])
    assert {r.request_id for r in q} == {"r4", "r5"}


def test_the_switch_is_read_and_checked():
    from tierserve.core import ConfigError
    assert EngineSettings.from_sources(None, {"TIERSERVE_INCREMENTAL_WAITING": "false"}).incremental_waiting is False
    assert EngineSettings.from_sources({"tierserve": {"incremental_waiting": False}}, {}).incremental_waiting is False
    with pytest.raises(ConfigError) as e:
        EngineSettings.from_sources(None, {"TIERSERVE_INCREMENTAL_WAITING": "maybe"})
    assert e.value.field == "TIERSERVE_INCREMENTAL_WAITING"
    with pytest.raises(ConfigError) as e:
        EngineSettings.from_sources({"tierserve": {"incremental_waiting": "no"}}, {})
    assert e.value.field == "tierserve.incremental_waiting"
