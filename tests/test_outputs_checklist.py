"""Issue 29's output items that had no test of their own: calibrate --out never replaces a FIFO or device
node; a reproduction is published whole with a manifest and an interrupted rerun leaves the previous result;
a killed single-file write leaves no hidden temporary file that the next write of that file does not remove."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.core.outputs import MANIFEST_JSON, _temp_prefix, write_text_atomic

runner = CliRunner()


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "log.csv"
    log.write_text("prefill_tokens,decode_count,prefill_context,decode_context_sum,measured_ms\n" +
                   "".join(f"{p},1,0,100,{5 + p / 100}\n" for p in range(0, 600, 50)))
    return log


def test_calibrate_never_replaces_a_fifo_or_a_device_node(tmp_path):
    fifo = tmp_path / "fit.json"
    os.mkfifo(fifo)
    for out in (str(fifo), "/dev/null"):
        result = runner.invoke(app, ["calibrate", "--iterations", str(_log(tmp_path)), "--out", out])
        assert result.exit_code == 2 and "--out" in result.output and out in result.output, result.output
        assert "FIFO" in result.output or "device node" in result.output
    assert fifo.is_fifo() and Path("/dev/null").is_char_device()


def _fake_study(files: dict[str, str], then: BaseException | None = None):
    def run_study(study, out, **kw):
        for name, text in files.items():
            (Path(out) / name).write_text(text)
            if then is not None:
                raise then                # killed after its first file
        return {"markdown": files.get("ktier_report.md", ""), "plots": []}
    return run_study


def test_a_reproduction_is_published_whole_and_an_interrupted_rerun_keeps_the_previous(tmp_path, monkeypatch):
    import tierserve.experiments.ktier_report as ktier_report
    out = tmp_path / "ktier"
    first = {"ktier_capacity.csv": "old csv\n", "ktier_report.md": "old report\n"}
    monkeypatch.setattr(ktier_report, "run_study", _fake_study(first))
    assert runner.invoke(app, ["reproduce", "ktier", "--quick", "--out", str(out)]).exit_code == 0
    manifest = json.loads((out / MANIFEST_JSON).read_text())
    assert manifest["complete"] and sorted(manifest["files"]) == sorted(first)
    monkeypatch.setattr(ktier_report, "run_study", _fake_study({"ktier_capacity.csv": "new csv\n",
                                                                 "ktier_report.md": "new report\n"},
                                                                then=KeyboardInterrupt()))
    result = runner.invoke(app, ["reproduce", "ktier", "--quick", "--out", str(out)])
    assert result.exit_code == 130
    assert {n: (out / n).read_text() for n in first} == first        # no new CSV beside the old report
    assert json.loads((out / MANIFEST_JSON).read_text()) == manifest
    assert sorted(p.name for p in out.iterdir()) == sorted([*first, MANIFEST_JSON])


def test_a_killed_single_file_write_leaves_nothing_the_next_write_keeps(tmp_path):
    target = tmp_path / "fit.json"
    code = ("import os, sys\nfrom pathlib import Path\nfrom tierserve.core.outputs import atomic_path\n"
            "with atomic_path(Path(sys.argv[1])) as tmp:\n    tmp.write_text('half')\n    os.kill(os.getpid(), 9)\n")
    killed = subprocess.run([sys.executable, "-c", code, str(target)], env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert killed.returncode == -9
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".tierserve-")       # what SIGKILL leaves
    live = tmp_path / (_temp_prefix(target) + "x.partial")            # a live writer's (this process): kept
    live.write_text("mine")
    (tmp_path / "other.partial").write_text("not ours")               # not our name: kept
    write_text_atomic(target, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["fit.json", live.name, "other.partial"])


def test_calibrate_on_a_full_disk_is_one_line_and_keeps_the_previous_fit(tmp_path, monkeypatch):
    import errno
    import pathlib
    out = tmp_path / "fit.json"
    out.write_text('{"previous": true}')
    log = _log(tmp_path)
    real_write_text = pathlib.Path.write_text

    def half_then_full(self, data, *args, **kwargs):
        real_write_text(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device", str(self))
    monkeypatch.setattr(pathlib.Path, "write_text", half_then_full)
    result = runner.invoke(app, ["calibrate", "--iterations", str(log), "--out", str(out)])
    monkeypatch.undo()
    text = "".join(result.output.splitlines())          # one message (the console wraps it at 80 columns)
    assert result.exit_code == 2 and result.output.count("error:") == 1 and "Traceback" not in result.output
    assert text.startswith(f"error: {out}: ") and "no space left on the device (ENOSPC)" in text
    assert out.read_text() == '{"previous": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.json", "log.csv"]
