"""A reproduction's --doc (issue 29): the results document goes through the output layer. A FIFO or device is
refused before the study runs (not read, not replaced, no hang after hours of work); the document is replaced
by a rename, so a full disk leaves the previous document whole and says so in one line naming the path."""
from __future__ import annotations

import errno
import os
import pathlib
import signal

import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.core.errors import ConfigError, OutputError
from tierserve.experiments.results_doc import read_section, write_section


@pytest.fixture
def alarm():
    def timeout(signum, frame):
        raise TimeoutError("blocked on a FIFO")
    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_a_fifo_document_is_refused_not_read_or_replaced(tmp_path, alarm):
    fifo = tmp_path / "results.md"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO") as e:
        write_section(fifo, "ktier quick", "| a |\n")
    assert str(fifo) in str(e.value) and fifo.is_fifo()


def test_a_full_disk_leaves_the_previous_document_whole(tmp_path, monkeypatch):
    doc = tmp_path / "results.md"
    write_section(doc, "ktier quick", "old table\n", "K-tier")
    before = doc.read_bytes()
    real_write_text = pathlib.Path.write_text

    def half_then_full(self, data, *args, **kwargs):       # the disk fills half-way through the document
        real_write_text(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device", str(self))
    monkeypatch.setattr(pathlib.Path, "write_text", half_then_full)
    with pytest.raises(OutputError) as e:
        write_section(doc, "ktier quick", "new table\n" * 50)
    monkeypatch.undo()
    assert "\n" not in str(e.value) and str(doc) in str(e.value) and "ENOSPC" in str(e.value)
    assert doc.read_bytes() == before and read_section(doc, "ktier quick") == "old table\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md"]     # no temporary file left


@pytest.mark.parametrize("command", ["ktier", "uniboost", "niyama", "contract"])
def test_a_reproduction_refuses_a_fifo_doc_before_its_study_runs(command, tmp_path, monkeypatch, alarm):
    import importlib
    module = {"contract": "tierserve.experiments.contract"}.get(command, f"tierserve.experiments.{command}_report")

    def study_ran(*a, **k):
        raise AssertionError("the study ran although its --doc cannot be written")
    monkeypatch.setattr(importlib.import_module(module), "run_study", study_ran)
    fifo = tmp_path / "doc.md"
    os.mkfifo(fifo)
    result = CliRunner().invoke(app, ["reproduce", command, "--quick", "--out", str(tmp_path / "out"),
                                      "--doc", str(fifo)])
    assert isinstance(result.exception, ConfigError), result.exception
    assert str(result.exception).startswith(f"--doc: got '{fifo}'") and "FIFO" in str(result.exception)
    assert fifo.is_fifo()
