"""Scenario files and the config schema: every number checked for type, finiteness and range, sizes bounded
by stated limits, YAML's surprises refused, policy and migration parameters type-checked before a run."""
from __future__ import annotations

import json
import time

import pytest

from tierserve.core.errors import ConfigError
from tierserve.experiments.scenario import ScenarioConfig, run_scenario


def refused(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        ScenarioConfig.from_dict(data)
    return ei.value


def yaml_refused(tmp_path, text: str) -> ConfigError:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        ScenarioConfig.from_yaml(p)
    return ei.value


# ---- YAML --------------------------------------------------------------------------------------------------

def test_duplicate_yaml_key_is_refused_with_its_line(tmp_path):
    e = yaml_refused(tmp_path, "name: a\nseed: 1\nseed: 2\n")
    assert "duplicate key 'seed'" in str(e) and "line 3" in str(e)
    e = yaml_refused(tmp_path, "cluster:\n  num_replicas: 2\n  num_replicas: 3\n")
    assert "duplicate key 'num_replicas'" in str(e)


@pytest.mark.parametrize("text", ["1_000", "0x10", "1:30", "on"])
def test_yaml_1_1_number_forms_are_text_so_a_count_refuses_them(tmp_path, text):
    e = yaml_refused(tmp_path, f"workload:\n  num_requests: {text}\n")
    assert e.field == "workload.num_requests" and "not the text" in str(e)


@pytest.mark.parametrize("text", ["true", "True", "false"])
def test_yaml_boolean_is_not_a_count(tmp_path, text):
    e = yaml_refused(tmp_path, f"cluster:\n  num_replicas: {text}\n")
    assert e.field == "cluster.num_replicas" and "not the boolean" in str(e)


def test_yaml_exponent_without_a_dot_is_a_number(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("workload:\n  arrivals: {kind: poisson, rate: 1e1}\n")
    assert ScenarioConfig.from_yaml(p).workload.arrivals.rate == 10.0


def test_yaml_alias_bomb_is_refused_fast_and_never_printed(tmp_path):
    lines = ["a: &a [" + ",".join(["lol"] * 10) + "]"]
    for i in range(1, 10):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*{'a' if i == 1 else f'l{i - 1}'}"] * 10) + "]")
    lines.append("name: *l9")
    t0 = time.monotonic()
    e = yaml_refused(tmp_path, "\n".join(lines) + "\n")
    assert time.monotonic() - t0 < 2.0
    assert "TIERSERVE_MAX_YAML_NODES" in str(e) and "lol" not in str(e) and len(str(e)) < 400


def test_yaml_below_the_alias_limit_is_quoted_short_in_errors(tmp_path):
    e = yaml_refused(tmp_path, "x: &x [" + ",".join(["word"] * 50) + "]\nname: [*x, *x, *x, *x]\n")
    assert len(str(e)) < 400 and e.field == "name"


def test_recursive_yaml_alias_is_refused(tmp_path):
    e = yaml_refused(tmp_path, "name: &a [1, *a]\n")
    assert "recursive alias" in str(e)


def test_deeply_nested_yaml_is_refused(tmp_path):
    e = yaml_refused(tmp_path, "name: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested at most 64 levels" in str(e)


def test_yaml_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_MAX_CONFIG_BYTES", "100")
    e = yaml_refused(tmp_path, "name: " + "x" * 200 + "\n")
    assert "TIERSERVE_MAX_CONFIG_BYTES" in str(e)


# ---- numbers: type, finiteness, range ------------------------------------------------------------------------

@pytest.mark.parametrize("data, field, allowed", [
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"workload": {"seed": -5}}, "workload.seed", "greater than or equal to 0"),
    ({"workload": {"num_requests": True}}, "workload.num_requests", "not the boolean"),
    ({"workload": {"num_requests": "100"}}, "workload.num_requests", "not the text"),
    ({"workload": {"num_requests": 2.5}}, "workload.num_requests", "integer"),
    ({"workload": {"arrivals": {"kind": "poisson", "rate": float("nan")}}}, "workload.arrivals.poisson.rate",
     "got nan"),
    ({"workload": {"arrivals": {"kind": "poisson", "rate": float("inf")}}}, "workload.arrivals.poisson.rate",
     "got inf"),
    ({"workload": {"arrivals": {"kind": "poisson", "rate": True}}}, "workload.arrivals.poisson.rate", "boolean"),
    ({"workload": {"arrivals": {"kind": "poisson", "rate": 0}}}, "workload.arrivals.poisson.rate", "greater than 0"),
    ({"workload": {"arrivals": {"kind": "gamma", "rate": 1, "cv": 1e-300}}}, "workload.arrivals.gamma.cv",
     "greater than or equal to 0.001"),
    ({"workload": {"lengths": {"kind": "choice", "options": [{"prompt": 1e30, "output": 1}]}}},
     "workload.lengths.choice.options.0.prompt", "2^53"),
    ({"workload": {"lengths": {"kind": "choice", "options": [{"prompt": 2**64, "output": 1}]}}},
     "workload.lengths.choice.options.0.prompt", "2^53"),
    ({"workload": {"lengths": {"kind": "choice", "options": [{"prompt": 2**40, "output": 1}]}}},
     "workload.lengths.choice.options.0.prompt", "less than or equal to 2147483647"),
    ({"cluster": {"replica": {"tp": True}}}, "cluster.replica.tp", "boolean"),
    ({"cluster": {"replica": {"num_blocks": 2**64}}}, "cluster.replica.num_blocks", "2^53"),
    ({"cluster": {"skip_ahead": "no"}}, "cluster.skip_ahead", "boolean"),
    ({"cluster": {"time_limit_s": 1e17}}, "cluster.time_limit_s", "less than or equal to 1000000000"),
])
def test_bad_number_names_field_value_and_rule(data, field, allowed):
    e = refused(data)
    assert e.field == field and allowed in str(e)


# ---- size limits ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, field, env", [
    ({"workload": {"num_requests": 10**8}}, "workload.num_requests", "TIERSERVE_MAX_REQUESTS"),
    ({"cluster": {"num_replicas": 10**8}}, "cluster.num_replicas", "TIERSERVE_MAX_REPLICAS"),
    ({"workload": {"arrivals": {"kind": "diurnal", "mean_rate": 4, "segments": 10**9}}},
     "workload.arrivals.diurnal.segments", "TIERSERVE_MAX_SEGMENTS"),
    ({"workload": {"arrivals": {"kind": "piecewise", "rates": [1.0] * 100_001, "durations_s": [1.0] * 100_001}}},
     "workload.arrivals.piecewise.rates", "TIERSERVE_MAX_SEGMENTS"),
    ({"workload": {"tiers": {"num_tiers": 1000}}}, "workload.tiers.num_tiers", "TIERSERVE_MAX_TIERS"),
])
def test_size_over_its_limit_says_the_limit_and_how_to_raise_it(data, field, env):
    t0 = time.monotonic()
    e = refused(data)
    assert time.monotonic() - t0 < 2.0
    assert e.field == field and "at most" in str(e) and f"{env}=N" in str(e)


def test_a_limit_is_raised_by_its_environment_variable(monkeypatch):
    data = {"workload": {"tiers": {"num_tiers": 150, "mix": "uniform"}}}
    refused(data)
    monkeypatch.setenv("TIERSERVE_MAX_TIERS", "200")
    assert ScenarioConfig.from_dict(data).workload.tiers.num_tiers == 150
    monkeypatch.setenv("TIERSERVE_MAX_TIERS", "lots")
    assert refused(data).field == "TIERSERVE_MAX_TIERS"


def test_generated_arrivals_beyond_1e9_s_are_refused():
    cfg = ScenarioConfig.from_dict({"workload": {"num_requests": 10,
                                                 "arrivals": {"kind": "poisson", "rate": 1e-12}}})
    with pytest.raises(ConfigError, match="within 1e\\+09 s.*sub-microsecond") as ei:
        run_scenario(cfg)
    assert ei.value.field == "arrivals"


# ---- policy and migration parameters ----------------------------------------------------------------------------

@pytest.mark.parametrize("cluster, field, allowed", [
    ({"local_policy_params": {"long_prefill_threshold": "abc"}}, "cluster.local_policy_params.long_prefill_threshold",
     "int"),
    ({"local_policy_params": {"long_prefill_threshold": True}}, "cluster.local_policy_params.long_prefill_threshold",
     "int"),
    ({"local_policy_params": {"preempt_mode": "swpa"}}, "cluster.local_policy_params.preempt_mode",
     "recompute | swap"),
    ({"local_policy_params": {"chunk": 5}}, "cluster.local_policy_params.chunk", "a parameter of vllm"),
    ({"local_policy": "llumlet", "local_policy_params": {"promote_after_s": "soon"}},
     "cluster.local_policy_params.promote_after_s", "float"),
    ({"cluster_policy": "llumnix", "cluster_policy_params": {"hold_when_busy": "yes"}},
     "cluster.cluster_policy_params.hold_when_busy", "bool"),
    ({"cluster_policy": "llumnix", "cluster_policy_params": {"migrate_threshold": float("inf")}},
     "cluster.cluster_policy_params.migrate_threshold", "finite"),
    ({"cluster_policy": "llumnix", "migration_params": {"bandwidth_gbytes_s": "fast"}},
     "cluster.migration_params.bandwidth_gbytes_s", "a number"),
    ({"cluster_policy": "llumnix", "migration_params": {"max_stages": 2.5}},
     "cluster.migration_params.max_stages", "an integer"),
    ({"cluster_policy": "llumnix", "migration_params": {"bandwidth_gbytes_s": -1}},
     "cluster.migration_params.bandwidth_gbytes_s", "positive"),
    ({"cluster_policy": "llumnix", "migration_params": {"bandwidth": 1}},
     "cluster.migration_params.bandwidth", "bandwidth_gbytes_s"),
])
def test_policy_and_migration_parameters_are_checked_before_the_run(cluster, field, allowed):
    e = refused({"cluster": cluster})
    assert e.field == field and allowed in str(e)


# ---- the execution-model file -------------------------------------------------------------------------------

@pytest.mark.parametrize("body, problem", [
    ("{}", "with fitted coefficients"),
    ('{"layers": {}, "attention": []}', "with fitted coefficients"),
    ('{"colour": "blue"}', "unknown keys"),
    ('{"kind": "x", "kind": "y"}', "duplicate key"),
    ("[1, 2]", "mapping"),
])
def test_empty_or_foreign_model_file_is_refused(tmp_path, body, problem):
    p = tmp_path / "fit.json"
    p.write_text(body)
    e = refused({"cluster": {"replica": {"exec_model_file": str(p)}}})
    assert e.field == "cluster.replica.exec_model_file" and problem in str(e)


def test_model_file_that_is_not_utf8_is_refused(tmp_path):
    p = tmp_path / "fit.json"
    p.write_bytes(b'{"meta": "\xff"}')
    assert "byte offset 10" in str(refused({"cluster": {"replica": {"exec_model_file": str(p)}}}))


# ---- values that used to crash ---------------------------------------------------------------------------------

def test_tiny_gaussian_sigma_puts_every_request_in_the_middle_tier():
    cfg = ScenarioConfig.from_dict({"workload": {"num_requests": 40, "tiers": {"num_tiers": 3, "mix": "gaussian",
                                                                               "sigma": 1e-300}}})
    res = run_scenario(cfg)
    assert len(res.table) == 40 and set(res.table["tier"].tolist()) == {1}


def test_summary_json_of_a_run_says_complete(tmp_path):
    from tierserve.experiments.scenario import write_result
    from tierserve.metrics.io import load_outputs
    res = run_scenario(ScenarioConfig.from_dict({"workload": {"num_requests": 30}}))
    write_result(res, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["complete"] is True
    assert len(load_outputs(tmp_path).table) == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "requests.csv", "summary.json",
                                                          "summary_by_tier.csv"]


def test_outputs_without_the_complete_marker_are_not_loaded(tmp_path):
    from tierserve.core.errors import InputError
    from tierserve.experiments.scenario import write_result
    from tierserve.metrics.io import load_outputs
    write_result(run_scenario(ScenarioConfig.from_dict({"workload": {"num_requests": 10}})), tmp_path)
    doc = json.loads((tmp_path / "summary.json").read_text())
    doc.pop("complete")
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="not a complete run"):
        load_outputs(tmp_path)
