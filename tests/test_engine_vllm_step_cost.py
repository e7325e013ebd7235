"""The vLLM adapter's cheap step path, without vLLM: a repeated plan is reused only while the policy would plan
the same again, the held-back list is optional, the iteration log written in batches is byte for byte the
row-by-row log, and tokens delivered together are booked as one at a time would be."""
from __future__ import annotations

import csv
import io
from types import SimpleNamespace

import pytest

from tierserve.engines.vllm import EngineSettings, PolicyDriver
from tierserve.engines.vllm.logs import ITERATION_HEADER, WARMUP_STEPS, IterationLog
from tierserve.policies.local.vllm import VLLMPolicy
from test_engine_vllm_incremental import Clock

BLOCK = 16


def request(i: int, tier: int, prompt: int):
    return SimpleNamespace(request_id=f"r{i}", priority=tier, arrival_time=1000.0 + i, sampling_params=None,
                           max_tokens=64, num_prompt_tokens=prompt, num_output_tokens=0,
                           num_tokens_with_spec=prompt, num_tokens=prompt, num_output_placeholders=0,
                           num_computed_tokens=0)


def decode_once(req) -> None:
    """The engine ran one token of `req` and delivered it."""
    req.num_computed_tokens = req.num_tokens
    req.num_output_tokens += 1
    req.num_tokens = req.num_tokens_with_spec = req.num_tokens + 1


class Pair:
    """A kept-order driver and a full-path driver fed the same engine state; every step must agree."""

    def __init__(self, max_num_seqs: int = 2, total_blocks: int = 40, token_budget: int = 256) -> None:
        limits = dict(block_size=BLOCK, total_blocks=total_blocks, token_budget=token_budget,
                      max_num_seqs=max_num_seqs, clock=Clock())
        self.kept = PolicyDriver(EngineSettings(policy="vllm_priority"), incremental=True, **limits)
        self.full = PolicyDriver(EngineSettings(policy="vllm_priority"), incremental=False, **limits)
        self.running: list = []
        self.waiting: list = []

    def add(self, req) -> None:
        self.waiting.append(req)
        for d in (self.kept, self.full):
            d.admit(req)

    def step(self, free_blocks: int) -> bool:
        """One plan on both; admissions run their whole prompt. True when the kept driver reused its last plan."""
        before = self.kept.repeated_plans
        hk = self.kept.plan_step(self.running, None, free_blocks)
        hf = self.full.plan_step(self.running, self.waiting, free_blocks)
        for a, b in ((hk.preempt, hf.preempt), (hk.running, hf.running), (hk.admit, hf.admit), (hk.held, hf.held)):
            assert [r.request_id for r in a] == [r.request_id for r in b]
        assert hk.budget == hf.budget and self.kept._last_plan == self.full._last_plan
        assert not hk.preempt                               # (these scenarios keep KV sufficient)
        self.running[:] = hk.running
        for req in hk.admit:
            self.waiting.remove(req)
            self.running.append(req)
        left = hk.budget
        for req in self.running:                            # vLLM's loop: in service order, within the budget
            n = min(req.num_tokens - req.num_computed_tokens, left)
            left -= n
            if n and req.num_computed_tokens + n == req.num_tokens:
                decode_once(req)
            else:
                req.num_computed_tokens += n
        return self.kept.repeated_plans > before


def steady(max_num_seqs: int = 2) -> Pair:
    """`max_num_seqs` requests decoding, three more waiting behind them."""
    p = Pair(max_num_seqs=max_num_seqs)
    for i in range(max_num_seqs + 3):
        p.add(request(i, tier=i % 3, prompt=20))
    assert not p.step(40)                                    # admissions: a fresh plan
    assert not p.step(40)                                    # the admitted are seen running: a change
    assert p.step(40) and p.step(40)                         # decode-only, nothing admissible: reused
    return p


def test_a_decode_only_plan_is_reused_until_something_changes():
    p = steady()
    late = request(9, tier=0, prompt=20)
    p.add(late)                                              # an arrival
    assert not p.step(40)
    assert p.step(40)
    p.waiting.remove(late)
    for d in (p.kept, p.full):                               # a waiting request aborted
        d.finished(late)
    assert not p.step(40)
    assert p.step(40)
    p.running.reverse()                                      # the engine runs them in another order
    assert not p.step(40)
    assert p.step(40)
    spec = p.running[0]
    spec.num_tokens_with_spec += 2                           # speculative drafts: no longer one decode token
    assert not p.step(40)
    spec.num_tokens_with_spec = spec.num_tokens
    assert not p.step(40)
    assert p.step(40)
    d = p.kept
    d._repeat = (*d._repeat[:5], d._repeat[0].max_repeat)    # the plan's own repeat limit reached
    assert not p.step(40)


def test_a_repeated_plan_is_not_reused_where_more_free_blocks_would_admit():
    p = Pair(max_num_seqs=4)
    for i in range(2):
        p.add(request(i, tier=0, prompt=20))
    assert not p.step(40) and not p.step(40)                 # both admitted, then seen running
    p.add(request(2, tier=1, prompt=100))                    # needs 7 blocks
    assert not p.step(5)                                     # does not fit: a decode-only plan
    assert p.step(5) and p.step(4)                           # as few blocks or fewer: reused
    assert not p.step(12)                                    # blocks freed outside the plan: it fits
    assert [r.request_id for r in p.running] == ["r0", "r1", "r2"]


def test_running_requests_the_plan_leaves_out_keep_their_place_after_the_scheduled():
    p = Pair(max_num_seqs=4, token_budget=32)
    short, long_ = request(0, tier=1, prompt=8), request(1, tier=0, prompt=100)
    p.add(short)
    assert not p.step(40) and not p.step(40)                 # `short` runs, then decodes
    p.add(long_)
    p.step(40)                                               # `long_` admitted: a 31-token first chunk
    p.running[:] = [long_, short]
    p.step(40)                                               # `long_` takes the whole budget
    assert [r.request_id for r in p.running] == ["r1", "r0"]
    assert p.kept._last_plan == {"r1": 32}


def test_held_false_leaves_the_held_list_empty_and_the_plan_as_it_was():
    limits = dict(block_size=BLOCK, total_blocks=64, token_budget=256, max_num_seqs=2, clock=Clock())
    a = PolicyDriver(EngineSettings(policy="vllm_priority"), **limits)
    b = PolicyDriver(EngineSettings(policy="vllm_priority"), **limits)
    reqs = [request(i, tier=2 - i % 3, prompt=20) for i in range(6)]
    for r in reqs:
        a.admit(r)
        b.admit(r)
    ha, hb = a.plan_step([], None, 64), b.plan_step([], None, 64, held=False)
    assert [r.request_id for r in ha.admit] == [r.request_id for r in hb.admit] and ha.budget == hb.budget
    assert len(ha.held) == 4 and hb.held == []


def test_the_policys_resumable_outside_a_plan_is_its_own():
    d = PolicyDriver(EngineSettings(policy="vllm_priority"), block_size=BLOCK, total_blocks=64, token_budget=256,
                     max_num_seqs=2, clock=Clock())
    for i in range(5):
        d.admit(request(i, tier=2 - i % 3, prompt=20))
    own = VLLMPolicy.resumable(d.policy, d.view)
    assert d.policy.resumable(d.view) == own and d.policy.resumable(d.view) is not d._wstates
    assert [s.tier for s in own] == [0, 1, 1, 2, 2]


def test_the_batched_iteration_log_is_the_row_by_row_log(tmp_path, monkeypatch):
    import tierserve.engines.vllm.logs as logs
    ticks = iter(range(10_000))
    monkeypatch.setattr(logs.time, "monotonic", lambda: next(ticks) * 0.4)     # a flush every third row or so
    log = IterationLog(tmp_path / "it.csv")
    rows = [(k, (7 * k, 1234.56789 * k, k % 3, 100 + k, k + 1, k % 2), 0.0123456789 * (k + 1)) for k in range(12)]
    for step, shape, measured in rows[:5]:
        log.add(step, shape, measured)
    log.flush()
    for step, shape, measured in rows[5:]:
        log.add(step, shape, measured)
    log.close()
    expected = io.StringIO(newline="")
    w = csv.writer(expected)
    w.writerow(ITERATION_HEADER)
    for n, (step, (pt, pairs, dc, dcs, nreq, pre), measured) in enumerate(rows, 1):
        w.writerow((pt, round(pairs, 1), dc, dcs, round(measured * 1e3, 4), step, nreq, pre,
                    "warm-up: one of the engine's first batches" if n <= WARMUP_STEPS else ""))
    assert (tmp_path / "it.csv").read_bytes() == expected.getvalue().encode()


def test_the_iteration_log_row_is_the_steps_shape(tmp_path):
    d = PolicyDriver(EngineSettings(policy="vllm_priority", iteration_log=str(tmp_path / "it.csv")),
                     block_size=BLOCK, total_blocks=64, token_budget=256, max_num_seqs=4, clock=Clock())
    chunk, decode = request(0, tier=0, prompt=50), request(1, tier=0, prompt=10)
    for r in (chunk, decode):
        d.admit(r)
    chunk.num_computed_tokens = 20 + 30                      # a 30-token chunk after 20 computed
    decode.num_output_tokens, decode.num_tokens = 3, 13       # a decode over 12 computed tokens
    decode.num_computed_tokens = 13
    d.record_schedule({"r0": 30, "r1": 1}, {"r0": chunk, "r1": decode}, ["rX"], 0.5)
    d.record_output(0.5125, {}, False)
    d.close()
    with open(tmp_path / "it.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[1] == ["30", str(round(30 * (20 + 15.0), 1)), "1", "13", "12.5", "0", "2", "1",
                       "warm-up: one of the engine's first batches"]


@pytest.mark.parametrize("first_token_seen", [False, True])
def test_tokens_delivered_together_count_as_one_at_a_time(tmp_path, first_token_seen):
    clock = Clock()
    d = PolicyDriver(EngineSettings(policy="vllm_priority", request_log=str(tmp_path / "req.jsonl")),
                     block_size=BLOCK, total_blocks=64, token_budget=256, max_num_seqs=2, clock=clock)
    req = request(0, tier=0, prompt=20)
    s = d.admit(req)
    if first_token_seen:
        req.num_output_tokens = 1
        d._deliver(s, req, clock())
        clock.t += 0.25
    req.num_output_tokens += 3
    d._deliver(s, req, clock())
    # one at a time: the first of the three after 0.25 s (or the first token), then two gaps of 0 s
    assert s.attained_tokens == req.num_output_tokens and s.last_token_s == clock.t
    assert s.first_token_s == 1000.0 and s.tbt_max_s == (0.25 if first_token_seen else 0.0)
    assert d._gaps[s.id] == ([0.25, 0.0, 0.0] if first_token_seen else [0.0, 0.0])
