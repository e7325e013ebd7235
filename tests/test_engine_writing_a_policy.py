"""The worked example of docs/writing-a-policy.md: the guide shows the example file as it is, and that policy,
registered by the guide's one line, runs in `tierserve simulate` (keeping its skip-ahead promise under KV
contention) and in the engine driver under vLLM v1's rule."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.policies.local import LOCAL_POLICIES

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "writing-a-policy.md"
EXAMPLE = ROOT / "examples" / "policies" / "tier_short_first.py"
NAME = "tier_short_first"
TIGHT = """name: tight
seed: 3
cluster:
  num_replicas: 1
  replica: {model: Llama-3-8B, gpu: A100-80GB, tp: 1, num_blocks: 300}
  local_policy: tier_short_first
  cluster_policy: round_robin
workload:
  num_requests: 250
  arrivals: {kind: poisson, rate: 3.0}
  lengths: {kind: fit, dataset: azure2023_conv, max_total_tokens: 4096}
  tiers: {num_tiers: 3, mix: enterprise}
"""


def guide_registry_line() -> tuple[str, str]:
    """(name, module:Class) of the registry line the guide tells the reader to add."""
    m = re.search(r'^\s*"(\w+)": "([\w.]+:\w+)",\s*$', GUIDE.read_text(), re.M)
    assert m, "the guide shows no registry line"
    return m.group(1), m.group(2)


@pytest.fixture
def registered(monkeypatch):
    """The guide's registry line, pointing at the example file where it lies (examples/policies)."""
    name, path = guide_registry_line()
    module, cls = path.split(":")
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    monkeypatch.setitem(LOCAL_POLICIES.table, name, f"{module.rsplit('.', 1)[-1]}:{cls}")
    yield name
    sys.modules.pop("tier_short_first", None)


def simulate(*args: str) -> str:
    result = CliRunner().invoke(app, ["simulate", *args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_the_guide_shows_the_example_file_whole_and_its_registry_line():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert EXAMPLE.read_text() in blocks
    name, path = guide_registry_line()
    assert name == NAME and path == "tierserve.policies.local.tier_short_first:TierShortFirstPolicy"
    assert NAME not in LOCAL_POLICIES.table          # an example, not a shipped policy


def test_the_example_runs_in_tierserve_simulate(registered, tmp_path):
    out = simulate("-l", registered, "-n", "200", "-o", str(tmp_path))
    assert f"{registered} + round_robin, 200 requests" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] is True
    assert sum(1 for _ in (tmp_path / "requests.csv").open()) == 201        # header + every request


def test_the_example_keeps_its_skip_ahead_promise_under_kv_contention(registered, tmp_path):
    cfg = tmp_path / "tight.yaml"
    cfg.write_text(TIGHT)
    out = simulate("-c", str(cfg), "-o", str(tmp_path / "ahead"))
    preemptions = int(re.search(r"([\d,]+) preemptions", out).group(1).replace(",", ""))
    assert preemptions > 0                                   # the eviction path ran
    simulate("-c", str(cfg), "--no-skip-ahead", "-o", str(tmp_path / "stepped"))
    assert (tmp_path / "ahead" / "requests.csv").read_bytes() == (tmp_path / "stepped" / "requests.csv").read_bytes()


def test_the_example_runs_in_the_engine_driver_as_planned(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    from test_engine_registry import run_policy
    d, loop = run_policy("tier_short_first:TierShortFirstPolicy")
    stats = d.stats()
    assert stats["policy"] == NAME and stats["finished"] == 30 and loop.planned_evictions > 0
    assert stats["disagreements"] == 0 and stats["engine_preemptions"] == 0, stats
