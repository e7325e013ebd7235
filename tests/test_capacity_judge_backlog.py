"""`capacity.judge` gives the backlog verdict on the whole-run path (drop_fraction 0) as on the steady-state
path: the same verdict an overloaded run's growing backlog earns under `steady_run`."""
from __future__ import annotations

from tierserve.experiments.capacity import judge, with_rate
from tierserve.experiments.scenario import ScenarioConfig, run_scenario
from tierserve.metrics.stability import BACKLOG, UNSTABLE


def test_whole_run_judge_carries_the_backlog_verdict_of_the_steady_state_path():
    cfg = ScenarioConfig.from_dict({"cluster": {"num_replicas": 1}, "workload": {"num_requests": 400}})
    result = run_scenario(with_rate(cfg, 60.0))             # far past one replica's capacity: backlog climbs
    whole, steady = judge(result, 60.0, drop_fraction=0.0), judge(result, 60.0)
    assert BACKLOG in whole.stability
    assert whole.stability[BACKLOG] == steady.stability[BACKLOG]
    assert whole.stability[BACKLOG].verdict == UNSTABLE and not whole.stable
