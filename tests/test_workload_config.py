"""WorkloadConfig validation, build_requests determinism and the built-in default."""
from __future__ import annotations


import numpy as np
import pytest

from tierserve.core.errors import ConfigError, TraceError
from tierserve.core.paths import shared_data
from tierserve.workload import WorkloadConfig, build_requests, build_workload, default_workload


def test_default_workload_needs_no_files_and_is_moderately_loaded():
    w = build_workload(default_workload())
    reqs = w.requests
    assert len(reqs) == 2000 and [r.id for r in reqs] == list(range(2000))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    assert len(reqs) / reqs[-1].arrival_s == pytest.approx(12.0, rel=0.08)
    assert max(r.prompt_tokens + r.output_tokens for r in reqs) <= 8192
    assert np.mean([r.output_tokens for r in reqs]) == pytest.approx(211, rel=0.1)
    freq = np.bincount([r.tier for r in reqs], minlength=3) / 2000
    assert freq == pytest.approx([0.1, 0.7, 0.2], abs=0.03)
    assert all(r.slo == w.tier_set[r.tier].slo for r in reqs)
    assert w.tier_set[0].slo.ttft_s == 0.5 and w.num_clipped >= 0


def test_same_seed_same_requests_and_different_seed_differs():
    cfg = default_workload()
    assert build_requests(cfg) == build_requests(cfg)
    assert build_requests(cfg, seed=5) == build_requests(cfg, seed=5)
    assert build_requests(cfg, seed=5) != build_requests(cfg, seed=6)


def test_changing_arrivals_keeps_length_and_tier_draws():
    a = build_requests(WorkloadConfig.from_dict({"arrivals": {"kind": "poisson", "rate": 2}}))
    b = build_requests(WorkloadConfig.from_dict({"arrivals": {"kind": "gamma", "rate": 9, "cv": 3}}))
    assert [(r.prompt_tokens, r.output_tokens, r.tier) for r in a] == [(r.prompt_tokens, r.output_tokens, r.tier) for r in b]


@pytest.mark.parametrize("data, field", [
    ({"num_request": 10}, "num_request"),                                   # misspelt field
    ({"arrivals": {"kind": "poisson", "rate": -1}}, "arrivals.poisson.rate"),
    ({"arrivals": {"kind": "weibull", "rate": 1}}, "arrivals"),
    ({"arrivals": {"kind": "poisson", "rate": 1, "cv": 2}}, "arrivals.poisson.cv"),
    ({"lengths": {"kind": "fit", "dataset": "lmsys"}}, "lengths.fit"),
    ({"tiers": {"num_tiers": 0}}, "tiers.num_tiers"),
    ({"tiers": {"num_tiers": 3, "mix": "weights", "weights": [1, 2]}}, "tiers"),
    ({"tiers": {"num_tiers": 2, "preset": "niyama"}}, "tiers"),
    ({"tiers": {"num_tiers": 2, "slos": [{"ttft_s": 1}]}}, "tiers"),
    ({"tiers": {"num_tiers": 1, "slos": [{"ttft_s": 0}]}}, "tiers.slos.0.ttft_s"),
    ({"arrivals": {"kind": "trace"}}, "workload"),
    ({"trace": {"path": "x.csv"}}, "workload"),
    ({"trace": {"path": "x.csv", "format": "parquet"}, "lengths": {"kind": "trace"}}, "trace.format"),
    ({"num_requests": None}, "workload"),
])
def test_bad_config_names_the_field(data, field):
    with pytest.raises(ConfigError) as ei:
        WorkloadConfig.from_dict(data)
    assert ei.value.field == field
    assert str(ei.value).startswith(field)


def test_semantic_messages_say_what_is_allowed():
    with pytest.raises(ConfigError, match="allowed: 3 with preset 'niyama'"):
        WorkloadConfig.from_dict({"tiers": {"num_tiers": 2, "preset": "niyama"}})
    with pytest.raises(ConfigError, match="azure2023_conv"):
        WorkloadConfig.from_dict({"lengths": {"kind": "fit", "dataset": "lmsys"}})


def test_trace_driven_csv_keeps_rows_tiers_and_apps(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,tier,app\n0,10,5,1,a\n2,20,6,0,b\n4,9000,7,2,c\n")
    cfg = WorkloadConfig.from_dict({"num_requests": None, "trace": {"path": str(p)},
                                    "arrivals": {"kind": "trace", "target_rate": 1.0},
                                    "lengths": {"kind": "trace", "max_total_tokens": 4096}})
    w = build_workload(cfg)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.tier, r.app) for r in w.requests] == [
        (0.0, 10, 5, 1, "a"), (1.0, 20, 6, 0, "b"), (2.0, 4089, 7, 2, "c")]
    assert w.num_clipped == 1


def test_trace_tier_outside_k_is_reported(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,tier\n0,10,5,3\n")
    cfg = WorkloadConfig.from_dict({"num_requests": None, "trace": {"path": str(p)},
                                    "arrivals": {"kind": "trace"}, "lengths": {"kind": "trace"}})
    with pytest.raises(TraceError) as ei:
        build_requests(cfg)
    assert ei.value.field == "tier" and ei.value.row == 1


def test_niyama_preset_assigns_three_qos_classes_evenly():
    cfg = WorkloadConfig.from_dict({"num_requests": 6000, "tiers": {"preset": "niyama"}})
    reqs = build_requests(cfg)
    freq = np.bincount([r.tier for r in reqs], minlength=3) / len(reqs)
    assert freq == pytest.approx([1 / 3] * 3, abs=0.02)
    assert {r.slo.ttlt_s for r in reqs if r.tier == 2} == {1800.0}


def test_yaml_file_round_trip(tmp_path):
    y = tmp_path / "w.yaml"
    y.write_text("workload:\n  num_requests: 50\n  seed: 3\n  arrivals: {kind: diurnal, mean_rate: 4, period_s: 600}\n"
                 "  lengths: {kind: choice, options: [{prompt: 125, output: 100, weight: 0.9},"
                 " {prompt: 2000, output: 6000, weight: 0.1}]}\n  tiers: {num_tiers: 4, mix: gaussian}\n")
    cfg = WorkloadConfig.from_yaml(y)
    reqs = build_requests(cfg)
    assert len(reqs) == 50 and {r.prompt_tokens for r in reqs} <= {125, 2000}
    assert WorkloadConfig.from_dict(cfg.model_dump()) == cfg


def test_vidur_reference_run_through_config():
    d = shared_data("vidur", "reference_runs", "l3_vllm_poisson_qps4_n1000")
    if d is None:
        pytest.skip("shared/data/vidur/reference_runs absent")
    cfg = WorkloadConfig.from_dict({"num_requests": None, "trace": {"path": str(d), "format": "vidur_run"},
                                    "arrivals": {"kind": "trace"}, "lengths": {"kind": "trace"},
                                    "tiers": {"num_tiers": 1}})
    reqs = build_requests(cfg)
    import csv
    with open(d / "request_arrival_time_series.csv") as f:
        times = [float(r["Time (sec)"]) for r in csv.DictReader(f)]
    assert len(reqs) == 1000 and reqs[0].prompt_tokens == 4065
    assert [r.arrival_s for r in reqs] == times  # exactly Vidur's arrivals
