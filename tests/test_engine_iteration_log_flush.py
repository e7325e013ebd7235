"""The engine's iteration log is complete on disk once the engine goes idle.

vLLM's `has_requests()` is still true after the step that finishes the last request (its id waits to be sent in
the next SchedulerOutput), so the engine goes idle only after one more, empty step. The log must flush there:
otherwise a burst's last rows stay in memory until the next burst's first flush and are read as that burst's
(sim_to_real's per-run row split: each validation run's rows began with the previous run's last 70-90 steps).
"""
from __future__ import annotations

import csv
from types import SimpleNamespace

import tierserve.engines.vllm.logs as logs
from test_engine_vllm_driver import greedy_schedule
from tierserve.engines.vllm import EngineSettings, PolicyDriver


def request(i: int, prompt: int, max_tokens: int):
    return SimpleNamespace(request_id=f"r{i}", priority=0, arrival_time=1000.0 + i * 1e-3,
                           sampling_params=SimpleNamespace(extra_args=None), max_tokens=max_tokens,
                           num_prompt_tokens=prompt, num_output_tokens=0, num_tokens_with_spec=prompt,
                           num_tokens=prompt, num_output_placeholders=0, num_computed_tokens=0)


def rows_on_disk(path) -> int:
    with open(path, newline="") as f:
        return sum(1 for _ in csv.DictReader(f))


def test_rows_reach_the_file_at_the_empty_step_that_idles_the_engine(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "FLUSH_EVERY_S", 1e9)          # no time-based flush: only going idle flushes
    path = tmp_path / "it.csv"
    now = [1000.0]
    d = PolicyDriver(EngineSettings(policy="vllm_priority", iteration_log=str(path)), clock=lambda: now[0],
                     block_size=16, total_blocks=64, token_budget=256, max_num_seqs=4)
    reqs = [request(i, prompt=20 + 10 * i, max_tokens=3) for i in range(3)]
    for r in reqs:
        d.admit(r)
    running, waiting, t, steps = [], list(reqs), 0.0, 0
    while running or waiting:
        hints = d.plan_step(running, waiting, free_blocks=64)
        running, waiting = hints.running + hints.admit, hints.held
        sched = greedy_schedule(running, hints.budget)
        d.record_schedule(sched, {r.request_id: r for r in running}, [], t)
        t += 0.005
        now[0] += 0.005
        for r in running:
            if r.num_computed_tokens == r.num_tokens:
                r.num_output_tokens += 1
                r.num_tokens = r.num_tokens_with_spec = r.num_tokens + 1
        done = [r for r in running if r.num_output_tokens >= r.max_tokens]
        for r in done:
            running.remove(r)
            d.finished(r)
        # as vLLM reports it: busy while any request runs or a finished id is still to be sent
        d.record_output(t, {r.request_id: r for r in running + done}, True)
        steps += 1
    assert rows_on_disk(path) == 0                               # nothing flushed while busy
    d.plan_step([], [], free_blocks=64)                          # the empty step that sends the finished ids
    d.record_schedule({}, {}, [], t)
    d.record_output(t + 1e-4, {}, False)
    assert rows_on_disk(path) == steps                           # every step of the burst, before close()
    d.close()
    assert rows_on_disk(path) == steps
