"""Speed paths of the executor give exactly what the plain paths give.

A decode run cut by an arriving request, or read by a cluster policy (`Replica.used_blocks_now`), records a
checkpoint instead of bringing every request up to date at once; the checkpoints are applied in the run's next
pass (`Replica._apply_pieces`). That must leave every
request, every histogram (bins, counts and sums), the KV block-seconds and the statistics bit-identical to
applying each checkpoint when it happened.
"""
from __future__ import annotations

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.sim import ClusterConfig, simulate
from tierserve.sim.replica import Replica

# Patches Replica methods: a compiled build runs this file in a pure-Python process (tests/test_native.py).
pytestmark = pytest.mark.pure_python


def fingerprint(res):
    states = [(s.id, s.status, s.replica, s.dispatch_s, s.first_token_s, s.finish_s, s.last_token_s, s.num_generated,
               s.num_computed_tokens, s.num_preemptions, s.num_swaps, s.num_migrations, s.tbt_max_s,
               s.attained_tokens, s.service_tokens, s.service_s, s.last_scheduled_s) for s in res.states]
    hists = [(sorted(h.counts.items()), h.total, h.sum) for h in res.tbt_by_tier]
    return states, hists, res.duration_s, dict(res.stats, wall_s=None)


def run(cfg: ClusterConfig, reqs, monkeypatch, allow_defer: bool) -> tuple:
    calls = {"pieces": 0}
    original_truncate, original_pieces = Replica._truncate_run, Replica._apply_pieces

    def truncate(self, now, defer=False):
        return original_truncate(self, now, defer and allow_defer)

    def pieces(self, run_, finished):
        calls["pieces"] += 1
        return original_pieces(self, run_, finished)

    def used_blocks_synced(self):
        self.sync()                 # the plain path: the run applied up to the read, then its blocks counted
        return self.total_blocks - self.free_blocks

    with monkeypatch.context() as m:
        m.setattr(Replica, "_truncate_run", truncate)
        m.setattr(Replica, "_apply_pieces", pieces)
        if not allow_defer:
            m.setattr(Replica, "used_blocks_now", used_blocks_synced)
        res = simulate(cfg, reqs, 3, predictor=LinearPredictor())
    return fingerprint(res), calls["pieces"]


@pytest.mark.parametrize("cfg", [
    ClusterConfig(num_replicas=2, local_policy="vllm", cluster_policy="round_robin"),
    ClusterConfig(num_replicas=2, local_policy="vllm", cluster_policy="jsq", replica={"num_blocks": 500}),
    ClusterConfig(num_replicas=2, local_policy="vllm", local_policy_params={"preempt_mode": "swap"},
                  replica={"num_blocks": 400, "swap_space_gib": 0.01}),
    ClusterConfig(num_replicas=2, local_policy="sarathi", cluster_policy="random"),
    ClusterConfig(num_replicas=4, local_policy="llumlet", cluster_policy="llumnix_k",
                  cluster_policy_params={"num_tiers": 3}, replica={"num_blocks": 400}),
], ids=["vllm-rr", "vllm-jsq-small-kv", "vllm-swap", "sarathi-random", "llumlet-llumnix_k"])
def test_deferred_cuts_equal_immediate_application(cfg, monkeypatch):
    reqs = make_requests(500, rate=40.0, num_tiers=3)
    deferred, multi = run(cfg, reqs, monkeypatch, allow_defer=True)
    immediate, single = run(cfg, reqs, monkeypatch, allow_defer=False)
    assert multi > 0 and single == 0          # the fused multi-checkpoint pass really ran (and only deferred)
    assert deferred == immediate
