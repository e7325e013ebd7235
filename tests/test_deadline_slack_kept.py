"""`deadline_slack`'s kept running part (`DeadlineLoad`: decodes, context and running partial prefills reused
while the replica's stamps are unchanged, advanced in O(1) over a decode run) and its kept iteration prices:
on every read of runs under each local policy (decode runs, chunk runs, relegation, preemption, swaps) the load
equals the O(queue) walk of the definition, and every dispatch equals the reference argmax."""
from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import LinearPredictor, make_requests
from test_deadline_slack_load import FAST, reference_deadline_load, reference_dispatch
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.policies.cluster.deadline_slack import DeadlineSlackDispatch
from tierserve.policies.local.deadlines import prefill_deadline
from tierserve.sim import ClusterConfig, simulate

SEEN = {"reads": 0, "dispatches": 0, "ties": 0, "skip_advance": False}


class CheckedSlack(DeadlineSlackDispatch):
    """Checks every instance's kept load, then the decision, against the walks of the definition."""

    def dispatch(self, state, instances, now):
        deadline = prefill_deadline(state)
        for inst in instances:
            if SEEN["skip_advance"]:            # sabotage: pretend the load already saw its run's progress
                inst._replica.sync()
                run = inst._replica._run
                if run is not None:
                    inst._deadline_load._run_done = run.done
            assert inst.deadline_load(deadline) == reference_deadline_load(inst, deadline)
            SEEN["reads"] += 1
            if "loads" in SEEN:
                SEEN["loads"][inst.index] = inst._deadline_load
        choice = super().dispatch(state, instances, now)
        assert choice == reference_dispatch(self, state, instances, now)
        SEEN["dispatches"] += 1
        return choice


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setitem(CLUSTER_POLICIES.table, "checked_slack", f"{__name__}:CheckedSlack")
    SEEN.update(reads=0, dispatches=0, skip_advance=False)


def _requests(n, rate, seed):
    return [replace(r, slo=FAST[r.tier]) for r in make_requests(n, rate=rate, seed=seed, num_tiers=3,
                                                                    prompt=(20, 900), output=(1, 300))]


def _run(local, params=None, blocks=600, n=500, rate=60.0):
    cfg = ClusterConfig(num_replicas=4, local_policy=local, local_policy_params=params or {},
                        cluster_policy="checked_slack", replica={"num_blocks": blocks, "block_size": 16})
    return simulate(cfg, _requests(n, rate, seed=13), 3, predictor=LinearPredictor())


@pytest.mark.parametrize("local,params", [("vllm", {}), ("vllm", {"preempt_mode": "swap"}), ("sarathi", {}),
                                          ("vllm_v0", {}), ("niyama", {})])
def test_kept_load_equals_the_walk_on_every_read(checked, local, params):
    res = _run(local, params, blocks=300)
    assert SEEN["dispatches"] == len(res.states) - len(res.reasons) and SEEN["reads"] == 4 * SEEN["dispatches"]
    assert sum(s.num_preemptions for s in res.states) > 0                   # requests left running for a queue
    if local == "niyama":
        assert sum(s.relegated for s in res.states) > 0


def test_the_kept_part_is_reused_and_advanced_over_decode_runs(checked):
    """The cache is exercised: most reads walk nothing, and some add a decode run's progress in O(1)."""
    SEEN["loads"] = {}
    _run("vllm", n=400, rate=30.0)
    made = list(SEEN.pop("loads").values())
    walks = sum(d.walks for d in made)
    advances = sum(d.advances for d in made)
    assert len(made) == 4 and SEEN["reads"] > 1000
    loads = 2 * SEEN["reads"]                   # the check's read and the policy's
    assert walks < 0.4 * loads and advances > 50


def test_the_check_catches_a_load_that_misses_its_runs_progress(checked):
    SEEN["skip_advance"] = True
    with pytest.raises(AssertionError):
        _run("vllm", n=400, rate=30.0)
