"""Command-line flags and outputs: bad flags refused by name, `--out` checked before any work, no traceback."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.core.errors import ConfigError, TierserveError

runner = CliRunner()


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from tierserve.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout)


def cli_error(*args: str) -> TierserveError:
    result = runner.invoke(app, list(args))
    assert isinstance(result.exception, TierserveError), (result.output, result.exception)
    return result.exception


def unwritable_outs(tmp_path: Path) -> list[str]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return [str(a_file), str(a_file / "below"), "/proc/tierserve-out"]


@pytest.mark.parametrize("command", [
    ["simulate", "-n", "10000000", "--replicas", "1"],       # one run: would take minutes before any write
    ["simulate", "-n", "10000000"],                          # the default main job (two stacks)
    ["simulate", "-n", "10000000", "--replicas", "1", "--seeds", "2", "--executor", "serial"],
    ["compare", "--stacks", "vllm+round_robin", "-n", "10000000", "--executor", "serial"],
    ["reproduce", "ktier", "--quick", "--executor", "serial"],
])
def test_unwritable_out_is_refused_before_the_run_starts(tmp_path, command):
    for out in unwritable_outs(tmp_path):
        t0 = time.monotonic()
        e = cli_error(*command, "--out", out)
        assert time.monotonic() - t0 < 5.0
        assert isinstance(e, ConfigError) and e.field == "--out" and out in str(e)


def test_calibrate_checks_its_out_file_before_fitting(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("prefill_tokens,decode_count,prefill_context,decode_context_sum,measured_ms\n" +
                   "".join(f"{p},1,0,100,{5 + p / 100}\n" for p in range(0, 600, 50)))
    for out in unwritable_outs(tmp_path)[1:] + [str(tmp_path)]:
        result = runner.invoke(app, ["calibrate", "--iterations", str(log), "--out", out])
        assert result.exit_code == 2 and "--out" in result.output, result.output
    ok = runner.invoke(app, ["calibrate", "--iterations", str(log), "--out", str(tmp_path / "fit.json")])
    assert ok.exit_code == 0, ok.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "fit.json", "log.csv"]


def test_calibrate_refuses_a_log_that_is_not_utf8(tmp_path):
    log = tmp_path / "log.csv"
    log.write_bytes(b"prefill_tokens,decode_count,prefill_context,decode_context_sum,measured_ms\n0,1,0,100,5\xb5\n")
    result = runner.invoke(app, ["calibrate", "--iterations", str(log), "--out", str(tmp_path / "fit.json")])
    assert result.exit_code == 2 and "byte offset" in result.output and "log.csv" in result.output


def test_calibrate_refuses_duplicate_columns(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("prefill_tokens,decode_count,prefill_context,decode_context_sum,measured_ms,measured_ms\n"
                   "0,1,0,100,5,6\n")
    result = runner.invoke(app, ["calibrate", "--iterations", str(log), "--out", str(tmp_path / "fit.json")])
    assert result.exit_code == 2 and "duplicate column" in result.output


def test_trace_format_without_trace_is_refused():
    e = cli_error("simulate", "--trace-format", "mooncake", "-n", "10")
    assert e.field == "--trace-format" and "--trace" in str(e)


def test_negative_seed_is_a_named_error():
    e = cli_error("simulate", "--seed", "-1", "-n", "10", "--replicas", "1")
    assert e.field == "--seed" and "[0, 9,223,372,036,854,775,807]" in e.allowed


@pytest.mark.parametrize("stacks", ["", ",", " , "])
def test_empty_stack_list_is_a_named_error(stacks):
    assert cli_error("compare", "--stacks", stacks, "-n", "10").field == "--stacks"


@pytest.mark.parametrize("rate", ["0", "-3", "nan", "inf"])
def test_zero_or_non_finite_rate_is_a_named_error(rate):
    e = cli_error("simulate", "--rate", rate, "-n", "10", "--replicas", "1")
    assert e.field == "--rate"                  # the flag, checked before any work


def test_simulate_out_holds_only_whole_files_marked_complete(tmp_path):
    import json
    result = runner.invoke(app, ["simulate", "-n", "50", "--replicas", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "requests.csv", "summary.json",
                                                          "summary_by_tier.csv"]
    assert json.loads((tmp_path / "summary.json").read_text())["complete"] is True


@pytest.mark.parametrize("args, needle", [
    (["simulate", "--trace", "{bin}"], "byte offset"),
    (["simulate", "--trace", "{dup}"], "duplicate column"),
    (["simulate", "-c", "{yaml}"], "duplicate key"),
    (["simulate", "--out", "/proc/tierserve-x", "-n", "10"], "--out"),
])
def test_no_traceback_on_bad_input(tmp_path, args, needle):
    files = {"bin": tmp_path / "b.csv", "dup": tmp_path / "d.csv", "yaml": tmp_path / "s.yaml"}
    files["bin"].write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    files["dup"].write_text("arrival_s,arrival_s,prompt_tokens,output_tokens\n0,0,1,1\n")
    files["yaml"].write_text("seed: 1\nseed: 1\n")
    proc = run_cli(*[a.format(**files) for a in args])
    assert proc.returncode == 2 and needle in proc.stderr.replace("\n", " ")
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout


def test_bad_trace_read_inside_a_pool_worker_comes_back_as_the_named_error(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,abc,5\n")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"workload:\n  num_requests: null\n  arrivals: {{kind: trace}}\n  lengths: {{kind: trace}}\n"
                   f"  trace: {{path: {trace}}}\n")
    e = cli_error("compare", "-c", str(cfg), "--stacks", "vllm+round_robin,sarathi+jsq", "--executor", "process")
    assert e.field == "prompt_tokens" and e.row == 2


def test_errors_survive_pickling():
    import pickle

    from tierserve.core.errors import InputError, TraceError
    for e in (ConfigError("cluster.tp", 3, "1 or 2"), TraceError("t.csv", 4, "arrival_s", "x", "not a number"),
              InputError("f", None, "<file>", "f", "cannot be read")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e) and back.field == e.field
