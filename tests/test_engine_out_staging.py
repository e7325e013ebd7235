"""Issue 29: the engine driver's whole `--out` (results.json, iterations.csv, decisions.jsonl, vLLM's tmp/) goes
through the output layer: published whole with manifest.json when the run ends; a SIGTERM'd or SIGKILL'd run
leaves nothing that looks complete; files in --out the run did not write (an unrelated `*.partial` among them)
survive; a rerun replaces the previous run's files whole.

`python -m tierserve.engines.vllm.run` runs here against a stand-in `vllm` package (written below, first on
the child's PYTHONPATH): an engine that opens the log files it is configured with, writes vLLM-like temporary
files under TMPDIR, and finishes one request per step, or stops mid-run until killed (FAKE_VLLM_HANG)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_VLLM = '''
import os, time
from types import SimpleNamespace


class SamplingParams:
    def __init__(self, max_tokens, **kwargs):
        self.max_tokens = max_tokens


class _Engine:
    def __init__(self, kwargs):
        ts = (kwargs.get("additional_config") or {}).get("tierserve", {})
        self.logs = [open(p, "w") for p in (ts.get("iteration_log"), ts.get("decision_log")) if p]
        import tempfile
        tmp = os.environ["TMPDIR"]
        assert tempfile.gettempdir() == tmp, (tempfile.gettempdir(), tmp)
        open(os.path.join(tmp, "engine-ipc.sock"), "w").close()        # what vLLM leaves under TMPDIR
        with open(os.environ["FAKE_VLLM_NOTE"], "w") as f:               # where, for the test to look after
            f.write(tmp)
        self.pending = {}
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False))
        self.engine_core = SimpleNamespace(engine_core=SimpleNamespace(scheduler=object()), shutdown=self.shutdown)

    def add_request(self, rid, prompt, params, priority=0):
        self.pending[rid] = params.max_tokens

    def has_unfinished_requests(self):
        return bool(self.pending)

    def step(self):
        for f in self.logs:
            f.write("a step\\n")
            f.flush()
        hang = os.environ.get("FAKE_VLLM_HANG")
        if hang:
            open(hang, "w").close()                 # the run is mid-way: the test may kill it now
            time.sleep(300)
        rid, n = self.pending.popitem()
        out = SimpleNamespace(token_ids=list(range(n)), finish_reason="length")
        return [SimpleNamespace(request_id=rid, outputs=[out], finished=True)]

    def shutdown(self):
        for f in self.logs:
            f.close()


class LLM:
    def __init__(self, **kwargs):
        self.llm_engine = _Engine(kwargs)
'''
PUBLISHED = ("results.json", "iterations.csv", "decisions.jsonl")


@pytest.fixture
def fake_vllm(tmp_path):
    pkg = tmp_path / "fake" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    return pkg.parent


def start(fake: Path, out: Path, *args: str, hang: Path | None = None) -> subprocess.Popen:
    reqs = out.parent / "reqs.json"
    reqs.write_text(json.dumps([{"prompt_tokens": 8, "output_tokens": 3, "tier": t} for t in (0, 1, 2)]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(ROOT)]))
    env.pop("FAKE_VLLM_HANG", None)
    env["FAKE_VLLM_NOTE"] = str(out.parent / "tmpdir-used")
    if hang is not None:
        env["FAKE_VLLM_HANG"] = str(hang)
    return subprocess.Popen([sys.executable, "-m", "tierserve.engines.vllm.run", "--model", "none", "--requests",
                             str(reqs), "--out", str(out), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stdout + stderr


def unrelated(out: Path) -> dict[str, bytes]:
    """Files in --out before the run that it did not write: they must survive every outcome."""
    out.mkdir(parents=True, exist_ok=True)
    files = {"notes.txt": b"mine\n", "draft.partial": b"half of something else\n",
             "sub/other.partial": b"another run's\n"}
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


def assert_untouched(out: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (out / name).read_bytes() == data, name


def kill_mid_run(fake: Path, out: Path, sig: signal.Signals) -> tuple[int, str]:
    marker = out.parent / "mid-run"
    proc = start(fake, out, hang=marker)
    deadline = time.time() + 60
    while not marker.exists():
        assert proc.poll() is None, finish(proc)[1]
        assert time.time() < deadline, "the engine run never got under way"
        time.sleep(0.05)
    proc.send_signal(sig)
    return finish(proc)


def test_a_finished_engine_run_publishes_its_whole_out_with_a_manifest(fake_vllm, tmp_path):
    out = tmp_path / "out"
    mine = unrelated(out)
    rc, text = finish(start(fake_vllm, out))
    assert rc == 0, text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and sorted(manifest["files"]) == sorted(PUBLISHED)
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest(), name
    assert len(json.loads((out / "results.json").read_text())["requests"]) == 3
    assert (out / "iterations.csv").read_text().count("a step") == 3     # closed by the engine before publishing
    assert not (out / "tmp").exists()                                    # vLLM's temporary files are not results
    used = Path((tmp_path / "tmpdir-used").read_text())
    assert not used.exists() and out not in used.parents                 # a private folder, removed at the end
    assert len(str(used / "0123456789abcdef0123456789abcdef01234567")) < 108   # a socket path there fits
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tierserve")]
    assert_untouched(out, mine)


def test_a_terminated_engine_run_publishes_nothing_and_removes_only_its_own_files(fake_vllm, tmp_path):
    out = tmp_path / "out"
    mine = unrelated(out)
    rc, text = kill_mid_run(fake_vllm, out, signal.SIGTERM)
    assert rc == 143 and "nothing was published" in text, text
    assert not Path((tmp_path / "tmpdir-used").read_text()).exists()
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(mine)
    assert_untouched(out, mine)


def test_a_killed_engine_run_leaves_nothing_that_looks_complete_and_a_rerun_cleans_up(fake_vllm, tmp_path):
    out = tmp_path / "out"
    mine = unrelated(out)
    rc, _ = kill_mid_run(fake_vllm, out, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    for name in (*PUBLISHED, "manifest.json", "tmp"):
        assert not (out / name).exists(), f"a killed run left {name} under its final name"
    assert_untouched(out, mine)
    rc, text = finish(start(fake_vllm, out))              # the next run on the folder: the killed one's stage goes
    assert rc == 0, text
    assert sorted(json.loads((out / "manifest.json").read_text())["files"]) == sorted(PUBLISHED)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tierserve")]
    assert_untouched(out, mine)


def test_a_rerun_replaces_the_previous_runs_files_whole(fake_vllm, tmp_path):
    out = tmp_path / "out"
    rc, text = finish(start(fake_vllm, out))
    assert rc == 0 and (out / "decisions.jsonl").exists(), text
    rc, text = finish(start(fake_vllm, out, "--logs", "none"))
    assert rc == 0, text
    # no decision or iteration log of the first run beside the second run's results
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "results.json"]
