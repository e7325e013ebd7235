"""The output layer (tierserve.core.files.output_folder / atomic_path): results published whole with a manifest,
reruns that never mix, a lock per folder, only the run's own files cleaned up, non-regular targets refused and
write errors as one line naming the path."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from tierserve.core.errors import ConfigError, OutputError
from tierserve.core.files import (
    MANIFEST_JSON, FolderLock, atomic_path, check_out_file, output_folder, read_manifest, write_text_atomic,
)


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_run_is_published_with_a_manifest_of_every_file_and_its_sha256(tmp_path):
    out = tmp_path / "out"
    with output_folder(out) as stage:
        assert stage.parent == out and stage.name.startswith(".tierserve-stage-")
        (stage / "a.csv").write_text("x\n1\n")
        (stage / "seed0").mkdir()
        (stage / "seed0" / "summary.json").write_text("{}\n")
        assert not (out / "a.csv").exists()          # nothing under the final names until the run ends
    doc = read_manifest(out)
    assert doc["complete"] is True and sorted(doc["files"]) == ["a.csv", "seed0/summary.json"]
    for rel, entry in doc["files"].items():
        data = (out / rel).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert _tree(out) == ["a.csv", MANIFEST_JSON, "seed0/summary.json"]       # no lock, no staging folder left


def test_a_rerun_replaces_the_previous_result_whole_and_leaves_unrelated_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with output_folder(out) as stage:
        for s in range(3):
            write_text_atomic(stage / f"seed{s}" / "summary.json", f"old {s}\n")
        write_text_atomic(stage / "seeds.json", "old\n")
    with output_folder(out) as stage:
        for s in range(2):
            write_text_atomic(stage / f"seed{s}" / "summary.json", f"new {s}\n")
        write_text_atomic(stage / "seeds.json", "new\n")
    assert _tree(out) == [MANIFEST_JSON, "notes.txt", "seed0/summary.json", "seed1/summary.json", "seeds.json"]
    assert (out / "seeds.json").read_text() == "new\n" and (out / "notes.txt").read_text() == "mine"


def test_an_interrupted_run_removes_only_its_own_files(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    theirs = [out / "x.partial", out / "sub" / "y.partial", out / ".hidden.partial"]
    for p in theirs:
        p.write_text("not tierserve's")
    with pytest.raises(KeyboardInterrupt):
        with output_folder(out) as stage:
            (stage / "requests.csv").write_text("half")
            with atomic_path(stage / "summary.json") as tmp:
                tmp.write_text("{")
                raise KeyboardInterrupt
    assert _tree(out) == [".hidden.partial", "sub/y.partial", "x.partial"]


def test_a_staging_folder_left_by_a_killed_run_is_removed_by_the_next_run(tmp_path):
    out = tmp_path / "out"
    stale = out / ".tierserve-stage-killed"
    stale.mkdir(parents=True)
    (stale / "requests.csv").write_text("half")
    with output_folder(out) as stage:
        (stage / "a.txt").write_text("a")
    assert _tree(out) == ["a.txt", MANIFEST_JSON]


def test_a_second_run_on_the_same_folder_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with FolderLock(out):
        with pytest.raises(ConfigError, match=f"process {os.getpid()} holds"):
            with output_folder(out):
                pass
    with output_folder(out):            # released: the next run goes ahead
        pass


def test_simulate_refuses_an_out_folder_another_run_holds(tmp_path, capsys, monkeypatch):
    from tierserve.cli import main
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(sys, "argv", ["tierserve", "simulate", "-n", "50", "--replicas", "1", "--rate", "5",
                                      "--out", str(out)])
    with FolderLock(out), pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "holds" in err and "Traceback" not in err
    assert not (out / "summary.json").exists()


def test_a_foreign_manifest_is_left_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST_JSON).write_text('{"files": ["/etc/passwd"]}')
    with pytest.raises(ConfigError, match="manifest.json is tierserve's"):
        with output_folder(out):
            pass
    (out / MANIFEST_JSON).write_text('{"written_by": "tierserve", "complete": true, "files": {"../x": {}}}')
    with pytest.raises(ConfigError, match="inside its folder"):
        with output_folder(out):
            pass


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
def test_device_nodes_and_fifos_are_never_replaced(tmp_path):
    with pytest.raises(ConfigError, match="device node"):
        check_out_file("/dev/null")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        check_out_file(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        write_text_atomic(fifo, "x")
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "summary.json")
    with pytest.raises(ConfigError, match="FIFO"):
        with output_folder(out) as stage:
            (stage / "summary.json").write_text("{}")
    assert (out / "summary.json").is_fifo()


def test_an_over_long_file_name_is_one_line_naming_it(tmp_path):
    long_name = tmp_path / ("x" * 300 + ".json")
    with pytest.raises(ConfigError, match="at most 255 bytes"):
        check_out_file(long_name)


def test_a_full_disk_is_one_error_naming_the_path(tmp_path, monkeypatch):
    from tierserve.metrics import io
    from tierserve.metrics.records import RequestTable

    def full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RequestTable, "to_csv", full)
    out = tmp_path / "out"
    with pytest.raises(OutputError) as e:
        io.write_outputs(out, RequestTable.__new__(RequestTable), None, None)   # type: ignore[arg-type]
    assert str(e.value).startswith(str(out)) and "no space left on the device (ENOSPC)" in str(e.value)
    assert _tree(out) == []


def test_simulate_rerun_with_fewer_seeds_leaves_no_old_seed_folder(tmp_path, monkeypatch):
    from tierserve.cli import main
    out = tmp_path / "out"
    base = ["tierserve", "simulate", "-n", "60", "--replicas", "1", "--rate", "5", "--executor", "serial",
            "--out", str(out)]
    for n in ("3", "2"):
        monkeypatch.setattr(sys, "argv", base + ["--seeds", n])
        with pytest.raises(SystemExit) as e:
            main()
        assert e.value.code in (0, None)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_JSON, "seed0", "seed1", "seeds.json"]
    listed = json.loads((out / MANIFEST_JSON).read_text())["files"]
    assert "seed0/requests.csv" in listed and not any(k.startswith("seed2") for k in listed)
