"""benchmarks/sim_identity.py --keep through the output layer (issue 29): each tree's outputs are published
whole with a manifest; a rerun removes nothing under --keep that a run did not write (it used to rmtree
DIR/work); and the base tree's kept outputs are reused only when they were made with the same tree and options
(a kept base from another --only was compared as if it were this run's)."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
STACK = "vllm_v0+round_robin"


def test_keep_publishes_whole_reuses_only_a_matching_base_and_removes_nothing_else(tmp_path, capsys):
    ident = load_script("benchmarks/sim_identity.py", "sim_identity_outputs")
    keep = tmp_path / "keep"
    args = ["--base", str(ROOT), "--work", str(ROOT), "--quick", "--keep", str(keep)]
    assert ident.main(args + ["--only", STACK]) == 0
    listed = json.loads((keep / "work" / "manifest.json").read_text())["files"]
    assert f"{STACK}/summary.json" in listed and "sim_identity.json" in listed
    (keep / "work" / "mine.txt").write_text("not the benchmark's")
    (keep / "work" / "my_folder").mkdir()
    (keep / "work" / "my_folder" / "notes.txt").write_text("mine")
    other = "sarathi+round_robin"
    code = ident.main(args + ["--only", other])       # another stack: the kept base (vllm_v0) must not be reused
    out = capsys.readouterr().out
    assert (keep / "work" / "mine.txt").read_text() == "not the benchmark's"
    assert (keep / "work" / "my_folder" / "notes.txt").read_text() == "mine"
    assert not (keep / "base" / STACK).exists() and (keep / "base" / other).is_dir()
    assert code == 1 and "my_folder: only in work" in out    # an unrelated folder is reported, not deleted
