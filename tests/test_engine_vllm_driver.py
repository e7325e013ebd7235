"""The vLLM adapter's engine-independent half: request mapping, settings, refusals, plan → hints, logs.

Runs without vLLM (fake engine requests with the attributes the driver reads); `test_engine_vllm.py` runs
the real engine. `RelegateLatePolicy` is also the policy that file's relegation test loads by name.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tierserve.core import SLO, ConfigError
from tierserve.engines.vllm import (EngineSettings, PolicyDriver, check_policy, gateway_to_vllm_priority,
                                    request_meta, vllm_request_fields)
from tierserve.engines.vllm.driver import make_policy
from tierserve.engines.vllm.logs import read_decisions
from tierserve.engines.vllm.predictor import LinearPredictor, make_predictor
from tierserve.policies.local import LOCAL_POLICIES
from tierserve.policies.local.vllm import VLLMPriorityPolicy


class RelegateLatePolicy(VLLMPriorityPolicy):
    """vllm_priority that relegates a waiting request once its TTFT target has passed, and serves relegated
    requests after every other waiting one (eager relegation at its simplest)."""

    name = "relegate_late"

    def plan(self, view):
        plan = super().plan(view)
        for s in view.waiting:
            if not s.relegated and s.slo.ttft_s is not None and view.now - s.arrival_s > s.slo.ttft_s:
                plan.relegate.append((s, "ttft target passed while waiting"))
        return plan

    def order_waiting(self, waiting):
        return sorted(waiting, key=lambda s: (s.relegated, s.tier, s.arrival_s, s.id))


class OracleSJF(VLLMPriorityPolicy):
    name = "sjf_oracle"
    needs_oracle = True


# ----------------------------------------------------------------------------------------- mapping


def test_priority_is_the_tier_and_xargs_tier_wins():
    assert request_meta(2, None).tier == 2
    assert request_meta(2, {"tier": 0}).tier == 0
    meta = request_meta(1, {"ttft_s": 0.5, "tbt_s": 0.05, "app": "chat"})
    assert meta.slo == SLO(ttft_s=0.5, tbt_s=0.05) and meta.app == "chat"


@pytest.mark.parametrize("xargs,field", [({"tier": "1"}, "vllm_xargs.tier"), ({"tier": -1}, "vllm_xargs.tier"),
                                         ({"ttft_s": "fast"}, "vllm_xargs.ttft_s"), ({"ttft_s": -1.0}, "slo.ttft_s"),
                                         ({"app": 3}, "vllm_xargs.app")])
def test_malformed_request_fields_name_the_field(xargs, field):
    with pytest.raises(ConfigError) as e:
        request_meta(0, xargs)
    assert e.value.field == field


def test_gateway_priorities_are_inverted_and_keep_their_order():
    gateway = [10, 5, 0, -3]                      # higher = more important at the gateway
    vllm = [gateway_to_vllm_priority(p) for p in gateway]
    assert vllm == sorted(vllm)                   # vLLM serves lower first: the same order


def test_request_fields_round_trip():
    body = vllm_request_fields(1, SLO(ttlt_s=30.0), app="batch")
    assert body["priority"] == 1
    meta = request_meta(body["priority"], body["vllm_xargs"])
    assert (meta.tier, meta.slo, meta.app) == (1, SLO(ttlt_s=30.0), "batch")


# ---------------------------------------------------------------------------------------- settings


def test_additional_config_wins_over_environment():
    env = {"TIERSERVE_POLICY": "vllm", "TIERSERVE_POLICY_PARAMS": '{"long_prefill_threshold": 64}'}
    s = EngineSettings.from_sources({"tierserve": {"policy": "llumlet"}}, env)
    assert s.policy == "llumlet" and s.policy_params == {"long_prefill_threshold": 64}


@pytest.mark.parametrize("extra,env", [({"tierserve": {"polcy": "vllm"}}, {}),
                                       (None, {"TIERSERVE_POLICY_PARAMS": "{not json"}),
                                       ({"tierserve": {"watermark_fraction": 1.5}}, {})])
def test_bad_settings_are_refused(extra, env):
    with pytest.raises(ConfigError):
        EngineSettings.from_sources(extra, env)


# ---------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("name", ["vllm", "vllm_priority", "vllm_priority_sorted", "llumlet"])
def test_v1_shaped_policies_are_accepted(name):
    check_policy(LOCAL_POLICIES.create(name))


@pytest.mark.parametrize("name,why", [("sarathi", "WHOLE_PROMPT"), ("vllm_v0", "WHOLE_PROMPT"),
                                      ("orca", "MAX_LENGTH"), ("sarathi_edf", "WHOLE_PROMPT"),
                                      ("niyama", "WHOLE_PROMPT")])
def test_allocation_rules_v1_lacks_are_refused(name, why):
    with pytest.raises(ConfigError, match=why):
        make_policy(name)


def test_swap_preemption_is_refused():
    with pytest.raises(ConfigError, match="recompute"):
        make_policy("vllm", {"preempt_mode": "swap"})


def test_oracle_policies_are_refused():
    with pytest.raises(ConfigError, match="output length"):
        make_policy(f"{__name__}:OracleSJF")


def test_unknown_policy_names_the_choices():
    with pytest.raises(ConfigError, match="vllm_priority") as err:
        make_policy("nope")
    assert "vllm_edf" in str(err.value) and err.value.field == "tierserve.policy"


def test_the_engines_deadline_order_is_accepted_and_its_parameters_checked():
    assert make_policy("vllm_edf").name == "vllm_edf"
    with pytest.raises(ConfigError, match="preempt_mode"):
        make_policy("vllm_edf", {"preempt_mode": "sometimes"})
    with pytest.raises(ConfigError, match="recompute"):
        make_policy("vllm_edf", {"preempt_mode": "swap"})


# ------------------------------------------------------------------------------------ plan → hints


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fake_request(i: int, tier: int, prompt: int, max_tokens: int = 8, xargs: dict | None = None):
    return SimpleNamespace(request_id=f"r{i}", priority=tier, arrival_time=1000.0 + i * 1e-3,
                           sampling_params=SimpleNamespace(extra_args=xargs), max_tokens=max_tokens,
                           num_prompt_tokens=prompt, num_output_tokens=0, num_tokens_with_spec=prompt,
                           num_tokens=prompt, num_output_placeholders=0, num_computed_tokens=0)


def make_driver(tmp_path: Path | None = None, policy: str = "vllm_priority", clock=None, **kw) -> PolicyDriver:
    logs = {} if tmp_path is None else {"iteration_log": str(tmp_path / "it.csv"),
                                        "decision_log": str(tmp_path / "dec.jsonl")}
    limits = dict(block_size=16, total_blocks=64, token_budget=256, max_num_seqs=4)
    limits.update(kw)
    return PolicyDriver(EngineSettings(policy=policy, **logs), clock=clock or Clock(), **limits)


def test_waiting_requests_are_admitted_in_tier_order_within_the_limits():
    d = make_driver()
    reqs = [fake_request(i, tier=2 - i % 3, prompt=40) for i in range(9)]
    for r in reqs:
        d.admit(r)
    hints = d.plan_step([], reqs, free_blocks=64)
    assert [r.priority for r in hints.admit] == [0, 0, 0, 1]      # max_num_seqs 4, strict tier order
    assert hints.budget == 4 * 40
    assert [r.priority for r in hints.held] == [1, 1, 2, 2, 2]     # the rest, in the policy's order


def test_the_plans_victim_is_preempted_and_the_rest_keep_service_order():
    d = make_driver()
    running = [fake_request(i, tier=t, prompt=32) for i, t in enumerate([1, 0, 2, 0])]
    for r in running:
        d.admit(r)
        r.num_computed_tokens, r.num_output_tokens = 32, 1          # decoding: each needs a third block
        r.num_tokens_with_spec = r.num_tokens = 33
    hints = d.plan_step(running, [], free_blocks=2)                 # one request short
    assert [r.request_id for r in hints.preempt] == ["r2"]          # the worst (tier, arrival) request
    assert [r.request_id for r in hints.running] == ["r0", "r1", "r3"]


def test_vllm_edf_admits_by_earliest_deadline_then_requests_without_one():
    d = make_driver(policy="vllm_edf", max_num_seqs=3)
    # arrival order r0..r4; tiers say nothing here; deadlines a + ttft (interactive) or a + ttlt
    targets = [{"ttlt_s": 5.0}, {"ttft_s": 0.3, "tbt_s": 0.05}, {}, {"ttft_s": 0.1, "tbt_s": 0.05},
               {"ttlt_s": 0.2}]
    reqs = [fake_request(i, tier=i % 3, prompt=40, xargs=x) for i, x in enumerate(targets)]
    for r in reqs:
        d.admit(r)
    hints = d.plan_step([], reqs, free_blocks=64)
    assert [r.request_id for r in hints.admit] == ["r3", "r4", "r1"]
    assert [r.request_id for r in hints.held] == ["r0", "r2"]         # r2 has no deadline: last


def test_vllm_edf_evicts_the_latest_deadline():
    d = make_driver(policy="vllm_edf")
    running = [fake_request(i, tier=0, prompt=32, xargs={"ttlt_s": s}) for i, s in enumerate([3.0, 9.0, 1.0, 2.0])]
    for r in running:
        d.admit(r)
        r.num_computed_tokens, r.num_output_tokens = 32, 1
        r.num_tokens_with_spec = r.num_tokens = 33
    hints = d.plan_step(running, [], free_blocks=2)
    assert [r.request_id for r in hints.preempt] == ["r1"]


def test_the_held_back_order_reuses_the_plans_and_waiting_requests_are_not_copied_each_step():
    calls = []

    class Counting(VLLMPriorityPolicy):
        def order_waiting(self, waiting):
            calls.append(len(waiting))
            return super().order_waiting(waiting)

    d = PolicyDriver(EngineSettings(), clock=Clock(), policy=Counting(), block_size=16, total_blocks=64,
                     token_budget=256, max_num_seqs=2)
    reqs = [fake_request(i, tier=2 - i % 3, prompt=40) for i in range(7)]
    for r in reqs:
        d.admit(r)
    hints = d.plan_step([], reqs, free_blocks=64)
    assert calls == [7]                                               # once per step, not once more for held
    assert [r.priority for r in hints.held] == [1, 1, 2, 2, 2]
    # a waiting request's fields are read at entry and again only when it runs or is preempted
    waiting = hints.held
    waiting[0].num_prompt_tokens = 999                                # (vLLM never changes a queued request)
    d.plan_step([], waiting, free_blocks=64)
    assert d.states[waiting[0].request_id].prompt_tokens == 40
    run = hints.admit[0]
    run.num_computed_tokens, run.num_output_tokens = 40, 3
    run.num_tokens_with_spec = run.num_tokens = 43
    d.plan_step([run], waiting, free_blocks=64)                       # it ran: synced
    run.num_computed_tokens = 0                                       # vLLM resets it to recompute, then
    d.engine_preempted(run, planned=True)                             # calls the hook
    s = d.states[run.request_id]
    assert (s.num_tokens, s.num_generated, s.num_computed_tokens, s.num_blocks) == (43, 3, 0, 0)
    assert s.status.name == "WAITING"


def test_a_policy_ordering_through_an_iterator_still_holds_back_every_request():
    class IteratorOrder(VLLMPriorityPolicy):
        def order_waiting(self, waiting):
            return iter(super().order_waiting(waiting))      # consumed by the plan: must not be reused

    d = PolicyDriver(EngineSettings(), clock=Clock(), policy=IteratorOrder(), block_size=16, total_blocks=64,
                     token_budget=256, max_num_seqs=2)
    reqs = [fake_request(i, tier=2 - i % 3, prompt=40) for i in range(7)]
    for r in reqs:
        d.admit(r)
    hints = d.plan_step([], reqs, free_blocks=64)
    assert [r.priority for r in hints.admit] == [0, 0]
    assert [r.priority for r in hints.held] == [1, 1, 2, 2, 2]


def test_relegated_requests_are_marked_and_served_last():
    clock = Clock()
    d = make_driver(policy=f"{__name__}:RelegateLatePolicy", clock=clock, max_num_seqs=1)
    late = fake_request(0, tier=0, prompt=16, xargs={"ttft_s": 0.5})
    other = fake_request(1, tier=2, prompt=16)
    blocker = fake_request(2, tier=0, prompt=16)
    for r in (late, other, blocker):
        d.admit(r)
    blocker.num_computed_tokens, blocker.num_output_tokens = 16, 1
    blocker.num_tokens_with_spec = blocker.num_tokens = 17
    clock.t += 1.0                                                   # late's TTFT target has passed
    d.plan_step([blocker], [late, other], free_blocks=60)
    assert d.states["r0"].relegated and d.relegations == 1
    hints = d.plan_step([], [late, other], free_blocks=60)
    assert [r.request_id for r in hints.admit] == ["r1"]             # tier 2 goes before the relegated tier 0


def greedy_schedule(running: list, budget: int) -> dict[str, int]:
    """vLLM's greedy loop within the token budget: each running request in order takes what it needs of what is
    left; its computed tokens advance. Returns request id -> tokens scheduled."""
    sched, left = {}, budget
    for r in running:
        n = min(r.num_tokens - r.num_computed_tokens, left)
        left -= n
        r.num_computed_tokens += n
        sched[r.request_id] = n
    return sched


def test_iteration_log_is_what_calibrate_reads(tmp_path):
    from tierserve.hardware.calibration import calibrate_from_iterations
    d = make_driver(tmp_path)
    t = 0.0
    reqs = [fake_request(i, tier=i % 3, prompt=20 + 10 * i) for i in range(8)]
    for r in reqs:
        d.admit(r)
    waiting = list(reqs)
    running: list = []
    for step in range(40):
        hints = d.plan_step(running, waiting, free_blocks=64)
        running = hints.running + hints.admit
        waiting = hints.held
        sched = greedy_schedule(running, hints.budget)
        d.record_schedule(sched, {r.request_id: r for r in running}, [], t)
        t += 0.002 + 1e-5 * sum(sched.values())
        for r in running:
            if r.num_computed_tokens == r.num_tokens:
                r.num_output_tokens += 1
                r.num_tokens = r.num_tokens_with_spec = r.num_tokens + 1
        d.record_output(t, {r.request_id: r for r in running}, True)
        for r in [r for r in running if r.num_output_tokens >= r.max_tokens]:
            running.remove(r)
            d.finished(r)
    d.close()
    fit = calibrate_from_iterations(tmp_path / "it.csv")
    assert fit.n_rows >= 10 and fit.c_prefill_tok_s > 0
    recs = read_decisions(tmp_path / "dec.jsonl")
    steps = [r for r in recs if "step" in r and "plan" in r]
    assert len(steps) == 40 and all(r["agree"] for r in steps)
    finished = [r["finished"] for r in recs if "finished" in r]
    assert sorted(finished) == sorted(r.request_id for r in reqs)   # each exactly once


# --------------------------------------------------------------------------------------- predictor


def test_linear_predictor_reads_the_calibrated_fit(tmp_path):
    p = tmp_path / "fit.json"
    p.write_text(json.dumps({"c0_s": 0.002, "c_prefill_tok_s": 1e-5, "c_decode_tok_s": 1e-4, "c_pair_s": 0.0,
                             "c_ctx_s": 1e-8, "n_rows": 10, "mape_test": 5.0}))
    pred = make_predictor(str(p))
    assert isinstance(pred, LinearPredictor)
    assert pred.decode_base_time(4) == pytest.approx(0.002 + 4e-4)
    n = pred.max_prefill_tokens_within(0.004, decode_count=0, decode_context_sum=0)
    assert pred.iteration_time(n, 0, 0, 0) <= 0.004 < pred.iteration_time(n + 1, 0, 0, 0)


def test_a_policy_asking_an_uncalibrated_predictor_is_told_how_to_calibrate():
    with pytest.raises(ConfigError, match="calibrate --iterations"):
        make_predictor(None).iteration_time(10, 0, 0, 0)


# ------------------------------------------------------------------------------------------- floors


def test_engines_import_only_core_and_policies():
    root = Path(__file__).resolve().parents[1] / "tierserve" / "engines"
    for f in root.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.startswith("tierserve"):
                    assert name.split(".")[1] in ("core", "policies", "engines"), f"{f.name} imports {name}"
