"""`tierserve plan --out` through the output layer (issue 29): a rerun replaces the previous plan whole (no old
row scenario beside a new plan.json), manifest.json lists every file with its digest, and a second writer on
the same folder is refused."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from tierserve.core.errors import ConfigError
from tierserve.core.outputs import MANIFEST_JSON, FolderLock
from tierserve.experiments.plan import Fleet, Plan, PlanMix, Probe
from tierserve.experiments.plan_output import write_plan


def _plan(replicas: list[int]) -> Plan:
    mix = PlanMix.from_dict({"name": "t", "rate": 10.0})
    probes = [Probe(Fleet("A100-80GB", 1, "vllm_priority+round_robin", r), 1.5 * r, True, {}, {}, 2, 2)
              for r in replicas]
    return Plan(mix=mix, searches=[], ranked=probes)


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_rerun_replaces_the_plan_whole_with_a_manifest(tmp_path):
    write_plan(_plan([3, 4, 5]), tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    write_plan(_plan([2]), tmp_path)
    rows = [f for f in _files(tmp_path) if f.startswith("rows/")]
    assert rows == ["rows/01_A100-80GB_tp1_vllm_priority__round_robin_r2.yaml"]    # the old rows 02, 03 gone
    listed = json.loads((tmp_path / MANIFEST_JSON).read_text())["files"]
    assert sorted(listed) == ["plan.json", *rows] and (tmp_path / "notes.txt").read_text() == "mine"
    for rel, entry in listed.items():
        assert entry["sha256"] == hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest()
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert [r["scenario"] for r in doc["rows"]] == [str(tmp_path / rows[0])]     # the final path, not a temp


def test_a_second_writer_on_the_same_plan_folder_is_refused(tmp_path):
    with FolderLock(tmp_path):
        with pytest.raises(ConfigError, match=f"process {os.getpid()} holds"):
            write_plan(_plan([2]), tmp_path)
    assert not (tmp_path / "plan.json").exists()
