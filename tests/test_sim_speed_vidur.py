"""The Vidur side of benchmarks/sim_speed.py: the CLI it builds reproduces each reference run's config.json, the
requests Vidur draws are replayed unchanged, and a live run refuses to time a cold predictor cache."""
import shutil

import pytest

from tierserve.core.paths import shared_data
from tierserve.workload import read_vidur_run
from conftest import load_script

pytestmark = pytest.mark.skipif(shared_data("vidur", "reference_runs", "l3_vllm_poisson_qps4_n1000") is None,
                                reason="shared/data/vidur/reference_runs absent")


@pytest.fixture(scope="module")
def sim_speed():
    return load_script("benchmarks/sim_speed.py", "sim_speed")


def _flags(cmd: list[str]) -> dict[str, str | None]:
    """`--name value` pairs of a command line; a flag followed by another flag maps to None."""
    out, i = {}, 0
    while i < len(cmd):
        if cmd[i].startswith("--"):
            nxt = cmd[i + 1] if i + 1 < len(cmd) else None
            out[cmd[i]] = None if nxt is None or nxt.startswith("--") else nxt
        i += 1
    return out


@pytest.mark.parametrize("kind,cap_flag,cap_value", [("vllm", "--vllm_scheduler_config_max_tokens_in_batch", "4096"),
                                                     ("sarathi", "--sarathi_scheduler_config_chunk_size", "512")])
def test_vidur_command_reproduces_reference_config(sim_speed, kind, cap_flag, cap_value):
    import json
    ref = sim_speed.reference_dir(kind, 10000)
    cfg = json.loads((ref / "config.json").read_text())
    f = _flags(sim_speed.vidur_command("py", cfg, 50000, "/out", "/cache"))
    assert f["--replica_scheduler_config_type"] == kind
    assert f[cap_flag] == cap_value
    assert f["--synthetic_request_generator_config_num_requests"] == "50000"
    assert f["--trace_request_length_generator_config_trace_file"] == "./data/processed_traces/splitwise_conv_x3.csv"
    assert f["--poisson_request_interval_generator_config_qps"] == "4.0"
    assert f["--seed"] == f["--synthetic_request_generator_config_seed"] == "42"
    assert f["--replica_config_model_name"] == "meta-llama/Meta-Llama-3-8B"
    assert f["--metrics_config_cache_dir"] == "/cache" and f["--metrics_config_output_dir"] == "/out"
    # the reference runs' metric settings, which differ from Vidur's CLI defaults
    for flag in ("--no-metrics_config_enable_chrome_trace", "--no-metrics_config_store_plots",
                 "--metrics_config_store_token_completion_metrics"):
        assert flag in f


def test_vidur_output_run_replays_the_same_requests(sim_speed, tmp_path):
    ref = shared_data("vidur", "reference_runs", "l3_vllm_poisson_qps4_n1000")
    run = tmp_path / "out" / "2026-12-01_00-00-00-000000"      # Vidur's timestamped layout
    (run / "plots").mkdir(parents=True)
    shutil.copy(ref / "request_metrics.csv", run / "request_metrics.csv")
    shutil.copy(ref / "request_arrival_time_series.csv", run / "plots" / "request_arrival_time_series.csv")
    replay = sim_speed.vidur_output_run(tmp_path / "out")
    got, want = read_vidur_run(replay), read_vidur_run(ref)
    assert len(got) == 1000
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in got] == \
           [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in want]


def test_vidur_output_run_without_arrival_series_is_none(sim_speed, tmp_path):
    ref = shared_data("vidur", "reference_runs", "l3_vllm_poisson_qps4_n1000")
    (tmp_path / "out" / "run").mkdir(parents=True)
    shutil.copy(ref / "request_metrics.csv", tmp_path / "out" / "run" / "request_metrics.csv")
    assert sim_speed.vidur_output_run(tmp_path / "out") is None


def test_vidur_setup_refuses_a_cold_cache_and_a_missing_trace(sim_speed, tmp_path, monkeypatch):
    vdir = tmp_path / "vidur_checkout"
    (vdir / "vidur").mkdir(parents=True)
    (vdir / "vidur" / "main.py").write_text("")
    py = tmp_path / "python"
    py.write_text("")
    monkeypatch.delenv("VIDUR_CACHE_DIR", raising=False)
    with pytest.raises(SystemExit, match="splitwise_conv_x3.csv"):
        sim_speed.vidur_setup(str(py), str(vdir))
    (vdir / "data" / "processed_traces").mkdir(parents=True)
    (vdir / "data" / "processed_traces" / "splitwise_conv_x3.csv").write_text("")
    (vdir / "cache").mkdir()
    with pytest.raises(SystemExit, match="0 predictor tables"):
        sim_speed.vidur_setup(str(py), str(vdir))
    for i in range(sim_speed.VIDUR_NUM_PREDICTION_TABLES):
        (vdir / "cache" / f"m{i}_abcd1234_predictions.pkl").write_bytes(b"")
    (vdir / "VIDUR_COMMIT").write_text("microsoft/vidur@7d47513\nhow it was built\n")
    info = sim_speed.vidur_setup(str(py), str(vdir))
    assert info["commit"] == "microsoft/vidur@7d47513" and info["notes"] == ["how it was built"]
    assert info["cache_dir"] == str(vdir / "cache")
