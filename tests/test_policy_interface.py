"""The policy interface of core v2: oracle boundary, read-only view, hooks, relegation, allocation rules,
monotone attained work, same-instant batching."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.core import (AllocationRule, BatchPlan, Outcome, PreemptMode, Request, RequestState, Status,
                            true_output_tokens)
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.policies.local import LOCAL_POLICIES, Oracle
from tierserve.policies.local.vllm import VLLMPolicy
from tierserve.sim import ClusterConfig, simulate

INTERFACE_MODULES = {"tierserve.policies.local.base", "tierserve.policies.local.view", "tierserve.policies.cluster.base"}
SECRET_LENGTH = 7919        # a prime no other field of the test request takes


def public_values(obj, depth: int = 2, seen=None):
    """Every value reachable from `obj` through public attributes, `depth` levels deep."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    for name in dir(obj):
        if name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except Exception:
            continue
        if callable(value):
            continue
        yield name, value
        if not isinstance(value, (int, float, str, bytes, bool)):
            yield from public_values(value, depth - 1, seen)


def test_request_view_exposes_no_public_path_to_the_true_output_length():
    state = RequestState(Request(3, 0.5, 11, SECRET_LENGTH, tier=1))
    assert true_output_tokens(state) == SECRET_LENGTH       # the truth is there, for the executor
    leaks = [name for name, v in public_values(state) if v == SECRET_LENGTH]
    assert leaks == []


def _policy_modules(registry) -> dict[str, type]:
    return {name: registry.get_class(name) for name in registry.names}


@pytest.mark.parametrize("registry", [LOCAL_POLICIES, CLUSTER_POLICIES], ids=["local", "cluster"])
def test_non_oracle_policies_never_read_the_truth(registry):
    forbidden = {"true_output_tokens", "request_of", "_request", "output_tokens", "Oracle", "oracle"}
    for name, cls in _policy_modules(registry).items():
        if getattr(cls, "needs_oracle", False):
            continue
        for klass in cls.__mro__:
            # The interface modules define the boundary (bind_oracle, Oracle); every policy module is scanned.
            if klass.__module__.startswith("tierserve.policies") and klass.__module__ not in INTERFACE_MODULES:
                tree = ast.parse(inspect.getsource(inspect.getmodule(klass)))
                used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
                used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
                used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
                assert not used & forbidden, (name, klass.__name__, used & forbidden)


class _OracleSRPT(VLLMPolicy):
    """Waiting queue by true remaining output (a minimal oracle baseline for the test)."""

    name = "oracle_test"
    needs_oracle = True

    def order_waiting(self, waiting):
        return sorted(waiting, key=lambda s: (self.oracle.remaining_output_tokens(s), s.arrival_s))


def test_oracle_is_handed_only_to_a_policy_that_declares_it():
    with pytest.raises(TypeError, match="needs_oracle"):
        VLLMPolicy().bind_oracle(Oracle())
    LOCAL_POLICIES.table["oracle_test"] = f"{__name__}:_OracleSRPT"
    try:
        reqs = make_requests(200, rate=60.0)
        res = simulate(ClusterConfig(num_replicas=1, local_policy="oracle_test"), reqs, predictor=LinearPredictor())
        assert all(s.status == Status.FINISHED for s in res.states)
    finally:
        del LOCAL_POLICIES.table["oracle_test"]


def test_view_is_a_read_only_facade_with_costs():
    seen = {}

    class Probe(VLLMPolicy):
        def plan(self, view):
            if "view" not in seen:
                seen["view"] = view
                seen["running_type"] = type(view.running)
                seen["recompute_1k"] = view.recompute_time_s(1000)
                seen["swap_10"] = view.swap_time_s(10)
                seen["free_swap"] = view.free_swap_blocks
                with pytest.raises(AttributeError):
                    view.free_blocks = 0
            return super().plan(view)

    LOCAL_POLICIES.table["probe_test"] = f"{__name__}:Probe"
    globals()["Probe"] = Probe
    try:
        simulate(ClusterConfig(num_replicas=1, local_policy="probe_test"), make_requests(5, 10.0),
                 predictor=LinearPredictor())
    finally:
        del LOCAL_POLICIES.table["probe_test"]
    assert seen["running_type"] is tuple
    assert seen["recompute_1k"] == pytest.approx(LinearPredictor().iteration_time(1000, 500_000, 0, 0))
    assert seen["swap_10"] > 0 and seen["free_swap"] > 0
    assert not hasattr(seen["view"], "policy") and not hasattr(seen["view"], "loop")


def test_eight_simultaneous_arrivals_share_the_first_iteration():
    reqs = [Request(i, 0.0, 100, 5) for i in range(8)]
    res = simulate(ClusterConfig(num_replicas=1), reqs, predictor=LinearPredictor())
    first = {s.first_token_s for s in res.states}
    assert len(first) == 1                      # one prefill iteration for all eight
    assert res.stats["iterations"] == 5         # 1 prefill + 4 decodes, all batched


def test_allocation_rule_is_declared_apart_from_ordering():
    rules = {name: LOCAL_POLICIES.get_class(name).allocation for name in ("vllm", "sarathi", "vllm_v0", "orca")}
    assert rules == {"vllm": AllocationRule.PER_CHUNK, "sarathi": AllocationRule.WHOLE_PROMPT,
                     "vllm_v0": AllocationRule.WHOLE_PROMPT, "orca": AllocationRule.MAX_LENGTH}
    s = RequestState(Request(0, 0.0, 100, 10))
    assert LOCAL_POLICIES.create("vllm").blocks_to_hold(s, 32, 16) == 2
    assert LOCAL_POLICIES.create("sarathi").blocks_to_hold(s, 32, 16) == 7
    assert LOCAL_POLICIES.create("orca", max_model_len=4096).blocks_to_hold(s, 32, 16) == 256


class _Recorder(VLLMPolicy):
    """Counts what the hooks saw and checks attained work never falls."""

    log: dict = {}

    def __init__(self, **kw):
        super().__init__(**kw)
        self.log.clear()
        self.log.update(iterations=0, preempts=0, finished=0, attained_drop=0, at_preempt={})

    def on_iteration_end(self, batch, num_iterations, elapsed_s, view):
        self.log["iterations"] += num_iterations

    def on_preempt(self, state, mode, view):
        self.log["preempts"] += 1
        self.log["at_preempt"][state.id] = (state.attained_tokens, state.service_s)
        assert state.prefill_remaining == (state.num_tokens if mode == PreemptMode.RECOMPUTE else 0) or \
            mode == PreemptMode.SWAP

    def on_finish(self, state, view):
        self.log["finished"] += 1
        a, svc = self.log["at_preempt"].get(state.id, (0, 0.0))
        if state.attained_tokens < a or state.service_s < svc:
            self.log["attained_drop"] += 1


@pytest.mark.parametrize("skip", [True, False])
def test_hooks_fire_and_attained_work_survives_recompute(skip):
    LOCAL_POLICIES.table["recorder_test"] = f"{__name__}:_Recorder"
    try:
        reqs = make_requests(300, rate=40.0)
        res = simulate(ClusterConfig(num_replicas=1, local_policy="recorder_test", skip_ahead=skip,
                                     replica={"num_blocks": 300}), reqs, predictor=LinearPredictor())
    finally:
        del LOCAL_POLICIES.table["recorder_test"]
    log = _Recorder.log
    assert log["iterations"] == res.stats["iterations"]       # one count per iteration, runs aggregated
    assert log["preempts"] == res.stats["preemptions"] > 0
    assert log["finished"] == len(reqs) and log["attained_drop"] == 0
    for s in res.states:
        assert s.attained_tokens == s.prompt_tokens + true_output_tokens(s)
        assert s.service_tokens >= s.attained_tokens - 1


def test_prefill_remaining_counts_the_recompute():
    s = RequestState(Request(0, 0.0, 1000, 100))
    s.num_generated, s.num_tokens, s.num_computed_tokens = 40, 1040, 1020      # recomputing after preemption
    assert s.in_prefill and s.prefill_remaining == 20
    s.num_computed_tokens = 1039
    assert not s.in_prefill and s.prefill_remaining == 0


class _RelegateTier2(VLLMPolicy):
    """Relegates every tier-2 request on sight and serves it only when nothing else waits."""

    def plan(self, view):
        plan = super().plan(view)
        plan.relegate = [(s, "test: tier 2 gives way") for s in view.waiting if s.tier == 2 and not s.relegated]
        return plan


def test_relegated_requests_finish_and_are_reported_as_relegated(tmp_path):
    from tierserve.metrics import RequestTable
    LOCAL_POLICIES.table["relegate_test"] = f"{__name__}:_RelegateTier2"
    try:
        reqs = make_requests(200, rate=40.0, num_tiers=3)
        res = simulate(ClusterConfig(num_replicas=1, local_policy="relegate_test"), reqs, 3,
                       predictor=LinearPredictor())
    finally:
        del LOCAL_POLICIES.table["relegate_test"]
    table = RequestTable.from_states(res.states, res.reasons)
    tier2 = table["tier"] == 2
    assert tier2.any()
    assert (table["outcome"][tier2] == Outcome.RELEGATED).all()
    assert table.finished[tier2].all() and (table["outcome"][~tier2] == Outcome.FINISHED).all()
    assert all(r == "test: tier 2 gives way" for r in table["reason"][tier2])
    assert res.stats["relegated"] == int(tier2.sum())
    path = table.to_csv(tmp_path / "requests.csv")
    back = RequestTable.from_csv(path)
    assert (back["outcome"] == table["outcome"]).all() and (back["reason"] == table["reason"]).all()
