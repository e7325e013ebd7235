"""The compiled hot path (tierserve/_native.py): when it is used, and that it changes no result.

A compiled build runs the same .py sources through mypyc; these tests check the choice made at import (compiled
only when every source matches its build record), that a compiled run's outputs equal the pure-Python run's
byte for byte, and they run the tests that patch compiled classes in a pure-Python process.
"""
from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tierserve import _native

REPO = Path(__file__).resolve().parent.parent
needs_native = pytest.mark.skipif(not _native.NATIVE_IN_USE, reason=f"compiled hot path not in use: {_native.REASON}")


def fake_tree(root: Path, with_extensions: bool = True, record: bool = True) -> Path:
    """The compiled sources (one line each), extension files beside them, and a build record."""
    for i, src in enumerate(_native.COMPILED_SOURCES):
        path = root / src
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {i}\n")
        if with_extensions:
            path.with_name(path.stem + importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"")
    if record:
        (root / _native.BUILD_RECORD).write_text(json.dumps(_native.build_record(root)))
    return root


def test_compiled_only_when_every_source_matches_its_record(tmp_path):
    root = fake_tree(tmp_path)
    assert _native.decide(root, {}) == (True, "compiled (mypyc)")
    edited = root / _native.COMPILED_SOURCES[-1]
    edited.write_text(edited.read_text() + "# edited\n")
    native, reason = _native.decide(root, {})
    assert not native and _native.COMPILED_SOURCES[-1] in reason and "changed since" in reason


def test_environment_variable_forces_pure_python(tmp_path):
    root = fake_tree(tmp_path)
    assert _native.decide(root, {_native.PURE_ENV: "1"})[0] is False
    assert _native.decide(root, {_native.PURE_ENV: "0"})[0] is True


@pytest.mark.parametrize("case", ["no extensions", "one extension missing", "no record", "unreadable record"])
def test_incomplete_builds_run_pure_python(tmp_path, case):
    root = fake_tree(tmp_path, with_extensions=case != "no extensions", record=case != "no record")
    if case == "one extension missing":
        src = root / _native.COMPILED_SOURCES[0]
        src.with_name(src.stem + importlib.machinery.EXTENSION_SUFFIXES[0]).unlink()
    if case == "unreadable record":
        (root / _native.BUILD_RECORD).write_text("{not json")
    native, reason = _native.decide(root, {})
    assert not native
    expected = {"no extensions": "not compiled", "one extension missing": "incomplete",
                "no record": "no readable build record", "unreadable record": "no readable build record"}[case]
    assert expected in reason


def _imported_file(env_pure: bool) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(_native.PURE_ENV, None)
    if env_pure:
        env[_native.PURE_ENV] = "1"
    code = "import tierserve.sim.replica as r, tierserve.core.request as q; print(r.__file__); print(q.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout


@needs_native
def test_sources_load_when_pure_python_is_asked_for():
    assert all(line.endswith(".py") for line in _imported_file(True).split())
    assert not any(line.endswith(".py") for line in _imported_file(False).split())


def test_ci_runs_the_compiled_build():
    """CI installs with `pip install -e .`, which compiles: a build that silently fell back would be slow."""
    if os.environ.get("CI", "").lower() not in ("1", "true"):
        pytest.skip("outside CI the compiled build is optional (TIERSERVE_PURE_PYTHON=1 or a failed build)")
    assert _native.NATIVE_IN_USE, _native.REASON


@needs_native
def test_compiled_outputs_equal_pure_python_outputs():
    """Every stack of benchmarks/sim_identity.py (every local policy, the migration and deadline-slack stacks,
    swap, Vidur parity, stepping, a time limit, a streamed run), compiled vs pure Python: every output file byte
    for byte."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sim_identity.py"), "--native-vs-pure",
                           "--quick", "--fit-lengths", "--work", str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL: " in proc.stdout and "pure Python vs compiled" in proc.stdout


@needs_native
def test_tests_that_patch_compiled_classes_pass_in_pure_python():
    env = dict(os.environ, **{_native.PURE_ENV: "1"})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "pure_python",
                           str(REPO / "tests")], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout


def test_requests_and_their_state_pickle_compiled_or_not():
    """Process pools and Ray pickle them; a compiled frozen class would otherwise fail to unpickle."""
    import copy
    import pickle

    from tierserve.core.histogram import LogHistogram
    from tierserve.core.request import Request, RequestState
    from tierserve.core.slo import SLO
    req = Request(7, 1.25, 300, 40, tier=2, slo=SLO(ttft_s=1.0), app="chat")
    state = RequestState(req)
    state.num_generated, state.policy_data["k"] = 5, [1, 2]
    hist = LogHistogram()
    hist.add(0.02)
    for obj in (req, state, hist):
        back = pickle.loads(pickle.dumps(obj))
        assert type(back) is type(obj)
    back_state = pickle.loads(pickle.dumps(state))
    assert back_state._request == req and back_state.num_generated == 5 and back_state.policy_data == {"k": [1, 2]}
    assert pickle.loads(pickle.dumps(hist)).total == 1 and copy.deepcopy(state).id == 7
