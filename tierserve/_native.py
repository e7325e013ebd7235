"""The compiled event loop: which modules an install compiles, and whether this process uses them.

The simulator's hot path (the request state, the histogram, the event core, the replica executor, the cluster
driver, the Llumnix freeness loops, deadline-slack dispatch, Niyama's plan and the execution-time model's
per-iteration part) is compiled with mypyc from these same .py files when tierserve is installed (`setup.py`);
the .py files stay the only implementation — there is no second copy. Why: at 50k requests the event loop is ~80% of a run, and CPython's attribute access and calls are
most of it; compiled, the loop took 3.0–3.4× less CPU in this session's measurements, with byte-identical outputs
(benchmarks/sim_speed.py, tests/test_native.py), which session after session of pure-Python work could not reach
(issue 11's ≥ 50× Vidur).

A build records each compiled source's SHA-256 in `_native_build.json`. At import, the compiled modules are
used only when every source still matches its record; otherwise (a source edited since the build, no record,
or `TIERSERVE_PURE_PYTHON=1` in the environment) every one of them loads from its .py file. All or none:
compiled modules expect each other's native classes. This module imports nothing from tierserve, so
`setup.py` can read the list from it.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

COMPILED_SOURCES: tuple[str, ...] = (        # relative to the repository root; compiled together, in one group
    "tierserve/core/request.py",
    "tierserve/core/histogram.py",
    "tierserve/sim/events.py",
    "tierserve/sim/queue_events.py",
    "tierserve/sim/step_time.py",        # the replica executor's rooms, bottom of the chain first
    "tierserve/sim/runs.py",
    "tierserve/sim/replica_state.py",
    "tierserve/sim/preemption.py",
    "tierserve/sim/decode_runs.py",
    "tierserve/sim/chunk_runs.py",
    "tierserve/sim/iteration.py",
    "tierserve/sim/steady.py",
    "tierserve/sim/migration_endpoints.py",
    "tierserve/sim/replica.py",
    "tierserve/sim/cluster.py",
    "tierserve/policies/cluster/freeness.py",
    "tierserve/sim/deadline_load.py",
    "tierserve/policies/cluster/slack_argmax.py",
    "tierserve/policies/local/deadlines.py",
    "tierserve/policies/local/prioqueue.py",
    "tierserve/policies/local/niyama_core.py",
    "tierserve/hardware/exec_runtime.py",
)
BUILD_RECORD = "tierserve/_native_build.json"
PURE_ENV = "TIERSERVE_PURE_PYTHON"
ROOT = Path(__file__).resolve().parent.parent

# What this process decided (set once, by `install`): True = compiled modules in use.
NATIVE_IN_USE = False
REASON = "not decided"


def module_name(source: str) -> str:
    return source[:-3].replace("/", ".")


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_record(root: Path = ROOT) -> dict[str, str]:
    """{source: SHA-256} of the sources as they are now: what `setup.py` writes when it compiles them."""
    return {src: source_digest(root / src) for src in COMPILED_SOURCES}


def _compiled_file(root: Path, source: str) -> Path | None:
    stem = root / source[:-3]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = stem.with_name(stem.name + suffix)
        if candidate.exists():
            return candidate
    return None


def decide(root: Path = ROOT, environ: os._Environ | dict = os.environ) -> tuple[bool, str]:
    """(use the compiled modules?, why) for the tree at `root`."""
    built = [src for src in COMPILED_SOURCES if _compiled_file(root, src) is not None]
    if not built:
        return False, "not compiled (pure Python)"
    if environ.get(PURE_ENV, "") not in ("", "0"):
        return False, f"{PURE_ENV}={environ[PURE_ENV]}: pure Python"
    if len(built) != len(COMPILED_SOURCES):
        missing = sorted(set(COMPILED_SOURCES) - set(built))
        return False, f"compiled build incomplete (no extension for {', '.join(missing)}): pure Python"
    record_path = root / BUILD_RECORD
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return False, f"no readable build record {record_path}: pure Python"
    for src in COMPILED_SOURCES:
        if record.get(src) != source_digest(root / src):
            return False, f"{src} changed since it was compiled (rebuild: pip install -e .): pure Python"
    return True, "compiled (mypyc)"


class _SourceFinder:
    """Finds the compiled modules' .py files, so that the extension beside each is not loaded."""

    def __init__(self, root: Path) -> None:
        self.paths = {module_name(src): root / src for src in COMPILED_SOURCES}

    def find_spec(self, name: str, path: object = None, target: object = None):
        source = self.paths.get(name)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(name, source)


def install() -> None:
    """Decide once per process; when not compiled in use, route the compiled modules to their sources."""
    global NATIVE_IN_USE, REASON
    if REASON != "not decided":
        return
    NATIVE_IN_USE, REASON = decide()
    if NATIVE_IN_USE:
        return
    sys.meta_path.insert(0, _SourceFinder(ROOT))
    if "changed since" in REASON or "incomplete" in REASON or "build record" in REASON:
        warnings.warn(f"tierserve: {REASON}", RuntimeWarning, stacklevel=2)
