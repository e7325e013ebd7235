"""The `tierserve` command: the default run, scenario files, and clear errors on bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.core import ConfigError
from tierserve.experiments.scenario import ScenarioConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from tierserve.cli import main; main()", *args],
                          capture_output=True, text=True)


def test_default_simulate_compares_fcfs_with_the_tier_aware_stack(tmp_path):
    from tierserve.experiments.scenario import DEFAULT_STACKS
    result = runner.invoke(app, ["simulate", "-n", "300", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "ρ = 0.90" in result.output and "burst" in result.output
    for tier in ("tier0", "tier1", "tier2", "all"):
        assert tier in result.output
    for stack in DEFAULT_STACKS:
        assert stack in result.output
        # header + every request, for each stack
        assert (tmp_path / stack.replace("+", "__") / "requests.csv").read_text().count("\n") == 301


def test_default_scenario_shows_tiers_mattering():
    """At the default load and burst, local priority protects tier 0's tail and costs the bottom tier's."""
    from tierserve.experiments.scenario import DEFAULT_STACKS, ScenarioConfig, run_scenario
    ttft_p99 = {}
    for stack in DEFAULT_STACKS:
        local, _, glob = stack.partition("+")
        cfg = ScenarioConfig.from_dict({"cluster": {"local_policy": local, "cluster_policy": glob}})
        res = run_scenario(cfg)
        ttft_p99[stack] = [res.summary.tiers[f"tier{t}"].get("ttft.p99") for t in range(3)]
    fcfs, tiered = (ttft_p99[s] for s in DEFAULT_STACKS)
    assert tiered[0] < 0.5 * fcfs[0]          # tier 0's tail shrinks under priority
    assert tiered[2] > fcfs[2]                # … paid for by the bottom tier


@pytest.mark.parametrize("args, field", [
    (["--model", "gpt-9"], "cluster.replica.model"),
    (["--gpu", "tpu-v9"], "cluster.replica.gpu"),
    (["-l", "fifo-magic"], "cluster.local_policy"),
    (["-g", "nearest"], "cluster.cluster_policy"),
    (["--replicas", "0"], "--replicas"),          # bounded at the flag, before any work
])
def test_bad_flag_gives_an_error_naming_the_field_not_a_traceback(args, field):
    proc = run_cli("simulate", *args)
    assert proc.returncode == 2
    assert field in proc.stderr and "Traceback" not in proc.stderr


def test_scenario_file_with_a_wrong_field_names_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  num_replica: 3\n")
    with pytest.raises(ConfigError, match="cluster.num_replica"):
        ScenarioConfig.from_yaml(bad)


def test_scenario_file_that_is_not_yaml_mapping(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        ScenarioConfig.from_yaml(bad)


@pytest.mark.parametrize("path", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_scenario_validates(path, monkeypatch):
    monkeypatch.chdir(EXAMPLES.parent)
    cfg = ScenarioConfig.from_yaml(EXAMPLES / path)
    assert cfg.cluster.num_replicas >= 1


def test_malformed_trace_is_a_clear_error(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,abc,5\n")
    proc = run_cli("simulate", "--trace", str(trace))
    assert proc.returncode == 2
    assert "prompt_tokens" in proc.stderr and "abc" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_runs_stacks_side_by_side(tmp_path):
    result = runner.invoke(app, ["compare", "--stacks", "vllm+round_robin,sarathi+jsq", "-n", "200",
                                 "--executor", "serial", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "vllm+round_robin" in result.output and "sarathi+jsq" in result.output
    assert (tmp_path / "sarathi__jsq" / "requests.csv").exists()


def test_calibrate_from_iterations_then_simulate_with_the_fit(tmp_path):
    import random
    from tierserve.experiments.scenario import run_scenario
    rng = random.Random(0)
    log = tmp_path / "iterations.csv"
    rows = ["prefill_tokens,decode_count,prefill_context,decode_context_sum,measured_ms"]
    for _ in range(300):
        p, b, ctx = rng.choice([0, 128, 512, 1024]), rng.randint(0, 64), rng.randint(0, 2048)
        c = b * rng.randint(100, 2000)
        if p == 0 and b == 0:
            b, c = 1, 500
        ms = 8.0 + 0.04 * p + 0.03 * b + 1e-6 * p * (ctx + p / 2) + 4e-5 * c
        rows.append(f"{p},{b},{ctx},{c},{ms * (1 + rng.uniform(-0.01, 0.01)):.4f}")
    log.write_text("\n".join(rows) + "\n")
    fit_json = tmp_path / "fit.json"
    result = runner.invoke(app, ["calibrate", "--iterations", str(log), "--out", str(fit_json)])
    assert result.exit_code == 0, result.output
    # The ±1% noise planted above is what the recorded step-time table shows (mean ≈ 1, CV well under 1%).
    table = json.loads(fit_json.read_text())["step_time_ratios"]
    assert len(table) == 64 and "step-time ratio table (64 values" in result.output
    assert abs(sum(table) / 64 - 1) < 0.002 and 0.003 < max(table) - 1 < 0.02
    cfg = ScenarioConfig.from_dict({"workload": {"num_requests": 200},
                                    "cluster": {"replica": {"exec_model_file": str(fit_json)}}})
    res = run_scenario(cfg)
    assert res.summary.all.finished == 200
    # The fitted 8 ms floor shows in every token gap.
    assert res.summary.all.tbt.p50 > 0.008


def test_simulate_prints_the_queue_stability_verdict_and_writes_it(tmp_path):
    result = runner.invoke(app, ["simulate", "-n", "300", "--replicas", "1", "--rate", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "queue stability" in result.output and "work: stable" in result.output
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["summary"]["extras"]["stability"]["work"]["verdict"] == "stable"


def test_simulate_steady_state_over_seeds_states_window_and_seeds(tmp_path):
    result = runner.invoke(app, ["simulate", "-n", "300", "--replicas", "1", "--rate", "12", "--steady-state",
                                 "--seeds", "3", "--executor", "serial", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "seeds [0, 1, 2]" in out and "first and last 10% of arrivals dropped" in out and " ± " in out
    # 12 req/s on one replica: each seed's queue grows
    for seed in range(3):
        verdict = json.loads((tmp_path / f"seed{seed}" / "summary.json").read_text())["summary"]["extras"]["stability"]
        assert verdict["work"]["verdict"] == "unstable" and verdict["work"]["growth_low"] > verdict["work"]["tolerance"]
    doc = json.loads((tmp_path / "seeds.json").read_text())
    assert doc["seeds"] == [0, 1, 2] and doc["drop_fraction_each_end"] == 0.1
    assert doc["intervals"]["all"]["ttft.p50"]["n"] == 3 and doc["intervals"]["all"]["ttft.p50"]["half_width_95"] > 0
    for seed in range(3):
        run = json.loads((tmp_path / f"seed{seed}" / "summary.json").read_text())
        assert run["config"]["seed"] == seed
        assert run["summary"]["extras"]["steady_state"]["kept"] == 240  # 300 less 30 at each end


def test_compare_steady_state_over_seeds(tmp_path):
    result = runner.invoke(app, ["compare", "--stacks", "vllm+round_robin,vllm_priority+jsq", "-n", "200",
                                 "--replicas", "1", "--rate", "2", "--steady-state", "--drop-fraction", "0.2",
                                 "--seeds", "2", "--executor", "serial", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "vllm_priority+jsq" in result.output and "first and last 20% of arrivals dropped" in result.output
    for stack in ("vllm__round_robin", "vllm_priority__jsq"):
        doc = json.loads((tmp_path / stack / "seeds.json").read_text())
        assert doc["seeds"] == [0, 1] and doc["drop_fraction_each_end"] == 0.2
        assert [r["verdict"] for r in doc["runs"]] == ["stable", "stable"]
        assert (tmp_path / stack / "seed1" / "requests.csv").exists()


def test_drop_fraction_out_of_range_is_a_named_error():
    proc = run_cli("simulate", "-n", "50", "--steady-state", "--drop-fraction", "0.5")
    assert proc.returncode == 2
    assert "--drop-fraction" in proc.stderr and "Traceback" not in proc.stderr


def test_examples_default_yaml_is_the_default_scenario():
    from pathlib import Path

    from tierserve.experiments.scenario import ScenarioConfig
    path = Path(__file__).resolve().parents[1] / "examples" / "default.yaml"
    assert ScenarioConfig.from_yaml(path).model_dump() == ScenarioConfig().model_dump()
