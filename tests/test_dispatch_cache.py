"""The per-instance load a dispatch reuses (`InstanceHandle.measure_load`) is never stale: on every read of a
llumnix run with preemptions and live migrations it equals a fresh walk over the instance's queues, and its KV
blocks (counted off a decode run's block-growth schedule, without applying the run) equal what applying the
run up to the read gives."""
from __future__ import annotations

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.policies.cluster.freeness import measure_by_walk, measure_counters
from tierserve.policies.cluster.llumnix_k import LlumnixK, LlumnixKAdaptive
from tierserve.sim import ClusterConfig, simulate

SEEN = {"reads": 0, "reused": 0, "last": {}, "ahead": 0}


def check_loads(instances, loads, num_tiers):
    assert len(loads) == len(instances)
    for v, kept in zip(instances, loads):
        r = v._replica
        if kept.used_blocks != r.total_blocks - r.free_blocks:
            SEEN["ahead"] += 1          # the run's iterations since its last pass added blocks
        r.sync()                        # applies them (the checkpoint the read recorded, same arithmetic)
        assert kept.used_blocks == r.total_blocks - r.free_blocks
        walked, counted = measure_by_walk(v, num_tiers), measure_counters(v, num_tiers)
        assert kept == walked == counted, (kept, walked)
        assert list(kept.tier_counts) == list(walked.tier_counts)   # same order: headroom sums bit-identical
        if SEEN["last"].get(v.index) is kept:
            SEEN["reused"] += 1
        SEEN["last"][v.index] = kept
        SEEN["reads"] += 1


class CheckedK(LlumnixK):
    def loads(self, instances):
        loads = super().loads(instances)
        check_loads(instances, loads, self.num_tiers)
        return loads


class CheckedAdaptive(LlumnixKAdaptive):
    def loads(self, instances):
        loads = super().loads(instances)
        check_loads(instances, loads, self.num_tiers)
        return loads


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setitem(CLUSTER_POLICIES.table, "checked_k", f"{__name__}:CheckedK")
    monkeypatch.setitem(CLUSTER_POLICIES.table, "checked_adaptive", f"{__name__}:CheckedAdaptive")
    SEEN.update(reads=0, reused=0, last={}, ahead=0)


def run(policy: str, mode: str = "recompute", n: int = 600):
    reqs = make_requests(n, rate=70.0, seed=5, num_tiers=3)
    cfg = ClusterConfig(num_replicas=4, local_policy="llumlet",
                        local_policy_params={"preempt_mode": mode, "promote_after_s": 0.5},
                        cluster_policy=policy, cluster_policy_params={"num_tiers": 3},
                        replica={"num_blocks": 300, "swap_space_gib": 0.01})
    return simulate(cfg, reqs, 3, predictor=LinearPredictor())


@pytest.mark.parametrize("policy,mode", [("checked_k", "recompute"), ("checked_k", "swap"),
                                         ("checked_adaptive", "recompute")])
def test_kept_load_equals_a_fresh_walk_on_every_read(checked, policy, mode):
    res = run(policy, mode)
    assert res.stats["preemptions"] > 0 and res.stats["migrations_live_committed"] > 0
    assert SEEN["reads"] > 1000
    # The check saw the cache at work: many reads answered with the load object kept from the previous read.
    assert SEEN["reused"] > SEEN["reads"] // 10
    assert SEEN["ahead"] > 20               # blocks counted off the schedule, not read after a pass


class StaleK(CheckedK):
    """A cache keyed on the queues alone: misses the blocks a decode run allocates as its iterations pass."""

    def loads(self, instances):
        fresh = LlumnixK.loads(self, instances)
        kept = self.__dict__.setdefault("kept", {})
        loads = []
        for v, load in zip(instances, fresh):
            version = v._replica.queues_version
            old = kept.get(v.index)
            if old is not None and old[0] == version and old[1].num_running == load.num_running:
                load = old[1]
            kept[v.index] = (version, load)
            loads.append(load)
        check_loads(instances, loads, self.num_tiers)
        return loads


def test_the_check_catches_a_load_kept_past_a_change(checked, monkeypatch):
    monkeypatch.setitem(CLUSTER_POLICIES.table, "stale_k", f"{__name__}:StaleK")
    with pytest.raises(AssertionError):
        run("stale_k", n=300)
