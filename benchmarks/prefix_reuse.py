"""Prefix reuse bound: the fraction of prompt blocks (and tokens) an unlimited cache could hit, requests taken in
arrival order, for the Mooncake conversation trace (512-token hash blocks, from its `hash_ids`) and for the
multi-turn session generator at its default parameters (16-token blocks; 32, vLLM-CPU's, as a sensitivity row),
3 seeds. No simulation: this is the ceiling any simulated or real hit rate must stay under (issue 28).

    PYTHONPATH=. python benchmarks/prefix_reuse.py [--requests 2000] [--seeds 3]

`simulated_hit_rates` is the curve against KV size; it needs the simulator's prefix cache (issue 28 item 1) and
refuses to run without it.
"""
from __future__ import annotations

import argparse
import statistics
import time

from tierserve.core.paths import shared_data

MOONCAKE = ("traces", "mooncake_fast25_conversation.csv")


def _row(name: str, bound, seconds: float) -> str:
    return (f"{name:<44}{bound.num_requests:>9,}{bound.blocks:>11,}{bound.block_fraction:>10.1%}"
            f"{bound.prompt_tokens:>14,}{bound.token_fraction:>10.1%}{seconds:>8.2f}")


def mooncake_requests():
    from tierserve.workload.readers import read_csv
    return read_csv(shared_data(*MOONCAKE))


def session_requests(num_requests: int, seed: int, hash_block_tokens: int = 16):
    from tierserve.workload.config import WorkloadConfig, build_workload
    from tierserve.workload.sessions import SessionsConfig
    cfg = WorkloadConfig(num_requests=num_requests, seed=seed,
                         sessions=SessionsConfig(hash_block_tokens=hash_block_tokens))
    return build_workload(cfg).requests


def simulated_hit_rates(requests, num_blocks: list[int], **replica) -> list[tuple[int, float]]:
    """(KV blocks per replica, simulated token hit rate) for one replica with prefix caching on, per KV size.

    Needs the simulator's prefix cache: `cluster.replica.prefix_caching` and a per-request cached-token count;
    without them this raises rather than report anything."""
    from tierserve.sim.config import ClusterConfig, ReplicaConfig
    if "prefix_caching" not in ReplicaConfig.model_fields:
        raise RuntimeError("simulated_hit_rates: this simulator has no prefix cache (ReplicaConfig has no "
                           "'prefix_caching' field; issue 28 item 1): only the reuse bound can be printed")
    from tierserve.sim import simulate
    out = []
    for n in num_blocks:
        cluster = ClusterConfig(num_replicas=1, replica=ReplicaConfig(prefix_caching=True, num_blocks=n, **replica))
        sim = simulate(cluster, list(requests), num_tiers=max(r.tier for r in requests) + 1, seed=0)
        if not sim.states or not hasattr(sim.states[0], "num_cached_tokens"):
            raise RuntimeError("simulated_hit_rates: request states carry no num_cached_tokens (issue 28 item 1)")
        cached = sum(s.num_cached_tokens for s in sim.states)
        out.append((n, cached / sum(r.prompt_tokens for r in requests)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="generator requests per seed (the default workload)")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    from tierserve.workload.sessions import prefix_reuse_bound
    print("prefix reuse bound (unlimited cache, arrival order): blocks seen before / full blocks; tokens a vLLM v1 "
          "cache could skip / prompt tokens")
    print(f"{'workload':<44}{'requests':>9}{'blocks':>11}{'seen':>10}{'tokens':>14}{'tok seen':>10}{'s':>8}")
    path = shared_data(*MOONCAKE)
    if path is not None:
        t = time.perf_counter()
        reqs = mooncake_requests()
        print(_row("mooncake conversation (512-token blocks)", prefix_reuse_bound(reqs), time.perf_counter() - t))
    else:
        print("mooncake conversation: skipped (../shared/data/traces/mooncake_fast25_conversation.csv not found)")
    for block in (16, 32):
        fractions = []
        for seed in range(a.seeds):
            t = time.perf_counter()
            bound = prefix_reuse_bound(session_requests(a.requests, seed, block))
            fractions.append((bound.block_fraction, bound.token_fraction))
            print(_row(f"sessions default, {block}-token blocks, seed {seed}", bound, time.perf_counter() - t))
        if len(fractions) > 1:
            b, k = zip(*fractions)
            print(f"{'  mean ± sd over seeds':<64}{statistics.mean(b):>10.1%}{'':>14}{statistics.mean(k):>10.1%}"
                  f"   (sd {statistics.stdev(b):.1%} / {statistics.stdev(k):.1%})")


if __name__ == "__main__":
    main()
