"""benchmarks/sim_to_real.py --out through the output layer (issue 29): the result (runs.json, fits, tables,
summary.json) is published whole with a manifest beside the engine's working files, never mixed with a previous
result, under the folder's lock; write errors are one line naming the path. The engine and the analysis are
replaced by stand-ins that write what they write (no vLLM needed); the writers the analysis calls are real."""
from __future__ import annotations

import errno
import json
import os
import signal

import numpy as np
import pytest

from tierserve.core.errors import ConfigError, OutputError
from tierserve.core.outputs import MANIFEST_JSON, FolderLock
from tierserve.experiments.sim_to_real import cli

LOGS = ("iterations.csv", "requests.jsonl")


def _engine(args, out, builder):
    """Stand-in for `collect`: the engine's logs written in place, as the engine writes them."""
    for name in LOGS:
        (out / name).write_text(f"{name} of seed {args.seed}\n")
    return {"seed": args.seed, "slo": [{}, {}, {}]}


def _analysis(text="new", fail=None):
    def analyse(args, out, saved, dest=None):
        dest = out if dest is None else dest
        (dest / "fit.json").write_text(json.dumps({"from": text}))
        if fail is not None:
            raise fail
        (dest / "table.txt").write_text(text + "\n")
        (dest / "summary.json").write_text(json.dumps({"from": text}))
        return 0
    return analyse


@pytest.fixture
def stand_ins(monkeypatch):
    monkeypatch.setattr(cli, "collect", _engine)
    monkeypatch.setattr(cli, "load_builder", lambda: None)
    return monkeypatch


def _listed(out):
    return sorted(json.loads((out / MANIFEST_JSON).read_text())["files"])


def test_the_result_is_published_with_a_manifest_beside_the_engine_logs(stand_ins, tmp_path):
    stand_ins.setattr(cli, "analyse", _analysis())
    out = tmp_path / "run"
    assert cli.main(["--out", str(out)]) == 0
    assert _listed(out) == ["fit.json", "runs.json", "summary.json", "table.txt"]
    assert all((out / name).is_file() for name in LOGS)          # the engine's files: there, not listed
    assert not any(p.name.startswith(".tierserve") for p in out.iterdir())
    assert cli.main(["--out", str(out), "--reanalyse"]) == 0     # a reanalysis keeps the recorded run
    assert "runs.json" in _listed(out) and json.loads((out / "runs.json").read_text())["seed"] == 1


def test_a_failed_reanalysis_leaves_the_previous_result_whole(stand_ins, tmp_path):
    out = tmp_path / "run"
    stand_ins.setattr(cli, "analyse", _analysis("first"))
    assert cli.main(["--out", str(out)]) == 0
    before = {p: (out / p).read_bytes() for p in _listed(out) + [MANIFEST_JSON]}
    stand_ins.setattr(cli, "analyse", _analysis("second", fail=RuntimeError("analysis failed")))
    with pytest.raises(RuntimeError):
        cli.main(["--out", str(out), "--reanalyse"])
    assert {p: (out / p).read_bytes() for p in before} == before    # not a half-new fit.json beside old tables
    assert not any(p.name.startswith(".tierserve") for p in out.iterdir())


def test_a_new_recording_withdraws_the_previous_result(stand_ins, tmp_path):
    out = tmp_path / "run"
    stand_ins.setattr(cli, "analyse", _analysis("first"))
    assert cli.main(["--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    stand_ins.setattr(cli, "analyse", _analysis("second", fail=KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--out", str(out), "--seed", "2"])
    # the logs now are seed 2's: seed 1's summary, tables and runs.json must not stand beside them
    assert sorted(p.name for p in out.iterdir()) == sorted([*LOGS, "notes.txt"])
    assert (out / "iterations.csv").read_text() == "iterations.csv of seed 2\n"


def test_a_full_disk_is_one_line_naming_the_folder(stand_ins, tmp_path, capsys):
    out = tmp_path / "run"
    stand_ins.setattr(cli, "analyse", _analysis(fail=OSError(errno.ENOSPC, "No space left on device")))
    assert cli.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(out) in err and "no space left on the device (ENOSPC)" in err
    assert not (out / MANIFEST_JSON).exists() and not (out / "fit.json").exists()


def test_a_second_run_on_the_same_out_is_refused(stand_ins, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    stand_ins.setattr(cli, "analyse", _analysis())
    with FolderLock(out):
        assert cli.main(["--out", str(out)]) == 2
    assert f"process {os.getpid()} holds" in capsys.readouterr().err
    assert not (out / "iterations.csv").exists()                   # refused before the engine started


def _alarm(seconds):
    def timeout(signum, frame):
        raise TimeoutError("the write blocked on a FIFO")
    signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)


def test_the_analysis_writers_refuse_a_fifo_and_report_a_full_disk(tmp_path, monkeypatch):
    from tierserve.experiments.sim_to_real.records import write_rows
    from tierserve.experiments.sim_to_real.step_model import write_fit
    rows = [{"step": 0, "prefill_tokens": 8, "decode_count": 1, "prefill_attn_pairs": 0, "decode_context_sum": 8,
             "measured_ms": 2.0}]
    for name in ("fit.json", "rows.csv"):
        os.mkfifo(tmp_path / name)
    _alarm(5)
    try:
        with pytest.raises(ConfigError, match="FIFO"):
            write_fit(np.array([1e-3, 0, 0, 0, 0]), tmp_path / "fit.json", 1, "test", rows)
        with pytest.raises(ConfigError, match="FIFO"):
            write_rows(rows, tmp_path / "rows.csv")
    finally:
        signal.alarm(0)
    assert (tmp_path / "fit.json").is_fifo() and (tmp_path / "rows.csv").is_fifo()

    import tempfile

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(OutputError, match="no space left on the device"):
        write_rows(rows, tmp_path / "other.csv")
