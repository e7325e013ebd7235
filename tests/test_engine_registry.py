"""Every registered replica policy in the engine driver: it runs under vLLM v1's scheduling rule, or it is
refused when the driver starts, with the reason (issue 29 item 4). The registry is iterated, so a policy
registered later is checked here too.

No vLLM here: `V1Loop` plays the engine's side of `TierScheduler.schedule` — the plan's victims evicted
(recompute), running requests in the plan's service order each capped at its planned tokens, then the plan's
admissions greedily in plan order within the budget left, KV blocks per chunk — and the driver's other calls
(`record_schedule`, `record_output`, `engine_preempted`, `finished`) as the scheduler makes them.
`test_engine_vllm.py` runs the real engine.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tierserve.core import ConfigError
from tierserve.engines.vllm import EngineSettings, PolicyDriver
from tierserve.engines.vllm.driver import make_policy
from tierserve.engines.vllm.predictor import LINEAR_FIT_KEYS
from tierserve.policies.local import LOCAL_POLICIES

BLOCK_SIZE = 16
TOTAL_BLOCKS = 48           # tight: the 30 requests below need far more, so eviction paths run
TOKEN_BUDGET = 128
MAX_NUM_SEQS = 6
# A linear step-time fit for `exec_model_file` (seconds): what `tierserve calibrate --iterations` writes
FIT = dict(zip(LINEAR_FIT_KEYS, (0.004, 2e-5, 1e-4, 1e-9, 1e-8)))
# What v1 cannot honour, by the reason `check_policy` names (the rest must run)
REFUSED_FOR = {"WHOLE_PROMPT": "allocation", "MAX_LENGTH": "allocation", "output length": "oracle"}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def engine_request(i: int, arrival: float, tier: int, prompt: int, max_tokens: int):
    xargs = {"tier": tier, **({"ttft_s": 0.5, "tbt_s": 0.1} if tier == 0 else {"ttlt_s": 20.0 + 10 * tier})}
    return SimpleNamespace(request_id=f"r{i}", priority=tier, arrival_time=arrival,
                           sampling_params=SimpleNamespace(extra_args=xargs), max_tokens=max_tokens,
                           num_prompt_tokens=prompt, num_output_tokens=0, num_tokens_with_spec=prompt,
                           num_tokens=prompt, num_output_placeholders=0, num_computed_tokens=0)


class V1Loop:
    """The engine side of `TierScheduler` over fake requests (module docstring)."""

    def __init__(self, driver: PolicyDriver, clock: Clock) -> None:
        self.d, self.clock = driver, clock
        self.requests: dict[str, SimpleNamespace] = {}
        self.running: list = []
        self.waiting: list = []
        self.blocks: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self.planned_evictions = 0

    def add(self, req) -> None:
        self.requests[req.request_id] = req
        self.d.admit(req)
        self.waiting.append(req)

    def _evict(self, req, planned: bool) -> None:
        self.running.remove(req)
        self.blocks.pop(req.request_id, None)
        req.num_computed_tokens = 0                       # v1 preempts by recompute
        self.waiting.insert(0, req)
        self.d.engine_preempted(req, planned)

    def step(self) -> None:
        d = self.d
        free = TOTAL_BLOCKS - sum(self.blocks.values())
        hints = d.plan_step(self.running, list(self.waiting), free)
        for v in hints.preempt:
            self._evict(v, True)
            self.planned_evictions += 1
        self.running = [r for r in hints.running if r in self.running]
        free = TOTAL_BLOCKS - sum(self.blocks.values())
        budget = min(hints.budget, TOKEN_BUDGET)
        caps = d.planned_tokens
        sched: dict[str, int] = {}
        own_evictions: list[str] = []
        for r in list(self.running):
            if r not in self.running:                    # evicted by the fallback below
                continue
            n = min(r.num_tokens - r.num_computed_tokens, budget, caps.get(r.request_id, 0))
            if n <= 0:
                continue
            need = -(-(r.num_computed_tokens + n) // BLOCK_SIZE) - self.blocks.get(r.request_id, 0)
            while need > free and self.running[-1] is not r:     # vLLM's own fallback: evict the tail
                tail = self.running[-1]
                free += self.blocks.get(tail.request_id, 0)
                own_evictions.append(tail.request_id)
                sched.pop(tail.request_id, None)
                self._evict(tail, False)
            if need > free:
                own_evictions.append(r.request_id)
                self._evict(r, False)
                continue
            self.blocks[r.request_id] = self.blocks.get(r.request_id, 0) + need
            free -= need
            budget -= n
            sched[r.request_id] = n
        if not own_evictions:
            watermark = d.replica.watermark_blocks
            for r in hints.admit:
                if len(self.running) >= MAX_NUM_SEQS or budget <= 0:
                    break
                n = min(r.num_tokens - r.num_computed_tokens, budget)
                need = -(-(r.num_computed_tokens + n) // BLOCK_SIZE)
                if need > free - watermark:
                    break
                self.waiting.remove(r)
                self.running.append(r)
                self.blocks[r.request_id] = need
                free -= need
                budget -= n
                sched[r.request_id] = n
        for rid, n in sched.items():
            self.requests[rid].num_computed_tokens += n
        d.record_schedule(sched, self.requests, own_evictions, self.clock.t)
        self.clock.t += 0.004 + 2e-5 * sum(sched.values()) + 1e-4 * len(sched)
        for rid in sched:
            r = self.requests[rid]
            if r.num_computed_tokens == r.num_tokens:        # prompt done or a decode: one token out
                r.num_output_tokens += 1
                r.num_tokens += 1
                r.num_tokens_with_spec += 1
        done = [r for r in self.running if r.num_output_tokens >= r.max_tokens]
        d.record_output(self.clock.t, self.requests, bool(self.waiting) or len(done) < len(self.running))
        for r in done:
            self.running.remove(r)
            self.blocks.pop(r.request_id)
            self.received[r.request_id] = r.num_output_tokens
            d.finished(r)


def run_policy(name: str, params: dict | None = None, exec_model_file: str | None = None,
               n: int = 30) -> tuple[PolicyDriver, V1Loop]:
    clock = Clock()
    settings = EngineSettings(policy=name, policy_params=params or {}, exec_model_file=exec_model_file)
    d = PolicyDriver(settings, block_size=BLOCK_SIZE, total_blocks=TOTAL_BLOCKS, token_budget=TOKEN_BUDGET,
                     max_num_seqs=MAX_NUM_SEQS, clock=clock)
    loop = V1Loop(d, clock)
    # 30 requests, three tiers, prompts 20-300 tokens, arriving two per step for the first 15 steps
    reqs = [engine_request(i, 1000.0 + 0.01 * i, (i * 2) % 3, 20 + (i * 53) % 280, 4 + (i * 7) % 20)
            for i in range(n)]
    for step in range(5000):
        for r in reqs[2 * step:2 * step + 2]:
            loop.add(r)
        if 2 * step + 2 >= len(reqs) and not loop.running and not loop.waiting:
            break
        loop.step()
    return d, loop


@pytest.fixture(scope="module")
def fit_file(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("fit") / "fit.json"
    p.write_text(json.dumps(FIT))
    return str(p)


def refusal(name: str) -> str | None:
    """The reason `make_policy` refuses `name` for v1 (None: accepted)."""
    try:
        make_policy(name)
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", LOCAL_POLICIES.names)
def test_every_registered_policy_runs_in_the_driver_or_is_refused_at_start(name, fit_file):
    why = refusal(name)
    if why is not None:
        assert any(k in why for k in REFUSED_FOR), why          # a named v1 limitation, not a crash
        with pytest.raises(ConfigError):
            PolicyDriver(EngineSettings(policy=name, exec_model_file=fit_file), block_size=BLOCK_SIZE,
                         total_blocks=TOTAL_BLOCKS, token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS)
        return
    policy = LOCAL_POLICIES.create(name)
    if policy.uses_predictor:
        # without a fit of the engine's iterations it is refused when the driver starts, with the way out
        with pytest.raises(ConfigError, match="calibrate --iterations") as err:
            run_policy(name)
        assert err.value.field == "tierserve.exec_model_file"
    # (a policy that does not declare uses_predictor runs against the uncalibrated predictor, which refuses
    # any question: the declaration is checked here)
    d, loop = run_policy(name, exec_model_file=fit_file if policy.uses_predictor else None)
    stats = d.stats()
    assert stats["finished"] == 30 and not stats["finished_more_than_once"], stats
    assert all(loop.received[r] == loop.requests[r].max_tokens for r in loop.requests)
    assert stats["planned_steps"] == stats["steps"] > 30
    # vLLM's rule ran what the policy planned, at every step, and never evicted on its own
    assert stats["disagreements"] == 0 and stats["engine_preemptions"] == 0, stats


def test_the_registry_holds_policies_of_both_outcomes():
    refused = [n for n in LOCAL_POLICIES.names if refusal(n) is not None]
    assert {"sarathi", "orca", "niyama", "sjf"} <= set(refused)
    assert {"fcfs", "las", "distboost", "uniboost_base", "uniboost_memguard", "uniboost",
            "niyama_chunked"}.isdisjoint(refused)


@pytest.mark.parametrize("name", ["vllm_priority", "uniboost", "niyama_chunked"])
def test_the_runs_reach_the_eviction_path(name, fit_file):
    """The KV cache above is small enough that plans evict (so the agreement above covers victims too)."""
    d, loop = run_policy(name, exec_model_file=fit_file)
    assert loop.planned_evictions > 0 and d.stats()["disagreements"] == 0
