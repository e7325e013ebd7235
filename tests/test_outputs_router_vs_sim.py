"""benchmarks/router_vs_sim.py --out through the output layer (issue 29): its result is published whole with a
manifest beside the engines' logs, a second run on the same --out is refused before any engine starts, and a
failed run publishes nothing. The engines and the measurement are stand-ins (no vLLM needed)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import load_script

from tierserve.core.outputs import MANIFEST_JSON, FolderLock


def _script(monkeypatch, tmp_path):
    s2 = load_script("benchmarks/router_vs_sim.py", "router_vs_sim_outputs")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return s2, ["--model", str(model), "--out", str(tmp_path / "out")]


def _measure(fail=None):
    def measure(a, shape, out, stage):
        (Path(out) / "engine0").mkdir(exist_ok=True)
        (Path(out) / "engine0" / "iterations.csv").write_text("log\n")      # the engines' own files
        (Path(stage) / "step_fit.json").write_text("{}")
        if fail:
            raise fail
        (Path(stage) / "router_vs_sim.json").write_text(json.dumps({"1": {}}))
        return 0
    return measure


def test_the_result_is_published_with_a_manifest_beside_the_engine_logs(monkeypatch, tmp_path):
    s2, args = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(s2, "measure", _measure())
    assert s2.main(args) == 0
    out = tmp_path / "out"
    assert sorted(json.loads((out / MANIFEST_JSON).read_text())["files"]) == ["router_vs_sim.json", "step_fit.json"]
    assert (out / "engine0" / "iterations.csv").is_file()


def test_a_failed_run_publishes_nothing_and_a_held_out_is_refused(monkeypatch, tmp_path, capsys):
    s2, args = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(s2, "measure", _measure(fail=RuntimeError("engine died")))
    try:
        s2.main(args)
    except RuntimeError:
        pass
    out = tmp_path / "out"
    assert not (out / "step_fit.json").exists() and not (out / MANIFEST_JSON).exists()

    def engines_started(*a, **k):
        raise AssertionError("an engine started on a folder another run holds")
    monkeypatch.setattr(s2, "measure", engines_started)
    with FolderLock(out):
        assert s2.main(args) == 2
    assert f"process {os.getpid()} holds" in capsys.readouterr().err
