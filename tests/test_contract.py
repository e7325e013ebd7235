"""The tier contract (`tierserve` local + cluster policies, docs/contract.md): the budget rule against the
predictor, the victim rule, deferral accounting in requests.csv, and skip-ahead exactness."""
from __future__ import annotations

import csv
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierserve.core import SLO, ConfigError, Outcome, Request, RequestState, Status
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.policies.local import LOCAL_POLICIES, ReplicaView
from tierserve.policies.local.tierserve import TierServePolicy, is_decoding

SLOS = (SLO(ttft_s=0.5, tbt_s=0.05), SLO(ttft_s=1.5, tbt_s=0.1), SLO(ttlt_s=60.0))
FLOOR = 16


@lru_cache(maxsize=1)
def a100_model():
    from tierserve.hardware.exec_model import make_execution_model
    return make_execution_model("Llama-3-8B", "A100-80GB", 1)


class Source:
    """A ReplicaSource over hand-made states (what the executor would hold)."""

    def __init__(self, running, waiting, free_blocks, predictor, now=10.0, token_budget=2048, max_num_seqs=256):
        self.index = 0
        self.running, self.waiting, self.swapped = running, waiting, []
        self.free_blocks = free_blocks
        self.total_blocks = 100_000
        self.block_size = 16
        self.watermark_blocks = 0
        self.free_swap_blocks = 0
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.swap_time_per_block_s = 1e-5
        self.predictor = predictor
        self._now = now

    @property
    def now(self):
        return self._now


def decode_state(i, tier, context, now=10.0, generated=5):
    s = RequestState(Request(i, now - 2.0, context, 500, tier, SLOS[tier]))
    s.num_tokens = context + generated
    s.num_computed_tokens = context + generated - 1
    s.num_generated = generated
    s.first_token_s = now - 1.0
    s.last_token_s = now - 0.02
    s.num_blocks = -(-s.num_computed_tokens // 16)
    s.status = Status.RUNNING
    s.replica = 0
    return s


def prefill_state(i, tier, prompt, done, now=10.0):
    s = RequestState(Request(i, now - 0.1, prompt, 100, tier, SLOS[tier]))
    s.num_computed_tokens = done
    s.num_blocks = -(-done // 16)
    s.status = Status.RUNNING if done else Status.WAITING
    s.replica = 0
    return s


def batch_shape(plan):
    """(prefill tokens, attention pairs, decodes, decode context) exactly as the executor prices a batch."""
    p = pairs = b = ctx = 0
    for r, n in plan.scheduled:
        if n == 1 and is_decoding(r):
            b += 1
            ctx += r.num_computed_tokens + 1
        else:
            p += n
            pairs += n * (r.num_computed_tokens + n * 0.5)
    return p, pairs, b, ctx


requests = st.lists(st.tuples(st.sampled_from(["decode", "partial", "waiting"]), st.integers(0, 2),
                              st.integers(1, 8000)), min_size=1, max_size=80)


def build(spec):
    running, waiting = [], []
    for i, (kind, tier, size) in enumerate(spec):
        if kind == "decode":
            running.append(decode_state(i, tier, size))
        elif kind == "partial" and size > 32:
            running.append(prefill_state(i, tier, size, size // 2))
        else:
            waiting.append(prefill_state(i, tier, size, 0))
    return running, waiting


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=requests, margin=st.sampled_from([0.8, 0.9, 1.0]))
def test_budget_never_exceeds_tier0_tbt_unless_the_floor_chunk_does(spec, margin):
    """A batch with a tier-0 decode is never given a budget whose predicted time exceeds tier 0's TBT target,
    unless the decodes plus one 16-token chunk already do (then that one floor chunk is all it runs)."""
    model = a100_model()
    running, waiting = build(spec)
    policy = TierServePolicy(tbt_margin=margin, min_chunk_tokens=FLOOR)
    plan = policy.plan(ReplicaView(Source(running, waiting, 100_000, model)))
    p, pairs, b, ctx = batch_shape(plan)
    tier0_decoding = any(r.tier == 0 and n == 1 and is_decoding(r) for r, n in plan.scheduled)
    if not tier0_decoding:
        return
    target = SLOS[0].tbt_s
    predicted = model.iteration_time(p, pairs, b, ctx)
    floor_alone = model.iteration_time(FLOOR, FLOOR * FLOOR * 0.5, b, ctx)
    if floor_alone <= target:
        assert predicted <= target + 1e-12, (p, b, predicted)
    else:
        assert p <= FLOOR


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=requests, free=st.integers(0, 400))
def test_no_tier0_decode_is_preempted_while_a_lower_tier_runs(spec, free):
    model = a100_model()
    running, waiting = build(spec)
    # Every decode crosses a block boundary next token, so a KV shortfall forces evictions.
    for r in running:
        if is_decoding(r):
            r.num_blocks = r.num_computed_tokens // 16
    plan = TierServePolicy().plan(ReplicaView(Source(running, waiting, free, model, max_num_seqs=len(running) or 1)))
    gone = {id(v) for v, _ in plan.preempt}
    left = [r for r in running if id(r) not in gone]
    for v, _ in plan.preempt:
        if v.tier == 0 and is_decoding(v):
            assert all(r.tier == 0 for r in left), "a tier-0 decode was evicted while a lower tier kept running"
            assert all(r.tier == 0 for r, _ in plan.scheduled), "a tier-0 decode was evicted to admit a lower tier"


@pytest.mark.parametrize("tier_order", [True, False])
def test_a_tier0_decode_outlives_a_lower_tier_with_an_earlier_deadline(tier_order):
    """The victim rule where the deadline order alone would pick the tier-0 decode: a tier-1 decode that arrived
    3 s earlier has the earlier next-token deadline. KV for one decode only: the tier-1 one goes,
    by tier order or, without it, by decode protection; with neither, the tier-0 decode would (the case the
    property above guards)."""
    model = a100_model()

    def states():
        t0, t1 = decode_state(0, 0, 700), decode_state(1, 1, 700, now=7.0)
        for r in (t0, t1):
            r.num_blocks = r.num_computed_tokens // 16          # each needs one block for its next token
        return t0, t1

    t0, t1 = states()
    plan = TierServePolicy(tier_order=tier_order).plan(ReplicaView(Source([t0, t1], [], 1, model)))
    assert [v for v, _ in plan.preempt] == [t1] and [r for r, _ in plan.scheduled] == [t0]
    t0, t1 = states()
    unprotected = TierServePolicy(tier_order=False, protect_decodes=False)
    assert [v for v, _ in unprotected.plan(ReplicaView(Source([t0, t1], [], 1, model))).preempt] == [t0]


def test_a_waiting_tier0_request_displaces_a_lower_tier_at_max_num_seqs():
    model = a100_model()
    running = [decode_state(i, 1 + i % 2, 500) for i in range(4)]
    waiting = [prefill_state(9, 0, 300, 0)]
    plan = TierServePolicy().plan(ReplicaView(Source(running, waiting, 100_000, model, max_num_seqs=4)))
    assert [v.tier for v, _ in plan.preempt] == [2]
    assert any(r is waiting[0] for r, _ in plan.scheduled)
    assert len(plan.scheduled) <= 4


def test_knobs_are_validated_by_name():
    with pytest.raises(ConfigError, match="tbt_margin"):
        TierServePolicy(tbt_margin=1.5)
    with pytest.raises(ConfigError, match="min_chunk_tokens"):
        TierServePolicy(min_chunk_tokens=0)
    with pytest.raises(ConfigError, match="defer_backlog_s"):
        CLUSTER_POLICIES.create("tierserve", defer_backlog_s=-1)
    with pytest.raises(ConfigError, match="defer_tiers"):
        CLUSTER_POLICIES.create("tierserve", defer_tiers="2")
    assert LOCAL_POLICIES.get_class("tierserve") is TierServePolicy


def small_burst_scenario(skip_ahead=True, num_requests=500, **cluster_params):
    from tierserve.experiments.scenario import ScenarioConfig
    d = ScenarioConfig().model_dump(mode="json")
    d["cluster"].update(num_replicas=2, local_policy="tierserve", cluster_policy="tierserve",
                        cluster_policy_params=cluster_params, skip_ahead=skip_ahead)
    d["workload"]["num_requests"] = num_requests
    d["workload"]["arrivals"] = {"kind": "piecewise", "rates": [6.0, 30.0, 6.0], "durations_s": [5.0, 10.0, 1e6]}
    return ScenarioConfig.from_dict(d)


@pytest.fixture(scope="module")
def burst_run():
    from tierserve.experiments.scenario import run_scenario
    return run_scenario(small_burst_scenario())


def test_deferred_requests_are_in_requests_csv_with_their_reason(burst_run, tmp_path):
    from tierserve.experiments.scenario import write_result
    paths = write_result(burst_run, tmp_path)
    with open(paths["requests.csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 500                                    # every request that entered has a row
    deferred = [r for r in rows if r["reason"].startswith("deferred: held")]
    assert deferred, "the burst should make the cluster hold some low-tier requests"
    for r in deferred:
        assert r["tier"] == "2"                                 # only the non-interactive tier is deferrable
        assert float(r["dispatch_s"]) > float(r["arrival_s"])
    assert all(r["outcome"] == str(int(Outcome.FINISHED)) for r in deferred)   # held, then served in full


def test_every_held_request_is_accounted_for_as_deferred(burst_run, tmp_path):
    """Deferred ⇔ held: a request's record says `deferred: held …` exactly when it was dispatched after it
    arrived (the only way tierserve dispatch delays one), and a streamed run's requests.csv says the same."""
    t = burst_run.table
    held = t["dispatch_s"] > t["arrival_s"]
    marked = np.array([isinstance(r, str) and r.startswith("deferred: held") for r in t["reason"]])
    assert held.sum() > 0
    np.testing.assert_array_equal(held, marked)
    from tierserve.experiments.contract import deferred_per_tier
    tiers = t["tier"][marked].tolist()
    assert deferred_per_tier(t) == {k: tiers.count(k) for k in set(tiers)}
    from tierserve.experiments.scenario import run_scenario
    run_scenario(small_burst_scenario(), stream=True, outdir=tmp_path)
    with open(tmp_path / "requests.csv", newline="") as f:
        streamed = {int(r["id"]): r["reason"] for r in csv.DictReader(f)}
    assert len(streamed) == len(t["id"])
    for i, reason in zip(t["id"].tolist(), t["reason"]):
        if isinstance(reason, str) and reason.startswith("deferred:"):
            assert streamed[int(i)] == reason
        else:
            assert not streamed[int(i)].startswith("deferred:")


def test_skip_ahead_is_exact_for_the_contract_stack(burst_run):
    from tierserve.experiments.scenario import run_scenario
    stepped = run_scenario(small_burst_scenario(skip_ahead=False))
    a, b = burst_run.table, stepped.table
    for col in ("first_token_s", "finish_s", "dispatch_s", "replica", "outcome", "relegated_s", "tbt_max_s"):
        np.testing.assert_array_equal(a[col], b[col], err_msg=col)


def test_the_default_run_prints_fcfs_priority_and_tierserve_side_by_side():
    from typer.testing import CliRunner

    from tierserve.cli import app
    from tierserve.cli.simulate_cmds import MAIN_JOB_STACKS
    result = CliRunner().invoke(app, ["simulate", "-n", "200", "--executor", "serial"])
    assert result.exit_code == 0, result.output
    assert MAIN_JOB_STACKS == ("vllm+round_robin", "vllm_priority+round_robin", "tierserve+tierserve")
    for stack in MAIN_JOB_STACKS:
        assert f"{stack} queue:" in result.output


class Instance:
    """An InstanceView stand-in (what the cluster policy reads of one replica)."""

    def __init__(self, index, running, waiting, predictor):
        self.index = index
        self.running, self.waiting, self.swapped = running, waiting, []
        self.total_blocks, self.block_size, self.max_num_seqs = 100_000, 16, 256
        self.predictor = predictor

    @property
    def num_outstanding(self):
        return len(self.running) + len(self.waiting)


def waiting_state(i, tier, prompt, arrival, replica):
    s = RequestState(Request(i, arrival, prompt, 100, tier, SLOS[tier]))
    s.status, s.replica = Status.WAITING, replica
    return s


def test_redispatch_moves_a_late_kv_less_tier1_request_to_a_replica_where_it_is_in_time():
    model = a100_model()
    now = 10.0
    # Replica 0: a tier-0 decode throttles the chunk and 30k tier-1 prompt tokens queue ahead of request 99.
    ahead = [waiting_state(i, 1, 3000, now - 0.2, 0) for i in range(10)]
    late = waiting_state(99, 1, 2000, now - 0.1, 0)
    busy = Instance(0, [decode_state(50, 0, 2000)], ahead + [late], model)
    free = Instance(1, [], [], model)
    policy = CLUSTER_POLICIES.create("tierserve", redispatch=True)
    moves = policy.rebalance([busy, free], now)
    assert len(moves) == 1 and moves[0].source == 0 and moves[0].destination == 1
    assert moves[0].request.tier == 1 and moves[0].request.num_blocks == 0
    # Nothing moves when it is off, when the request makes its TTFT where it is, or when it is protected or
    # holds KV.
    assert CLUSTER_POLICIES.create("tierserve").rebalance([busy, free], now) == []
    assert policy.rebalance([Instance(0, [], [late], model), free], now) == []
    t0 = waiting_state(98, 0, 2000, now - 0.1, 0)
    assert policy.rebalance([Instance(0, [decode_state(50, 0, 2000)], ahead[:0] + [t0], model), free], now) == []
    for r in ahead + [late]:
        r.num_blocks = 1
    assert policy.rebalance([busy, free], now) == []


def test_redispatch_runs_in_the_simulator_and_is_recorded(tmp_path):
    """Queued moves happen (each counted in the request's `migrations`), every request still ends once, and
    skip-ahead stays exact with re-dispatch on."""
    from tierserve.experiments.scenario import run_scenario
    on = run_scenario(small_burst_scenario(redispatch=True))
    stepped = run_scenario(small_burst_scenario(skip_ahead=False, redispatch=True))
    t = on.table
    moves = on.sim.stats["migrations_queued"]
    assert len(t["id"]) == 500 and moves > 0 and on.sim.stats["migrations_live_started"] == 0
    migrations = np.asarray(t["migrations"])
    assert migrations.sum() == moves                            # every move is on the moved request's record
    moved = migrations > 0
    assert set(t["tier"][moved].tolist()) <= {1}
    for col in ("first_token_s", "finish_s", "replica", "outcome", "migrations"):
        np.testing.assert_array_equal(t[col], stepped.table[col], err_msg=col)
