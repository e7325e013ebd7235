"""`capacity.judge` gives the same work verdict on the whole-run path (drop_fraction 0) as on the steady-state
path, and it reads an overloaded run's piling-up work as unstable."""
from __future__ import annotations

from tierserve.experiments.capacity import judge, with_rate
from tierserve.experiments.scenario import ScenarioConfig, run_scenario
from tierserve.metrics.stability import UNSTABLE, WORK


def test_whole_run_judge_carries_the_work_verdict_of_the_steady_state_path():
    cfg = ScenarioConfig.from_dict({"cluster": {"num_replicas": 1}, "workload": {"num_requests": 400}})
    result = run_scenario(with_rate(cfg, 60.0))             # far past one replica's capacity: work piles up
    whole, steady = judge(result, 60.0, drop_fraction=0.0), judge(result, 60.0)
    assert whole.stability[WORK] == steady.stability[WORK]
    assert whole.stability[WORK].verdict == UNSTABLE and not whole.stable
    assert steady.summary.extras["steady_state"]["dropped"] > 0    # the warm-up found is left out
