"""Chunk runs: the Sarathi chunk iterations the executor applies in one pass give exactly what stepping gives.

Under a `repeats_prefill_chunk` policy the executor times the iterations that follow a chunk iteration (the
same decodes, the prefill's next chunk) ahead and applies them to the requests in one pass — at the run's end,
or when something reads or changes the replica first (a cluster policy reading its blocks, a deadline-load
hook). Every request, histogram (bins in insertion order, counts, sums), the KV block-seconds, busy time and
every statistic, the event count included, must be bit-identical to starting each chunk iteration one by one —
and the runs, their cuts and the partial last chunks dropped by an arrival must really have happened.
"""
from __future__ import annotations

import pytest

from conftest import LinearPredictor, make_requests
from tierserve.sim import ClusterConfig, simulate
from tierserve.sim.replica import Replica
from test_sim_deferred_apply import fingerprint

# Patches Replica methods: a compiled build runs this file in a pure-Python process (tests/test_native.py).
pytestmark = pytest.mark.pure_python


def run(reqs, monkeypatch, chunk_runs: bool, **cfg) -> tuple:
    """One sarathi run; without `chunk_runs` each chunk iteration starts on its own (`_continue_chunk` one by
    one, the tree's behaviour before chunk runs). Returns the exact fingerprint and what the runs did."""
    seen = {"final": 0, "cut": 0, "longest": 0, "dropped": 0, "recompute_last_chunk": 0}
    original_catch_up, original_drop = Replica._chunks_catch_up, Replica._chunks_drop_partial

    def catch_up(self, run_, u, final):
        seen["final" if final else "cut"] += u > 0
        seen["longest"] = max(seen["longest"], u)
        p = run_.batch[-1][0]
        seen["recompute_last_chunk"] += (final and p.first_token_s >= 0
                                         and p.num_computed_tokens + sum(run_.chunks) == p.num_tokens)
        return original_catch_up(self, run_, u, final)

    def drop(self):
        before = len(self._chunks.ends)
        original_drop(self)
        seen["dropped"] += len(self._chunks.ends if self._chunks else [0]) < before

    replica_cfg = dict(cfg.pop("replica", {}))
    with monkeypatch.context() as m:
        m.setattr(Replica, "_chunks_catch_up", catch_up)
        m.setattr(Replica, "_chunks_drop_partial", drop)
        if not chunk_runs:
            m.setattr(Replica, "_chunks_start", lambda self, *a: False)
        res = simulate(ClusterConfig(local_policy="sarathi", replica=replica_cfg, **cfg), reqs, 3,
                       predictor=LinearPredictor())
    hist_order = [list(h.counts) for h in res.tbt_by_tier]       # bins in insertion order
    return (fingerprint(res), hist_order), seen


CASES = {
    # long prompts against a 256-token budget: runs of many chunks, decodes finishing inside them
    "light": dict(rate=6.0, cfg=dict(num_replicas=2, cluster_policy="round_robin", replica={"token_budget": 256})),
    # queues and a short KV: partial last chunks dropped by arrivals, the KV bound, evictions around runs
    "pressure": dict(rate=30.0, cfg=dict(num_replicas=2, cluster_policy="round_robin",
                                         replica={"num_blocks": 400, "token_budget": 256})),
    # a tiny KV and long outputs: preempted requests recompute, the last chunk of a recompute emits a gap
    "recompute": dict(rate=6.0, prompt=(20, 1500), output=(1, 600),
                      cfg=dict(num_replicas=2, cluster_policy="round_robin",
                               replica={"num_blocks": 200, "token_budget": 256})),
    # infaas reads every replica's used blocks at each dispatch: runs are caught up mid-flight
    "read_mid_run": dict(rate=10.0, cfg=dict(num_replicas=2, cluster_policy="infaas",
                                             replica={"token_budget": 256})),
    # deadline_slack chains a hook onto on_arrival: arrivals catch the run up too
    "arrival_hook": dict(rate=10.0, cfg=dict(num_replicas=2, cluster_policy="deadline_slack",
                                             replica={"token_budget": 256})),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunk_runs_equal_stepping_each_chunk(case, monkeypatch):
    spec = CASES[case]
    reqs = make_requests(250, rate=spec["rate"], num_tiers=3, prompt=spec.get("prompt", (20, 2500)),
                         output=spec.get("output", (1, 200)))
    with_runs, seen = run(reqs, monkeypatch, True, **spec["cfg"])
    stepped, seen_stepping = run(reqs, monkeypatch, False, **spec["cfg"])
    assert with_runs == stepped
    assert seen_stepping["final"] == seen_stepping["cut"] == 0
    assert seen["longest"] >= 3                             # runs of several chunks were applied in one pass
    if case in ("read_mid_run", "arrival_hook"):
        assert seen["cut"] > 0                              # caught up while an iteration was in flight
    else:
        assert seen["final"] > 0
    if case == "pressure":
        assert seen["dropped"] > 0                          # an arrival dropped a partial last chunk
    if case in ("pressure", "recompute"):
        assert with_runs[0][3]["preemptions"] > 0
    if case == "recompute":
        assert seen["recompute_last_chunk"] > 0            # a run ended on a recompute's last chunk
