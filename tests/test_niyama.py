"""Niyama/QoServe (seed 003): QoS deadlines, dynamic chunking against the predictor, eager relegation,
selective preemption, the fixed-chunk Sarathi baselines, silos, skip-ahead exactness and bad parameters."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from conftest import LinearPredictor, make_requests, register_stepwise
from tierserve.core import SLO, ConfigError, Outcome, PreemptMode, Request, RequestState, Status
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.policies.cluster.silo import silo_layout
from tierserve.policies.local import LOCAL_POLICIES, ReplicaView
from tierserve.policies.local.deadlines import (
    DecodeLengthEstimator, check_qos_class, decode_slack_s, first_token_deadline, next_token_deadline, qos_class,
    token_deadline,
)
from tierserve.sim import ClusterConfig, simulate
from test_deadline_slack_load import reference_deadline_load
from test_sim_executor import per_request

Q1, Q2, Q3 = SLO(ttft_s=6.0, tbt_s=0.05), SLO(ttlt_s=600.0), SLO(ttlt_s=1800.0)
# Deadlines scaled to the fast test predictor so that they bind at test rates.
FAST = (SLO(ttft_s=0.5, tbt_s=0.03), SLO(ttlt_s=5.0), SLO(ttlt_s=15.0))


class DCPredictor(LinearPredictor):
    """The test predictor plus `max_prefill_tokens_within` by linear scan (the reference for bisection)."""

    def max_prefill_tokens_within(self, slack_s, decode_count, decode_context_sum, prefill_context=0, lo=0, hi=8192):
        def fits(p):
            return self.iteration_time(p, p * (prefill_context + p * 0.5), decode_count, decode_context_sum) <= slack_s
        if hi <= lo or not fits(lo + 1):
            return lo
        p = lo + 1
        while p < hi and fits(p + 1):
            p += 1
        return p


def state(i=0, arrival=0.0, prompt=100, out=50, tier=0, slo=Q1, app=""):
    return RequestState(Request(i, arrival, prompt, out, tier=tier, slo=slo, app=app))


def decoding(s: RequestState, generated: int, first_token_s: float) -> RequestState:
    """Put `s` in decode: prompt computed, `generated` tokens out, holding its blocks."""
    s.num_generated = generated
    s.num_tokens = s.prompt_tokens + generated
    s.num_computed_tokens = s.num_tokens - 1
    s.first_token_s = first_token_s
    s.status = Status.RUNNING
    s.num_blocks = -(-s.num_tokens // 16)
    return s


class Source:
    """A minimal replica for driving `plan` directly."""

    def __init__(self, running=(), waiting=(), now=0.0, free=10_000, total=10_000, budget=2552, predictor=None):
        self.index, self.running, self.waiting, self.swapped = 0, list(running), list(waiting), []
        self.free_blocks, self.total_blocks, self.block_size, self.watermark_blocks = free, total, 16, 0
        self.free_swap_blocks, self.token_budget, self.max_num_seqs = 0, budget, 128
        self.swap_time_per_block_s = 1e-4
        self.predictor = predictor or DCPredictor()
        self._now = now

    @property
    def now(self):
        return self._now


def niyama(**params):
    return LOCAL_POLICIES.create("niyama", **params)


def plan_of(pol, running=(), waiting=(), **src):
    """Queue `waiting` through the arrival hook (as the executor does), then plan once."""
    view = ReplicaView(Source(running, waiting, **src))
    for w in waiting:
        if w.policy_data == {}:
            w.replica = 0
            pol.on_arrival(w, view)
    return pol.plan(view)


# ---------------------------------------------------------------------------------------------- deadlines
def test_interactive_deadlines_are_ttft_then_one_tbt_per_token():
    s = state(arrival=10.0)
    assert first_token_deadline(s) == 16.0 == token_deadline(s, 1) == next_token_deadline(s)
    decoding(s, 1, first_token_s=12.0)                  # first token early: deadlines stay on the schedule
    assert token_deadline(s, 2) == pytest.approx(16.05)
    assert next_token_deadline(s) == pytest.approx(16.05)
    decoding(s, 5, first_token_s=12.0)
    assert next_token_deadline(s) == pytest.approx(16.0 + 5 * 0.05)


def test_late_prefill_moves_token_deadlines_to_the_actual_first_token():
    s = decoding(state(arrival=0.0), 1, first_token_s=9.0)       # TTFT target 6 s missed by 3 s
    assert token_deadline(s, 2) == pytest.approx(9.05)           # not 6.05: one late prefill dooms no token
    assert token_deadline(s, 11) == pytest.approx(9.5)
    assert first_token_deadline(s) == 6.0


def test_non_interactive_deadline_is_ttlt_and_its_slack_is_spread_over_remaining_tokens():
    s = state(arrival=5.0, slo=Q2)
    assert first_token_deadline(s) == 605.0 == next_token_deadline(s)
    decoding(s, 10, first_token_s=20.0)
    assert decode_slack_s(s, now=105.0, decode_remaining_est=100.0) == pytest.approx(5.0)
    assert decode_slack_s(s, now=700.0, decode_remaining_est=100.0) < 0


def test_qos_classes_and_bad_slos_are_named_errors():
    assert qos_class(Q1) == "interactive" and qos_class(Q2) == "non_interactive"
    with pytest.raises(ConfigError, match="tbt_s"):
        qos_class(SLO(ttft_s=1.0))                       # interactive without TBT
    with pytest.raises(ConfigError, match="QoS class"):
        qos_class(SLO())
    with pytest.raises(ConfigError, match=r"slo.ttlt_s: got -3"):
        SLO(ttlt_s=-3.0)
    with pytest.raises(ConfigError, match="qos_class: got 'batchy'"):
        check_qos_class("batchy")


def test_decode_estimate_is_app_mean_plus_two_sigma_learned_from_finished_requests():
    est = DecodeLengthEstimator()
    probe = state(app="chat")
    assert est.total_tokens(probe) == 256.0                      # prior before anything finished
    for n in (100, 200, 300):
        done = state(app="chat")
        done.num_generated = n
        est.observe(done)
    assert est.total_tokens(probe) == pytest.approx(200 + 2 * 100)     # sample σ of 100/200/300 is 100
    assert est.total_tokens(state(app="code")) == 256.0          # other apps keep their own history
    decoding(probe, 350, 1.0)
    assert est.remaining(probe) == pytest.approx(50.0)
    decoding(probe, 500, 1.0)
    assert est.remaining(probe) == 1.0


# --------------------------------------------------------------------------------------- dynamic chunking
def _tight_decodes(now, slack_s, n=8):
    """n interactive decodes (1 token out) whose tightest next-token slack at `now` is `slack_s`."""
    slo = SLO(ttft_s=1e-3, tbt_s=0.05)     # first token never late: the next deadline is first_token_s + TBT
    return [decoding(state(i, prompt=500, slo=slo), 1, first_token_s=now + slack_s - 0.05 + 0.01 * i)
            for i in range(n)]


@pytest.mark.parametrize("slack_s", [0.02, 0.035, 0.06])
def test_dynamic_chunk_is_the_largest_whose_predicted_time_fits_the_tightest_slack(slack_s):
    from tierserve.hardware.exec_model import make_execution_model
    pred = make_execution_model("Llama-3-8B", "A100-80GB", 1)
    decodes = _tight_decodes(10.0, slack_s)
    waiting = [state(100, arrival=9.0, prompt=4000, slo=Q2)]
    view = ReplicaView(Source(decodes, waiting, now=10.0, predictor=pred))
    pol = niyama(eager_relegation=False)
    total = pol.batch_tokens(view, decodes, view.free_blocks, waiting[0])
    n = len(decodes)
    ctx = sum(d.num_computed_tokens + 1 for d in decodes)

    def predicted(p):
        return pred.iteration_time(p, p * p * 0.5, n, ctx)
    p = total - n
    assert 128 <= total <= 2552
    if p > 128 - n:
        assert predicted(p) * 1.2 <= slack_s + 1e-12          # what it picked fits
    if total < 2552:
        assert predicted(p + 1) * 1.2 > slack_s               # one more token would not
    plan = plan_of(pol, decodes, waiting, now=10.0, predictor=pred)
    assert plan.num_tokens == total                            # the plan uses exactly that budget


def test_dynamic_chunk_extremes_no_decodes_no_slack_and_memory_pressure():
    pol = niyama()
    w = [state(100, prompt=5000, slo=Q2)]
    view = ReplicaView(Source([], w, now=1.0))
    assert pol.batch_tokens(view, [], view.free_blocks, w[0]) == 2552        # nothing to protect
    late = _tight_decodes(10.0, -0.01)
    view = ReplicaView(Source(late, w, now=10.0))
    assert pol.batch_tokens(view, late, view.free_blocks, w[0]) == 128       # slack <= 0: the smallest
    view = ReplicaView(Source([], w, now=1.0, free=500, total=10_000))
    assert pol.batch_tokens(view, [], 500, w[0]) == 512                      # memory pressure cap
    fixed = niyama(dynamic_chunking=False)
    assert fixed.batch_tokens(view, late, 500, w[0]) == 256


# ---------------------------------------------------------------------------------------- eager relegation
def test_violator_is_relegated_itself_when_all_tiers_are_equal():
    now = 10.0
    hopeless = state(1, arrival=4.5, prompt=8000, tier=0)                   # 6 s TTFT: due at 10.5, 8k tokens left
    fine = state(2, arrival=9.0, prompt=100, tier=2, slo=Q3)
    plan = plan_of(niyama(), [], [hopeless, fine], now=now)
    assert [(s.id, why) for s, why in plan.relegate] == [(1, "eager relegation: would miss its deadline")]
    assert plan.scheduled[0][0] is fine                                   # relegated requests run last


def test_relegation_scope_ahead_takes_the_lowest_tier_ahead_first_and_the_violator_only_when_none_is_left():
    now = 10.0
    savable = state(1, arrival=4.5, prompt=8000, tier=0)        # would miss (due 10.5), has not missed yet
    urgent = SLO(ttft_s=1.0, tbt_s=0.05)
    low_a = state(2, arrival=9.3, prompt=300, tier=1, slo=urgent)     # due 10.3: ahead of it in line
    low_b = state(3, arrival=9.4, prompt=300, tier=2, slo=urgent)
    behind = state(4, arrival=9.0, prompt=300, tier=2, slo=Q3)        # due 1809: behind it, no help
    pol = niyama(tier_importance=[0, 1, 2], relegation_scope="ahead")
    queue = [savable, low_a, low_b, behind]
    plan = plan_of(pol, [], queue, now=now)
    assert [s.id for s, _ in plan.relegate] == [3]              # the lowest tier ahead gives way first
    assert "gave way to tier 0 request 1" in plan.relegate[0][1]
    low_b.relegated_s = now
    pol.on_relegate(low_b, None)
    plan = plan_of(pol, [], queue, now=now)
    assert [s.id for s, _ in plan.relegate] == [2]              # then tier 1
    low_a.relegated_s = now
    pol.on_relegate(low_a, None)
    plan = plan_of(pol, [], queue, now=now)
    assert [s.id for s, _ in plan.relegate] == [1]              # none lower ahead: the violator itself
    pol = niyama(tier_importance=[0, 1, 2], relegation_scope="ahead")
    missed = state(5, arrival=0.0, prompt=100, tier=0)          # already past its 6 s deadline
    plan = plan_of(pol, [], [missed, state(6, arrival=9.9, prompt=50, tier=2, slo=urgent)], now=now)
    assert [s.id for s, _ in plan.relegate] == [5]              # a lost cause is never rescued at others' cost


def test_relegation_takes_the_lowest_tier_in_the_whole_queue_before_any_violator_of_a_higher_one():
    """Seed 003 / ALGORITHMS.md §4: low-priority requests are relegated first, a higher tier only when no lower
    one is left — also when the violator has already missed (the default `relegation_scope` "queue")."""
    now = 10.0
    urgent = SLO(ttft_s=1.0, tbt_s=0.05)
    savable = state(1, arrival=4.5, prompt=8000, tier=0)              # would miss (due 10.5)
    low_ahead = state(2, arrival=9.3, prompt=300, tier=1, slo=urgent)  # due 10.3: ahead of it
    mid_behind = state(3, arrival=9.0, prompt=300, tier=1, slo=Q3)     # due 1809: behind it
    low_behind_late = state(4, arrival=9.5, prompt=300, tier=2, slo=Q3)
    low_behind = state(5, arrival=9.2, prompt=300, tier=2, slo=Q3)     # least important, first in line of them
    pol = niyama(tier_importance=[0, 1, 2])
    queue = [savable, low_ahead, mid_behind, low_behind_late, low_behind]
    gave_way = []
    for _ in range(5):
        plan = plan_of(pol, [], queue, now=now)
        assert len(plan.relegate) == 1
        victim, why = plan.relegate[0]
        gave_way.append(victim.id)
        victim.relegated_s = now
        pol.on_relegate(victim, None)
        if victim is savable:
            break
        assert "gave way to tier 0 request 1" in why
    assert gave_way == [2, 5, 4, 3, 1]       # ahead first, then rank 2 in line order, then rank 1, then itself
    pol = niyama(tier_importance=[0, 1])
    missed = state(6, arrival=0.0, prompt=100, tier=0)                 # already past its 6 s deadline
    low = state(7, arrival=9.9, prompt=50, tier=1, slo=Q3)
    plan = plan_of(pol, [], [missed, low], now=now)
    assert [s.id for s, _ in plan.relegate] == [7]                     # a low one gives way even for a lost cause
    assert plan.scheduled[0][0] is missed


def test_relegated_requests_still_finish_and_are_reported_relegated():
    from tierserve.metrics import RequestTable
    reqs = [replace(r, slo=FAST[r.tier]) for r in make_requests(300, rate=80.0, num_tiers=3)]
    res = simulate(ClusterConfig(num_replicas=1, local_policy="niyama"), reqs, 3, predictor=DCPredictor())
    table = RequestTable.from_states(res.states, res.reasons)
    rel = table["outcome"] == Outcome.RELEGATED
    assert res.stats["relegated"] == int(rel.sum()) > 0
    assert table.finished.all()                                  # every relegated request finished too
    assert all(r.startswith("eager relegation") for r in table["reason"][rel])


# ------------------------------------------------------------------------------------- selective preemption
def _partial(i, arrival, prompt, done, slo):
    s = state(i, arrival=arrival, prompt=prompt, slo=slo)
    s.num_computed_tokens = done
    s.status = Status.RUNNING
    s.num_blocks = -(-prompt // 16)
    return s


def test_partial_prefill_is_paused_for_a_higher_priority_request_only_if_it_still_meets_its_deadline():
    pol = niyama(dynamic_chunking=False, chunk_tokens=256, eager_relegation=False)
    urgent = state(9, arrival=9.9, prompt=1000, slo=SLO(ttft_s=0.5, tbt_s=0.05))     # due 10.4
    roomy = _partial(1, 9.0, 4000, 1000, Q2)                               # due 609: can wait
    plan = plan_of(pol, [roomy], [urgent], now=10.0)
    assert plan.scheduled[0][0] is urgent and plan.num_tokens == 256
    # Judged one iteration at a time: yielding this iteration's 256 tokens (30 ms at 8.5k tok/s) to `urgent`
    # must leave time for its own 3000 (0.353 s) before 10.37 s.
    tight = _partial(2, 5.0, 4000, 1000, SLO(ttft_s=5.37, tbt_s=0.05))
    plan = plan_of(pol, [tight], [urgent], now=10.0)
    assert plan.scheduled[0][0] is tight                                  # pausing it would make it miss
    sarathi_like = niyama(dynamic_chunking=False, eager_relegation=False, selective_preemption=False)
    plan = plan_of(sarathi_like, [roomy], [urgent], now=10.0)
    assert plan.scheduled[0][0] is roomy                                  # off: partial prefills first


def test_kv_shortfall_evicts_a_partial_prefill_never_a_decode():
    d = decoding(state(1, prompt=32), 17, first_token_s=0.5)     # 49 tokens known, 48 computed in 3 blocks
    assert d.num_blocks == 4
    d.num_blocks = 3                                             # the 49th token's KV needs a 4th block
    p = _partial(2, 0.2, 160, 32, Q2)
    pol = niyama(eager_relegation=False)
    plan = pol.plan(ReplicaView(Source([d, p], [], now=1.0, free=0)))
    assert plan.preempt == [(p, PreemptMode.RECOMPUTE)]
    assert plan.scheduled == [(d, 1)] and pol.forced_decode_evictions == 0


class _NiyamaRecorder(LOCAL_POLICIES.get_class("niyama")):
    """niyama that checks, on every plan, that each running decode is scheduled or evicted for memory only
    when no partial prefill was left to evict."""

    log: dict = {}

    def plan(self, view):
        plan = super().plan(view)
        decodes = [r for r in view.running if not r.in_prefill]
        partial = [r for r in view.running if r.in_prefill]
        scheduled = {id(r) for r, _ in plan.scheduled}
        evicted = {id(r) for r, _ in plan.preempt}
        log = self.log
        for r in decodes[:view.max_num_seqs]:
            if id(r) in evicted:
                log["decode_evictions"] += 1
                if any(id(p) not in evicted for p in partial):
                    log["decode_evicted_before_prefill"] += 1
            elif id(r) not in scheduled:
                log["decode_skipped"] += 1
        log["prefill_evictions"] += sum(1 for p in partial if id(p) in evicted)
        log["pauses"] = self.pauses
        return plan


@pytest.mark.parametrize("num_blocks", [600, 4000])
def test_niyama_never_pauses_or_preempts_a_decode_for_priority(num_blocks):
    LOCAL_POLICIES.table["niyama_recorder_test"] = f"{__name__}:_NiyamaRecorder"
    _NiyamaRecorder.log.clear()
    _NiyamaRecorder.log.update(decode_evictions=0, decode_evicted_before_prefill=0, decode_skipped=0,
                               prefill_evictions=0, pauses=0)
    try:
        reqs = [replace(r, slo=FAST[r.tier]) for r in make_requests(300, rate=40.0, num_tiers=3, prompt=(20, 1500))]
        simulate(ClusterConfig(num_replicas=1, local_policy="niyama_recorder_test",
                               replica={"num_blocks": num_blocks}), reqs, 3, predictor=DCPredictor())
    finally:
        del LOCAL_POLICIES.table["niyama_recorder_test"]
    log = _NiyamaRecorder.log
    assert log["decode_skipped"] == 0 and log["decode_evicted_before_prefill"] == 0
    assert log["pauses"] > 0                         # selective preemption did pass partial prefills over
    if num_blocks == 600:
        assert log["prefill_evictions"] > 0          # memory was short: partial prefills gave way first
    else:
        assert log["decode_evictions"] == log["prefill_evictions"] == 0


# ------------------------------------------------------------------------------- baselines and equivalences
def _fast_reqs(n=400, rate=30.0, seed=1):
    return [replace(r, slo=FAST[r.tier]) for r in make_requests(n, rate=rate, seed=seed, num_tiers=3)]


def _run(policy, params, reqs, **cfg):
    cfg.setdefault("num_replicas", 2)
    cfg.setdefault("cluster_policy", "jsq")
    return simulate(ClusterConfig(local_policy=policy, local_policy_params=params, **cfg), reqs, 3,
                    predictor=DCPredictor())


def test_alpha_zero_orders_exactly_as_sarathi_edf():
    reqs = _fast_reqs()
    edf = _run("sarathi_edf", {"chunk_tokens": 256}, reqs)
    ny = _run("niyama", {"alpha_s_per_token": 0.0, "dynamic_chunking": False, "chunk_tokens": 256,
                         "eager_relegation": False, "selective_preemption": False}, reqs)
    assert [(s.id, s.first_token_s, s.finish_s) for s in edf.states] == \
        [(s.id, s.first_token_s, s.finish_s) for s in ny.states]
    hybrid = _run("niyama", {"alpha_s_per_token": 0.008, "dynamic_chunking": False, "chunk_tokens": 256,
                             "eager_relegation": False, "selective_preemption": False}, reqs)
    assert [s.first_token_s for s in hybrid.states] != [s.first_token_s for s in edf.states]   # α matters


def test_fixed_chunk_baselines_differ_only_in_prefill_order():
    reqs = _fast_reqs(seed=3)
    runs = {p: _run(p, {"chunk_tokens": 256}, reqs) for p in ("sarathi_fcfs", "sarathi_edf", "sarathi_srpf")}
    ttft = {p: sorted(s.first_token_s - s.arrival_s for s in r.states) for p, r in runs.items()}
    med = {p: v[len(v) // 2] for p, v in ttft.items()}
    assert med["sarathi_srpf"] < med["sarathi_fcfs"]                # shortest prompt first lowers the median
    small = _run("sarathi_fcfs", {"chunk_tokens": 64}, reqs)
    assert small.stats["iterations"] > runs["sarathi_fcfs"].stats["iterations"]      # the chunk is honoured


def test_silos_never_share_a_replica_and_each_pool_uses_its_chunk():
    reqs = _fast_reqs(300, rate=40.0)
    params, chunks = silo_layout([[0], [1], [2]], [2, 1, 1], [256, 2048, 2048])
    res = simulate(ClusterConfig(num_replicas=4, local_policy="sarathi_fcfs",
                                 local_policy_params={"chunk_by_replica": chunks},
                                 cluster_policy="silo", cluster_policy_params=params), reqs, 3,
                   predictor=DCPredictor())
    pools = {0: {0, 1}, 1: {2}, 2: {3}}
    for s in res.states:
        assert s.replica in pools[s.tier], (s.id, s.tier, s.replica)
    used = {t: {s.replica for s in res.states if s.tier == t} for t in range(3)}
    assert used[0] == {0, 1} and not (used[0] & used[1]) and not (used[1] & used[2])
    pol = LOCAL_POLICIES.create("sarathi_fcfs", chunk_by_replica=chunks)
    assert [pol.chunk_for(i) for i in range(4)] == [256, 256, 2048, 2048]


# ------------------------------------------------------------------------------- skip-ahead exactness
@pytest.mark.parametrize("policy,params", [
    ("sarathi_fcfs", {}), ("sarathi_edf", {}), ("sarathi_srpf", {}),
    ("niyama", {}), ("niyama", {"tier_importance": [0, 1, 2], "selective_preemption": False}),
    ("niyama", {"priority": "latest_start"}), ("niyama", {"priority": "edf", "dynamic_chunking": False}),
])
def test_skip_ahead_equals_stepping_for_the_new_policies(policy, params):
    register_stepwise()
    reqs = _fast_reqs(400, rate=45.0)
    cfg = dict(num_replicas=2, cluster_policy="jsq", replica={"num_blocks": 500})
    skipped = _run(policy, params, reqs, **cfg)
    stepped = _run("stepwise", {"inner": policy, **params}, reqs, **cfg)
    assert per_request(skipped) == per_request(stepped)
    assert [s.service_s for s in skipped.states] == pytest.approx([s.service_s for s in stepped.states], rel=1e-9)
    assert skipped.duration_s == stepped.duration_s and skipped.stats["iterations"] == stepped.stats["iterations"]
    assert [h.counts for h in skipped.tbt_by_tier] == [h.counts for h in stepped.tbt_by_tier]
    # Deadlines bind at this load, so niyama re-plans often (slack, relegation instants): fewer runs to skip.
    assert skipped.stats["events"] < stepped.stats["events"] * (0.5 if policy.startswith("sarathi") else 0.8)
    assert skipped.stats["preemptions"] > 0
    if policy == "niyama":
        assert skipped.stats["relegated"] > 0          # relegation instants were revision points


# ------------------------------------------------------------------------------------------ bad parameters
@pytest.mark.parametrize("policy,params,field", [
    ("niyama", {"alpha_s_per_token": -0.001}, "alpha_s_per_token: got -0.001"),
    ("niyama", {"priority": "fifo"}, "priority: got 'fifo'"),
    ("niyama", {"min_chunk_tokens": 0}, "min_chunk_tokens: got 0"),
    ("niyama", {"max_chunk_tokens": 64}, "max_chunk_tokens: got 64"),
    ("niyama", {"slack_factor": math.inf}, "slack_factor: got inf"),
    ("niyama", {"tier_importance": [0, -1]}, "tier_importance: got"),
    ("niyama", {"relegation_scope": "everyone"}, "relegation_scope: got"),
    ("niyama", {"dynamic_chunking": "yes"}, "dynamic_chunking: got 'yes'"),
    ("niyama", {"throughput_ewma_weight": 2.0}, "throughput_ewma_weight: got 2.0"),
    ("sarathi_fcfs", {"chunk_tokens": 0}, "chunk_tokens: got 0"),
    ("sarathi_edf", {"chunk_by_replica": [256, "2K"]}, r"chunk_by_replica\[1\]: got '2K'"),
])
def test_bad_local_parameters_name_the_parameter_and_value(policy, params, field):
    with pytest.raises(ConfigError, match=field):
        LOCAL_POLICIES.create(policy, **params)


def test_bad_silo_parameters_name_the_parameter_and_value():
    with pytest.raises(ConfigError, match=r"pools\[1\]"):
        CLUSTER_POLICIES.create("silo", pools=[[0], [0, 1]], pool_replicas=[1, 1])
    with pytest.raises(ConfigError, match=r"pool_replicas\[0\]: got 0"):
        CLUSTER_POLICIES.create("silo", pools=[[0]], pool_replicas=[0])
    silo = CLUSTER_POLICIES.create("silo", pools=[[0], [1]], pool_replicas=[1, 2])
    with pytest.raises(ConfigError, match="num_replicas: got 4"):
        silo.setup(4, 0)
    with pytest.raises(ConfigError, match="tier: got 5"):
        silo.pool_of(5)


# ------------------------------------------------------------------------- deadline-aware dispatch (item 6)
class Instance:
    """A replica as a cluster policy sees it (the fields `deadline_slack` reads; its deadline load by the
    O(queue) walk of the definition, which the simulator's kept load is checked against)."""

    def __init__(self, running=(), waiting=()):
        self.running, self.waiting, self.swapped = list(running), list(waiting), []

    @property
    def num_outstanding(self):
        return len(self.running) + len(self.waiting) + len(self.swapped)

    def deadline_load(self, deadline):
        return reference_deadline_load(self, deadline)


def slack_dispatch(**params):
    return CLUSTER_POLICIES.create("deadline_slack", predictor=LinearPredictor(), **params)


def test_deadline_slack_is_the_deadline_minus_the_predicted_first_token_over_the_work_ahead():
    pol = slack_dispatch(chunk_tokens=100)
    now = 10.0
    decodes = [decoding(state(10 + i, arrival=0.0, prompt=200, out=50), 5, 1.0) for i in range(3)]
    earlier = state(1, arrival=8.0, prompt=400)                       # Q1 due 14: ahead of r
    later_q3 = state(2, arrival=9.0, prompt=5000, slo=Q3)             # due 1809: r overtakes it
    relegated = state(3, arrival=1.0, prompt=700)
    relegated.relegated_s = 5.0                                       # served last: not ahead
    r = state(4, arrival=now, prompt=300)                             # due 16
    inst = Instance(decodes, [earlier, later_q3, relegated])
    ctx = sum(d.num_computed_tokens + 1 for d in decodes)
    per_iteration = LinearPredictor().iteration_time(100, 100 * 50, 3, ctx)
    expected = 16.0 - (now + (400 + 300) / 100 * per_iteration)
    assert pol.predicted_slack_s(r, inst, now) == pytest.approx(expected)
    q3 = state(5, arrival=now, prompt=300, slo=Q3)                    # sees the Q3 backlog too (not the relegated)
    assert pol.predicted_slack_s(q3, inst, now) == pytest.approx(
        now + 1800.0 - (now + (400 + 5000 + 300) / 100 * per_iteration))


def test_deadline_slack_sends_an_interactive_request_past_a_relaxed_backlog_that_jsq_avoids():
    now = 10.0
    relaxed_backlog = Instance(waiting=[state(i, arrival=9.0, prompt=4000, slo=Q3) for i in range(4)])
    interactive_work = Instance(waiting=[state(10 + i, arrival=9.5, prompt=3000) for i in range(2)])
    instances = [relaxed_backlog, interactive_work]
    q1 = state(20, arrival=now, prompt=200)
    q3 = state(21, arrival=now, prompt=200, slo=Q3)
    pol = slack_dispatch()
    assert CLUSTER_POLICIES.create("jsq").dispatch(q1, instances, now) == 1         # fewer outstanding
    assert pol.dispatch(q1, instances, now) == 0           # the Q3 backlog is served after it: more slack there
    assert pol.dispatch(q3, instances, now) == 1           # a Q3 request waits behind everything: less work on 1
    assert pol.dispatch(q1, [Instance(), Instance()], now) == 0                    # ties: lower index


def test_deadline_slack_runs_in_the_simulator_and_rejects_bad_parameters():
    reqs = _fast_reqs(200, rate=30.0)
    res = simulate(ClusterConfig(num_replicas=2, local_policy="niyama", cluster_policy="deadline_slack"), reqs, 3,
                   predictor=DCPredictor())
    assert all(s.finish_s is not None and s.finish_s >= s.arrival_s for s in res.states)
    assert {s.replica for s in res.states} == {0, 1}
    with pytest.raises(ConfigError, match="chunk_tokens: got 0"):
        CLUSTER_POLICIES.create("deadline_slack", chunk_tokens=0, predictor=LinearPredictor())
    with pytest.raises(ConfigError, match="model"):
        CLUSTER_POLICIES.create("deadline_slack", model="GPT-9")     # the replicas' model is used: no such field


def test_conftest_predictor_bisects_to_the_largest_chunk_that_fits_like_a_linear_scan():
    fast, scan = LinearPredictor(), DCPredictor()
    for slack in (0.004, 0.006, 0.02, 0.05, 0.3):
        for decodes, ctx, pctx, lo, hi in ((0, 0, 0, 0, 8192), (32, 20_000, 500, 128, 2552), (8, 100, 0, 100, 90)):
            assert fast.max_prefill_tokens_within(slack, decodes, ctx, pctx, lo, hi) == \
                scan.max_prefill_tokens_within(slack, decodes, ctx, pctx, lo, hi)
