"""Live migration: tokens produced once, KV returned, aborts lose nothing, tier 0 stays, one per instance."""
from __future__ import annotations

from typing import Sequence

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.core import ConfigError, RequestState, Status, request_of
from tierserve.policies.cluster import CLUSTER_POLICIES, ClusterPolicy, InstanceView, Move
from tierserve.sim import ClusterConfig, ReplicaConfig, simulate
from tierserve.sim.migration import MigrationParams


class ChaosMigrator(ClusterPolicy):
    """Round-robin dispatch; every tick each instance sends two decoding requests (tier >= 1) to the next."""

    name = "test_chaos"
    migrates = True
    rebalance_period_s = 0.05

    def setup(self, num_replicas: int, seed: int) -> None:
        self._next = 0

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int:
        self._next = (self._next + 1) % len(instances)
        return self._next

    def rebalance(self, instances: Sequence[InstanceView], now: float) -> list[Move]:
        moves = []
        for v in instances:
            movable = [s for s in v.running if s.tier >= 1 and s.num_generated > 0
                       and s.num_tokens - s.num_computed_tokens == 1]
            for s in movable[:2]:       # the second one must be refused: one migration per instance
                moves.append(Move(s, v.index, (v.index + 1) % len(instances)))
        return moves


@pytest.fixture
def chaos(monkeypatch):
    monkeypatch.setitem(CLUSTER_POLICIES.table, "test_chaos", f"{__name__}:ChaosMigrator")


def run(policy: str, requests, k: int = 3, params: dict | None = None, migration: dict | None = None,
        num_blocks: int = 600):
    cfg = ClusterConfig(num_replicas=4, replica=ReplicaConfig(num_blocks=num_blocks), local_policy="llumlet",
                        cluster_policy=policy, cluster_policy_params=params or {},
                        migration_params=migration or {})
    return simulate(cfg, requests, num_tiers=k, seed=0, predictor=LinearPredictor())


def assert_every_token_once(res) -> None:
    """Every request finished with exactly its output, no KV held, and one TBT gap per later token."""
    gaps = 0
    for s in res.states:
        r = request_of(s)
        assert s.status == Status.FINISHED, (s.id, s.status)
        assert s.num_generated == r.output_tokens
        assert s.num_tokens == r.prompt_tokens + r.output_tokens      # no duplicated progress
        assert s.num_blocks == 0                                        # KV returned
        gaps += r.output_tokens - 1
    assert sum(h.total for h in res.tbt_by_tier) == gaps               # each token emitted once


@pytest.fixture(scope="module")
def loaded():
    return make_requests(1200, rate=60.0, seed=5, num_tiers=3)


def test_migrated_requests_produce_each_token_once_and_return_kv(loaded):
    res = run("llumnix_k", loaded, params={"num_tiers": 3})
    st = res.stats
    assert st["migrations_live_committed"] > 0    # some live (KV-copying) migrations
    assert st["migration_bytes"] > 0 and st["migration_downtime_p99_s"] > 0
    assert_every_token_once(res)


def test_tier0_is_never_migrated(loaded):
    res = run("llumnix_k", loaded, params={"num_tiers": 3})
    moved = [s for s in res.states if s.num_migrations > 0]
    assert moved and all(s.tier >= 1 for s in moved)


def test_live_migrations_commit_under_chaos_and_second_move_is_refused(chaos, loaded):
    res = run("test_chaos", loaded)
    st = res.stats
    assert st["migrations_live_committed"] + st["migrations_queued"] > 50
    assert st["migrations_refused"] > 0                 # one migration per instance at a time
    assert st["migration_downtime_total_s"] > 0
    assert_every_token_once(res)


def test_aborted_migrations_lose_nothing(chaos, loaded):
    # 0.002 GB/s: a block of Llama-3-8B KV (2 MiB) takes ~1 s to copy, so requests finish mid-copy.
    res = run("test_chaos", loaded, migration={"bandwidth_gbytes_s": 0.002})
    st = res.stats
    assert st["migrations_live_aborted"] > 0
    assert st["migrations_live_aborted"] + st["migrations_live_committed"] == st["migrations_live_started"]
    assert_every_token_once(res)


def test_destination_without_room_aborts_cleanly(chaos):
    # Tiny replicas: reservations often fail at the destination; every request must still finish.
    reqs = make_requests(400, rate=40.0, seed=7, num_tiers=3, prompt=(20, 200), output=(20, 200))
    res = run("test_chaos", reqs, num_blocks=60)
    assert res.stats.get("migrations_live_aborted_destination_full", 0) > 0
    assert_every_token_once(res)


def test_bad_migration_params():
    with pytest.raises(ConfigError) as e:
        MigrationParams.from_dict({"bandwidth": 10})
    assert e.value.field == "migration_params.bandwidth"
    with pytest.raises(ConfigError) as e:
        MigrationParams.from_dict({"bandwidth_gbytes_s": 0})
    assert e.value.field == "migration_params.bandwidth_gbytes_s"
