"""`hardware` and `calibrate` commands register and run."""
import csv

import typer
from typer.testing import CliRunner

from tierserve.cli.hardware_cmds import register


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop")   # typer collapses a one-command app; keep both as subcommands
    def noop() -> None:
        pass
    return app


def test_hardware_list_and_describe():
    r = CliRunner().invoke(_app(), ["hardware"])
    assert r.exit_code == 0 and "Llama-3-8B" in r.output and "H200" in r.output
    r = CliRunner().invoke(_app(), ["hardware", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "a100"])
    assert r.exit_code == 0 and "decode b32" in r.output
    r = CliRunner().invoke(_app(), ["hardware", "--model", "Llama-3-8B", "--gpu", "a100", "--tp", "3"])
    assert r.exit_code == 2 and "tp" in r.output


def test_calibrate_from_iterations(tmp_path):
    log = tmp_path / "log.csv"
    with log.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prefill_tokens", "decode_count", "decode_context_sum", "prefill_attn_pairs", "measured_ms"])
        for i in range(30):
            p, b = 64 * (i % 5), 8 * (i % 7)
            w.writerow([p, b, b * 500, p * p / 2, 5 + 0.02 * p + 0.05 * b + 1e-4 * b * 500])
    out = tmp_path / "fit.json"
    r = CliRunner().invoke(_app(), ["calibrate", "--iterations", str(log), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file()
    r = CliRunner().invoke(_app(), ["calibrate", "--out", str(out)])
    assert r.exit_code == 2
