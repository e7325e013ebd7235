"""Sweeps give the same results, in job order, on every executor."""
from __future__ import annotations

import json

import pytest

from tierserve.core import ConfigError
from tierserve.experiments.sweep import run_many

# json.dumps is importable in any worker (a test module is not, on Ray) and takes its argument by keyword.
JOBS = [{"obj": [i, i * i]} for i in range(6)]
EXPECTED = [json.dumps([i, i * i]) for i in range(6)]


@pytest.mark.parametrize("executor", ["serial", "process"])
def test_run_many_keeps_job_order(executor):
    assert run_many(json.dumps, JOBS, executor=executor, workers=2, progress=False) == EXPECTED


def test_run_many_on_local_ray():
    pytest.importorskip("ray", reason="ray not installed (pip install 'tierserve[ray]')")
    assert run_many(json.dumps, JOBS, executor="ray", progress=False) == EXPECTED


def test_unknown_executor_is_named():
    with pytest.raises(ConfigError, match="executor"):
        run_many(json.dumps, JOBS, executor="slurm")
