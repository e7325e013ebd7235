"""Seeds that are really distinct, tier names that cannot merge, and every number bounded with its limit named:
command-line flags, policy parameters, speed traces, watermarks, per-tier lists; files that would hang (FIFOs)
or are malformed (a blank line before a CSV header) refused, valid ones (a 100k-character line, a tiny rate)
accepted."""
from __future__ import annotations

import os
import signal
from contextlib import contextmanager

import numpy as np
import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.core.errors import ConfigError, TierserveError
from tierserve.experiments.scenario import ScenarioConfig, run_scenario

runner = CliRunner()


def cli_error(*args: str) -> TierserveError:
    result = runner.invoke(app, list(args))
    assert isinstance(result.exception, TierserveError), (result.output, result.exception)
    return result.exception


def scenario(**sections) -> ScenarioConfig:
    data = {"cluster": {"num_replicas": 1}, "workload": {"num_requests": 30}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return ScenarioConfig.from_dict(data)


@contextmanager
def within(seconds: int):
    """Fail (rather than hang the suite) when the block takes longer."""
    def fail(*_):
        raise AssertionError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_seeds_of_a_scenario_with_its_own_workload_seed_draw_distinct_samples():
    from tierserve.experiments.capacity import with_seed
    base = scenario(workload={"seed": 1})
    samples = [np.array([r.arrival_s for r in run_scenario(with_seed(base, s)).workload.requests])
               for s in (0, 1, 2)]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.array_equal(samples[i], samples[j]), f"seeds {i} and {j} drew the same requests"
    again = run_scenario(with_seed(base, 1)).workload.requests       # and each is still deterministic
    assert np.array_equal(samples[1], [r.arrival_s for r in again])


@pytest.mark.parametrize("names, needle", [
    (["gold", "gold"], "no other tier has"),
    (["Gold", "gold"], "no other tier has"),
    (["all", "b"], "reserved"),
    (["a", "backlog"], "reserved"),
    (["", "b"], "at least 1 character"),
    (["a\nb", "c"], "printable"),
])
def test_tier_names_are_unique_and_not_reserved(names, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        scenario(workload={"tiers": {"num_tiers": 2, "names": names}})
    assert "workload.tiers.names" in e.value.field


@pytest.mark.parametrize("args, flag, needle", [
    (["simulate", "--seeds", "1000000", "-n", "10"], "--seeds", "TIERSERVE_MAX_SEEDS"),
    (["reproduce", "ktier", "--requests", "0"], "--requests", "at least 1"),
    (["reproduce", "ktier", "--replicas", "0"], "--replicas", "at least 1"),
    (["reproduce", "niyama", "--segment-s", "nan"], "--segment-s", "finite"),
    (["reproduce", "niyama", "--requests", "100000000"], "--requests", "TIERSERVE_MAX_REQUESTS"),
    (["hardware", "--model", ""], "--model", "not blank"),
    (["hardware", "--tp", "0"], "--tp", "[1, 64]"),
    (["simulate", "--time-limit", "inf", "-n", "10"], "--time-limit", "finite"),
])
def test_every_command_line_number_is_bounded_with_the_limit_named(tmp_path, args, flag, needle):
    e = cli_error(*args, *(["--out", str(tmp_path / "o")] if args[0] == "reproduce" else []))
    assert e.field == flag and needle in str(e)
    assert not (tmp_path / "o").exists()          # refused before any work or output


def test_a_malformed_reuse_file_is_a_named_error(tmp_path):
    bad = tmp_path / "prev.json"
    bad.write_text('{"goodput": 3}')
    e = cli_error("reproduce", "niyama", "--reuse", str(bad), "--out", str(tmp_path / "o"))
    assert e.field == "--reuse" and "'goodput' is missing or not a mapping" in str(e)
    bad.write_text("{")
    assert cli_error("reproduce", "uniboost", "--reuse-capacities", str(bad), "--out",
                     str(tmp_path / "o")).field == "--reuse-capacities"


@pytest.mark.parametrize("cluster, field", [
    ({"local_policy": "sjf", "local_policy_params": {"quantum_steps": 10**30}}, "quantum_steps"),
    ({"local_policy": "sarathi_fcfs", "local_policy_params": {"chunk_by_replica": [2**40]}}, "chunk_by_replica[0]"),
    ({"cluster_policy": "llumnix", "cluster_policy_params": {"headroom_blocks": 10**20}}, "headroom_blocks"),
])
def test_huge_integer_policy_parameters_are_refused(cluster, field):
    with pytest.raises(ConfigError, match="at most 2,147,483,647") as e:
        scenario(cluster=cluster)
    assert e.value.field.endswith(field)


def test_a_speed_factor_of_1e300_and_a_watermark_of_099_are_refused():
    with pytest.raises(ConfigError, match=r"\[0.001, 1000\]"):
        scenario(cluster={"replica": {"speed_trace": [[0.0, 1e300]]}})
    scenario(cluster={"replica": {"speed_trace": [[0.0, 2.0], [10.0, 0.5]]}})      # a real slowdown is fine
    with pytest.raises(ConfigError, match="watermark_fraction"):
        scenario(cluster={"replica": {"watermark_fraction": 0.99}})


def test_a_short_niyama_tier_importance_is_caught_at_config_time():
    with pytest.raises(ConfigError, match="one entry per tier: at least 3") as e:
        scenario(cluster={"local_policy": "niyama", "local_policy_params": {"tier_importance": [2, 1]}})
    assert e.value.field.endswith("tier_importance")
    scenario(cluster={"local_policy": "niyama", "local_policy_params": {"tier_importance": [2, 1, 0]}})


def test_a_fifo_as_trace_or_scenario_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with within(10):
        assert "FIFO" in str(cli_error("simulate", "--trace", str(fifo)))
        assert "FIFO" in str(cli_error("simulate", "-c", str(fifo)))


def test_a_blank_first_line_in_a_vidur_file_is_refused(tmp_path):
    from tierserve.workload import read_trace
    p = tmp_path / "v.csv"
    p.write_text("\narrived_at,num_prefill_tokens,num_decode_tokens\n0,10,10\n")
    with pytest.raises(TierserveError, match="blank line before the header"):
        read_trace(p, "vidur")
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,10\n\n1,5,5\n")   # later blanks: skipped
    assert len(read_trace(p, "vidur")) == 2


def test_a_tiny_rate_is_accepted():
    res = run_scenario(scenario(workload={"num_requests": 5, "arrivals": {"kind": "poisson", "rate": 1e-3}}))
    assert len(res.workload.requests) == 5 and res.sim.duration_s > 100
